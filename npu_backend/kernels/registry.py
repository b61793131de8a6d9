"""The one list of op families, and what the stages ask of it.

Stage: shared by partition (the pattern table and the reason a match stays on the host), the
target hook (an offloaded function's spec, its family's tiling, compute and schedule) and
explain. FAMILIES is ordered: first the attention (attention/: matmul, softmax and matmul as one
kernel, before the matmul chains take its pieces), RoPE (elementwise/rope.py: its multiplies,
slices and concat as one kernel, before the elementwise families take them one each), the roots one kernel fuses (inverted_residual.py: a 1x1
expansion, a depthwise conv2d and the 1x1 conv2d after it, before separable.py's pair of the
last two, which would take them apart), then the epilogue chains of the families with
roots (epilogue.py sorts those among themselves, most specific first), then the standalone
patterns in this order, so the standalone elementwise ops come last and an add a kernel's
epilogue can fuse is taken by that kernel; SiLU's multiply(x, sigmoid(x)) is one
smooth-activation kernel before its multiply could be an ELTWISE; a chain of elementwise ops on
one tensor goes to the fabric before its ops could go to the vector unit one kernel each, and
an op or a float chain between quantized tensors (qlinear.py, qchain.py) is one kernel before the
fabric or the vector unit could take its ops apart. The layout copies (layout/) come last: a
kernel that reads a transpose itself takes it first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect

from tvm import relax

from ..errors import CGRAError, FamilyError, UnsupportedCopy, UnsupportedOperator, stage_context
from ..partition.call_tir import prim_func_of
from ..partition.composite import SHARED_SOURCE, composite_call, composite_name, composite_ops, matched_roles
from .attention.attention import ATTENTION
from .attention.length_rows import LENGTH_ROWS
from .elementwise.activation import ACTIVATION
from .elementwise.cast import CAST
from .common.chains import require_program
from .gemm.conv2d import CONV2D
from .gemm.depthwise import DEPTHWISE
from .elementwise.eltwise import ELTWISE
from .gemm.epilogue import chain_pattern_graphs
from .gemm.epilogue_tail import tail_graphs
from .gemm.gated import gated_graphs
from .gemm.post_norm import post_norm_graphs
from .gemm.rope_epilogue import rope_graphs, with_pass_columns
from .elementwise.fabric import FABRIC
from .elementwise.rope import ROPE
from .elementwise.qlinear import QLINEAR
from .elementwise.qchain import QCHAIN
from .elementwise.qlookup import QLOOKUP
from .elementwise.quantize import QUANTIZE
from .fused.inverted_residual import INVERTED_RESIDUAL
from .fused.mlp import MLP
from .family import OpFamily
from .gemm.matmul import MATMUL
from .pool.pool import POOL
from .fused.separable import SEPARABLE
from .elementwise.sigmoid import SMOOTH
from .tir.tir import TIR, tir_spec
from .layout.layout import LAYOUT
from .rows.norms import NORMS
from .rows.row_reduce import ROW_REDUCE
from .rows.softmax import SOFTMAX
from .elementwise.special import SPECIAL

FAMILIES: tuple[OpFamily, ...] = (ATTENTION, LENGTH_ROWS, ROPE, INVERTED_RESIDUAL, SEPARABLE, MLP, MATMUL, CONV2D, DEPTHWISE, POOL, SMOOTH, SOFTMAX, NORMS, SPECIAL,
                                  ROW_REDUCE, QLINEAR, QCHAIN, QLOOKUP, QUANTIZE, FABRIC, ELTWISE, TIR, ACTIVATION,
                                  CAST, LAYOUT)
_PACKAGED = FAMILIES  # the package's own, not those of registered()


def check_families(families: tuple) -> None:
    """Each family with a name and ops of its own: a second family building the same op would
    never be asked for its kernels (family_of takes the first). Pattern names: pattern_table."""
    seen, built_by = set(), {}
    for family in families:
        if not isinstance(family, OpFamily):
            raise FamilyError(f"FAMILIES holds OpFamily objects, not {type(family).__name__}")
        if family.name in seen:
            raise FamilyError(f"OpFamily '{family.name}': name taken by another family")
        seen.add(family.name)
        for op in family.ops:
            if op in built_by:
                raise FamilyError(f"OpFamily '{family.name}': ops: '{op}' is built by the '{built_by[op]}' family")
            built_by[op] = family.name


check_families(FAMILIES)


@contextlib.contextmanager
def registered(family: OpFamily, before: OpFamily | None = None):
    """`family` among FAMILIES (before `before`, else last: the place gives its patterns their
    priority) while the block runs, then gone again: a family tried out, or a test's. A family
    of the package itself is an entry of the FAMILIES literal above."""
    global FAMILIES
    saved = FAMILIES
    at = FAMILIES.index(before) if before is not None else len(FAMILIES)
    check_families(FAMILIES[:at] + (family,) + FAMILIES[at:])
    FAMILIES = FAMILIES[:at] + (family,) + FAMILIES[at:]
    _forget()
    try:
        pattern_table()  # its pattern names checked
        yield family
    finally:
        FAMILIES = saved
        _forget()


@contextlib.contextmanager
def unregistered(family: OpFamily):
    """FAMILIES without `family` while the block runs (a test of what the host does without it:
    the runtime's host concat with the layout family gone)."""
    global FAMILIES
    saved = FAMILIES
    FAMILIES = tuple(f for f in FAMILIES if f is not family)
    _forget()
    try:
        yield
    finally:
        FAMILIES = saved
        _forget()


def packaged(spec) -> bool:
    """Whether `spec`'s family is one of the package's own: only their kernels go to the
    persistent kernel cache, whose key sees the spec but not a registered family's code."""
    return any(family_of(spec) is family for family in _PACKAGED)


def _forget() -> None:
    """Drop what was derived from FAMILIES."""
    pattern_table.cache_clear()
    pair_pattern_names.cache_clear()
    _TILINGS.clear()


@dataclasses.dataclass(frozen=True)
class PatternEntry:
    """One fusion pattern and the family whose kernels it offloads."""

    name: str  # "cgra.conv2d_bias_relu"
    pattern: object  # the DFPattern
    annotations: dict  # role -> DFPattern
    family: OpFamily


@functools.cache
def pattern_table() -> tuple[PatternEntry, ...]:
    """Every fusion pattern in the order FuseOpsByPattern must try them (see the module doc):
    pairs of roots first, whose roots' own chains would otherwise take them apart."""
    entries = [PatternEntry(name, pattern, roles, family)
               for family in FAMILIES for name, pattern, roles in family.pairs()]
    roots = [(root, family) for family in FAMILIES for root in family.roots()]
    owner = {root.name: family for root, family in roots}
    entries += [PatternEntry(name, pattern, roles, owner[root])
                for name, pattern, roles, root in gated_graphs([root for root, _ in roots])]
    entries += [PatternEntry(name, pattern, roles, owner[root])
                for name, pattern, roles, root in rope_graphs([root for root, _ in roots])]
    entries += [PatternEntry(name, pattern, roles, owner[root])  # before the tails, which would take its sum
                for name, pattern, roles, root in post_norm_graphs([root for root, _ in roots])]
    entries += [PatternEntry(name, pattern, roles, owner[root])
                for name, pattern, roles, root in tail_graphs([root for root, _ in roots])]
    entries += [PatternEntry(name, pattern, roles, owner[root])
                for name, pattern, roles, root in chain_pattern_graphs([root for root, _ in roots])]
    entries += [PatternEntry(name, pattern, roles, family)
                for family in FAMILIES for name, pattern, roles in family.patterns()]
    owners = {}
    for entry in entries:  # a mirrored residual add shares its name, within its family
        if owners.setdefault(entry.name, entry.family.name) != entry.family.name:
            raise FamilyError(f"OpFamily '{entry.family.name}': pattern '{entry.name}' is the "
                              f"'{owners[entry.name]}' family's too; a pattern name names one family's kernels")
    return tuple(entries)


@functools.cache
def pair_pattern_names() -> frozenset:
    """The names of the patterns that fuse several roots around a depthwise conv2d (OpFamily.pairs:
    separable.py, inverted_residual.py), which their checks require. (The attention's pairs,
    matmul -> softmax -> matmul, and the MLP's, matmul -> matmul, are tried whenever their
    operators are called.)"""
    return frozenset(name for family in FAMILIES if family not in (ATTENTION, LENGTH_ROWS, MLP)
                     for name, _, _ in family.pairs())


def entries_named(name: str) -> list[PatternEntry]:
    """The patterns registered under `name` (a mirrored residual add shares its name)."""
    found = [entry for entry in pattern_table() if entry.name == name]
    if not found:
        raise UnsupportedOperator(f"'{name}' is not a cgra pattern")
    return found


def family_of(spec) -> OpFamily:
    """The family that builds the kernel of `spec` (by its op)."""
    for family in FAMILIES:
        if spec.op in family.ops:
            return family
    raise CGRAError(f"no op family builds '{spec.op}' kernels (known: "
                    f"{', '.join(op for family in FAMILIES for op in family.ops)})")


def spec_from_match(name: str, annotated: dict):
    """The kernel pattern `name` matching `annotated` (role -> expression) would become."""
    return entries_named(name)[0].family.spec_from_match(name, annotated)


_TILINGS: dict = {}  # (spec, chip fingerprint) -> Tiling: tiling_of's results (both immutable)


def tiling_of(spec, arch):
    """family_of(spec).choose_tiling(spec, arch), searched once per (spec, chip) in a process:
    partitioning asks whether each call fits, the kernel stage asks again for its tiles, and a
    model's repeated blocks ask for the same spec (EfficientNet: 552 calls, 103 kernels)."""
    try:
        key = (spec, arch.fingerprint)
        hash(key)
    except TypeError:  # a spec holding something unhashable: searched every time
        return family_of(spec).choose_tiling(spec, arch)
    if key not in _TILINGS:
        if len(_TILINGS) >= 4096:
            _TILINGS.clear()
        _TILINGS[key] = family_of(spec).choose_tiling(spec, arch)  # a refusal raises, uncached
    return _TILINGS[key]


def offload_reason(name: str, annotated: dict, arch) -> str | None:
    """None if the match can run on the NPU described by `arch`, else the reason it stays on the host."""
    try:
        spec = spec_from_match(name, annotated)
        family = family_of(spec)
        if family.checks_pe_dtype and spec.dtype not in arch.dtypes:
            return f"{arch.name} computes {', '.join(arch.dtypes)}, not {spec.dtype}"
        tiling_of(spec, arch)
        if getattr(spec, "fabric_body", ()):  # a chain after the epilogue (fuse_chains)
            require_program(spec.fabric_body, spec.acc_dtype, arch, " -> ".join(spec.source_ops))
    except CGRAError as err:
        return str(err)
    return None


def host_patterns() -> dict:
    """Relax op -> the pattern explain reads a host call of it with."""
    return {op: pattern for family in FAMILIES for op, pattern in family.host_ops.items()}


def kernel_ops() -> dict:
    """Family name -> the Relax ops its kernels take (its `host_ops`, sorted), in FAMILIES
    order, families that take none left out: what `explain` says the NPU runs."""
    return {family.name: tuple(sorted(family.host_ops)) for family in FAMILIES if family.host_ops}


# ------------------------------------------------------------------ an offloaded function

def offloaded_spec(func):
    """The spec of an offloaded Relax function (attribute Codegen "cgra"), as the target hook
    and explain read it: errors name the partition stage and the kernel's symbol."""
    with stage_context("partition", str(func.attrs["global_symbol"])):
        prim_func = prim_func_of(func)
        if prim_func is not None:  # a user's PrimFunc (partition/call_tir.py)
            name, body = prim_func
            return tir_spec(body, name)
        _check_call_order(func)
        return spec_from_composite(func)


def spec_from_composite(func):
    """The spec of the composite inside `func`: its roles from the pattern it was fused with,
    its parameters in the function's order, its Relax operators as source ops."""
    name = composite_name(func)
    entries = entries_named(name)
    annotated = matched_roles(func, [(entry.pattern, entry.annotations) for entry in entries])
    spec = entries[0].family.spec_from_match(name, annotated)
    composite, _ = composite_call(func)
    roles = {}
    for role, expr in annotated.items():
        roles.setdefault(expr, []).append(role)
    param_roles, shape_args = [], []
    for position, param in enumerate(composite.params):
        if isinstance(param.ty, relax.ShapeType):
            # Symbolic sizes Relax passes beside the tensors (tir_vars: e.g. w when the data's
            # width is (w - 1) // 2 + 1); the kernel reads its sizes from the tensors instead.
            shape_args.append(position)
            continue
        played = roles.get(param, [])
        if sorted(played) == ["lhs", "residual"] and getattr(spec, "residual_is_lhs", False):
            param_roles.append("lhs")  # x @ W + x: the residual is read from the lhs (gemm/residual_lhs.py)
            continue
        if len(played) > 1 and all(role.endswith(SHARED_SOURCE) for role in played):
            param_roles.append("+".join(played))  # one tensor several boxes are read from (composite.py)
            continue
        if len(played) != 1:
            raise UnsupportedOperator(f"parameter '{param.name}' of '{name}' plays {played} "
                                      "roles; each operand must be its own tensor")
        param_roles.append(played[0])
    source_ops = tuple(call.op.name.replace("relax.", "") for _, call in composite_ops(func))
    spec = dataclasses.replace(spec, param_roles=tuple(param_roles), source_ops=source_ops)
    spec = with_pass_columns(spec, func)  # RoPE's tables' constant columns (kernels/gemm/rope_pass_columns.py)
    if shape_args:
        if "shape_args" not in {f.name for f in dataclasses.fields(spec)}:
            raise UnsupportedOperator(f"'{name}' is passed symbolic sizes beside its tensors (tir_vars); its NPU "
                                      "kernel reads sizes from its tensors only")
        spec = dataclasses.replace(spec, shape_args=tuple(shape_args))
    return spec


def _check_call_order(func) -> None:
    """The kernel's parameters are the composite's; the wrapper must pass its own in order."""
    _, call = composite_call(func)
    if call is not None and list(call.args) != list(func.params):
        raise UnsupportedCopy("the offloaded function reorders its parameters before the composite")


# ------------------------------------------------------------------ user schedules

_USER_SCHEDULES: dict = {}


def register_schedule(name: str, fn=None):
    """Schedule the kernels of `name` with `fn(sch, spec, tiling, arch)` instead of the built-in
    schedule (usable as a decorator). `name`: a pattern ("cgra.conv2d_bias_residual_relu": the
    kernels that pattern fuses, epilogue included) or an op ("conv2d": every kernel of it); a
    pattern's schedule wins over its op's. `fn=None` without decorating restores the built-in.

    `sch` is an `s_tir.Schedule` of the whole fused kernel (one PrimFunc: compute, copies into
    the scratchpad, epilogue), `spec` what it computes (KernelSpec), `tiling` the built-in tile
    search's choice (a schedule may ignore it), `arch` the chip (HardwareDescription). The
    schedule must leave every block tensorized or a scratchpad copy; everything after it (DMA
    pass, code generation, runtime, simulator) is the built-in kernels' path. docs/own-kernels.md."""
    return _register(_USER_SCHEDULES, "register_schedule", name, fn, ("sch", "spec", "tiling", "arch"))


def _register(table: dict, api: str, name: str, fn, params: tuple):
    """Put `fn` in `table` under pattern-or-op `name` once its signature takes `params`;
    `fn=None` removes the entry and returns a decorator."""
    _known_name(name, api)
    wanted = ", ".join(params)

    def register(fn):
        if not callable(fn):
            raise TypeError(f"{api}('{name}', ...) needs a function fn({wanted}), not {type(fn).__name__}")
        try:
            inspect.signature(fn).bind(*[None] * len(params))
        except TypeError:
            raise TypeError(f"the function given to {api}('{name}', ...) must take ({wanted}); "
                            f"{getattr(fn, '__name__', fn)}{inspect.signature(fn)} does not") from None
        except ValueError:  # a builtin without a signature: trust it
            pass
        table[name] = fn
        return fn

    if fn is None:
        table.pop(name, None)
        return register
    return register(fn)


def _known_name(name: str, api: str) -> None:
    ops = {op for family in FAMILIES for op in family.ops}
    patterns = {entry.name for entry in pattern_table()}
    if name not in ops and name not in patterns:
        raise UnsupportedOperator(
            f"{api}: '{name}' is neither a cgra pattern nor an op (patterns: "
            f"{', '.join(sorted(patterns))}; ops: {', '.join(sorted(ops))})")


def schedule_of(spec, pattern: str = ""):
    """The schedule function for `spec`'s kernel (fused by `pattern`): a user's for the pattern,
    else a user's for the op, else its family's."""
    return _USER_SCHEDULES.get(pattern) or _USER_SCHEDULES.get(spec.op) or family_of(spec).schedule


_USER_KERNELS: dict = {}


def register_kernel(name: str, fn=None):
    """Build the kernels of `name` (a pattern or an op, as for register_schedule) with
    `fn(spec, arch)`, which returns a PrimFunc written for the NPU (scratchpad buffers, copies,
    `cgra_*` device calls: docs/own-kernels.md), lowered as written instead of the built-in
    compute and schedule. Its parameters must be the built-in kernel's: the pattern's operands in
    order, then the output, with their shapes and dtypes. `fn=None` without decorating restores
    the built-in."""
    return _register(_USER_KERNELS, "register_kernel", name, fn, ("spec", "arch"))


def kernel_builder_of(spec, pattern: str = ""):
    """The user's kernel builder for `spec`'s kernel (by pattern, then op), or None."""
    return _USER_KERNELS.get(pattern) or _USER_KERNELS.get(spec.op)


def builtin_schedule(sch, spec, tiling, arch) -> None:
    """The built-in schedule of `spec`'s kernel, for a user schedule to call on the parts it
    does not write (or to wrap)."""
    family_of(spec).schedule(sch, spec, tiling, arch)
