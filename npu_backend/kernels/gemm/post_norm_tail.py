"""How many of a post-norm tile's last reduction steps run piece by piece (lower/piece_major.py).

Stage: schedule (gemm_schedule.py annotates the step loop). In: the spec of a GEMM with a post-norm
(post_norm.py), its tiling (a tile finished in pieces of rows: Tiling.epilogue_rows) and the chip.
Out: L, the last steps whose GEMMs run piece by piece (0: none, the steps in order).

Why L: a piece's vector work (its EPILOGUE and the norm's program) runs while the array computes
the next piece's GEMMs of those L steps; L is the fewest steps whose GEMMs on a piece last as
long as that work, at most the operand tiles' copies (the last L steps' loads all go before
their GEMMs, each into its own copy) and the steps there are less two: with fewer steps before
the tail the loads cannot get ahead, and its later steps wait for B as a held B would (32 x 64 x
128 in 2 steps, all piece by piece: 6,838 -> 7,280 cycles; 32 x 64 x 256, L = 3 of 4: 11,888).
Measured on cgra-8x8 (32 tokens, the last GEMM's final norm): Bloom 10,080 -> 9,498 cycles,
GPT-NeoX 5,398 -> 5,080, Llama 5,102 -> 4,814, GPT-J / GPT-2 / Falcon 9,494 -> 8,984.
The fold's estimate counts L for a float32 GEMM (post_norm_cost.py; a 16-bit GEMM's tail
measured no gain).
"""

from __future__ import annotations

from cgra_sim import cost

from .gemm_pieces import epilogue_piece_rows
from .post_norm import post_norm_tile_cycles


def tail_steps(spec, tiling, arch) -> int:
    """L for `spec`'s post-norm tile with `tiling` on `arch` (the module doc), or 0."""
    piece = epilogue_piece_rows(tiling)
    if not spec.post_norm or not 0 < piece < tiling.tm or tiling.kp % tiling.tk:
        return 0
    steps = tiling.kp // tiling.tk
    elements = piece * tiling.np
    vector = cost.vector_stream_cycles(arch, (1 + bool(spec.residual_shape)) * elements) + \
        post_norm_tile_cycles(spec, arch)(elements)[1]
    gemm = max(cost.gemm_steady_cycles(arch, piece, tiling.np, tiling.tk, spec.dtype), 1)
    tail = min(-(-vector // gemm), steps - 2, max(tiling.operand_copies, 2))
    return tail if tail >= 2 else 0
