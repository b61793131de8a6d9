"""The inverted-residual kernel's tile search: output rows per tile, expanded channels per block.

Stage: tiling (also asked by partitioning: a block whose search refuses it is not fused).
In: an InvertedResidualSpec (inverted_residual.py) and the hardware description. Out: a Tiling
as separable_tiles.py's (`tm` output rows, `tw` the whole padded output row, `tk` expanded
channels per block, `tn` = `np` every output channel), `kp` the expanded channels in whole
blocks.

A tile's window rows are the expansion's rows: each tile computes them, its halo rows (kh - 1
for stride 1) again after its neighbour did, so a taller tile recomputes less; the input
window (every input channel of the window's rows) is loaded once per tile. Among the tiles whose
buffers, each twice (double buffering), fit the scratchpad, the one with the fewest cycles
estimated with the simulator's cost model; and only if that estimate is no more than what the
block runs as without this kernel: the expansion's own conv2d kernel plus the separable pair
(fused, or its two convs if they do not fuse). Else the search says why.
"""

from __future__ import annotations

import functools

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ...errors import ScratchpadTooSmall, UnsupportedOperator
from ..gemm.depthwise import padded_width
from ..gemm.gemm import choose_gemm_tiling, estimate_cycles as gemm_estimate_cycles
from ..intrinsics.pe_array import window_extent
from .separable_tiles import TileCosts, channel_blocks, pair_buffers, pair_cycles, row_tiles, searched, tile_costs
from ..common.spad_layout import a_row_stride
from ..common.spec import KernelSpec, Tiling, aligned, round_up


def choose_inverted_residual_tiling(spec, arch: HardwareDescription) -> Tiling:
    """The fitting (tm, tk) with the fewest estimated cycles (ties: the larger tile); raises
    ScratchpadTooSmall or UnsupportedOperator, which partitioning reports as the reason the block
    is not fused. Refusals are remembered too: a model asks again at every such block."""
    return searched(_search, spec, arch)


@functools.lru_cache(maxsize=1024)
def _search(spec, arch: HardwareDescription):
    """(tiling, None), or (None, (error class, message))."""
    ex, dw, pw = spec.expand, spec.pair.depthwise, spec.pair.pointwise
    expanded, filters = dw.lhs_shape[1], pw.rhs_shape[0]
    rows, width = max(dw.output_shape[2], 2), padded_width(dw)
    tn = round_up(max(filters, 2), arch.cols)
    best = None
    for tm in row_tiles(rows):
        fitting = [tk for tk in channel_blocks(expanded, arch) if footprint(spec, arch, tm, width, tk, tn) <=
                   arch.spad_bytes]
        if not fitting:
            break  # the footprint grows with tm
        for tk in fitting:
            tiling = Tiling(tm, tn, tk, round_up(rows, tm), tn, round_up(expanded, tk), tw=width)
            key = (estimate_cycles(spec, tiling, arch), -tm * tk)
            if best is None or key < best[0]:
                best = (key, tiling)
    what = (f"1x1 conv2d {ex.lhs_shape} to {expanded} channels -> depthwise conv2d -> 1x1 conv2d to {filters} "
            "channels")
    if best is None:
        tk = round_up(2, arch.cols)
        smallest = footprint(spec, arch, 2, width, tk, tn)
        return None, (ScratchpadTooSmall, (
            f"{what}: its smallest fused tile (2 output rows of {width} pixels, {tk} expanded and {tn} output "
            f"channels, with the input window, double-buffered) needs {smallest} bytes, more than the "
            f"{arch.spad_bytes}-byte scratchpad of '{arch.name}'; the expansion and the pair run as their own "
            "kernels"))
    unfused = _unfused_cycles(spec, arch)
    if best[0][0] > unfused:
        return None, (UnsupportedOperator, (
            f"{what}: fused, an estimated {best[0][0]} cycles on '{arch.name}' (best tile {best[1].tm} output "
            f"rows, which recomputes the expansion of its halo rows), against {unfused} as the expansion's kernel "
            "and the separable pair; they run as their own kernels"))
    return best[1], None


def _unfused_cycles(spec, arch: HardwareDescription) -> float:
    """The estimate of the block without this kernel: the expansion's conv2d kernel (its tile
    search's) and the pair (pair_cycles), infinite if the expansion does not fit alone."""
    ex = spec.expand
    try:
        tiling = choose_gemm_tiling(ex, arch)
    except ScratchpadTooSmall:
        return float("inf")
    in_bytes, acc_bytes = DType.from_name(ex.dtype).itemsize, DType.from_name(ex.acc_dtype).itemsize
    return gemm_estimate_cycles(tiling, ex.dtype, in_bytes, acc_bytes, arch, init_folded=True) + \
        pair_cycles(spec.pair, arch)


def expand_depth(ex: KernelSpec) -> int:
    """The expansion GEMM's depth: the input channels (at least 2, so that no loop of the
    reduction has a unit extent)."""
    return max(ex.lhs_shape[1], 2)


def expanded_columns(spec, tiling: Tiling) -> int:
    """Image columns a window row holds (the expansion GEMM's rows): those the depthwise reads."""
    dw = spec.pair.depthwise
    left = dw.padding[1]
    in_w = window_extent(tiling.tw, dw.rhs_shape[3], dw.strides[1], dw.dilation[1])
    return min(dw.lhs_shape[3], in_w - left)


def pads_rows(dw: KernelSpec) -> bool:
    """Whether the depthwise's output reads rows above or below the image (its padding)."""
    return bool(dw.padding[0] or dw.padding[2])


def column_padding(spec, tiling: Tiling) -> bool:
    """Whether a window row has columns outside the image (left or right of it)."""
    dw = spec.pair.depthwise
    in_w = window_extent(tiling.tw, dw.rhs_shape[3], dw.strides[1], dw.dilation[1])
    return dw.padding[1] > 0 or in_w - dw.padding[1] > dw.lhs_shape[3]


def window_rows(spec, tm: int) -> int:
    """Padded rows of a tile's window: its output rows with the depthwise's halo."""
    dw = spec.pair.depthwise
    return window_extent(tm, dw.rhs_shape[2], dw.strides[0], dw.dilation[0])


#: Blocks whose buffers are one copy (spec.SINGLE_BUFFERED): per block, the window is written
#: after the previous block's DEPTHWISE has read it (its GEMMs come after that DEPTHWISE on the
#: PE array), the depthwise's accumulator and output likewise; per tile, the projection's
#: accumulator and output tile are written long after the previous tile's EPILOGUE and store.
SINGLE = ("ex_epi", "dw_acc", "dw_epi", "acc", "epi")


def footprint(spec, arch: HardwareDescription, tm: int, tw: int, tk: int, tn: int) -> int:
    """Scratchpad bytes of a tile's buffers: the pair's (separable_tiles.pair_buffers, whose
    window is the expansion's output here), the input window (every input channel, pixels
    padded), the expansion weights, one row of its accumulator, each twice but SINGLE's; and the
    two bias rows, loaded once."""
    ex = spec.expand
    tiling = Tiling(tm, tn, tk, tm, tn, tk, tw=tw)
    in_bytes, acc_bytes = DType.from_name(ex.dtype).itemsize, DType.from_name(ex.acc_dtype).itemsize
    columns, depth = expanded_columns(spec, tiling), expand_depth(ex)
    buffers = pair_buffers(spec.pair, arch, tm, tw, tk, tn)
    buffers["ex_epi"] = buffers.pop("dw_a_pad")
    buffers.update(ex_a_pad=window_rows(spec, tm) * columns * a_row_stride(columns, depth, in_bytes, arch) * in_bytes,
                   ex_b_pad=depth * tk * in_bytes, ex_acc=columns * tk * acc_bytes)
    rows = 2 if pads_rows(spec.pair.depthwise) else 1  # the bias row, and the lowest value's
    once = aligned(rows * round_up(spec.pair.depthwise.lhs_shape[1], tk) * acc_bytes) if ex.bias_shape else 0
    return once + sum(aligned((1 if name in SINGLE else 2) * size) for name, size in buffers.items())


def estimate_cycles(spec, t: Tiling, arch: HardwareDescription) -> int:
    """First-order cycles, each command priced by the simulator's cost model: per tile the
    pair's work (separable_tiles.tile_costs, its window not loaded) and per block the
    expansion's: a GEMM and an EPILOGUE per window row (rows above or below the image too: their
    EPILOGUE makes them 0), FILLs of the window's columns outside the image, and a bubble (the
    DEPTHWISE waits for the last row's EPILOGUE); the input window once per tile, the expansion
    weights per block."""
    ex, dw = spec.expand, spec.pair.depthwise
    in_bytes, acc_bytes = DType.from_name(ex.dtype).itemsize, DType.from_name(ex.acc_dtype).itemsize
    pair = tile_costs(spec.pair, t, arch, window_loaded=False)
    columns, depth, blocks = expanded_columns(spec, t), expand_depth(ex), t.kp // t.tk
    in_h = window_rows(spec, t.tm)
    in_w = window_extent(t.tw, dw.rhs_shape[3], dw.strides[1], dw.dilation[1])
    border = [width for width in (dw.padding[1], in_w - dw.padding[1] - columns) if width > 0]
    row_vector = cost.vector_cycles(arch, columns, t.tk) + sum(cost.vector_cycles(arch, b, t.tk) for b in border)
    compute = blocks * (in_h * cost.gemm_steady_cycles(arch, columns, t.tk, depth, ex.dtype) +
                        cost.gemm_fill_cycles(arch, columns, t.tk) + cost.vector_cycles(arch, columns, t.tk))
    weights = depth * t.tk * in_bytes + (t.tk * acc_bytes if ex.bias_shape else 0)
    window = in_h * columns * depth * in_bytes
    costs = TileCosts(pair.compute + compute, pair.vector + blocks * in_h * row_vector,
                      pair.load + window + blocks * weights, pair.store, 0)
    tiles = dw.lhs_shape[0] * t.mp // t.tm
    return costs.loop(arch, tiles, pair.first_load + window + weights).total
