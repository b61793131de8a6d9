"""What a schedule must leave behind: every computation on the NPU's units.

Stage: schedule (kernels/stage.py: schedule runs it after the built-in or a user's schedule function).
In: the scheduled s_tir PrimFunc. Out: nothing, or ScheduleError naming the first block that
still computes element by element, with its loop nest and how to fix it. A leaf block may be a
tensorized intrinsic (its body records a `cgra_*` command) or a copy between a tensor and the
scratchpad (the DMA pass turns it into a DMA box); anything else would run nowhere: the code
generator refuses host code in a kernel, and it would otherwise be neither simulated nor timed.
"""

from __future__ import annotations

from tvm import ir, tirx

from ...errors import ScheduleError
from ..intrinsics import INTRINSICS, SPAD


def check_scheduled(sch, where: str) -> None:
    """Raise ScheduleError for the first leaf block of `sch` that is neither a tensorized
    intrinsic nor a scratchpad copy; `where` says which kernel ("the schedule of pattern ...")."""
    try:
        root = sch.get_sblock("root")
    except Exception:  # noqa: BLE001 (TVM's ScheduleError): plain TIR without blocks, written as lowered
        return
    for block_rv in _leaf_blocks(sch, root):
        block = sch.get(block_rv)
        if _records_a_command(block.body) or _is_spad_copy(block.body):
            continue
        loops = [sch.get(loop) for loop in sch.get_loops(block_rv)]
        nest = ", ".join(f"{loop.loop_var.name} in {loop.extent}" for loop in loops) or "no loops"
        raise ScheduleError(
            f"{where} leaves block '{block.name_hint}' ({nest}) untensorized: it would compute element by "
            f"element, which the NPU cannot run. Stage its operands in the scratchpad (cache_read / "
            f"cache_write, scope '{SPAD}') and tensorize its tile with a CGRA intrinsic "
            f"({', '.join('cgra.' + kind for kind in INTRINSICS)}: npu_backend.kernels.intrinsics.get_intrin "
            "gives the name for a size), or leave this part to npu_backend.schedules.builtin")


def _leaf_blocks(sch, block_rv) -> list:
    """The blocks under `block_rv` that have no child blocks (itself when it has none)."""
    children = sch.get_child_blocks(block_rv)
    if not children:
        return [block_rv]
    return [leaf for child in children for leaf in _leaf_blocks(sch, child)]


def _records_a_command(stmt) -> bool:
    """Whether the statement calls a `cgra_*` device function (a tensorized intrinsic's body)."""
    if isinstance(stmt, tirx.Evaluate):
        call = stmt.value
        return isinstance(call, ir.Call) and any(
            isinstance(getattr(arg, "value", None), str) and arg.value.startswith("cgra_") for arg in call.args[:1])
    if isinstance(stmt, tirx.SeqStmt):
        return any(_records_a_command(s) for s in stmt.seq)
    for field in ("body", "then_case"):
        child = getattr(stmt, field, None)
        if isinstance(child, tirx.Stmt):
            return _records_a_command(child)
    return False


def _is_spad_copy(stmt) -> bool:
    """A store of one loaded element (optionally guarded by if_then_else against a constant, or
    cast) where exactly one side is a scratchpad buffer."""
    if isinstance(stmt, tirx.IfThenElse) and stmt.else_case is None:
        stmt = stmt.then_case
    if not isinstance(stmt, tirx.BufferStore):
        return False
    value = stmt.value
    while True:
        if isinstance(value, tirx.Cast):
            value = value.value
        elif isinstance(value, ir.Call) and str(getattr(value.op, "name", "")).endswith("if_then_else"):
            loads = [arg for arg in value.args[1:] if not isinstance(arg, (tirx.IntImm, tirx.FloatImm))]
            if len(loads) != 1:
                return False
            value = loads[0]
        else:
            break
    if not isinstance(value, ir.TensorLoad):
        return False
    return (_scope(stmt.buffer) == SPAD) != (_scope(value.source) == SPAD)


def _scope(buffer) -> str:
    """The buffer's storage scope ("global", "cgra.spad", ...), "" when it has none."""
    return str(buffer.scope()) if callable(getattr(buffer, "scope", None)) else ""


def check_signature(func, builtin, where: str) -> None:
    """Raise ScheduleError unless `func` (a user's kernel) is a PrimFunc whose parameters have the
    shapes and dtypes of the built-in kernel's (`builtin`): the pattern's operands, then the output."""
    if not isinstance(func, tirx.PrimFunc):
        raise ScheduleError(f"{where} returned {type(func).__name__}, not a PrimFunc (write it with @T.prim_func)")
    expected, given = [_param(p) for p in builtin.params], [_param(p) for p in func.params]
    if [e[1:] for e in expected] != [g[1:] for g in given]:
        def listing(params):
            return ", ".join(f"{name} {shape} {dtype}" for name, shape, dtype in params)
        raise ScheduleError(f"{where} takes ({listing(given)}), but the pattern's kernel is called with "
                            f"({listing(expected)}): the operands in this order, then the output")


def _param(var) -> tuple:
    """(name, shape, dtype) of a PrimFunc parameter, dimensions as ints or their names."""
    ty = var.ty
    shape = tuple(int(d) if hasattr(d, "value") else str(d) for d in getattr(ty, "shape", ()))
    return str(var.name), shape, str(getattr(ty, "dtype", ""))
