"""Tile sizes: how a kernel is cut to fit the PE array and the scratchpad.

Stage: target hook (before scheduling). Input: a kernel's `KernelSpec` (for a GEMM-shaped kernel,
its GEMM extents and dtypes) and the hardware description. Output: a `Tiling` with scratchpad
tile sizes (tm, tn, tk) that are whole multiples of the PE array (rows, cols) and whose buffers
fit the scratchpad, and the padded extents (mp, np, kp) the kernel iterates over. A depthwise
kernel's tiles are output rows x channels (see `choose_depthwise_tiling`), a pooling kernel's
whole images x channels (`choose_pool_tiling`).
"""

from __future__ import annotations

import dataclasses

from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from .errors import ScratchpadTooSmall
from .spad_layout import a_row_stride, out_row_stride, store_walks_rows, window_pixel_stride

#: Scratchpad buffers are placed 64-byte aligned by the code generator.
ALIGN = 64


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _aligned(nbytes: int) -> int:
    return _round_up(nbytes, ALIGN)


@dataclasses.dataclass(frozen=True)
class Tiling:
    tm: int  # rows of a scratchpad tile (PE-array folds of it run back to back)
    tn: int  # columns of a scratchpad tile (a multiple of the PE array's columns)
    tk: int  # reduction depth of a scratchpad tile
    mp: int  # padded extents: whole tiles
    np: int
    kp: int

    def spad_bytes(self, in_bytes: int, acc_bytes: int, has_bias: bool, has_residual: bool = False,
                   has_scale: bool = False, a_row: int | None = None, out_row: int | None = None) -> int:
        """Scratchpad the kernel's buffers take (operand tiles, accumulator, output, bias,
        residual tile, requantisation scale row), each twice: every tile is double-buffered
        (double_buffer.py). An int8 output is counted at the accumulator's size. `a_row` and
        `out_row`: the row strides (elements) of the A tile and the output tile when the
        schedule pads them against bank conflicts (spad_layout.py); compact by default."""
        a_row, out_row = a_row or self.tk, out_row or self.tn
        total = _aligned(2 * self.tm * a_row * in_bytes) + _aligned(2 * self.tk * self.tn * in_bytes)
        total += (2 if has_residual else 1) * _aligned(2 * self.tm * self.tn * acc_bytes)
        total += _aligned(2 * self.tm * out_row * acc_bytes)
        if has_bias:
            total += _aligned(2 * self.tn * acc_bytes)
        if has_scale:
            total += _aligned(2 * self.tn * 4)
        return total


def choose_kernel_tiling(spec, arch: HardwareDescription) -> Tiling:
    """The tiling of the kernel `spec` (a kernels.KernelSpec) describes."""
    if spec.op == "depthwise":
        return choose_depthwise_tiling(spec, arch)
    if spec.op == "pool":
        return choose_pool_tiling(spec, arch)
    if spec.op == "eltwise":
        from .eltwise import choose_eltwise_tiling  # eltwise.py builds on this module's Tiling
        return choose_eltwise_tiling(spec, arch)
    return choose_tiling(*spec.gemm_extents, spec.dtype, spec.acc_dtype, bool(spec.bias_shape), arch,
                         spec.row_step, has_residual=bool(spec.residual_shape),
                         has_scale=bool(spec.scale_shape), store_rows=store_walks_rows(spec))


def choose_tiling(rows: int, cols: int, depth: int, dtype: str, acc_dtype: str,
                  has_bias: bool, arch: HardwareDescription, row_step: int = 1,
                  has_residual: bool = False, has_scale: bool = False, store_rows: int = 0) -> Tiling:
    """The tiling with the fewest estimated cycles among those that fit the scratchpad.

    Output tiles grow in whole PE-array steps (rows: in multiples of `row_step` when the kernel
    needs whole groups of rows, e.g. whole output rows of a conv2d) up to the padded problem; for
    each, the reduction depth is the whole reduction when it fits, otherwise the largest chunk
    that does. A residual (`has_residual`) is one more output-sized tile in the scratchpad,
    loaded per output tile and read by the epilogue. The footprint counts the row padding the
    schedule adds against bank conflicts (A's rows; the output's when its store walks
    `store_rows` rows, see spad_layout.py).
    """
    row_step = row_step if row_step > 1 else arch.rows
    # A unit reduction extent would be elided by compute_at and leave nothing to tensorize
    # along; one zero column is cheaper than a special case.
    depth = max(depth, 2)
    in_bytes = DType.from_name(dtype).itemsize
    acc_bytes = DType.from_name(acc_dtype).itemsize
    best = None
    for tm in range(row_step, _round_up(rows, row_step) + 1, row_step):
        for tn in range(arch.cols, _round_up(cols, arch.cols) + 1, arch.cols):
            tk = _deepest_fitting_k(tm, tn, depth, in_bytes, acc_bytes, has_bias, arch, has_residual,
                                    out_row_stride(tn, acc_bytes, store_rows, arch), has_scale)
            if tk is None:
                continue
            tiling = Tiling(tm, tn, tk, _round_up(rows, tm), _round_up(cols, tn), _round_up(depth, tk))
            key = (estimate_cycles(tiling, dtype, in_bytes, acc_bytes, arch, has_residual), -tm * tn)
            if best is None or key < best[0]:
                best = (key, tiling)
    if best is None:
        raise ScratchpadTooSmall(
            f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold even one "
            f"{arch.rows}x{arch.cols} tile of a {dtype} GEMM: describe a larger scratchpad")
    return best[1]


def estimate_cycles(t: Tiling, dtype: str, in_bytes: int, acc_bytes: int, arch: HardwareDescription,
                    has_residual: bool = False) -> int:
    """A first-order estimate of a tiled GEMM's cycles under the simulator's timing model.

    With double buffering the busiest unit sets the pace; what cannot overlap is the first
    tile's loads (nothing to compute yet), the last tile's epilogue and store, and a bubble per
    tile: the vector unit runs in order, so the next tile's first FILL waits behind this tile's
    EPILOGUE, which waits for this tile's last GEMM, and the PE array refills after the gap.
    A residual adds its tile to each output tile's loads and to the epilogue's vector cycles.
    """
    tiles, steps = (t.mp // t.tm) * (t.np // t.tn), t.kp // t.tk
    passes = tiles * steps * -(-t.tm // arch.rows) * -(-t.tn // arch.cols)
    compute = passes * -(-t.tk // arch.macs_per_pe[dtype]) + arch.rows + arch.cols + arch.config_load_cycles
    tile_load = (t.tm * t.tk + t.tk * t.tn) * in_bytes
    residual_load = t.tm * t.tn * acc_bytes if has_residual else 0
    load = (tiles * steps * tile_load + tiles * residual_load) // arch.dma_bytes_per_cycle
    store = tiles * t.tm * t.tn * acc_bytes // arch.dma_bytes_per_cycle
    # fill and epilogue of every tile; the epilogue streams the residual tile too
    vector = (3 if has_residual else 2) * tiles * t.tm * t.tn // arch.vector_lanes
    prologue = arch.dma_latency + tile_load // arch.dma_bytes_per_cycle
    tail = t.tm * t.tn // arch.vector_lanes + arch.dma_latency + t.tm * t.tn * acc_bytes // arch.dma_bytes_per_cycle
    vector_tile = t.tm * t.tn // arch.vector_lanes  # one FILL or EPILOGUE of a tile
    bubble = (tiles - 1) * (2 * vector_tile + arch.rows + arch.cols)
    return max(compute, load, store, vector) + bubble + prologue + tail


def _deepest_fitting_k(tm, tn, depth, in_bytes, acc_bytes, has_bias, arch, has_residual, out_row,
                       has_scale=False):
    for tk in _k_candidates(depth):
        probe = Tiling(tm, tn, tk, tm, tn, tk)
        a_row = a_row_stride(tm, tk, in_bytes, arch)
        if probe.spad_bytes(in_bytes, acc_bytes, has_bias, has_residual, has_scale, a_row, out_row) \
                <= arch.spad_bytes:
            return tk
    return None


def _k_candidates(depth: int):
    """The whole reduction, then halvings of it (rounded up to a multiple of 8)."""
    tk = depth
    seen = set()
    while tk >= 1:
        candidate = tk if tk == depth else _round_up(tk, 8)
        if candidate not in seen:
            seen.add(candidate)
            yield candidate
        if tk == 1:
            break
        tk = -(-tk // 2)


def depthwise_padded_width(spec) -> int:
    """Output columns a depthwise kernel computes: at least 2, so that no loop of the tile has a
    unit extent (the scheduler's compute_at would drop it and leave nothing to tensorize)."""
    return max(spec.output_shape[3], 2)


def choose_depthwise_tiling(spec, arch: HardwareDescription) -> Tiling:
    """Tiles of a depthwise conv2d: `tm` whole output rows (>= 2) by `tn` channels (a multiple of
    the PE array's columns, >= 2), all taps at once (tk = kp = kh * kw); the one with the fewest
    estimated cycles among those whose double-buffered input window, weights, accumulator,
    output, bias and residual fit the scratchpad. mp and np: output rows and channels padded to
    whole tiles."""

    _, channels, _, _ = spec.lhs_shape
    _, _, kh, kw = spec.rhs_shape
    (sh, sw), (dh, dw) = spec.strides, spec.dilation
    rows, width = max(spec.output_shape[2], 2), depthwise_padded_width(spec)
    in_bytes, acc_bytes = DType.from_name(spec.dtype).itemsize, DType.from_name(spec.acc_dtype).itemsize
    in_w = (width - 1) * sw + (kw - 1) * dw + 1
    first_tn = _round_up(2, arch.cols)
    store_rows = store_walks_rows(spec)
    best = None
    for tm in range(2, rows + 1):
        in_h = (tm - 1) * sh + (kh - 1) * dh + 1
        for tn in range(first_tn, max(_round_up(channels, arch.cols), first_tn) + 1, arch.cols):
            pixel = window_pixel_stride(tn, in_bytes, sw, width, arch)  # padded pixels (spad_layout.py)
            footprint = _aligned(2 * in_h * in_w * pixel * in_bytes) + _aligned(2 * kh * kw * tn * in_bytes)
            compact_tiles = 2 if spec.residual_shape else 1  # accumulator (, residual)
            footprint += compact_tiles * _aligned(2 * tm * width * tn * acc_bytes)
            # the output tile, its pixels padded against bank conflicts (spad_layout.py)
            footprint += _aligned(2 * tm * width * out_row_stride(tn, acc_bytes, store_rows, arch) * acc_bytes)
            footprint += _aligned(2 * tn * acc_bytes) if spec.bias_shape else 0
            footprint += _aligned(2 * tn * 4) if spec.scale_shape else 0
            if footprint > arch.spad_bytes:
                continue
            tiling = Tiling(tm, tn, kh * kw, _round_up(rows, tm), _round_up(channels, tn), kh * kw)
            loaded = (in_h * in_w + kh * kw) * tn * in_bytes
            loaded += tm * width * tn * acc_bytes if spec.residual_shape else 0
            load = -(-loaded // arch.dma_bytes_per_cycle)
            key = (_depthwise_cycles(tiling, spec, width, load, arch), -tm * tn)
            if best is None or key < best[0]:
                best = (key, tiling)
    if best is None:
        raise ScratchpadTooSmall(
            f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold two output rows "
            f"of a {spec.lhs_shape} depthwise conv2d ({kh}x{kw}): describe a larger scratchpad")
    return best[1]


def _depthwise_cycles(t: Tiling, spec, width: int, load: int, arch: HardwareDescription) -> int:
    """First-order cycles of a tiled depthwise kernel under the simulator's timing model: with
    double buffering the busiest unit per tile sets the pace, plus the first load and last store."""
    images = spec.lhs_shape[0]
    tiles = images * (t.mp // t.tm) * (t.np // t.tn)
    pixels = t.tm * width
    acc_bytes = DType.from_name(spec.acc_dtype).itemsize
    compute = -(-pixels // arch.rows) * -(-t.tn // arch.cols) * -(-t.tk // arch.macs_per_pe[spec.dtype])
    store = -(-pixels * t.tn * acc_bytes // arch.dma_bytes_per_cycle)
    vector = t.tm * (-(-width * t.tn // arch.vector_lanes) + 2)
    return tiles * max(compute, load, store, vector) + load + store + 2 * arch.dma_latency


def pool_window_extents(spec) -> tuple[int, int]:
    """(rows, columns) of the input window a pooling kernel holds: every output's taps."""
    _, _, oh, ow = spec.output_shape
    (kh, kw), (sh, sw), (dh, dw) = spec.pool.size, spec.strides, spec.dilation
    return (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1


def choose_pool_tiling(spec, arch: HardwareDescription) -> Tiling:
    """Tiles of a pooling kernel: the whole output image (tm = output rows) by `tn` channels
    (>= 2, any count: the vector unit has no column alignment), kh * kw taps at once; the tn with
    the fewest estimated cycles among those whose double-buffered window and output fit the
    scratchpad. A whole image per tile keeps every tap's place in the padding known at compile
    time (pool_intrinsic.py). np: channels padded to whole tiles."""
    n, channels, _, _ = spec.lhs_shape
    _, _, oh, ow = spec.output_shape
    in_h, in_w = pool_window_extents(spec)
    taps = spec.pool.size[0] * spec.pool.size[1]
    size = DType.from_name(spec.dtype).itemsize
    best = None
    for tn in range(2, max(channels, 2) + 1):
        if _aligned(2 * in_h * in_w * tn * size) + _aligned(2 * oh * ow * tn * size) > arch.spad_bytes:
            break
        tiles = n * -(-channels // tn)
        key = (_pool_cycles(tiles, in_h * in_w * tn * size, oh * ow * tn * size, oh * ow * tn * taps, arch), -tn)
        if best is None or key < best[0]:
            best = (key, Tiling(oh, tn, taps, oh, _round_up(channels, tn), taps))
    if best is None:
        raise ScratchpadTooSmall(
            f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold the {in_h}x{in_w} input "
            f"window of two channels that a pooling kernel takes (the whole image at once): describe a "
            "larger scratchpad")
    return best[1]


def _pool_cycles(tiles: int, load_bytes: int, store_bytes: int, taps: int, arch: HardwareDescription) -> int:
    """First-order cycles of a tiled pooling kernel under the simulator's timing model: the
    busiest unit per tile, or, with two copies of each buffer, half of a buffer's round trip
    (a window is loaded, with the DMA latency, then pooled before the load two tiles later can
    reuse it; an output is pooled, then stored, with the latency, before it is written again);
    plus the first load and the last store."""
    load = -(-load_bytes // arch.dma_bytes_per_cycle)
    store = -(-store_bytes // arch.dma_bytes_per_cycle)
    vector = -(-taps // arch.vector_lanes) + 2
    period = max(load, vector, store, -(-(arch.dma_latency + load + vector) // 2),
                 -(-(vector + arch.dma_latency + store) // 2))
    return tiles * period + 2 * arch.dma_latency + load + store
