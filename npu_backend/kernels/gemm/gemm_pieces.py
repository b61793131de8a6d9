"""Output tiles finished in pieces of rows, and the tile search's choices that go with them.

Stage: tiling and schedule (gemm.py's tile search asks `finishes_in_pieces`, `shallower_depths`
and `in_pieces`; its schedule `epilogue_piece_rows`). A transformer's prefill runs GEMMs of a
few dozen rows (tokens) by a few hundred columns: few output tiles, so a kernel's first load and
its last tile's epilogue and store are much of its time. Finished in pieces of the PE array's
rows, the last tile's stores overlap its epilogue (gemm_estimate.py prices it: piece_rows), and a
shallow reduction step lets the first GEMM start after a short load.
"""

from __future__ import annotations

import dataclasses

from cgra_sim.arch import HardwareDescription

from ..common.spec import KernelSpec, Tiling, round_up
from .epilogue_tail import act_on_vector


def finishes_in_pieces(spec: KernelSpec, arch: HardwareDescription) -> bool:
    """Whether the kernel may finish its output tiles in pieces of rows (epilogue_rows) and its
    tile search weighs reduction steps shallower than the deepest that fits: a static matmul
    (static: its tile loops are not cut by lower/ragged.py) whose epilogue runs on the vector
    unit alone (no FABRIC body or activation between two tiles' GEMMs) and reads no operand tile
    but a residual (a multiplier's or a per-channel scale's cost in pieces the estimate does not
    price: BERT's residual x scale went 2% slower), with more rows than one fold of the PE array
    (a prefill's tokens; one row, a decode step's, streams B's panel and is bound by its loads
    whatever the tiling). Two folds were left out while a tile's GEMM ran whole and its operand
    tiles had two copies: 32 x 64 x 32 on cgra-16x16 ran 968 cycles whole and 1,032 in pieces;
    with its GEMMs in pieces (lower/gemm_rows.py) and three copies (gemm_copies.py) 968 and 920."""
    return spec.op == "matmul" and spec.compute_name == "matmul" and not spec.symbols \
        and spec.gemm_extents[0] > arch.rows and not spec.fabric_body \
        and not spec.multiplier_shape and not spec.channel_scale_shape and not spec.rope_pattern \
        and (not spec.act or spec.act == "gelu" or act_on_vector(spec, arch))


def patch_pieces(spec: KernelSpec, tiling: Tiling, arch: HardwareDescription) -> Tiling:
    """`tiling`, for a patch conv storing NHWC (patchify.py: a ViT's patch embedding), finished in
    pieces of the PE array's rows when they are whole output rows and split its tile evenly: its
    kernel is bound by its weights' load (196 KB at 16 patches of 768 x 64), and in pieces the last
    reduction step's first piece is added, its bias and positions too, and stored while the array
    computes the second (ViT's at 64 x 64 px on cgra-8x8: 16,816 -> 16,560 cycles)."""
    rows = spec.gemm_extents[0]
    if not (spec.patch_channels and spec.out_layout == "NHWC") or tiling.epilogue_rows or \
            tiling.tm != tiling.mp or tiling.tm <= arch.rows or rows % arch.rows or arch.rows % spec.row_step:
        return tiling
    return dataclasses.replace(tiling, epilogue_rows=arch.rows)


#: How much faster than the tiling chosen without pieces the estimate must find one with them: the
#: estimate's error bound on GEMM kernels (tests/test_overlap_estimate.py), so that a choice moves
#: only where the estimate is sure it gains.
PIECES_MARGIN = 0.015


def in_pieces(whole, candidates, rows: int, row_step: int, arch: HardwareDescription, tiling_for, cycles,
              a_panel: bool) -> Tiling:
    """The tiling of a kernel that may finish its output tiles in pieces: the fastest
    of `candidates` (deepest and shallower steps) that reads no more operand elements from DRAM
    than `whole`, the choice without pieces (DRAM is most of a kernel's energy), each whole or in
    pieces of the PE array's rows, priced as the kernel runs (its FILL folded:
    lower/fold_init.py), if it beats `whole` by PIECES_MARGIN; else `whole`."""
    most = _operand_reads(tiling_for(whole, rows), a_panel)
    choices = [(c, piece) for c in candidates if _operand_reads(tiling_for(c, rows), a_panel) <= most
               for piece in ((0, arch.rows) if min(c[0], round_up(rows, row_step)) > arch.rows else (0,))]
    best, piece = min(choices, key=lambda c: (cycles(c[0], rows, c[1], True), -c[0][0] * c[0][1], c[1]))
    if cycles(best, rows, piece, True) < (1 - PIECES_MARGIN) * cycles(whole, rows, 0, True):
        return dataclasses.replace(tiling_for(best, rows), epilogue_rows=piece)
    return tiling_for(whole, rows)


def _operand_reads(t: Tiling, a_panel: bool) -> int:
    """Elements of A and B a tiling loads: B once per row tile, A once (its panel held or
    streamed, or one column tile) or once per column tile."""
    a_once = t.stream_panel or t.np == t.tn or (a_panel and t.tk == t.kp)
    return t.mp * t.kp * (1 if a_once else t.np // t.tn) + t.mp // t.tm * t.kp * t.np


def streamed_candidates(tm: int, tn: int, deepest: int, depth: int, column_tiles: int, may_stream_panel: bool,
                        arch: HardwareDescription, fits) -> list[tuple]:
    """(tm, tn, tk, stream_panel) for the reduction steps shallower than `deepest`: with one
    column tile, A is read once anyway; with more, only A's row panel loaded a step at a time by
    the first column tile and held (Tiling.stream_panel; `may_stream_panel`: a matmul that may
    hold A's panel), when `fits(tk, steps)` says the panel's `steps` copies fit too. Never A
    reloaded per column tile: it would cost DRAM traffic (and energy) the panel saves (BERT on
    cgra-4x4 read 0.96 -> 1.87 MB for 1% fewer cycles)."""
    found = []
    for tk in shallower_depths(deepest, depth, arch):
        if column_tiles == 1:
            found.append((tm, tn, tk, False))
        elif may_stream_panel and fits(tk, depth // tk):
            found.append((tm, tn, tk, True))
    return found


def shallower_depths(deepest: int, depth: int, arch: HardwareDescription) -> list[int]:
    """Reduction steps shallower than the deepest that fits (gemm.choose_tiling's `pieces`):
    halvings of it that divide the depth, down to a sixteenth of it and no fewer than 16 or twice
    the PE array's rows (a shallower step's GEMM hardly covers its loads' round trip, and the
    estimate misses its stalls: 64 x 64 x 64 on cgra-4x4 in 8-deep steps ran 2.2% over it)."""
    found, tk = [], deepest
    while tk % 2 == 0 and tk // 2 >= max(16, 2 * arch.rows, deepest // 16) and depth % (tk // 2) == 0:
        tk //= 2
        found.append(tk)
    return found


def epilogue_piece_rows(tiling: Tiling) -> int:
    """Rows of the EPILOGUE commands and stores an output tile is finished in: the whole tile, or
    the tiling's `epilogue_rows`. In pieces, piece i's EPILOGUE runs while piece i - 1 is stored
    (each piece has its own buffer: lower/hoist_allocs.py), so the last tile's epilogue and
    store overlap: what the kernel waits for after its last GEMM is the epilogue and one piece's
    store, not the epilogue and the whole tile's store."""
    return tiling.epilogue_rows if 0 < tiling.epilogue_rows < tiling.tm else tiling.tm
