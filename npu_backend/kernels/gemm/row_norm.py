"""A pre-norm folded into the linear layer that reads it: the GEMM normalises its own A panel.

Stage: partition (the roots `cgra.<matmul | linear>_<rms_norm | layer_norm>...` and the spec field
they set) and kernel definition, tiling and schedule (the A panel's row program). A pre-norm
transformer (Llama, Qwen: RMSNorm; GPT-2, ViT: layer norm) feeds each norm's output only to linear
layers, the norm's gamma and beta already in their weights and bias (normalise/norm_folds.py) and
each reader given its own copy of the norm (normalise/normed_linears.py). For such a

    matmul(norm(x, 1 [, 0], eps), W)       x float32 (M, K), static rows, W a constant

the kernel takes x itself: per tile of rows, once its A panel (tm x K) is in the scratchpad, the
vector unit runs the plain norm kernel's own program on it (kernels/rows/norms.py):

    RMSNorm     FILL, REDUCE sum of squares, VFUNC r = rsqrt(s / K + eps), ELTWISE x * r
    layer norm  the mean (REDUCE, VFUNC), x - mean (ELTWISE), the mean's rounding corrected
                (REDUCE, VFUNC, ELTWISE), r as above of the centred rows, ELTWISE centred * r

into a panel the GEMMs read: the same commands on the same values, so the result is the two
kernels' but for the GEMM's summation order, without the norm's launch, its store of the normed
rows and the GEMM's load of them. The row scale is applied to the panel, not the output: r (x W)
would be a pass over tm x N a tile, 2-4x the panel's tm x K for q / k / v and gate / up, and the
gated unit's act(r a) (r b) needs it before the activation; the layer norm's mean needs no
colsum(W) correction (the rows are centred before the GEMMs, no cancellation).

A bfloat16 / float16 model's RMSNorm, rounded and times its gamma in h (which no weight can take
exactly), is half_row_norm.py's: the same panel program with the norm kernel's two roundings and
gamma's row, into an h panel (`row_norm` then names h too).

Only where the kernel holds the whole reduction in one step (tk = K, unpadded: a padded column
would be -mean once centred): the row's statistics need
the row whole, so the tile search keeps whole-depth tiles with room for the program's panels
(`panel_bytes`); where none fits the root is refused and the norm runs as its own kernel, and
so it is where that tiling costs the GEMM more than the norm's kernel (few rows, large weights:
row_norm_cost.py).
"""

from __future__ import annotations

import dataclasses

import tvm
from tvm import relax, te, tirx
from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of
from ..common.spec import KernelSpec, Tiling, aligned, round_up
from ..intrinsics import SPAD, get_intrin
from ..intrinsics.row_ops import reduce_start
from ..rows.norms import steps_of
from ..rows.rows import RowSpec, choose_row_tiling, estimate_row_cycles, shapes_of, stage_of, step_cycles
from .half_row_norm import (SCALED, centred_once, half_normed_roots, half_row_roles, lhs_dtype, panel_input_bytes,
                            panel_rows, with_half_row_norm)
from .half_rounded_lhs import ROUND, is_rounded_lhs, round_steps, rounded_lhs_roots, with_rounded_lhs
from .roots import Root

F32 = "float32"
#: The prefix of the panel program's blocks (the GEMM's own are a_pad, b_pad, acc, epi, ...).
PREFIX = "row_"
#: Each norm's constant operands: the plain kernel's values of them.
_CONSTANTS = {"rms_norm": (("norm_weight", 1.0),), "layer_norm": (("norm_weight", 1.0), ("norm_bias", 0.0))}


def normed_roots() -> list[Root]:
    """A matmul and a linear (permute_dims + matmul) whose left operand is a plain norm. Its
    gamma / beta are wildcards: inside the composite they are parameters (roles "norm_weight",
    "norm_bias", which the kernel takes and never reads); at partition they are the constants
    `with_row_norm` checks."""
    roots = []
    for kind in _CONSTANTS:
        for name, permuted in (("matmul", False), ("linear", True)):
            x, rhs, weight, bias = wildcard(), wildcard(), wildcard(), wildcard()
            norm = is_op(f"relax.nn.{kind}")(x, weight, bias) if kind == "layer_norm" else \
                is_op("relax.nn.rms_norm")(x, weight)
            operand = is_op("relax.permute_dims")(rhs) if permuted else rhs
            roles = {"lhs": x, "rhs": rhs, "row_norm": norm, "norm_weight": weight,
                     **({"norm_bias": bias} if kind == "layer_norm" else {}),
                     **({"permute": operand} if permuted else {})}
            roots.append(Root(f"{name}_{kind}", is_op("relax.matmul")(norm, operand), roles))
    # a rounded operand's first: a later root of as many calls is tried first (epilogue.py), and a
    # 16-bit norm's astype(norm(x)) is the norm's root's, not a rounded operand's
    return rounded_lhs_roots() + roots + half_normed_roots()


def with_row_norm(spec: KernelSpec, annotated: dict) -> KernelSpec:
    """`spec` normalising its left operand's rows when the match has a norm; raises
    UnsupportedOperator when the kernel cannot (the norm then runs on its own)."""
    if is_rounded_lhs(annotated):  # float32 rows rounded to a 16-bit float (half_rounded_lhs.py)
        return with_rounded_lhs(spec, annotated)
    norm = annotated.get("row_norm")
    if norm is None:
        return spec
    if SCALED in annotated:  # a bfloat16 / float16 model's norm, rounded (half_row_norm.py)
        return with_half_row_norm(spec, annotated)
    kind = str(norm.op.name).removeprefix("relax.nn.")
    for role, value in _CONSTANTS[kind]:
        operand = annotated[role]
        if not isinstance(operand, (tvm.ir.GenericConst, relax.Var)) or \
                isinstance(operand, tvm.ir.GenericConst) and not (operand.value.numpy() == value).all():
            raise UnsupportedOperator(f"{kind} before a matmul: its {role.removeprefix('norm_')} is not all {value:g} "
                                      "(norm_folds.py folds it into the weights where it can); the norm runs on its own")
    if kind == "layer_norm" and not (bool(norm.attrs.center) and bool(norm.attrs.scale)):
        raise UnsupportedOperator("layer_norm without its center or scale runs on its own")
    # symbolic rows (symbolic_rows.py), and RoPE's tables of as many rows (rope_epilogue.py)
    rows_only = all(role in ("lhs", "out", "cos", "sin") and axis == 0 for role, axis, _ in spec.symbols)
    if spec.op != "matmul" or spec.compute_name != "matmul" or spec.dtype != F32 or not rows_only or spec.batch > 1:
        raise UnsupportedOperator(f"{kind} folded into a matmul: a 2-D float32 GEMM with static columns and "
                                  "reduction only; the norm runs on its own")
    axes = [int(a) for a in norm.attrs.axes]
    if axes not in ([-1], [len(spec.lhs_shape) - 1]) or dtype_of(norm) != F32:
        raise UnsupportedOperator(f"{kind} folded into a matmul normalises the last axis of float32 rows")
    return dataclasses.replace(spec, row_norm=(kind, float(norm.attrs.epsilon)))


def check_row_norm(spec: KernelSpec, tiling: Tiling, arch) -> None:
    """Refuse a tiling that does not hold whole rows of A (the statistics need the row whole), and
    a fold whose panel programs, priced as if none overlapped (the vector unit runs in order, and
    a kernel whose epilogue keeps it busy, a GELU's over 256 rows of 16, hides none of them), cost
    as much as the norm's own kernel: then the norm runs on its own."""
    if spec.row_norm is None:
        return
    kind, depth = spec.row_norm[0], spec.gemm_extents[2]
    # a rounding (half_rounded_lhs.py) needs the panel whole, not the row: padding rounds to 0
    if tiling.tk != tiling.kp or tiling.kp != depth and kind != ROUND or tiling.stream_panel:
        raise UnsupportedOperator(f"{kind} folded into a matmul of depth {depth}: the tiling steps through it "
                                  f"{tiling.tk} at a time, and the panel program needs the row whole; the "
                                  f"{'cast' if kind == ROUND else 'norm'} runs on its own")
    if kind == ROUND:  # one EPILOGUE a panel: always cheaper than a cast kernel's launch and DMA round trip
        return
    program = panel_program_cycles(spec, tiling, arch)
    alone_cycles = norm_alone_cycles(spec, arch)
    if program >= alone_cycles:
        raise UnsupportedOperator(f"{kind} folded into a matmul: its program on the A panels ({program} cycles) "
                                  f"costs as much as the norm's own kernel ({alone_cycles}); the norm runs on its own")


def norm_alone_cycles(spec: KernelSpec, arch) -> int:
    """The estimate of the norm's own kernel (kernels/rows/norms.py) over the GEMM's rows: what
    a fold saves (check_row_norm; row_norm_cost.check_fold_pays)."""
    kind, depth, rows = spec.row_norm[0], spec.gemm_extents[2], spec.gemm_extents[0]
    alone_spec = RowSpec(kind, kind, (rows, depth), (rows, depth), rows, depth, spec.row_norm[1],
                         **half_row_roles(spec))
    plain = steps_of(alone_spec)
    alone = choose_row_tiling(alone_spec, arch, plain)
    return estimate_row_cycles(alone_spec, arch, plain, alone.tm, alone.tn)


def panel_program_cycles(spec: KernelSpec, tiling: Tiling, arch) -> int:
    """The vector unit's cycles of the panel programs of all the row tiles, as if none
    overlapped (check_row_norm; post_norm_cost.py prices a rounded operand's with them); 0
    without a norm."""
    if spec.row_norm is None:
        return 0
    steps = _steps(spec)
    return tiling.mp // tiling.tm * step_cycles(arch, steps, _kinds(spec, steps), tiling.tm, spec.gemm_extents[2])


def _steps(spec: KernelSpec) -> tuple:
    """The panel's row program: the plain norm kernel's (norms.steps_of), its blocks prefixed."""
    kind, eps = spec.row_norm[:2]
    depth = spec.gemm_extents[2]
    if kind == ROUND:  # a float32 panel rounded to h (half_rounded_lhs.py)
        plain = round_steps(spec.row_norm[2])
    else:
        plain = centred_once(spec, steps_of(RowSpec(kind, kind, (depth,), (depth,), 1, depth, eps,
                                                    **half_row_roles(spec))))
    names = {step.name: PREFIX + step.name for step in plain}
    return tuple(dataclasses.replace(step, name=names[step.name], inputs=tuple(names.get(i, i) for i in step.inputs))
                 for step in plain)


def panel_bytes(spec: KernelSpec, tm: int) -> int:
    """Scratchpad bytes of the panel program of a tile of tm rows, 0 without a norm: every
    intermediate step's panel or column once (the vector unit runs them in order: one copy each,
    `single_buffered`); the panel the GEMMs read, the wider rows loaded and the norm's rows twice
    where there are several row tiles (double buffered: the next tile's program and loads run
    while the GEMMs read this one's; until 2026-11 counted once, and a widened float16 layer norm
    of 36 rows of 64 on cgra-4x4, every buffer of its program doubled, needed 78,464 bytes of the
    65,536 the search had fitted)."""
    if spec.row_norm is None:
        return 0
    steps = _steps(spec)
    kinds = _kinds(spec, steps)
    copies = 2 if round_up(spec.gemm_extents[0], tm) > tm else 1
    size = {"full": aligned(tm * spec.gemm_extents[2] * 4), "column": aligned(tm * 4)}
    return sum(size[kinds[step.name]] for step in steps[:-1]) + \
        copies * (size[kinds[steps[-1].name]] + panel_input_bytes(spec, tm))


def single_buffered(spec: KernelSpec) -> list:
    """The panel program's intermediate blocks: one copy each (lower/double_buffer.py), the
    vector unit running a row tile's program after the one before's; [] without a norm."""
    return [step.name for step in _steps(spec)[:-1]] if spec.row_norm is not None else []


def _kinds(spec: KernelSpec, steps) -> dict:
    """rows.shapes_of the panel program: its gamma (a 16-bit model's, half_row_norm.py) a row."""
    return shapes_of(steps, tuple(name for name, _, _ in panel_rows(spec)))


def normed_panel(spec: KernelSpec, a_pad, tiling: Tiling, inputs: dict):
    """The A panel the GEMMs read: `a_pad` itself, or its rows normalised (module doc); the
    norm's constants, parameters the kernel never reads, join `inputs`."""
    if spec.row_norm is None:
        return a_pad
    depth = spec.gemm_extents[2]
    steps = _steps(spec)
    tensors, kinds = {"x": a_pad}, _kinds(spec, steps)
    for name, role, dtype in panel_rows(spec):  # a 16-bit norm's gamma [, beta], read: (1, depth) rows
        inputs[role] = te.placeholder((depth,), dtype, name=role)
        tensors[name] = _row_of(inputs[role], depth, f"{PREFIX}{name}_pad")
    for role, _ in _CONSTANTS[spec.row_norm[0]] if len(spec.row_norm) == 2 else ():
        inputs[role] = te.placeholder((depth,), F32, name=role)
    mp, kp = a_pad.shape
    for step in steps:
        tensors[step.name] = stage_of(step, tensors, kinds, mp, int(kp))
    return tensors[steps[-1].name]


def _row_of(vector, depth: int, name: str):
    """A (depth,) operand as the (1, depth) row its ELTWISE broadcasts along the panel's rows."""
    return te.compute((1, depth), lambda z, j: vector[j], name=name)


def place_row_norm(sch, spec: KernelSpec, at) -> None:
    """The panel program under the loop `at`, where the A panel is loaded (before the panel's own
    compute_at, which needs its readers there)."""
    if spec.row_norm is None:
        return
    names = [f"{PREFIX}{name}_pad" for name, _, _ in panel_rows(spec)] + [step.name for step in _steps(spec)]
    for name in reversed(names):
        block = sch.get_sblock(name)
        sch.compute_at(block, at)
        sch.set_scope(block, 0, SPAD)


def tensorize_row_norm(sch, spec: KernelSpec, tiling: Tiling, align) -> None:
    """Each step of the panel program tensorized onto its command (as rows.schedule_rows does);
    `align(block)` pads the rows of the panel the GEMMs read as the GEMM schedule pads A's (after
    tensorize, which blockizes the block into "<name>_o" and would drop an annotation made before)."""
    if spec.row_norm is None:
        return
    steps = _steps(spec)
    kinds, tm, kp = _kinds(spec, steps), tiling.tm, tiling.kp
    for step in steps:
        block = sch.get_sblock(step.name)
        if step.kind == "reduce":
            tensorize_row_reduce(sch, block, step.func, tm, kp)
            continue
        width = kp if kinds[step.name] == "full" else 1
        if width == 1:
            sch.add_unit_loop(block)
        row = sch.get_loops(block)[-2]
        if step.kind == "vfunc":
            sch.tensorize(row, get_intrin("vfunc", tm, width, step.func, scale=step.scale, offset=step.offset))
            continue
        if step.kind == "cast":  # x_h widened, or the float32 norm rounded to h (an EPILOGUE)
            source = lhs_dtype(spec) if step.inputs[0] == "x" else F32
            sch.tensorize(row, get_intrin("epilogue", tm, width, source, bias=False, relu=False, residual=False,
                                          clip=None, zero_point=None, out_dtype=step.dtype))
            continue
        full = {"full": (True, True), "column": (True, False), "row": (False, True)}
        a_full, b_full = (full[kinds[i]] for i in step.inputs)
        sch.tensorize(row, get_intrin("eltwise", tm, width, step.func, step.dtype, a_full=a_full, b_full=b_full))
    align(sch.get_sblock(steps[-1].name + "_o"))


def tensorize_row_reduce(sch, block, func: str, tm: int, width: int) -> None:
    """A (tm, width) tile's row reduction `block` (innermost loops: rows, columns) as the FILL of
    its (tm, 1) result and the REDUCE (this module's panel program and post_norm.py's tile program)."""
    init = sch.decompose_reduction(block, sch.get_loops(block)[-2])
    sch.add_unit_loop(init)
    sch.tensorize(sch.get_loops(init)[-2], get_intrin("fill", tm, 1, F32, value=tirx.const(reduce_start(func), F32)))
    sch.add_unit_loop(sch.get_loops(block)[-1])
    sch.tensorize(sch.get_loops(block)[-3], get_intrin("reduce", tm, width, func))
