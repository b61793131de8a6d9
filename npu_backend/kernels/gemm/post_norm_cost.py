"""The price of a post-norm fold (post_norm.py): its tiling's estimate, and whether it pays.

Stage: tiling. In: a GEMM spec with a post-norm (post_norm.py's with_post_norm set `post_norm`),
the tile search's tiling, the chip. Out: `post_norm_tiling`, that tiling or one of whole-depth
row tiles holding B (post_norm.holds_b) when estimated faster; `post_norm_cycles`, the estimate
of the fused kernel (or of its GEMM alone); `check_post_norm`, which refuses a fold no cheaper
than the GEMM's best tiling and the norm kernel apart, so that the norm keeps its own kernel
(explain reports the refusal: tools/post_norm_reasons.py).

Each unit's work is the simulator's cost model (cgra_sim.cost): the GEMM's loop as
gemm_estimate.estimate_cycles prices it, the program on the vector unit after each tile's or
piece's EPILOGUE as the norm kernel prices it (post_norm.post_norm_tile_cycles, rows.step_cycles).
"""

from __future__ import annotations

import dataclasses

from cgra_sim import cost

from ...errors import UnsupportedOperator
from ..common.spec import Tiling
from ..rows.norms import steps_of
from ..rows.rows import RowSpec, choose_row_tiling, estimate_row_cycles
from .gemm_estimate import estimate_cycles, may_hold_a_panel
from .post_norm import F32, holds_b, post_norm_footprint, post_norm_tile_cycles
from .post_norm_rows import regret_tiling


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
    norm: spec.post_norm None)."""
    if holds_b(spec, tiling):
        return _held_b_cycles(spec, tiling, arch)
    tail = post_norm_tile_cycles(spec, arch) if spec.post_norm else None
    return estimate_cycles(tiling, spec.dtype, 4, 4, arch, bool(spec.residual_shape), init_folded=True,
                           tail_cycles=tail, a_panel=may_hold_a_panel(spec), piece_rows=tiling.epilogue_rows)


def _held_b_cycles(spec, t, arch) -> int:
    """Row tiles holding B (holds_b), as a pipeline: B and the first A tile loaded, then per row
    tile its GEMM (after its loads), its EPILOGUE and program on the vector unit (after its GEMM
    and the tile before's), its store (after both); the load engine a tile ahead."""
    elements = t.tm * t.np
    gemm = cost.gemm_steady_cycles(arch, t.tm, t.np, t.kp, spec.dtype) + cost.gemm_fill_cycles(arch, t.tm, t.np)
    vector = cost.vector_stream_cycles(arch, (1 + bool(spec.residual_shape)) * elements) + \
        post_norm_tile_cycles(spec, arch)(elements)[1]
    loads = cost.dma_transfer_cycles(arch, 4 * (t.tm * t.kp + bool(spec.residual_shape) * elements))
    store = cost.dma_transfer_cycles(arch, 4 * elements)
    loaded = cost.dma_cycles(arch, 4 * t.kp * t.np) + loads
    array = loaded + cost.pe_array_config_cycles(arch, spec.dtype)
    done = stored = 0
    for _ in range(t.mp // t.tm):
        array = max(array, loaded) + gemm
        done = max(done, array) + vector
        stored = max(stored, done) + store
        loaded += loads + store
    return stored + arch.dma_latency


def check_post_norm(spec, tiling, arch, choose_gemm_tiling) -> None:
    """Refuse a fold whose estimate is no cheaper than the GEMM's best tiling without it plus
    the norm kernel it would run as (gamma and beta applied unless plain; until 2026-11 priced
    plain: Bloom's ln_f, 2,717 cycles alone, priced 2,128, kept its kernel, the fold 677 faster;
    with_post_norm refuses ones and zeros in the weighted pattern): then the norm runs on its own.
    `choose_gemm_tiling`: gemm.py's. A patch conv's norm is not priced (patch_norm.py: measured
    cheaper fused), nor a 16-bit GEMM's (half_post_norm.py: measured)."""
    if not spec.post_norm or spec.patch_channels or spec.dtype != F32:
        return
    apart_spec = dataclasses.replace(spec, post_norm=None)
    m, n, _ = spec.gemm_extents
    kind = "layer_norm" if spec.post_norm[2] == "layer_norm" else "rms_norm"
    roles = ("weight",) if kind == "rms_norm" else ("gamma", "beta") if spec.post_norm[1] else ()
    norm = RowSpec(kind, kind, (m, n), (m, n), m, n, spec.post_norm[0], roles)
    steps = steps_of(norm)
    norm_tiling = choose_row_tiling(norm, arch, steps)
    alone = post_norm_cycles(apart_spec, choose_gemm_tiling(apart_spec, arch), arch) + \
        estimate_row_cycles(norm, arch, steps, norm_tiling.tm, norm_tiling.tn)
    fused = post_norm_cycles(spec, tiling, arch)
    if fused >= alone:
        raise UnsupportedOperator(f"layer_norm after the {spec.op}: in its epilogue ({fused} cycles estimated) it "
                                  f"costs as much as the GEMM and the norm's own kernel ({alone}); the norm runs on "
                                  "its own")
