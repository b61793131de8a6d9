"""The separable kernel's tile search: output rows and columns per tile, input channels per block.

Stage: tiling (also asked by partitioning: a pair whose search refuses it is not fused).
In: a SeparableSpec (separable.py) and the hardware description. Out: a Tiling whose `tm` is the
output rows of a tile (>= 2), `tw` its output columns (the whole row, or a multiple of the PE
array's rows: a GEMM's rows are one output row of the tile), `tk` the input channels of a block
(a multiple of the PE array's columns: the DEPTHWISE's channels and the GEMM's depth), `tn` =
`np` every output channel of the pointwise conv2d padded to the array's columns (one GEMM per row
covers them, so the depthwise output is computed once, never once per output-channel tile),
`mp` / `kp` rows and channels padded to whole tiles.

Among the tiles whose buffers, each twice (double buffering), fit the scratchpad, the one with
the fewest cycles estimated with the simulator's cost model; and only if that estimate is no more
than the two convs' own kernels' estimates (many output channels make a fused tile small, and it
reloads all the pointwise weights for every tile of pixels): else the pair stays two kernels,
and the search says why. Tiles narrower than the image let a wide image have taller tiles: each
tile loads its window's halo (kh - 1 rows, kw - 1 columns) again, and a squarer tile of the same
size loads less of it.
"""

from __future__ import annotations

import dataclasses
import functools

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ...errors import ScratchpadTooSmall, UnsupportedOperator
from ..gemm.depthwise import choose_depthwise_tiling, estimate_depthwise_cycles, padded_width
from ..gemm.gemm import choose_gemm_tiling, estimate_cycles as gemm_estimate_cycles
from ..intrinsics.pe_array import window_extent
from ..common.spad_layout import operand_row_stride, out_row_stride, window_pixel_stride
from ..common.spec import KernelSpec, Tiling, aligned, round_up


def choose_separable_tiling(spec, arch: HardwareDescription) -> Tiling:
    """The fitting (tm, tw, tk) with the fewest estimated cycles (ties: the larger tile); raises
    ScratchpadTooSmall or UnsupportedOperator, which partitioning reports as the reason the pair
    stays two kernels. Refusals are remembered too: a model asks again at every such pair."""
    return searched(_search, spec, arch)


def searched(search, spec, arch: HardwareDescription) -> Tiling:
    """The tiling `search(spec, arch)` found, or its refusal (error class, message) raised."""
    tiling, refusal = search(spec, arch)
    if refusal is not None:
        error, message = refusal
        raise error(message)
    return tiling


@functools.lru_cache(maxsize=1024)
def _search(spec, arch: HardwareDescription):
    """(tiling, None), or (None, (error class, message))."""
    dw, pw = spec.depthwise, spec.pointwise
    channels, filters = dw.lhs_shape[1], pw.rhs_shape[0]
    rows, width = max(dw.output_shape[2], 2), padded_width(dw)
    tn = round_up(max(filters, 2), arch.cols)
    best = None
    for tw in _column_tiles(width, arch):
        for tm in row_tiles(rows):
            fitting = [tk for tk in channel_blocks(channels, arch)
                       if footprint(spec, arch, tm, tw, tk, tn) <= arch.spad_bytes]
            if not fitting:
                break  # the footprint grows with tm
            for tk in fitting:
                tiling = Tiling(tm, tn, tk, round_up(rows, tm), tn, round_up(channels, tk), tw=tw)
                key = (estimate_cycles(spec, tiling, arch), -tm * tw * tk)
                if best is None or key < best[0]:
                    best = (key, tiling)
    what = f"depthwise conv2d {dw.lhs_shape} -> 1x1 conv2d to {filters} channels"
    if best is None:
        tw = min(width, arch.rows) if width > 2 else width
        smallest = footprint(spec, arch, 2, tw, round_up(2, arch.cols), tn)
        return None, (ScratchpadTooSmall, (
            f"{what}: its smallest fused tile (2 x {tw} output pixels, {round_up(2, arch.cols)} input and {tn} "
            f"output channels, double-buffered) needs {smallest} bytes, more than the {arch.spad_bytes}-byte "
            f"scratchpad of '{arch.name}'; the two convs run as separate kernels"))
    separate = _separate_cycles(spec, arch)
    if best[0][0] > separate:
        return None, (UnsupportedOperator, (
            f"{what}: fused, an estimated {best[0][0]} cycles on '{arch.name}' (best tile {best[1].tm} x "
            f"{best[1].tw} pixels, which reloads the {channels} x {filters} pointwise weights for each), against "
            f"{separate} as two kernels; the two convs run as separate kernels"))
    return best[1], None


def pair_cycles(spec, arch: HardwareDescription) -> float:
    """The estimate of what the pair runs as: its fused kernel's, else its two convs' kernels'."""
    tiling, refusal = _search(spec, arch)
    return _separate_cycles(spec, arch) if refusal is not None else estimate_cycles(spec, tiling, arch)


def _separate_cycles(spec, arch: HardwareDescription) -> float:
    """The estimates of the depthwise's and the pointwise's own kernels (their tile searches'),
    infinite if either does not fit alone."""
    try:  # once per pair: _search's cache holds the decision
        dw_tiling = choose_depthwise_tiling(spec.depthwise, arch, held=False)
        pw_tiling = choose_gemm_tiling(spec.pointwise, arch)
    except ScratchpadTooSmall:
        return float("inf")
    pw = spec.pointwise
    return estimate_depthwise_cycles(spec.depthwise, dw_tiling, arch, held=False) + gemm_estimate_cycles(
        pw_tiling, pw.dtype, DType.from_name(pw.dtype).itemsize, DType.from_name(pw.acc_dtype).itemsize, arch,
        bool(pw.residual_shape))


def row_tiles(rows: int) -> list:
    """Output rows per tile: for each count of row tiles the smallest tile covering the rows
    (>= 2), so that no two candidates pad the rows to the same number of tiles."""
    return sorted({max(-(-rows // count), 2) for count in range(1, rows + 1)})


def padded_columns(dw: KernelSpec, tiling: Tiling) -> int:
    """Output columns the kernel computes: the output width (at least 2) in whole tiles."""
    return round_up(padded_width(dw), tiling.tw)


def _column_tiles(width: int, arch: HardwareDescription) -> list:
    """The whole (padded) output row, and narrower tiles of whole PE-array folds (a GEMM's rows
    are a tile's row of pixels) whose padding past the row stays under one fold."""
    narrower = range(arch.rows, width, arch.rows) if arch.rows >= 2 else ()
    return [width] + [tw for tw in narrower if round_up(width, tw) - width < arch.rows]


def channel_blocks(channels: int, arch: HardwareDescription) -> list:
    """Input channels per block: multiples of the PE array's columns whose blocks pad the
    channels by less than one more multiple (a GEMM's depth, a DEPTHWISE's channels)."""
    first, whole = round_up(2, arch.cols), max(round_up(channels, arch.cols), round_up(2, arch.cols))
    return [tk for tk in range(first, whole + 1, arch.cols) if round_up(channels, tk) - channels < arch.cols]


@functools.lru_cache(maxsize=4096)
def window_stride(dw: KernelSpec, tk: int, tw: int, arch: HardwareDescription) -> int:
    """Pixel stride (elements) of the depthwise's input window of a tile of `tw` output columns
    (depthwise.py's, spad_layout.py)."""
    return window_pixel_stride(tk, DType.from_name(dw.dtype).itemsize, dw.strides[1], tw, arch)


def dw_row_stride(width: int, tk: int, itemsize: int, arch: HardwareDescription) -> int:
    """Pixel stride (elements) of the depthwise's output buffer, the GEMMs' A operand: the PE
    array reads one element of each of min(width, rows) pixels a cycle."""
    return operand_row_stride(tk, itemsize, min(width, arch.rows), arch)


def out_pixel_stride(pw: KernelSpec, tn: int, arch: HardwareDescription) -> int:
    """Pixel stride (elements) of the output tile: the NCHW store walks a row's pixels."""
    return out_row_stride(tn, DType.from_name(pw.acc_dtype).itemsize, pw.output_shape[3], arch)


def footprint(spec, arch: HardwareDescription, tm: int, tw: int, tk: int, tn: int) -> int:
    """Scratchpad bytes of a tile's buffers (`pair_buffers`), each twice."""
    return sum(aligned(2 * size) for size in pair_buffers(spec, arch, tm, tw, tk, tn).values())


def pair_buffers(spec, arch: HardwareDescription, tm: int, tw: int, tk: int, tn: int) -> dict:
    """{block name: bytes} of a tile's buffers: the window, the depthwise weights and bias row,
    its accumulator and epilogued output (pixels padded), the pointwise weights and bias row, the
    accumulator, the residual tile and the output tile (pixels padded)."""
    dw, pw = spec.depthwise, spec.pointwise
    in_bytes, acc_bytes = DType.from_name(dw.dtype).itemsize, DType.from_name(dw.acc_dtype).itemsize
    width, (kh, kw) = tw, dw.rhs_shape[2:]
    in_h = window_extent(tm, kh, dw.strides[0], dw.dilation[0])
    in_w = window_extent(width, kw, dw.strides[1], dw.dilation[1])
    pixels = tm * width
    buffers = {"dw_a_pad": in_h * in_w * window_stride(dw, tk, tw, arch) * in_bytes,
               "dw_b_pad": kh * kw * tk * in_bytes, "dw_acc": pixels * tk * acc_bytes,
               "dw_epi": pixels * dw_row_stride(width, tk, acc_bytes, arch) * acc_bytes,
               "b_pad": tk * tn * in_bytes, "acc": pixels * tn * acc_bytes,
               "epi": pixels * out_pixel_stride(pw, tn, arch) * acc_bytes}
    buffers.update({"dw_bias_pad": tk * acc_bytes} if dw.bias_shape else {})
    buffers.update({"bias_pad": tn * acc_bytes} if pw.bias_shape else {})
    one_block = Tiling(tm, tn, tk, tm, tn, round_up(dw.lhs_shape[1], tk), tw=tw)
    buffers.update({"res_pad": pixels * tn * acc_bytes} if pw.residual_shape and not window_shortcut(spec, one_block)
                   else {})
    return buffers


def window_shortcut(spec, tiling: Tiling) -> bool:
    """Whether the pointwise's residual, the depthwise's own input (a shortcut), is read from the
    depthwise's window (its padded coordinates hold the input's pixels): when one block holds
    every channel, the window is there for the whole tile, and the residual needs no load."""
    return bool(getattr(spec, "shortcut", False)) and tiling.kp == tiling.tk and tiling.tn <= tiling.kp


def estimate_cycles(spec, t: Tiling, arch: HardwareDescription) -> int:
    """First-order cycles, each command priced by the simulator's cost model (cgra_sim.cost).
    With double buffering the busiest unit per tile sets the pace (`tile_costs`); plus the
    first loads and the last store."""
    dw = spec.depthwise
    costs = tile_costs(spec, t, arch)
    tiles = dw.lhs_shape[0] * (t.mp // t.tm) * (padded_columns(dw, t) // t.tw)
    return costs.loop(arch, tiles, costs.first_load).total


@dataclasses.dataclass(frozen=True)
class TileCosts:
    """One tile's work on each unit: PE-array and vector-unit cycles, bytes loaded and stored,
    and the bytes of its first block's loads (which nothing overlaps on the first tile)."""

    compute: int
    vector: int
    load: int
    store: int
    first_load: int

    def loop(self, arch: HardwareDescription, tiles: int, first_load: int) -> cost.LoopCycles:
        """`tiles` such tiles double-buffered, the first loading `first_load` bytes: the busiest
        unit sets the pace, no round trip, the last tile priced as a whole step and then stored.
        The form the search was tuned with: the round trips pick a slower tile for MobileNetV2's
        first block on cgra-8x8 (4384 -> 5022 cycles), the plain tail slower tiles for the
        inverted residual block."""
        return cost.double_buffered_cycles(arch, cost.BufferedLoop(
            tiles, cost.dma_transfer_cycles(arch, self.load), (self.compute, self.vector),
            cost.dma_transfer_cycles(arch, self.store), first_load=cost.dma_transfer_cycles(arch, first_load),
            last_work=0, round_trips=(), whole_last_step=True))


def tile_costs(spec, t: Tiling, arch: HardwareDescription, window_loaded: bool = True) -> TileCosts:
    """A tile's work: the PE array (per block one DEPTHWISE, its window streamed at the
    scratchpad's width, and a GEMM per row; a GEMM waits for its row's depthwise EPILOGUE, so
    one row's EPILOGUE per block is a bubble), the load engine (per block the window, unless the
    kernel computes it (`window_loaded` False), and the weights; the residual), the vector unit
    (FILLs, the depthwise's and the pointwise's EPILOGUEs) and the store engine."""
    dw, pw = spec.depthwise, spec.pointwise
    in_bytes, acc_bytes = DType.from_name(dw.dtype).itemsize, DType.from_name(dw.acc_dtype).itemsize
    width, (kh, kw) = t.tw, dw.rhs_shape[2:]
    in_h = window_extent(t.tm, kh, dw.strides[0], dw.dilation[0])
    in_w = window_extent(width, kw, dw.strides[1], dw.dilation[1])
    pixels, taps, blocks = t.tm * width, kh * kw, t.kp // t.tk
    window = in_h * in_w * window_stride(dw, t.tk, t.tw, arch) * in_bytes
    depthwise = cost.depthwise_steady_cycles(arch, pixels, t.tk, taps, dw.dtype, window + taps * t.tk * in_bytes
                                             + pixels * t.tk * acc_bytes) + cost.depthwise_fill_cycles(arch, dw.dtype)
    gemm = t.tm * cost.gemm_steady_cycles(arch, width, t.tn, t.tk, pw.dtype) + cost.gemm_fill_cycles(arch, width, t.tn)
    bubble = cost.vector_cycles(arch, width, t.tk)
    compute = blocks * (depthwise + bubble + gemm)
    block_load = ((in_h * in_w if window_loaded else 0) + taps + t.tn) * t.tk * in_bytes + \
        (t.tk * acc_bytes if dw.bias_shape else 0)
    residual = pixels * t.tn * acc_bytes if pw.residual_shape else 0
    vector = blocks * t.tm * cost.vector_cycles(arch, width, t.tk) + t.tm * (
        cost.vector_cycles(arch, width, t.tn) + cost.vector_cycles(arch, width, t.tn, 2 if residual else 1))
    residual = 0 if window_shortcut(spec, t) else residual  # streamed by the EPILOGUE, not loaded
    return TileCosts(compute, vector, blocks * block_load + residual, pixels * t.tn * acc_bytes, block_load)
