"""A post-norm in the epilogue of the GEMM that produces its input: LayerNorm(x + proj(h)) as one kernel.

Stage: partition (the patterns `cgra.<matmul | linear>_post_norm[_plain]` and the spec field they
set), tiling (whole rows a tile; the fold's price: post_norm_cost.py), kernel definition (the epilogue's TE
blocks) and schedule (their commands). A post-norm encoder (BERT, RoBERTa, ALBERT, DistilBERT)
ends its attention and its MLP with

    layer_norm(reshape(h W^T + b) + x [* g], gamma, beta)

(the multiply by g: the previous norm's gamma, normalise/norm_folds.py's residual form), whose
sum the GEMM's EPILOGUE already computes on each output tile. Here the tile holds whole rows
(tn = N, one column tile), so the row's mean and variance are the tile's: after the plain
EPILOGUE (acc + bias + residual, block `post_summed`) the vector unit runs, per tile or per
piece of rows, [ELTWISE * g, + shift as (1, N) rows], then the layer norm kernel's own program
(kernels/rows/norms.py: REDUCE sum, VFUNC / N, ELTWISE x - mean, the mean's rounding corrected,
REDUCE sum of squares, VFUNC rsqrt(ss / N + eps), ELTWISE multiply, [* gamma, + beta as rows]),
its last command the tile's `epi`. `_plain` (gamma all ones, beta all zeros: the norms
norm_folds.py folded into the linears after them) stops at the multiply.

A centred stream's final norm (normalise/centred_streams.py: GPT-J's and GPT-NeoX's ln_f after
their last MLP), add(rms_norm(sum, gamma), beta), matches `..._post_norm_rms_beta` (without beta
`..._post_norm_rms`): the RMSNorm kernel's program (REDUCE sum of squares, VFUNC rsqrt, ELTWISE
multiply, * gamma) and the add kernel's ELTWISE + beta, so neither keeps a kernel (GPT-J at 32
tokens on cgra-8x8: 8,894 + 1,301 + 900 cycles -> 10,006).

Error: the same commands on the same values as the GEMM kernel followed by the norm kernel, so
the same bits but for the GEMM's summation order (its depth steps may differ): the norm
kernel's bound (3e-6 of the output's scale at a row mean of 50 standard deviations) plus the
GEMM's accumulation error carried through 1 / std (tests/test_post_norms.py: within 1e-5 of
float64 relative to the output's largest value, also at a mean of 20 standard deviations and
eps 1e-12 .. 0.1; within 2e-6 of the two kernels apart).

Saved: the norm's launch, the GEMM's store of the sum and the norm's load of it; paid: the
program on the vector unit after each tile's (or piece's) EPILOGUE, hidden only behind the next
tile's or piece's GEMMs. So the tiles are finished in pieces of the PE array's rows
(gemm_pieces.py; pieces complete as the last depth step's GEMMs do), or, with the whole
reduction in one step, are row tiles that all read one B, which the kernel loads once and holds
(`holds_b`): tile i's norm runs while tile i + 1's GEMM does (post_norm_cost.py prices that
pipeline). At 32 x 64 x 64 (BERT's out-projection plus its residual and folded gamma) on
cgra-8x8: 4,510 cycles against 3,061 + 2,125 apart.

The GEMM's rows may be symbolic (a prefill's length; post_norm_rows.py: which specs, which tiling).
A patch embedding's norm after its patch conv, without a residual, is patch_norm.py's (its checks;
this program). Refused (the norm keeps its own kernel; explain gives the reason, tools/post_norm_reasons.py):
N not a whole number of the PE array's columns (a padded column would join the row's variance),
a row too wide for a tile of the array's rows with the program's intermediates, and a fold whose
estimate is no cheaper than the GEMM's best tiling and the norm kernel apart (post_norm_cost.check_post_norm).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import tvm
from tvm import te
from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of, shape_dims, static_shape
from ..intrinsics import SPAD, get_intrin
from ..rows.norms import steps_of
from .half_post_norm import cast_intrin, half_post_norm_graphs, half_program, program_kinds, residual_tile, role_dtype
from .patch_norm import patch_norm_graphs, with_patch_norm
from .post_norm_rows import rows_only
from .gemm_estimate import gemm_footprint
from .row_norm import tensorize_row_reduce
from ..rows.rows import RowSpec, Step, stage_of, step_cycles

F32 = "float32"
#: The pattern-name suffix: "cgra.linear_post_norm", "cgra.linear_post_norm_plain".
SUFFIX = "_post_norm"
#: The block of the EPILOGUE's sum the program reads; the prefix of the program's blocks.
SUMMED, PREFIX = "post_summed", "post_"
#: The norm's constant operands: roles, and the value each has in a plain norm.
ROLES = (("norm_gamma", 1.0), ("norm_beta", 0.0))
#: The pattern-name ends of an RMSNorm's post-norm, with beta added after it and without.
RMS_BETA, RMS = "_rms_beta", "_rms"
#: The roots a post-norm follows: a 2-D matmul or a linear.
_ROOTS = ("matmul", "linear")


def post_norm_graphs(roots) -> list[tuple]:
    """(name, pattern, annotations, root name) of layer_norm(root [+ bias] [reshape] + residual
    [* ch_scale [+ ch_shift]]): the plain form (its name vouching for gamma 1 and beta 0) first."""
    graphs = []
    for root in sorted(roots, key=lambda root: -len(root.roles)):  # a linear before a bare matmul
        if root.name not in _ROOTS:
            continue
        for plain in ("_plain", ""):
            bias, residual, ch_scale, ch_shift, gamma, beta = (wildcard() for _ in range(6))
            with_bias = is_op("relax.add")(root.pattern, bias)
            reshape = is_op("relax.reshape")(with_bias | root.pattern, wildcard())
            summed = functools.reduce(lambda a, b: a | b, [
                is_op("relax.add")(*pair) for inner in (reshape, with_bias, root.pattern)
                for pair in ((residual, inner), (inner, residual))])
            scaled = is_op("relax.multiply")(summed, ch_scale)
            shifted = is_op("relax.add")(scaled, ch_shift) | scaled | summed
            norm = is_op("relax.nn.layer_norm")(shifted, gamma, beta)
            annotations = {"root": root.pattern, **root.roles, "bias": bias, "residual": residual, "reshape": reshape,
                           "ch_scale": ch_scale, "ch_shift": ch_shift, "post_norm": norm, "norm_gamma": gamma,
                           "norm_beta": beta}
            graphs.append((f"cgra.{root.name}{SUFFIX}{plain}", norm, annotations, root.name))
            if plain:
                continue
            # An RMSNorm [+ beta] (a centred stream's layer norm: normalise/centred_streams.py):
            # beta's add first, so that it joins the norm rather than run on its own.
            rms = is_op("relax.nn.rms_norm")(shifted, gamma)
            with_beta = is_op("relax.add")(rms, beta) | is_op("relax.add")(beta, rms)
            for top, suffix in ((with_beta, RMS_BETA), (rms, RMS)):
                roles = {**annotations, "post_norm": rms, **({"post_beta": top} if top is with_beta else {})}
                if top is rms:
                    del roles["norm_beta"]
                graphs.append((f"cgra.{root.name}{SUFFIX}{suffix}", top, roles, root.name))
    return graphs + patch_norm_graphs(roots) + half_post_norm_graphs(roots)  # (patch_norm.py, half_post_norm.py)


def is_post_norm_pattern(name: str) -> bool:
    return SUFFIX in name


def with_post_norm(spec, annotated: dict, name: str, tail):
    """`spec` with the sum's epilogue (`tail`: epilogue.with_epilogue_tail, read as the chain the
    plain or the tail patterns take) and the layer norm after it; refuses what the kernel does
    not compute (the norm then runs on its own)."""
    if spec.op == "conv2d":  # a patch embedding's norm (patch_norm.py)
        return with_patch_norm(spec, annotated)
    norm = annotated["post_norm"]
    inner = {role: expr for role, expr in annotated.items()
             if role not in ("post_norm", "post_beta", "norm_gamma", "norm_beta")}
    root = name.removeprefix("cgra.").split(SUFFIX)[0]
    tail_like = any(role in inner for role in ("reshape", "ch_scale", "ch_shift"))
    spec = tail(spec, inner, f"cgra.{root}_epilogue" if tail_like else f"cgra.{root}_residual")
    what = f"layer_norm after the {spec.op}'s residual add"
    if spec.op != "matmul" or spec.compute_name != "matmul" or spec.batch > 1 or not rows_only(spec) or \
            spec.dtype != F32 or spec.acc_dtype != F32 or spec.half_out or spec.act or spec.fabric_body or \
            spec.multiplier_shape or spec.requant_zero_point is not None or spec.row_norm:
        raise UnsupportedOperator(f"{what}: fused after a float32 2-D matmul with static columns and a plain "
                                  "epilogue; the norm runs on its own")
    n = spec.gemm_extents[1]
    dims = tuple(shape_dims(norm) or ())
    axes = [int(a) % max(len(dims), 1) for a in norm.attrs.axes]
    kind = "rms_norm_beta" if name.endswith(RMS_BETA) else "rms_norm" if name.endswith(RMS) else "layer_norm"
    if dtype_of(norm) != F32 or axes != [len(dims) - 1] or not dims or dims[-1] != n or \
            (kind == "layer_norm" and not (bool(norm.attrs.center) and bool(norm.attrs.scale))):
        raise UnsupportedOperator(f"{what}: the epilogue normalises the last axis of float32 rows, centred and "
                                  "scaled; the norm runs on its own")
    if kind == "rms_norm_beta" and str(shape_dims(annotated["post_beta"])) != str(list(dims)):
        raise UnsupportedOperator(f"{what}: beta's add broadcasts the norm's rows; the add runs on its own")
    plain = name.endswith("_plain")
    if _is_ones_call(annotated.get("norm_gamma")):
        raise UnsupportedOperator(f"{what}: its weight is R.ones, a 16-bit model's RMSNorm whose weight multiplies "
                                  "after the cast (the half norm kernel takes norm, cast and weight as one)")
    for role, value in ROLES:
        if role not in annotated:  # an RMSNorm without beta
            continue
        operand = annotated[role]
        if tuple(static_shape(operand) or ()) != (n,) or dtype_of(operand) != F32:
            raise UnsupportedOperator(f"{what}: its {role.removeprefix('norm_')} is not {n} float32 values")
        if plain and isinstance(operand, tvm.ir.GenericConst) and not np.all(operand.value.numpy() == value):
            raise UnsupportedOperator(f"{what}: its {role.removeprefix('norm_')} is not all {value:g} (the plain "
                                      "form applies none)")
    if not plain and kind == "layer_norm" and all(isinstance(annotated[r], tvm.ir.GenericConst) and
                                                  np.all(annotated[r].value.numpy() == v) for r, v in ROLES):
        raise UnsupportedOperator(f"{what}: gamma ones and beta zeros, the plain pattern's (priced against the "
                                  "plain norm kernel, check_post_norm); the norm runs on its own")
    return dataclasses.replace(spec, post_norm=(float(norm.attrs.epsilon), not plain, kind))


def _is_ones_call(expr) -> bool:
    """Whether `expr` is R.ones(...): normalise/half_casts.py's mark of HF's bfloat16 / float16 RMSNorm,
    whose float32 norm has no weight (a call the partition would leave on the host as the operand)."""
    op = getattr(expr, "op", None)
    return isinstance(op, tvm.ir.Op) and op.name == "relax.ones"


# ------------------------------------------------------------------ the program

def _steps(spec) -> tuple:
    """The program over the EPILOGUE's sum (input "x"): the per-channel scale and shift, if any
    (ELTWISEs by rows: the sum's EPILOGUE is then the plain one, a command fewer than the
    EPILOGUE's own channel scale takes), then the norm kernel's program (norms.steps_of), its
    blocks prefixed, the last one `epi`."""
    eps, affine, kind = spec.post_norm
    n = spec.gemm_extents[1]
    before, x = [], "x"
    for role, func, present in (("ch_scale", "multiply", spec.channel_scale_shape),
                                ("ch_shift", "add", spec.channel_shift_shape)):
        if present:
            before.append(Step(f"{PREFIX}{role}d", "eltwise", func, (x, role)))
            x = before[-1].name
    plain = _norm_steps(kind, n, eps, affine)
    names = {step.name: PREFIX + step.name for step in plain}
    names[plain[-1].name] = "epi"
    names["x"] = x
    steps = tuple(before) + tuple(dataclasses.replace(step, name=names[step.name],
                                                      inputs=tuple(names.get(i, i) for i in step.inputs)) for step in plain)
    return half_program(steps, spec)  # a 16-bit GEMM's: rounded as PyTorch does (half_post_norm.py)


def _norm_steps(kind: str, n: int, eps: float, affine: bool) -> tuple:
    """The norm kernel's program (norms.steps_of); an RMSNorm's beta as one ELTWISE add after
    it, the add kernel's (centred_streams.py writes a layer norm so)."""
    if kind == "layer_norm":
        return steps_of(RowSpec("layer_norm", "layer_norm", (n,), (n,), 1, n, eps, ("gamma", "beta") if affine else ()))
    steps = steps_of(RowSpec("rms_norm", "rms_norm", (n,), (n,), 1, n, eps, ("weight",)))
    return steps + ((Step("beta_added", "eltwise", "add", (steps[-1].name, "beta")),) if kind == "rms_norm_beta" else ())


def _rows(spec) -> dict:
    """{row input of the program: the operand's role} (a (1, N) row read from a parameter)."""
    rows = {role: role for role, present in (("ch_scale", spec.channel_scale_shape),
                                             ("ch_shift", spec.channel_shift_shape)) if present}
    kind = spec.post_norm[2]
    if kind != "layer_norm":  # an RMSNorm's weight, and beta after it
        return {**rows, "weight": "norm_gamma", **({"beta": "norm_beta"} if kind == "rms_norm_beta" else {})}
    return {**rows, **({"gamma": "norm_gamma", "beta": "norm_beta"} if spec.post_norm[1] else {})}


def summed_spec(spec):
    """The spec whose EPILOGUE computes the sum the program reads: no channel scale or shift
    (the program's ELTWISEs), no norm."""
    return dataclasses.replace(spec, channel_scale_shape=None, channel_shift_shape=None, post_norm=None,
                               residual_shape=None if spec.half_out else spec.residual_shape)  # (added in h after)


def _blocks(spec) -> list:
    """The blocks staged under the output tile loop besides the GEMM's own, producers first."""
    return [SUMMED, *(f"{PREFIX}{row}_row" for row in _rows(spec)), *(step.name for step in _steps(spec)[:-1])]


def single_buffered(spec) -> list:
    """The program's intermediates: one copy each (the vector unit runs them in order)."""
    return [SUMMED] + [step.name for step in _steps(spec)[:-1]]


def post_norm_epilogue(spec, summed, tiling, operands: dict):
    """The norm of the padded (mp, np) sum `summed` (block post_summed), ending in block `epi`;
    gamma and beta, (N,) parameters (read as rows when the norm applies them), join `operands`."""
    n = spec.gemm_extents[1]
    for role, _ in ROLES:  # (an RMSNorm without beta has no norm_beta parameter: its placeholder goes unused)
        operands[role] = te.placeholder((n,), role_dtype(spec, role), name=role)
    tensors = {"x": summed, **residual_tile(spec, summed, operands)}
    for row, role in _rows(spec).items():
        tensors[row] = _row_load(operands[role], tiling.np, f"{PREFIX}{row}_row")
    steps = _steps(spec)
    kinds = program_kinds(steps, tuple(_rows(spec)))
    for step in steps:
        tensors[step.name] = stage_of(step, tensors, kinds, summed.shape[0], tiling.np)
    return tensors["epi"]


def _row_load(vector, width: int, name: str):
    """A parameter of N values (shape (N,) or (1, .., N)) as the (1, N) row its ELTWISE
    broadcasts along the rows."""
    lead = (0,) * (len(vector.shape) - 1)
    return te.compute((1, width), lambda z, j: vector[lead + (j,)], name=name)


def stage_post_norm(sch, spec, tile_loop) -> None:
    """The sum, the rows and the program under the output tile loop, in the scratchpad (readers
    first: compute_at needs them there)."""
    for name in reversed(_blocks(spec)):
        block = sch.get_sblock(name)
        sch.compute_at(block, tile_loop)
        sch.set_scope(block, 0, SPAD)


_FULL = {"full": (True, True), "column": (True, False), "row": (False, True)}


def tensorize_post_norm(sch, spec, rows: int, piece_loop, epilogue) -> None:
    """The sum's EPILOGUE (`epilogue`: its intrinsic) and each step but the last (the tile's
    `epi`, tensorized as the epilogue: post_norm_intrin) on its command, over `rows` rows: the
    tile's, or with `piece_loop` (a tile finished in pieces of rows) under it, a piece's, so that
    a piece's norm runs while the PE array computes the next piece's rows."""
    if piece_loop is not None:
        for name in reversed(_blocks(spec)):
            sch.compute_at(sch.get_sblock(name), piece_loop)
    sch.tensorize(sch.get_loops(sch.get_sblock(SUMMED))[-2], epilogue)
    steps = _steps(spec)
    kinds, tm, width = program_kinds(steps, tuple(_rows(spec))), rows, spec.gemm_extents[1]
    for step in steps[:-1]:
        block = sch.get_sblock(step.name)
        if step.kind == "reduce":
            tensorize_row_reduce(sch, block, step.func, tm, width)
            continue
        if kinds[step.name] != "full":
            sch.add_unit_loop(block)
        sch.tensorize(sch.get_loops(block)[-2], _intrin(step, kinds, tm, width))


def _intrin(step, kinds: dict, rows: int, width: int) -> str:
    """A VFUNC or ELTWISE step's intrinsic over `rows` rows of the tile."""
    width = width if kinds[step.name] == "full" else 1
    if step.kind == "cast":  # (the 16-bit form's, half_post_norm.py)
        return cast_intrin(step, rows, width)
    if step.kind == "vfunc":
        return get_intrin("vfunc", rows, width, step.func, scale=step.scale, offset=step.offset)
    a_full, b_full = (_FULL[kinds[i]] for i in step.inputs)
    return get_intrin("eltwise", rows, width, step.func, step.dtype, a_full=a_full, b_full=b_full)


def post_norm_intrin(spec, tiling, rows: int) -> str:
    """The intrinsic of the tile's `epi`: the program's last ELTWISE."""
    steps = _steps(spec)
    return _intrin(steps[-1], program_kinds(steps, tuple(_rows(spec))), rows, tiling.np)


# ------------------------------------------------------------------ tiling (the price: post_norm_cost.py)

def post_norm_col_step(spec) -> int:
    """A column tile holds whole rows: the output's N columns (1 without a post-norm)."""
    return spec.gemm_extents[1] if spec.post_norm else 1


def post_norm_pieces(spec, arch) -> bool:
    """Whether the tile search may finish a post-norm's tiles in pieces of the PE array's rows
    (gemm_pieces.py), the norm run a piece at a time while the array computes the next piece's
    rows: a tile of more rows than one fold (a per-channel scale, which keeps other kernels
    whole, included: the norm's work is what the pieces hide)."""
    whole_rows = not spec.patch_channels or spec.row_step % arch.rows == 0  # (a patch conv's tiles: output rows)
    # (symbolic rows: lower/ragged.py cuts the last tile's commands, not pieces of it)
    return bool(spec.post_norm) and spec.gemm_extents[0] > arch.rows and whole_rows and not spec.symbols


def post_norm_tiles(spec) -> tuple:
    """(held, loaded) output-sized tiles the program adds, each as the tile search counts one
    (two copies: a tile finished in pieces has a copy of each per piece, lower/hoist_allocs.py,
    double-buffered per tile): the sum and every whole-tile step but the last (the output's),
    their columns and rows within one more."""
    if not spec.post_norm:
        return (0, 0)
    steps = _steps(spec)
    kinds = program_kinds(steps, tuple(_rows(spec)))
    return (2 + sum(kinds[step.name] == "full" for step in steps[:-1]), 0)


def post_norm_tile_cycles(spec, arch):
    """cycles(elements) -> (PE array, vector unit) cycles of the program on an output tile of
    elements / N whole rows (rows.step_cycles, as the norm kernel prices it)."""
    steps = _steps(spec)
    kinds, n = program_kinds(steps, tuple(_rows(spec))), spec.gemm_extents[1]
    return lambda elements: (0, step_cycles(arch, steps, kinds, max(elements // n, 1), n))


def post_norm_footprint(spec, tm: int, depth: int) -> int:
    """gemm_footprint of a tile of tm whole rows, `depth` deep, with the program's tiles."""
    return gemm_footprint(tm, spec.gemm_extents[1], depth, 4, 4, True, True, extra_tiles=post_norm_tiles(spec)[0])


def require_whole_rows(spec, arch) -> None:
    """Refuse a post-norm whose rows the tiles cannot hold whole: N not whole PE-array columns,
    or one PE-array fold of rows of N columns (and the program's tiles) too big for the
    scratchpad."""
    if not spec.post_norm:
        return
    m, n, depth = spec.gemm_extents
    if n % arch.cols:
        raise UnsupportedOperator(f"layer_norm after the {spec.op}: its {n} columns pad to whole columns of the "
                                  f"{arch.rows}x{arch.cols} PE array, and a padded column would join the row's "
                                  "variance; the norm runs as its own kernel")
    if post_norm_footprint(spec, arch.rows, min(depth, 8)) > arch.spad_bytes:
        raise UnsupportedOperator(f"layer_norm after the {spec.op}: a tile of whole rows of {n} columns, with the "
                                  f"norm's intermediates, does not fit the {arch.spad_bytes}-byte scratchpad of "
                                  f"'{arch.name}'; the norm runs as its own kernel")


def holds_b(spec, tiling) -> bool:
    """Whether the kernel loads B once and holds it for every row tile: a post-norm's tiles are
    whole rows, so with the whole reduction in one step every row tile reads the same B (the
    schedule leaves B's copy outside the tile loops). The norm of one row tile then runs while
    the PE array computes the next, whose B is already there."""
    if spec.patch_channels:  # (a patch conv reduces over kh kernel rows too: its B is loaded per step)
        return False
    return bool(spec.post_norm) and tiling.tk == tiling.kp and tiling.tn == tiling.np and tiling.mp > tiling.tm
