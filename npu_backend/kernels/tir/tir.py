"""The TensorIR family: a user's own PrimFuncs, called from Relax with R.call_tir, on the NPU.

Stage: partition (partition/call_tir.py asks `tir_spec` whether a called PrimFunc can run on the
NPU), tiling, kernel definition and schedule. A PrimFunc qualifies when its one block is

- a GEMM: a reduction that TVM's tensorize-mapping analysis
  (`s_tir.schedule.analysis.get_auto_tensorize_mapping_info`) maps onto the PE array's GEMM
  intrinsic, C[i, j] += A[i, k] * B[k, j] with the operands cast to the accumulator dtype, in
  any loop order and with either operand stored transposed; or
- elementwise: out = f(a, b) with f one of ELTWISE's add, subtract, multiply, maximum, minimum
  (operands of the output's rank, each walking or broadcasting every axis), or out = relu(a) or
  clip(a, lo, hi) on the vector unit's EPILOGUE (int32 or float32), or any other expression of
  one input of the output's shape and constants with + - * max min (int32 or float32, up to 16
  operations: a leaky relu, a hard-swish written with multiplies) as a FABRIC body on the PE
  fabric;

or when it is a kernel already written for the NPU (`T.func_attr({"cgra.kernel": True})`: its
own scratchpad buffers, copies and tensorized blocks or device calls), which goes to lowering as
it is. The kernel IS the user's PrimFunc: its GEMM block is tiled to the PE array and the
scratchpad with TVM's `tile_with_tensor_intrin` (padding the extents to whole tiles), its
operand tiles are staged into the scratchpad, and the tile is tensorized, the way the built-in
families' schedules do it (gemm_schedule.py); the DMA pass, double buffering, codegen and the simulator
are the same path as every other kernel's.
"""

from __future__ import annotations

import dataclasses
import math

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule.analysis import get_auto_tensorize_mapping_info
from tvm.s_tir.schedule.transform import tile_with_tensor_intrin

from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import ACC_DTYPE, DType
from cgra_sim.mapping import body as bodies

from ...errors import ScratchpadTooSmall, UnsupportedOperator
from ..elementwise import eltwise
from ..common.chains import require_program
from ..family import OpFamily
from ..gemm.gemm import choose_tiling as choose_gemm_tiling
from ..gemm.gemm_schedule import loops_after
from ..intrinsics import SPAD, get_intrin
from ..intrinsics.fabric import FabricBody
from .tir_exprs import EPILOGUE_DTYPES, fabric_op, indexes_by, vector_op
from ..intrinsics.vector_unit import ELTWISE_FUNCS
from ..common.spad_layout import a_row_stride, align_rows
from ..common.spec import Tiling

#: The PrimFunc attribute of a kernel written for the NPU by hand (scratchpad buffers, copies,
#: tensorized blocks or device calls): it is lowered as it is, not tiled.
KERNEL_ATTR = "cgra.kernel"
#: A kernel written for the NPU may state the model's multiply-accumulates it computes (an int),
#: which profiles and explain then count as the model's (kernels/gemm/int4_matmul.py does).
MACS_ATTR = "cgra.macs"
# The 16-bit floats are left out: a user's PrimFunc on them is not checked against the NPU yet.
GEMM_DTYPES = ("int8", "float32")
VECTOR_DTYPES = ("float32", "int32", "int8")


@dataclasses.dataclass(frozen=True)
class TirSpec:
    """One user PrimFunc as an NPU kernel. `func` is compared through `fingerprint` (its
    structural hash), so that identical PrimFuncs share a compiled kernel."""

    name: str  # the PrimFunc's name in the module
    kind: str  # "gemm", "vector" or "kernel"
    func: tirx.PrimFunc = dataclasses.field(compare=False, hash=False, repr=False)
    fingerprint: int = 0
    block: str = ""  # the block mapped onto an intrinsic
    dtype: str = ""  # the inputs' dtype
    acc_dtype: str = ""  # GEMM: the accumulator's (the output's) dtype
    extents: tuple = ()  # GEMM: (M, N, K); elementwise: the output's shape
    # elementwise: ("eltwise", func, lhs_full, rhs_full), ("epilogue", relu, clip) or ("fabric", nodes, flipped)
    vector_op: tuple = ()
    source_ops: tuple = ()
    param_roles: tuple = ()
    op: str = "tir"

    @property
    def output_shape(self) -> tuple:
        """GEMM: (M, N); elementwise: the output's; a kernel written for the NPU: its last
        parameter's (its output: destination-passing), None where that is not static."""
        if self.kind == "kernel":
            shape = self.func.params[-1].shape
            return tuple(int(d) for d in shape) if all(isinstance(d, tirx.IntImm) for d in shape) else None
        return self.extents[:2] if self.kind == "gemm" else self.extents

    @property
    def macs(self) -> int | None:
        """Multiply-accumulates of the PrimFunc (a GEMM: M * N * K; elementwise: 0); for a kernel
        written for the NPU its `cgra.macs` attribute (the model's MACs it computes), else None:
        its work only its commands tell."""
        if self.kind == "kernel":
            declared = (self.func.attrs or {}).get(MACS_ATTR, None)
            return int(declared) if declared is not None else None
        return math.prod(self.extents) if self.kind == "gemm" else 0


def tir_spec(func: tirx.PrimFunc, name: str) -> TirSpec:
    """What `func` computes as an NPU kernel; raises UnsupportedOperator with the reason it
    cannot be one (what stays on the host and why, for explain)."""
    where = f"PrimFunc '{name}'"
    _check_params(func, where)
    common = dict(name=name, fingerprint=tvm_ffi.structural_hash(func), source_ops=(f"call_tir {name}",))
    if bool((func.attrs or {}).get(KERNEL_ATTR, False)):
        return TirSpec(kind="kernel", func=func, **common)
    common["func"] = _as_s_tir(func)
    sch = s_tir.Schedule(common["func"])
    blocks = _compute_blocks(sch)
    if len(blocks) != 1:
        names = ", ".join(f"'{sch.get(b).name_hint}'" for b in blocks) or "none"
        raise UnsupportedOperator(
            f"{where} has {len(blocks)} blocks ({names}): the NPU takes a PrimFunc of one GEMM or "
            "elementwise block (split it into one PrimFunc per block), or a kernel written for it "
            f"(T.func_attr({{'{KERNEL_ATTR}': True}}))")
    block = blocks[0]
    stmt = sch.get(block)
    if any(iv.iter_type == tirx.IterVar.CommReduce for iv in stmt.iter_vars):
        return _gemm_spec(sch, block, where, common)
    return _vector_spec(stmt, where, common)


def _as_s_tir(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func if (func.attrs or {}).get("s_tir", False) else func.with_attr("s_tir", True)


def _check_params(func, where: str) -> None:
    for param in func.params:
        if not isinstance(param.ty, tirx.BufferType):
            raise UnsupportedOperator(f"{where} takes the scalar parameter '{param.name}': an NPU kernel "
                                      "takes tensors only")
        if not all(isinstance(d, tirx.IntImm) for d in param.shape):
            raise UnsupportedOperator(f"{where}: buffer '{param.name}' has the symbolic shape "
                                      f"{list(param.shape)}; the NPU path needs static shapes")


def _compute_blocks(sch) -> list:
    """Every block but the root, nested ones included."""
    if not _has_root(sch):
        return []
    found, stack = [], list(sch.get_child_blocks(sch.get_sblock("root")))
    while stack:
        block = stack.pop(0)
        found.append(block)
        stack[:0] = list(sch.get_child_blocks(block))
    return found


def _has_root(sch) -> bool:
    try:
        sch.get_sblock("root")
    except Exception:  # a PrimFunc without blocks (plain loops) has no root block
        return False
    return True


# ------------------------------------------------------------------ GEMM

def _gemm_spec(sch, block, where: str, common: dict) -> TirSpec:
    stmt = sch.get(block)
    written = [region.source for region in stmt.writes]
    dtypes = {str(r.source.dtype) for r in stmt.reads if not any(r.source.same_as(w) for w in written)}
    out_dtype = str(written[0].dtype) if len(written) == 1 else ""
    if len(dtypes) != 1 or next(iter(dtypes)) not in GEMM_DTYPES:
        raise UnsupportedOperator(f"{where}: block '{stmt.name_hint}' reads {sorted(dtypes)}; the PE array "
                                  f"multiplies two operands of one dtype among {', '.join(GEMM_DTYPES)}")
    dtype = next(iter(dtypes))
    acc_dtype = DType(int(ACC_DTYPE[DType.from_name(dtype)])).numpy_name
    if out_dtype != acc_dtype:
        raise UnsupportedOperator(f"{where}: block '{stmt.name_hint}' accumulates {dtype} products into "
                                  f"{out_dtype or 'several outputs'}; the PE array accumulates {dtype} in "
                                  f"{acc_dtype}")
    for region in stmt.reads:
        if not all(isinstance(r.min, tirx.Var) or _is_zero(r.min) for r in region.region):
            indices = ", ".join(str(r.min) for r in region.region)
            raise UnsupportedOperator(
                f"{where}: block '{stmt.name_hint}' reads {region.source.name}[{indices}], not by its "
                "iterators alone: a sliding window or a gather, which the PE array's GEMM does not take "
                "(a convolution runs on the NPU as relax.op.nn.conv2d)")
    desc = s_tir.TensorIntrin.get(get_intrin("gemm", 2, 2, 2, dtype, acc_dtype)).desc
    info = get_auto_tensorize_mapping_info(sch, block, desc)
    if info is None or len(info.mappings) == 0:
        raise UnsupportedOperator(
            f"{where}: block '{stmt.name_hint}' is a reduction the PE array's GEMM does not map onto "
            f"(C[i, j] += A[i, k] * B[k, j] with {dtype} operands cast to {acc_dtype}, loops in any order, "
            "either operand transposed)")
    extents = tuple(int(e) for e in info.mappings[0].map_shape([iv.dom.extent for iv in info.lhs_iters]))
    return TirSpec(kind="gemm", block=stmt.name_hint, dtype=dtype, acc_dtype=acc_dtype, extents=extents,
                   **common)


def _schedule_gemm(sch, spec: TirSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """Tile the GEMM block to (tm, tn, tk) with TVM's tile_with_tensor_intrin (its extents padded
    to whole tiles), order the tile loops spatial first, stage the A and B tiles per reduction
    step and the accumulator tile per output tile in the scratchpad, and tensorize: FILL, GEMM
    (fold_init later merges the two)."""
    intrin = get_intrin("gemm", tiling.tm, tiling.tn, tiling.tk, spec.dtype, spec.acc_dtype)
    block = sch.get_sblock(spec.block)
    if tile_with_tensor_intrin(sch, block, intrin, allow_padding=True) is None:
        raise UnsupportedOperator(f"block '{spec.block}' could not be tiled to {tiling.tm} x {tiling.tn} x "
                                  f"{tiling.tk} GEMM tiles")
    spatial, reductions = _tile_loops(sch, block)
    if spatial and reductions:
        sch.reorder(*spatial, *reductions)
    row = sch.get_loops(block)[-3]
    step = (reductions or spatial)[-1] if (reductions or spatial) else None
    a_stage, b_stage = (_stage_operand(sch, block, role) for role in ("A", "B"))
    acc_store = _stage_output(sch, block)
    if step is not None:
        for stage in (a_stage, b_stage):
            sch.compute_at(stage, step)
    if spatial:
        sch.reverse_compute_at(acc_store, spatial[-1])
    align_rows(sch, a_stage, tiling.tk, a_row_stride(tiling.tm, tiling.tk, DType.from_name(spec.dtype).itemsize,
                                                     arch), spec.dtype, arch)
    init = sch.decompose_reduction(block, reductions[0] if reductions else row)
    sch.tensorize(row, intrin)
    sch.tensorize(sch.get_loops(init)[-2], get_intrin("fill", tiling.tm, tiling.tn, spec.acc_dtype))


def _tile_loops(sch, block) -> tuple[list, list]:
    """The loops around the GEMM block's tile (all but its inner three), split into those that
    walk output tiles (or batches) and those that walk reduction steps, each in loop order."""
    loops = sch.get_loops(block)
    realize = sch.get(loops[-1]).body
    reduce_vars = [value for iv, value in zip(realize.block.iter_vars, realize.iter_values)
                   if iv.iter_type == tirx.IterVar.CommReduce]
    spatial, reductions = [], []
    for loop in loops[:-3]:
        var = sch.get(loop).loop_var
        (reductions if any(_uses(value, var) for value in reduce_vars) else spatial).append(loop)
    return spatial, reductions


def _uses(expr, var) -> bool:
    """Whether the affine index expression `expr` reads `var`."""
    if isinstance(expr, tirx.Var):
        return expr.same_as(var)
    return any(_uses(getattr(expr, side), var) for side in ("a", "b") if hasattr(expr, side))


def _operand_roles(sch, block) -> dict:
    """Which buffer the block reads as A (indexed by rows and depth) and which as B (depth and
    columns), each with whether it is stored transposed against the intrinsic's tiles (A: rows x
    depth, B: depth x cols). After tile_with_tensor_intrin the block's last three iterators are
    the GEMM's (i, j, k)."""
    stmt = sch.get(block)
    gemm_axes = [iv.var for iv in stmt.iter_vars][-3:]
    out = stmt.writes[0].source
    roles = {}
    for region in stmt.reads:
        if region.source.same_as(out):
            continue
        axes = [_position(r.min, gemm_axes) for r in region.region]
        used = [a for a in axes if a is not None]
        if sorted(used) == [0, 2]:
            roles["A"] = (region.source, used == [2, 0])
        elif sorted(used) == [1, 2]:
            roles["B"] = (region.source, used == [1, 2])
    return roles


def _position(expr, variables):
    """The position of the variable `expr` among `variables`, or None."""
    for position, var in enumerate(variables):
        if isinstance(expr, tirx.Var) and expr.same_as(var):
            return position
    return None


def _stage_operand(sch, block, role: str):
    """The block that puts operand `role`'s tile into the scratchpad, in the layout the GEMM
    intrinsic reads (A: rows x depth, B: depth x cols): the padding block tile_with_tensor_intrin
    made, or a new cache read; a transposed operand's scratchpad copy is stored transposed."""
    buffer, transposed = _operand_roles(sch, block)[role]
    index = [r.source.same_as(buffer) for r in sch.get(block).reads].index(True)
    producers = [p for p in sch.get_producers(block) if sch.get(p).writes[0].source.same_as(buffer)]
    if producers:  # tile_with_tensor_intrin's padding block
        stage = producers[0]
        sch.set_scope(stage, 0, SPAD)
    else:
        stage = sch.cache_read(block, index, SPAD)
    if transposed:
        sch.transform_layout(block, ("read", index), lambda x, y: (y, x))
    return stage


def _stage_output(sch, block):
    """The accumulator tile in the scratchpad and the block that stores it to the output."""
    consumers = sch.get_consumers(block)
    if consumers:  # tile_with_tensor_intrin's unpadding block
        sch.set_scope(block, 0, SPAD)
        return consumers[0]
    return sch.cache_write(block, 0, SPAD)


# ------------------------------------------------------------------ elementwise

def _vector_spec(stmt, where: str, common: dict) -> TirSpec:
    store = stmt.body
    if not isinstance(store, tirx.BufferStore):
        raise UnsupportedOperator(f"{where}: block '{stmt.name_hint}' is not one store of an elementwise "
                                  "value")
    out = store.buffer
    iterators = [iv.var for iv in stmt.iter_vars]
    if len(out.shape) < 2 or not indexes_by(store.indices, iterators, out, full_only=True):
        raise UnsupportedOperator(f"{where}: block '{stmt.name_hint}' must write every element of a "
                                  "buffer of rank 2 or more, indexed by its iterators in order")
    dtype = str(out.dtype)
    op = vector_op(store.value, iterators, out, dtype) or fabric_op(store.value, iterators, dtype)
    if op is None:
        raise UnsupportedOperator(
            f"{where}: block '{stmt.name_hint}' computes {store.value}; the vector unit runs a op b with op "
            f"one of {', '.join(ELTWISE_FUNCS)} (operands of the output's rank and dtype), relu and clip "
            f"({', '.join(EPILOGUE_DTYPES)}), and the PE fabric any expression of one input of the output's "
            f"shape, constants, + - * max min ({' or '.join(bodies.BODY_DTYPES)}, up to "
            f"{bodies.BODY_MAX_NODES} operations, a constant minus x excepted)")
    if dtype not in VECTOR_DTYPES:
        raise UnsupportedOperator(f"{where}: the vector unit computes {', '.join(VECTOR_DTYPES)}, not {dtype}")
    return TirSpec(kind="vector", block=stmt.name_hint, dtype=dtype, extents=tuple(int(d) for d in out.shape),
                   vector_op=op, **common)


def _is_zero(expr) -> bool:
    return isinstance(expr, tirx.IntImm) and expr.value == 0


def _vector_tiling(spec: TirSpec, arch: HardwareDescription) -> Tiling:
    """tm x tn tiles of the output's last two axes that divide them exactly (the user's blocks
    are not padded), with the fewest estimated cycles (eltwise.py's estimate) among those whose
    tiles, double-buffered, fit the scratchpad."""
    *_, rows, cols = spec.extents
    tiling = eltwise.best_tiling(_eltwise_spec(spec), arch, _divisors(rows), _divisors(cols))
    if tiling is None:
        raise ScratchpadTooSmall(f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold one "
                                 f"element of each {spec.dtype} operand twice")
    return tiling


def _eltwise_spec(spec: TirSpec) -> eltwise.EltwiseSpec:
    """The standalone elementwise family's spec of the same work, for its cost estimate."""
    if spec.vector_op[0] == "eltwise":
        _, func, lhs_full, rhs_full = spec.vector_op
    else:  # EPILOGUE and FABRIC stream one operand: count the second as a broadcast scalar
        func, lhs_full, rhs_full = "add", (True,) * len(spec.extents), (False,) * len(spec.extents)
    return eltwise.EltwiseSpec(func, spec.dtype, spec.extents, spec.extents, spec.extents,
                               extents=spec.extents, lhs_full=lhs_full, rhs_full=rhs_full)


def _divisors(extent: int) -> list:
    small = [d for d in range(1, math.isqrt(extent) + 1) if extent % d == 0]
    return sorted(set(small + [extent // d for d in small]))


def _vector_intrin(spec: TirSpec, tiling: Tiling) -> str:
    if spec.vector_op[0] == "fabric":
        _, nodes, flipped = spec.vector_op
        return get_intrin("fabric", tiling.tm, tiling.tn, FabricBody(nodes, spec.dtype, flipped))
    if spec.vector_op[0] == "eltwise":
        _, func, lhs_full, rhs_full = spec.vector_op
        return get_intrin("eltwise", tiling.tm, tiling.tn, func, spec.dtype, a_full=lhs_full[-2:], b_full=rhs_full[-2:])
    _, relu, clip = spec.vector_op
    return get_intrin("epilogue", tiling.tm, tiling.tn, spec.dtype, bias=False, relu=relu, residual=False, clip=clip)


def _schedule_vector(sch, spec: TirSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """Tile the output's last two axes to tm x tn, stage each operand's tile and the output's in
    the scratchpad per tile, and tensorize the tile onto ELTWISE or EPILOGUE."""
    del arch
    block = sch.get_sblock(spec.block)
    *outer, rows, cols = sch.get_loops(block)
    del outer
    row_tile, row = sch.split(rows, [None, tiling.tm])
    col_tile, col = sch.split(cols, [None, tiling.tn])
    sch.reorder(row_tile, col_tile, row, col)
    out = sch.get(block).writes[0].source
    for index, region in enumerate(sch.get(block).reads):
        if not region.source.same_as(out):
            sch.compute_at(sch.cache_read(block, index, SPAD), col_tile)
    sch.reverse_compute_at(sch.cache_write(block, 0, SPAD), col_tile)
    sch.tensorize(row, _vector_intrin(spec, tiling))


# ------------------------------------------------------------------ the family

def choose_tir_tiling(spec: TirSpec, arch: HardwareDescription):
    if spec.kind == "gemm":
        if spec.dtype not in arch.dtypes:
            raise UnsupportedOperator(f"{arch.name} computes {', '.join(arch.dtypes)}, not {spec.dtype}")
        return choose_gemm_tiling(*spec.extents, spec.dtype, spec.acc_dtype, False, arch)
    if spec.kind == "vector":
        if spec.vector_op[0] == "fabric":
            require_program(spec.vector_op[1], spec.dtype, arch, f"PrimFunc '{spec.name}'")
        return _vector_tiling(spec, arch)
    return None  # a kernel written for the NPU brings its own tiles


def tir_compute(spec: TirSpec, tiling) -> tirx.PrimFunc:
    del tiling
    return spec.func


def schedule_tir(sch, spec: TirSpec, tiling, arch: HardwareDescription) -> None:
    if spec.kind == "gemm":
        _schedule_gemm(sch, spec, tiling, arch)
    elif spec.kind == "vector":
        _schedule_vector(sch, spec, tiling, arch)


TIR = OpFamily(name="tir", ops=("tir",), choose_tiling=choose_tir_tiling, compute=tir_compute,
               schedule=schedule_tir, checks_pe_dtype=False)

__all__ = ["KERNEL_ATTR", "TIR", "TirSpec", "loops_after", "tir_spec"]
