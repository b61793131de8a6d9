"""The price of a float32 operand rounded to h for a 16-bit GEMM: on the A panel or by a cast kernel.

Stage: tiling (post_norm_cost.check_post_norm weighs a 16-bit Llama's last down projection and
final norm with them). In: a GEMM spec, its tiling, the chip. Out: `rounded_gemm_cycles`, the
estimate of a GEMM rounding its float32 A panel (half_rounded_lhs.py) without a post-norm;
`cast_cycles`, the cast kernel's (kernels/elementwise/cast.py) rounding its float32 operand to h.

Why its own estimate: gemm_estimate.estimate_cycles prices A in h and no panel program, and the
kernel's first GEMM waits for the float32 panel (twice the bytes), for the next row tile's panel
the load engine brings before the first B tile, and for the rounding (Llama bf16's 32 x 128 x 64
with its float32 residual: estimated 9,262 cycles on cgra-4x4 and 2,896 on cgra-8x8, run 10,760
and 3,408, so that the rounded GEMM + norm kernel looked cheaper than the cast kernel + fold).
This one follows the kernel's units command by command as the simulator orders them: the first
panel loaded and rounded in pieces of the vector lanes (lower/norm_rows.py), every later panel
loaded whole a row tile ahead (its buffer free once the row tile two back is done) and rounded in
one EPILOGUE before that row tile's first output tile's; B's tile (and the residual's) per output
tile, double-buffered; each tile's GEMM (its array fill after an idle gap) in the pieces of rows
its EPILOGUEs and stores follow (gemm.py's epilogue_rows).
"""

from __future__ import annotations

from cgra_sim import cost
from cgra_sim.isa import DType

from ..common.unary import UnaryOperand
from ..elementwise.cast import CastSpec, choose_cast_tiling

F32 = "float32"


def rounded_gemm_cycles(spec, t, arch) -> int:
    """The estimate of the GEMM of `spec` (row_norm a rounding: half_rounded_lhs.py, no
    post-norm) on tiling `t`: the module doc's pipeline over the rows that exist (padded rows
    are cut: lower/cut_padded_rows.py), the last store's end."""
    rows, col_tiles = spec.gemm_extents[0], t.np // t.tn
    half, wide = (DType.from_name(dtype).itemsize for dtype in (spec.dtype, spec.row_norm[3]))
    out_bytes = half if spec.half_out else DType.from_name(spec.acc_dtype).itemsize
    residual = bool(spec.residual_shape)
    b_load = cost.dma_transfer_cycles(arch, half * t.kp * t.tn)
    heights = [min(t.tm, rows - top) for top in range(0, rows, t.tm)]  # each row tile's rows
    load, vector, ready = _first_panel(arch, heights[0], t.kp, wide)
    array, stored, ends = cost.pe_array_config_cycles(arch, spec.dtype), 0, []  # ends: each tile's last GEMM
    for row, height in enumerate(heights):
        if row + 1 < len(heights):  # the next panel, a row tile ahead; its rounding in the rounded
            load += cost.dma_transfer_cycles(arch, wide * heights[row + 1] * t.kp)  # panel the row tile before read
            free = ends[row * col_tiles - 1] if row else 0
            ready.append(max(vector, load + arch.dma_latency, free) + cost.vector_cycles(arch, heights[row + 1], t.kp))
            vector = ready[-1]
        pieces = _pieces(height, t.epilogue_rows)
        for _ in range(col_tiles):
            load = max(load, ends[-2] if len(ends) >= 2 else 0) + b_load  # (two copies of B's tile)
            b_in = load + arch.dma_latency
            load += cost.dma_transfer_cycles(arch, out_bytes * height * t.tn) if residual else 0
            start = max(array, b_in, ready[row])
            array = start + (cost.gemm_fill_cycles(arch, pieces[0], t.tn) if start > array or not ends else 0)
            for piece in pieces:
                array += cost.gemm_steady_cycles(arch, piece, t.tn, t.kp, spec.dtype)
                vector = max(vector, array, load + arch.dma_latency) + \
                    cost.vector_cycles(arch, piece, t.tn, 1 + residual)
                stored = max(stored, vector) + cost.dma_transfer_cycles(arch, out_bytes * piece * t.tn)
            ends.append(array)
    return stored + arch.dma_latency


def _first_panel(arch, height: int, depth: int, wide: int) -> tuple:
    """(the load engine's and the vector unit's cycles, [the panel's rounded]) after the first
    row tile's panel, loaded and rounded in pieces of the vector lanes (lower/norm_rows.py)."""
    load = vector = 0
    for piece in _pieces(height, arch.vector_lanes):
        load += cost.dma_transfer_cycles(arch, wide * piece * depth)
        vector = max(vector, load + arch.dma_latency) + cost.vector_cycles(arch, piece, depth)
    return load, vector, [vector]


def _pieces(height: int, rows: int) -> list:
    """`height` rows in pieces of `rows` (0: whole), the last one what is left."""
    step = rows if 0 < rows < height else height
    return [min(step, height - top) for top in range(0, height, step)]


def cast_cycles(spec, arch) -> int:
    """The estimate of the cast kernel (kernels/elementwise/cast.py, at its tiling) rounding the
    float32 (M, K) operand of `spec` to its dtype: unary.estimate_unary_cycles' double-buffered
    loop over the elements that exist (padding is cut), loading float32 and storing h tiles (the
    family's own estimate, which picks the tiling, prices both as float32 and padded: 267 cycles
    against 218 run for one row of 64 on cgra-4x4)."""
    rows, _, depth = spec.gemm_extents
    tiling = choose_cast_tiling(CastSpec(F32, spec.dtype, UnaryOperand((rows, depth), rows, depth)), arch)
    m, n = min(tiling.tm, rows), min(tiling.tn, depth)
    tiles = -(-rows // tiling.tm) * -(-depth // tiling.tn)
    load = cost.dma_transfer_cycles(arch, m * n * DType.from_name(F32).itemsize)
    store = cost.dma_transfer_cycles(arch, m * n * DType.from_name(spec.dtype).itemsize)
    return cost.double_buffered_cycles(arch, cost.BufferedLoop(tiles, load, (cost.vector_cycles(arch, 1, m * n),),
                                                               store)).total
