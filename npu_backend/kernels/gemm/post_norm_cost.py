"""The price of a post-norm fold (post_norm.py): its tiling's estimate, and whether it pays.

Stage: tiling. In: a GEMM spec with a post-norm (post_norm.py's with_post_norm set `post_norm`),
the tile search's tiling, the chip. Out: `post_norm_tiling`, that tiling or one of whole-depth
row tiles holding B (post_norm.holds_b) when estimated faster; `post_norm_cycles`, the estimate
of the fused kernel (or of its GEMM alone); `check_post_norm`, which refuses a fold no cheaper
than the GEMM's best tiling and the norm kernel apart, so that the norm keeps its own kernel
(explain reports the refusal: tools/post_norm_reasons.py), and for a float32 operand rounded to h
the cheapest of its three ways (rounded_lhs_cost.py prices the two without the panel's fold).

Each unit's work is the simulator's cost model (cgra_sim.cost): the GEMM's loop as
gemm_estimate.estimate_cycles prices it, the program on the vector unit after each tile's or
piece's EPILOGUE as the norm kernel prices it (post_norm.post_norm_tile_cycles, rows.step_cycles).
"""

from __future__ import annotations

import dataclasses

from cgra_sim import cost
from cgra_sim.isa import DType

from ...errors import CGRAError, UnsupportedOperator
from ..common.spec import Tiling
from ..rows.norms import steps_of
from ..rows.rows import RowSpec, choose_row_tiling, estimate_row_cycles, shapes_of, step_cycles
from .gemm_estimate import estimate_cycles, may_hold_a_panel
from .post_norm import F32, holds_b, post_norm_footprint, post_norm_tile_cycles
from .post_norm_rows import regret_tiling
from .post_norm_tail import tail_steps
from .half_rounded_lhs import ROUND
from .row_norm import panel_program_cycles
from .rounded_lhs_cost import cast_cycles, rounded_gemm_cycles


def post_norm_tiling(spec, tiling, arch) -> Tiling:
    """The tile search's choice `tiling` (its estimate: the GEMM's, with the program on every
    tile), or a tiling of whole-depth row tiles holding B (`holds_b`, priced by
    `_held_b_cycles`) when one that fits is estimated faster."""
    if not spec.post_norm or spec.patch_channels:  # (a patch conv's tiles are whole output rows)
        return tiling
    held = [Tiling(tm, tiling.np, tiling.kp, tiling.mp, tiling.np, tiling.kp, operand_copies=2)
            for tm in range(arch.rows, tiling.mp, arch.rows)
            if not tiling.mp % tm and post_norm_footprint(spec, tm, tiling.kp) <= arch.spad_bytes]
    if spec.symbols:  # symbolic rows: the closest to the fastest at every length (post_norm_rows.py)
        return regret_tiling([tiling] + held, tiling.mp, arch.rows, lambda t: post_norm_cycles(spec, t, arch))
    return min([tiling] + held, key=lambda t: post_norm_cycles(spec, t, arch))


def post_norm_cycles(spec, tiling, arch) -> int:
    """The estimate of a post-norm kernel with `tiling` (or of its GEMM alone, without the
    norm: spec.post_norm None). A rounded operand's panel (half_rounded_lhs.py): in the row
    tiles' pipeline where they hold B (`_held_b_cycles`), else its program added."""
    if holds_b(spec, tiling):
        return _held_b_cycles(spec, tiling, arch)
    if not spec.post_norm and spec.row_norm and spec.row_norm[0] == ROUND:  # (the kernels apart's GEMM)
        return rounded_gemm_cycles(spec, tiling, arch)
    return _fold_cycles(spec, tiling, arch) + (tiling.mp // tiling.tm * _rounding_cycles(spec, tiling, arch)
                                              if spec.post_norm else 0)


def _rounding_cycles(spec, t, arch) -> int:
    """A row tile's EPILOGUE rounding its float32 A panel to h (half_rounded_lhs.py), on the
    vector unit; 0 for any other kernel. A post-norm's program runs in order with it, so the
    next tile's GEMMs wait for this tile's norm (before counted, the fold was estimated 2,014
    and ran 2,692: dearer than the kernels apart on cgra-4x4, 8x8 and 16x16). A GEMM without a
    post-norm is priced by rounded_lhs_cost.rounded_gemm_cycles."""
    if not spec.row_norm or spec.row_norm[0] != ROUND:
        return 0
    return panel_program_cycles(spec, t, arch) // (t.mp // t.tm)


def _fold_cycles(spec, tiling, arch) -> int:
    """post_norm_cycles of a tiling that does not hold B, without a rounded panel's program."""
    tail = post_norm_tile_cycles(spec, arch) if spec.post_norm else None
    in_bytes, res_bytes, _, summed_residual = _sizes(spec)
    return estimate_cycles(tiling, spec.dtype, in_bytes, res_bytes, arch, summed_residual, init_folded=True,
                           extra_tiles=bool(spec.residual_shape) and not summed_residual, tail_cycles=tail,
                           a_panel=may_hold_a_panel(spec), piece_rows=tiling.epilogue_rows,
                           piece_major=_piece_major(spec, tiling, arch))


def _piece_major(spec, tiling, arch) -> int:
    """The last steps a tile in pieces runs piece by piece (post_norm_tail.tail_steps), as the
    estimate counts them: a float32 GEMM's (Bloom's 32 x 64 x 256 on cgra-8x8: 10,934 -> 10,352
    cycles run). A 16-bit GEMM's tail gained nothing measured (Llama bf16's final norm on
    cgra-8x8, 32 x 128 x 64, L = 3: 4,118 cycles with and without; ViT bf16's on cgra-4x4: 9,730
    both): priced in, the estimate was 7% under and kept folds that lose."""
    return tail_steps(spec, tiling, arch) if spec.dtype == F32 else 0


def _sizes(spec) -> tuple:
    """(bytes of an A or B element, of the residual's, of the output's, whether the EPILOGUE
    streams the residual): 4, 4, 4 for a float32 GEMM. The 16-bit form (half_post_norm.py) reads
    h operands; with half_out its residual is in h, added by the program (an ELTWISE in h) after
    the EPILOGUE rounded the sum, and the output h; the RMS form's EPILOGUE adds a float32
    residual and its output is h."""
    residual = bool(spec.residual_shape)
    if spec.dtype == F32:
        return 4, 4, 4, residual
    half = DType.from_name(spec.dtype).itemsize
    if spec.half_out:
        return half, half, half, False
    return half, 4, half if spec.post_norm else 4, residual


def _held_b_cycles(spec, t, arch) -> int:
    """Row tiles holding B (holds_b), as a pipeline: B and the first A tile loaded (the PE
    array's configuration loading meanwhile), then per row tile its GEMM (after its A), its
    EPILOGUE and program on the vector unit (after its GEMM, its residual and the tile
    before's), its store (after both); the load engine a tile ahead, the residual after A (the
    GEMM does not wait for it: 16x16 BERT bf16 2,722 cycles estimated without that, 2,534 run)."""
    elements = t.tm * t.np
    in_bytes, res_bytes, out_bytes, summed_residual = _sizes(spec)
    rounding = _rounding_cycles(spec, t, arch)  # in order with the tile before's program
    a_bytes = DType.from_name(spec.row_norm[3]).itemsize if rounding else in_bytes  # (a float32 panel)
    gemm = cost.gemm_steady_cycles(arch, t.tm, t.np, t.kp, spec.dtype) + cost.gemm_fill_cycles(arch, t.tm, t.np)
    vector = cost.vector_stream_cycles(arch, (1 + summed_residual) * elements) + \
        post_norm_tile_cycles(spec, arch)(elements)[1]
    a_load = cost.dma_transfer_cycles(arch, a_bytes * t.tm * t.kp)
    residual = cost.dma_transfer_cycles(arch, res_bytes * bool(spec.residual_shape) * elements)
    store = cost.dma_transfer_cycles(arch, out_bytes * elements)
    first = in_bytes * t.kp * (t.np + t.tm)
    loaded = cost.dma_cycles(arch, in_bytes * t.kp * t.np) + a_load
    array = loaded + max(0, cost.pe_array_config_cycles(arch, spec.dtype) - arch.dma_latency -
                         cost.dma_transfer_cycles(arch, first))
    done = stored = 0
    for _ in range(t.mp // t.tm):
        array = max(array, max(loaded, done) + rounding if rounding else loaded) + gemm
        done = max(done, array, loaded + residual) + vector
        stored = max(stored, done) + store
        loaded += residual + a_load + store
    return stored + arch.dma_latency


#: How much dearer than the kernels apart a 16-bit fold may be estimated and still be taken: the
#: estimates' error (tests/test_post_norm_estimates.py: 8%). ViT bf16's final norm on cgra-8x8 is
#: estimated 6% dearer fused (4,608 against 4,348 at 17 x 128 x 64 alone) but runs 467 cycles
#: cheaper in the model (3,700 against 2,109 + 2,058); refused, the model ran 45,775 -> 46,242.
#: On cgra-16x16 (12% dearer estimated) it is refused: 2,470 -> 1,062 + 1,272, ViT 27,974 -> 27,838.
HALF_MARGIN = 0.08


def check_post_norm(spec, tiling, arch, choose_gemm_tiling) -> None:
    """Refuse a fold whose estimate is no cheaper than the kernels it replaces, each at its best
    tiling (`apart_cycles`; a 16-bit fold dearer by more than HALF_MARGIN): then the norm runs
    on its own. A 16-bit RMS form whose float32 operand is rounded to h: the fold rounding it on
    the A panel weighed against the cheaper of the GEMM rounding its panel + the norm kernel and
    a cast kernel + the plain fold; that plain fold (lhs_cast_from) refused unless cheaper than
    the former (`check_cast_before_fold`). `choose_gemm_tiling`: gemm.py's. A patch conv's norm
    is not priced (patch_norm.py: measured cheaper fused)."""
    if not spec.post_norm or spec.patch_channels:
        return
    alone = apart_cycles(spec, arch, choose_gemm_tiling)
    fused = post_norm_cycles(spec, tiling, arch)
    if spec.lhs_cast_from:  # after a cast kernel (half_post_norm.py's RMS form)
        check_cast_before_fold(spec, fused, arch, choose_gemm_tiling)
    elif spec.row_norm and spec.row_norm[0] == ROUND:  # or that cast kernel and the plain fold
        alone = min(alone, _cast_and_fold_cycles(spec, arch, choose_gemm_tiling))
    if fused < alone or (spec.dtype != F32 and fused < (1 + HALF_MARGIN) * alone):
        return
    if spec.dtype == F32:
        raise UnsupportedOperator(f"layer_norm after the {spec.op}: in its epilogue ({fused} cycles estimated) it "
                                  f"costs as much as the GEMM and the norm's own kernel ({alone}); the norm runs on "
                                  "its own")
    apart = "the GEMM rounding its sum, the add and the norm" if spec.half_out else "the GEMM and the norm"
    raise UnsupportedOperator(f"a {spec.dtype} {spec.post_norm[2]} after the {spec.op}: in its epilogue ({fused} "
                              f"cycles estimated) it costs as much as {apart} as their own kernels ({alone}); "
                              "they run apart")


def check_cast_before_fold(spec, fused: int, arch, choose_gemm_tiling) -> None:
    """Refuse the fold of `spec` after a cast kernel rounding its float32 operand (lhs_cast_from)
    unless the two are estimated cheaper than the GEMM rounding that operand on its A panel
    (half_rounded_lhs.py) with the norm kernel apart, where that GEMM fits: the cheaper of the
    two ways runs (bf16 Llama's 32 x 128 x 64: on cgra-4x4 the cast kernel + fold, 2,320 +
    9,642 cycles run against 10,760 + 2,685; on cgra-8x8 the GEMM and norm apart, 3,408 + 1,501
    against 1,368 + 3,856)."""
    rounded = dataclasses.replace(spec, lhs_cast_from=None, row_norm=(ROUND, 0.0, spec.dtype, spec.lhs_cast_from))
    try:
        apart = apart_cycles(rounded, arch, choose_gemm_tiling)
    except CGRAError:  # (no rounded panel fits: the cast kernel it is)
        return
    cast = cast_cycles(spec, arch)
    if cast + fused >= apart:
        raise UnsupportedOperator(f"a {spec.dtype} {spec.post_norm[2]} after the {spec.op} whose float32 operand a "
                                  f"cast kernel rounds: the two ({cast} + {fused} cycles estimated) cost as much as "
                                  f"the GEMM rounding its panel and the norm kernel ({apart}); they run so")


def _cast_and_fold_cycles(spec, arch, choose_gemm_tiling) -> float:
    """The estimate of a cast kernel rounding the rounded operand of `spec` (row_norm ROUND)
    and the plain fold after it (check_cast_before_fold), inf where that fold is refused."""
    plain = dataclasses.replace(spec, row_norm=None, lhs_cast_from=spec.row_norm[3])
    try:
        tiling = choose_gemm_tiling(plain, arch)
    except CGRAError:
        return float("inf")
    return cast_cycles(spec, arch) + post_norm_cycles(plain, tiling, arch)


def apart_cycles(spec, arch, choose_gemm_tiling) -> int:
    """The estimate of the kernels a post-norm fold replaces: the GEMM's best tiling without the
    norm (`apart_gemm_cycles`) plus the norm kernel it would run as (`apart_norm_cycles`)."""
    return apart_gemm_cycles(spec, arch, choose_gemm_tiling) + apart_norm_cycles(spec, arch)


def apart_gemm_cycles(spec, arch, choose_gemm_tiling) -> int:
    """The GEMM without the norm at its best tiling: the 16-bit form's with half_out rounds its
    sum, adds the residual in h and rounds again (half_residual.py: an EPILOGUE and an ELTWISE in
    h a tile, the residual loaded as an h tile); the RMS form's stores its float32 sum."""
    apart_spec = dataclasses.replace(spec, post_norm=None, half_via=spec.half_out or spec.half_via)
    tiling = choose_gemm_tiling(apart_spec, arch)
    if not spec.half_out:
        return post_norm_cycles(apart_spec, tiling, arch)
    half = DType.from_name(spec.dtype).itemsize
    added = (lambda elements: (0, cost.eltwise_cycles(arch, elements, 2 * elements))) if spec.residual_shape else None
    return estimate_cycles(tiling, spec.dtype, half, half, arch, False, init_folded=True,
                           extra_tiles=bool(spec.residual_shape), tail_cycles=added, a_panel=may_hold_a_panel(spec),
                           piece_rows=tiling.epilogue_rows)


def apart_norm_cycles(spec, arch) -> int:
    """The norm kernel a post-norm would run as: gamma and beta applied unless plain (until
    2026-11 priced plain: Bloom's ln_f, 2,717 cycles alone, priced 2,128, kept its kernel, the
    fold 677 faster; with_post_norm refuses ones and zeros in the weighted pattern). The 16-bit
    form's (kernels/rows/half_norms.py): with half_out the layer norm reading and writing h, the
    RMS form's the RMSNorm of the float32 sum rounded to h, times g in h."""
    m, n, _ = spec.gemm_extents
    eps, affine, kind = spec.post_norm
    kind = "layer_norm" if kind == "layer_norm" else "rms_norm"
    if spec.dtype == F32:
        norm = RowSpec(kind, kind, (m, n), (m, n), m, n, eps,
                       ("weight",) if kind == "rms_norm" else ("gamma", "beta") if affine else ())
    elif spec.half_out:
        norm = RowSpec(kind, kind, (m, n), (m, n), m, n, eps, ("gamma", "beta"), out_dtype=spec.dtype,
                       in_dtype=spec.dtype)
    else:
        norm = RowSpec(kind, kind, (m, n), (m, n), m, n, eps, ("weight",), out_dtype=spec.dtype,
                       role_dtypes=(("weight", spec.dtype),))
    steps = steps_of(norm)
    tiling = choose_row_tiling(norm, arch, steps)
    if spec.dtype == F32 or tiling.tn < n:
        return estimate_row_cycles(norm, arch, steps, tiling.tm, tiling.tn)
    return _half_norm_cycles(norm, arch, steps, tiling.tm)


def _half_norm_cycles(norm, arch, steps, tm: int) -> int:
    """rows.estimate_row_cycles of a 16-bit norm kernel with its tiles' sizes (it prices 4-byte
    elements: BERT's bf16 norm at 32 x 64 on cgra-8x8 3,280 cycles, run 3,120): x's tile in
    its dtype, float32 or h row vectors, the output in h."""
    def size(dtype):
        return DType.from_name(dtype).itemsize
    roles = dict(norm.role_dtypes)
    load = cost.dma_transfer_cycles(arch, tm * norm.cols * size(norm.in_dtype)) + \
        sum(cost.dma_transfer_cycles(arch, norm.cols * size(roles.get(role, F32))) for role in norm.row_roles)
    store = cost.dma_transfer_cycles(arch, tm * norm.cols * size(norm.out_dtype))
    work = step_cycles(arch, steps, shapes_of(steps, norm.row_roles), tm, norm.cols)
    return cost.double_buffered_cycles(arch, cost.BufferedLoop(-(-norm.rows // tm), load, (work,), store)).total
