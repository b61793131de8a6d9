"""A pooling kernel's tiles: the POOL window a tile holds, the blocks of outputs along a
symbolic image height or width, and the tile search (tn channels of a whole image, or blocks of
outputs by tn channels), each candidate priced by the simulator's cost model.

Stage: tiling (pool.py's family calls `choose_pool_tiling`); pool.py's compute and schedule read
the window and the blocks from here.
"""

from __future__ import annotations

import functools
import itertools
import math
from fractions import Fraction

from tvm import sym, tirx

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription
from cgra_sim.banks import beat_slowdown
from cgra_sim.isa import DType

from ...errors import ScratchpadTooSmall
from ..common.dynamic import dim_var
from ..intrinsics.vector_unit import PoolWindow
from ..common.spec import HELD_HALO_TRIPS, KernelSpec, Tiling, aligned, round_up


def pool_window(spec: KernelSpec) -> PoolWindow:
    """The POOL window of a pooling kernel's tile (a whole image), rectangles in window positions."""
    _, _, h, w = spec.lhs_shape
    top, left, bottom, right = spec.padding
    valid = (top, top + h, left, left + w)
    count = None
    if spec.pool.kind == "avg":
        count = (0, top + h + bottom, 0, left + w + right) if spec.pool.count_include_pad else valid
    return PoolWindow(spec.pool.kind, tuple(spec.pool.size), tuple(spec.strides), tuple(spec.dilation),
                      valid, count)


def window_extents(spec: KernelSpec) -> tuple[int, int]:
    """(rows, columns) of the input window a pooling kernel holds: every output's taps."""
    _, _, oh, ow = spec.output_shape
    (kh, kw), (sh, sw), (dh, dw) = spec.pool.size, spec.strides, spec.dilation
    return (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1


def symbolic_axes(spec: KernelSpec) -> list:
    """(0 for the height or 1 for the width, its output extent as the kernel indexes it) of each
    of a pool's symbolic image axes. Its tiles cut each into blocks of outputs (`block_sizes`),
    and one POOL window serves every block: every tap along the axis is valid and
    counted, because the padding along it is in the scratchpad, loaded with the window as the
    DMA's halo: the dtype's lowest value for a max pool (DMA_FILL_LOWEST), zeros for an average
    that counts the padding. In ceil mode (a max pool) the last windows reach past the padded
    image into more halo, lowest values that their max skips as the static kernel's does. The
    last block is cut to the outputs that exist, its window load to the rows (or columns) they
    read (lower/ragged.py)."""
    names, axes = spec.symbolic("lhs"), []
    for index, axis in enumerate("HW"):
        name = names.get(spec.data_layout.index(axis))
        if name is not None:
            k, step, spacing = spec.pool.size[index], spec.strides[index], spec.dilation[index]
            lo, span = spec.padding[index], dim_var(name) + spec.padding[index] + spec.padding[index + 2] - \
                spacing * (k - 1) - 1
            if spec.pool.ceil_mode:  # a last window must start inside the image or its leading padding
                outputs = tirx.ceildiv(span, step) + 1
                outputs = outputs - tirx.Select((outputs - 1) * step >= dim_var(name) + lo, 1, 0)
            else:
                outputs = tirx.floordiv(span, step) + 1
            axes.append((index, sym.Analyzer().simplify(outputs)))
    return axes


def blocked_axes(spec: KernelSpec, tiling: Tiling) -> list:
    """`symbolic_axes`, or for a static image too large for the scratchpad, its height in blocks
    of `tiling.tm` output rows [(0, output rows)]: the same kind of blocks, every tap along the
    height in the block's window (its padding loaded with the window), the last block's outputs
    past the image computed and not stored."""
    axes = symbolic_axes(spec)
    if not axes and tiling.tm < spec.output_shape[2]:
        return [(0, spec.output_shape[2])]
    return axes


def block_sizes(axes: list, tiling: Tiling) -> dict:
    """{axis index: outputs per block} of a pool's symbolic axes: tiling.tm along the only one,
    or tm rows by tw columns when both are symbolic. Each block loop cuts its last block to
    the outputs that exist (lower/ragged.py, one cut per block loop of more than one output)."""
    if len(axes) == 2:
        return {0: tiling.tm, 1: tiling.tw}
    return {index: tiling.tm for index, _ in axes}


def choose_pool_tiling(spec: KernelSpec, arch: HardwareDescription) -> Tiling:
    """The whole output image (tm = output rows) by `tn` channels (>= 2, any count: the vector
    unit has no column alignment), kh * kw taps at once: the tn with the fewest estimated cycles
    among those whose double-buffered window and output fit the scratchpad. np: channels padded
    to whole tiles. With symbolic image axes, `_choose_block_tiling`."""
    if symbolic_axes(spec):
        return _choose_block_tiling(spec, arch)
    _, channels, _, _ = spec.lhs_shape
    _, _, oh, ow = spec.output_shape
    in_h, in_w = window_extents(spec)
    taps = spec.pool.size[0] * spec.pool.size[1]
    size = DType.from_name(spec.dtype).itemsize
    best = None
    for tn in range(2, max(channels, 2) + 1):
        if aligned(2 * in_h * in_w * tn * size) + aligned(2 * oh * ow * tn * size) > arch.spad_bytes:
            break
        key = (_static_cycles(spec, oh, tn, arch), -tn)
        if best is None or key < best[0]:
            best = (key, Tiling(oh, tn, taps, oh, round_up(channels, tn), taps))
    if best is None:
        return _choose_row_blocks(spec, arch)
    return best[1]


def _choose_row_blocks(spec: KernelSpec, arch: HardwareDescription) -> Tiling:
    """A static image whose whole window of two channels does not fit the scratchpad: blocks of
    `tm` output rows (`blocked_axes`) by `tn` channels, the fewest estimated cycles among those
    whose double-buffered block window and output fit (the last block computes the rows past the
    image too). An average in ceil mode or leaving its padding out of the count cannot be blocked
    this way: the block's window counts every tap along the height."""
    _, channels, _, _ = spec.lhs_shape
    _, _, oh, ow = spec.output_shape
    if spec.pool.kind == "avg" and (spec.pool.ceil_mode or (spec.padding[0] or spec.padding[2])
                                    and not spec.pool.count_include_pad):
        raise ScratchpadTooSmall(
            f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold the whole image that an average "
            "pool in ceil mode or leaving its padding out of the count (count_include_pad=False) takes: describe a "
            "larger scratchpad")
    k, step, spacing = spec.pool.size[0], spec.strides[0], spec.dilation[0]
    cols = window_extents(spec)[1]
    taps = spec.pool.size[0] * spec.pool.size[1]
    size = DType.from_name(spec.dtype).itemsize
    best = None
    for tm in range(1, oh):
        rows = (tm - 1) * step + (k - 1) * spacing + 1
        for tn in channel_candidates(channels):
            if aligned(2 * rows * cols * tn * size) + aligned(2 * tm * ow * tn * size) > arch.spad_bytes:
                break
            key = (_static_cycles(spec, tm, tn, arch), -tm, -tn)
            if best is None or key < best[0]:
                best = (key, Tiling(tm, tn, taps, round_up(oh, tm), round_up(channels, tn), taps))
    if best is None:
        raise ScratchpadTooSmall(
            f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold the input window of one output "
            f"row ({cols} columns) of two channels that a pooling kernel takes: describe a larger scratchpad")
    return best[1]


def _choose_block_tiling(spec: KernelSpec, arch: HardwareDescription) -> Tiling:
    """A pool with a symbolic height, width or both: blocks of outputs (`block_sizes`), a power of
    two along each symbolic axis and the whole of a static one, by tn channels; the block whose
    estimate, at sizes up to the bound (`spec.output_shape`; square images from
    SMALLEST_OUTPUT_SIDE when both axes are symbolic), is the closest to a kernel compiled for
    that size (minimax regret). Along each block axis the whole blocks run first, then the
    ragged last one, its POOL and window load cut to the outputs that exist."""
    n, channels, _, _ = spec.lhs_shape
    axes = [index for index, _ in symbolic_axes(spec)]
    static = spec.output_shape[2:]
    bound = min(static[index] for index in axes)
    taps = spec.pool.size[0] * spec.pool.size[1]
    size = DType.from_name(spec.dtype).itemsize
    window = pool_window(spec)

    def blocked(extent: int) -> tuple[int, int]:
        """A block of `extent` outputs along every symbolic axis."""
        return tuple(extent if index in axes else static[index] for index in (0, 1))

    def spans(block):
        return window.extent(block[0], 0), window.extent(block[1], 1)

    # Channel tiles: every count from 2 along one symbolic axis; with two (blocks of rows x
    # columns, 0.6 s of search for a 64-channel pool that way) powers of two and even splits of
    # the channels. (Pruned along one axis too, a 2x2/2 pool of 32 channels took 1.28x static at
    # 2 and 3 columns on cgra-16x16.)
    counts = range(2, max(channels, 2) + 1) if len(axes) == 1 else channel_candidates(channels)

    def channel_counts(block):
        """The tn that fit the scratchpad beside a double-buffered block (window and output)."""
        rows, cols = spans(block)
        for tn in counts:
            if aligned(2 * rows * cols * tn * size) + aligned(2 * block[0] * block[1] * tn * size) > arch.spad_bytes:
                break
            yield tn

    @functools.cache
    def commands(block, tn: int):
        """(load, pool, store) cycles of one block (the last one cut to what exists)."""
        rows, cols = spans(block)
        outputs = block[0] * block[1] * tn
        return _commands(rows * cols * tn * size, outputs * size, outputs * taps, arch,
                         _banks(spec, arch, rows, cols, tn), _banks(spec, arch, *block, tn))

    def cycles(candidate, extent: int) -> int:
        """Per channel tile: the whole blocks, and along each symbolic axis the ragged last one,
        cut to the outputs that exist."""
        block, tn = candidate
        tiles = n * -(-channels // tn)
        kinds = []  # per symbolic axis: (blocks, outputs of each)
        for axis in axes:
            whole, rest = divmod(extent, block[axis])
            kinds.append([(count, outputs) for count, outputs in ((whole, block[axis]), (1 if rest else 0, rest))
                          if count])
        total = 0
        for combination in itertools.product(*kinds):
            shape = block
            for axis, (_, outputs) in zip(axes, combination):
                shape = _with(shape, axis, outputs)
            total += tiles * math.prod(count for count, _ in combination) * \
                cost.buffered_step_cycles(arch, _loop(1, *commands(shape, tn)))
        first = block
        for axis in axes:
            first = _with(first, axis, min(block[axis], extent))
        return cost.double_buffered_cycles(arch, _loop(tiles, *commands(first, tn), steady=total)).total

    # Powers of two: up to the first at or past the bound along one axis, up to the bound when
    # both are symbolic.
    powers = [1 << k for k in range(bound.bit_length() + 1)]
    powers = [p for p in powers if p <= max(bound, 1)] if len(axes) == 2 else \
        [p for p in powers if p < bound] + [next(p for p in powers if p >= bound)]
    blocks = [blocked(p) for p in powers] if len(axes) == 1 else [(tm, tw) for tm in powers for tw in powers]
    candidates = [(block, tn) for block in blocks for tn in channel_counts(block)]
    if not candidates:
        raise ScratchpadTooSmall(
            f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold a pooling window of one output "
            "along its symbolic axes and two channels: describe a larger scratchpad")
    # Powers of two from one output to the bound. (Adding the sizes halfway between them made the
    # choice worse on cgra-8x8: the estimate is not that exact.)
    smallest = SMALLEST_OUTPUT_SIDE if len(axes) == 2 else 1
    sizes = sorted({min(bound, 1 << k) for k in range(bound.bit_length() + 1)} - set(range(min(bound, smallest))))
    # The reference at a size: a kernel compiled for it (one block of every output, if it fits).
    fastest = {s: min([cycles(c, s) for c in candidates] + [cycles((blocked(s), tn), s) for tn in
                                                            channel_counts(blocked(s))]) for s in sizes}
    block, tn = min(candidates, key=lambda c: (max(cycles(c, s) / fastest[s] for s in sizes), cycles(c, bound)))
    tm = block[axes[0]]
    return Tiling(tm, tn, taps, round_up(static[axes[0]], tm), round_up(channels, tn), taps,
                  tw=block[1] if len(axes) == 2 else 0)


def channel_candidates(channels: int) -> list:
    """Channel tile sizes a search that weighs many blocks tries: powers of two and even splits
    of the channels, from 2 (the estimates favour few, large tiles; every count would make the
    search quadratic in the channels)."""
    counts = {1 << k for k in range(1, channels.bit_length() + 1)} | {-(-channels // k) for k in range(1, 9)}
    return sorted(tn for tn in counts if 2 <= tn <= max(channels, 2))


def _with(block: tuple, axis: int, extent: int) -> tuple:
    return tuple(extent if index == axis else value for index, value in enumerate(block))


#: The smallest square output (a side, in outputs) a pool's tiles for a symbolic height and width
#: are weighed on: smaller images run few blocks, whatever their size. (8 left a 7 x 7 ResNet
#: stem pool at 1.31x static on cgra-16x16; 2 gave up 9% at large sizes; 4: at most 1.08.)
SMALLEST_OUTPUT_SIDE = 4


def _banks(spec: KernelSpec, arch: HardwareDescription, rows: int, cols: int, channels: int):
    """The scratchpad banks' slowdown of a DMA moving a (rows, cols, channels) tile (stored
    row, column, channel) in the order of the tensor's layout: a narrow block walks the tile
    with a stride and can put a beat's elements in few banks (cgra_sim.banks, as the simulator
    charges it)."""
    size = DType.from_name(spec.dtype).itemsize
    extents = {"N": 1, "C": channels, "H": rows, "W": cols}
    strides = {"N": 0, "C": size, "H": cols * channels * size, "W": channels * size}
    return beat_slowdown(arch.dma_bytes_per_cycle, [extents[a] for a in spec.data_layout],
                         [strides[a] for a in spec.data_layout], size, 0, arch.spad_banks, arch.bank_width_bytes)


def estimate_pool_cycles(spec: KernelSpec, tiling: Tiling, arch: HardwareDescription) -> int:
    """The search's estimate of a static-shape pooling kernel on `tiling`: whole images, or
    blocks of `tiling.tm` output rows (`blocked_axes`), by `tiling.tn` channels."""
    return _static_cycles(spec, tiling.tm, tiling.tn, arch)


def _static_cycles(spec: KernelSpec, tm: int, tn: int, arch: HardwareDescription) -> int:
    """`estimate_pool_cycles` of tiles of tm output rows (all of them: the whole image) by tn
    channels; a block of rows pays its DMAs' bank slowdowns (`_banks`)."""
    n, channels, _, _ = spec.lhs_shape
    _, _, oh, ow = spec.output_shape
    size = DType.from_name(spec.dtype).itemsize
    taps = spec.pool.size[0] * spec.pool.size[1]
    rows, cols = window_extents(spec)
    if tm == oh:
        tiles = n * -(-channels // tn)
        top, left = spec.padding[:2]
        inside = min(rows - top, spec.lhs_shape[2]) * min(cols - left, spec.lhs_shape[3])
        # The tiles after the two buffer copies' first load the window's inside alone, its halo
        # (padding, ceil mode's overhang) held in the copy (lower/held_halos.py), when every
        # tile's box is alike (a cut last channel tile's is not: no halo is held).
        held = cost.dma_transfer_cycles(arch, inside * tn * size) \
            if inside < rows * cols and channels % tn == 0 and 2 < tiles <= HELD_HALO_TRIPS else None
        return _estimate_cycles(tiles, rows * cols * tn * size, oh * ow * tn * size, oh * ow * tn * taps, arch,
                                held_load=held)
    rows = (tm - 1) * spec.strides[0] + (spec.pool.size[0] - 1) * spec.dilation[0] + 1
    return _estimate_cycles(n * -(-channels // tn) * -(-oh // tm), rows * cols * tn * size, tm * ow * tn * size,
                            tm * ow * tn * taps, arch, _banks(spec, arch, rows, cols, tn), _banks(spec, arch, tm, ow, tn))


def _estimate_cycles(tiles: int, load_bytes: int, store_bytes: int, taps: int, arch: HardwareDescription,
                     load_slowdown=1, store_slowdown=1, held_load: int | None = None) -> int:
    """First-order cycles of a tiled pooling kernel, each command priced by the simulator's cost
    model (cgra_sim.cost), the tiles a double-buffered loop of window load, POOL and store
    (`_loop`); `held_load`: the load of the tiles after the first two (cost.BufferedLoop)."""
    commands = _commands(load_bytes, store_bytes, taps, arch, load_slowdown, store_slowdown)
    return cost.double_buffered_cycles(arch, _loop(tiles, *commands, held_load=held_load)).total


def _loop(tiles: int, load: int, vector: int, store: int, steady: int | None = None,
          held_load: int | None = None) -> cost.BufferedLoop:
    """The pool's loop of tiles: each a window load, a POOL and a store; the last tile priced as a
    whole step, its POOL not again (the form the searches were tuned with: the plain tail picks
    slower tiles for SqueezeNet's pools, a 3 x 3 / 2 max on cgra-4x4 15924 -> 16140 cycles)."""
    return cost.BufferedLoop(tiles, load, (vector,), store, last_work=0, steady=steady, whole_last_step=True,
                             held_load=held_load)


def _commands(load_bytes: int, store_bytes: int, taps: int, arch: HardwareDescription, load_slowdown=1,
              store_slowdown=1) -> tuple[int, int, int]:
    """Cycles of a tile's window load, POOL and store (cgra_sim.cost)."""
    return (cost.dma_transfer_cycles(arch, load_bytes, Fraction(load_slowdown)), cost.pool_cycles(arch, taps),
            cost.dma_transfer_cycles(arch, store_bytes, Fraction(store_slowdown)))
