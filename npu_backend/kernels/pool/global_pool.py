"""A global average pool over an image whose height or width is known only at run time.

Stage: kernel definition, schedule and tiling, for the pool family (pool.py dispatches here when
a global average's image has a symbolic axis). The static kernel pools the whole image with one
POOL per channel tile, its window as large as the image; here the window's size is unknown, so
the image is summed in blocks of bh x bw pixels and the sum divided by the run-time area:

    a_pad   one block of the image in the scratchpad, (rows, columns, channels), the part past
            the image zero (the DMA halo: zeros add nothing to a sum)
    part    the block's sum: a POOL "average" whose count rectangle holds one tap (divides by 1)
    acc     the running sum of the blocks (FILL 0, then one ELTWISE add per block)
    scale   1 / (H * W), a FILL whose value the kernel computes from the tensor's shape at run
            time (the only run-time scalar in the command stream; tensorize matches it because
            description and kernel share the dimensions' TIR variables, dynamic.dim_var)
    scaled  acc * scale (ELTWISE multiply, the scale broadcast), stored to the output

Per image and channel tile: blocks row by row, each loaded, pooled and added, then the multiply
and the store. A last block along a symbolic axis is cut to the pixels that exist (its POOL's kh
or kw and its window load, lower/ragged.py), so no block moves or sums what lies past the image.
"""

from __future__ import annotations

import functools

from tvm import te, tirx

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ...errors import ScratchpadTooSmall
from ..common.dynamic import CUT_PARAMS, batch_extent, dim_var
from ..intrinsics import SPAD, get_intrin
from ..intrinsics.vector_unit import PoolWindow, pool_value
from ..common.operands import kernel_prim_func, padded, stored
from .pool_tiles import channel_candidates
from ..common.spec import KernelSpec, Tiling, aligned, round_up

#: Block sides tried along each axis (a static axis smaller than a side is taken whole). The
#: POOL's expression is as deep as its window, so a block stays at most 16 x 16 taps
#: (normalise/large_pools.py: much deeper windows overflow TVM's recursion).
BLOCK_SIDES = (1, 2, 4, 8, 16)
#: The smallest image side (along the symbolic axes) the block search weighs.
SMALLEST_SIDE = 4


def is_symbolic_global(spec: KernelSpec) -> bool:
    """A global average pool whose image height or width is symbolic."""
    return spec.pool is not None and spec.pool.whole and spec.symbolic_image


def area_reciprocal(image: tuple):
    """1 / (H * W) in float32 from the image's extents (ints or TIR variables): the kernel's
    `scale` and its FILL's value, one expression for both so that tensorize matches them."""
    h, w = image
    return tirx.const(1.0, "float32") / tirx.Cast("float32", h * w)


def _image(spec: KernelSpec) -> tuple:
    """(H, W) as the kernel indexes them: ints, or the symbolic axes' variables."""
    names = spec.symbolic("lhs")
    return tuple(dim_var(names[spec.data_layout.index(axis)]) if spec.data_layout.index(axis) in names else extent
                 for axis, extent in zip("HW", spec.lhs_shape[2:]))


def _block_window(bh: int, bw: int) -> PoolWindow:
    """A POOL summing one block: its window is the block, its count rectangle one tap."""
    return PoolWindow("avg", (bh, bw), (bh, bw), (1, 1), (0, bh, 0, bw), (0, 1, 0, 1))


def global_pool_compute(spec: KernelSpec, tiling: Tiling):
    """out[b, c] (in the spec's layout, H and W of extent 1) = the mean of image b, channel c."""
    n = batch_extent(spec)
    channels = spec.lhs_shape[1]
    image = _image(spec)
    bh, bw = tiling.tm, tiling.tw
    rows, cols = (tirx.ceildiv(extent, side) if not isinstance(extent, int) else -(-extent // side)
                  for extent, side in zip(image, (bh, bw)))
    data_shape = stored((n, channels, *image), "NCHW", spec.data_layout)
    x = te.placeholder(data_shape, spec.dtype, name="data")
    a_pad = te.compute((n, rows * bh, cols * bw, tiling.np), lambda b, py, px, c: padded(
        x, data_shape, stored((b, c, py, px), "NCHW", spec.data_layout)), name="a_pad")
    window = _block_window(bh, bw)
    part = te.compute((n, rows, cols, tiling.np), lambda b, i, j, c: pool_value(
        lambda py, px, ch: a_pad[b, py, px, ch], i, j, c, window, (1, 1), spec.dtype), name="part")
    ri, rj = te.reduce_axis((0, rows), name="ri"), te.reduce_axis((0, cols), name="rj")
    acc = te.compute((n, tiling.np), lambda b, c: te.sum(part[b, ri, rj, c], axis=[ri, rj]), name="acc")
    reciprocal = area_reciprocal(image)
    scale = te.compute((1, 1), lambda i, j: reciprocal, name="scale")
    scaled = te.compute((n, tiling.np), lambda b, c: acc[b, c] * scale[0, 0], name="scaled")

    def stored_out(*index):
        axis = dict(zip(spec.out_layout, index))
        return scaled[axis["N"], axis["C"]]

    out = te.compute(stored((n, channels, 1, 1), "NCHW", spec.out_layout), stored_out, name="out")
    func = kernel_prim_func(spec, {"lhs": x}, out)
    # A last block along a symbolic axis: its POOL's kh / kw cut to the pixels that exist, one
    # per tile loop (block rows, then block columns), its window load cut to the image by
    # lower/ragged.py's default box cut. Along a static axis a last ragged block runs whole, its
    # halo zero-filled; a block of one pixel needs no cut (and its loop is no tile loop).
    names = spec.symbolic("lhs")
    cuts = [param for axis, param, side in (("H", "kh", bh), ("W", "kw", bw))
            if spec.data_layout.index(axis) in names and side > 1]
    return func.with_attr(CUT_PARAMS, {"cgra_pool": cuts})


def schedule_global_pool(sch, spec: KernelSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """Per (image, tn channels): FILL the sum; per block a DMA of its window, a POOL and an
    ELTWISE add; then the multiply by the FILLed 1 / (H * W) and one DMA store."""
    del arch
    scaled = sch.get_sblock("scaled")
    image, channels = sch.get_loops(scaled)
    tile, channel = sch.split(channels, [None, tiling.tn])
    sch.set_scope(scaled, 0, SPAD)
    acc = sch.get_sblock("acc")
    sch.compute_at(acc, tile)
    sch.set_scope(acc, 0, SPAD)
    # Under the channel tile: the channels, then the block loops (one of extent 1, a static
    # axis taken whole, is gone); the block loops go outside the channels.
    acc_channel, *block_loops = sch.get_loops(acc)[2:]
    sch.reorder(*block_loops, acc_channel)
    part = sch.get_sblock("part")
    sch.compute_at(part, block_loops[-1])
    sch.set_scope(part, 0, SPAD)
    a_pad = sch.get_sblock("a_pad")
    sch.compute_at(a_pad, block_loops[-1])
    sch.set_scope(a_pad, 0, SPAD)
    scale = sch.get_sblock("scale")
    sch.set_scope(scale, 0, SPAD)
    sch.reverse_compute_at(sch.get_sblock("out"), tile)
    init = sch.decompose_reduction(acc, block_loops[0])
    # The intrinsics' tiles have a row (and a POOL's output a column) of extent 1: unit loops
    # above the channel loops, so each tile's loop nest is the intrinsic's.
    sch.tensorize(sch.add_unit_loop(sch.get_loops(init)[-1]), get_intrin("fill", 1, tiling.tn, spec.dtype))
    sch.tensorize(sch.add_unit_loop(acc_channel), get_intrin("accumulate", 1, tiling.tn, spec.dtype))
    pool_loop = sch.add_unit_loop(sch.add_unit_loop(sch.get_loops(part)[-1]))
    sch.tensorize(pool_loop, get_intrin("pool", 1, 1, tiling.tn, _block_window(tiling.tm, tiling.tw), spec.dtype))
    sch.tensorize(sch.get_loops(scale)[0], get_intrin("fill", 1, 1, spec.dtype, value=area_reciprocal(_image(spec))))
    multiply = get_intrin("eltwise", 1, tiling.tn, "multiply", spec.dtype, a_full=(True, True), b_full=(False, False))
    sch.tensorize(sch.add_unit_loop(channel), multiply)


def choose_global_tiling(spec: KernelSpec, arch: HardwareDescription) -> Tiling:
    """Blocks of bh x bw pixels (BLOCK_SIDES; a static axis smaller than the side taken whole) by
    tn channels whose double-buffered window fits the scratchpad: the candidate whose estimate,
    over square images (or lines along the one symbolic axis) from one pixel a side to the bound,
    is the closest to the static kernel's for that size (minimax regret), as pool_tiles does."""
    n, channels, h, w = spec.lhs_shape
    names = spec.symbolic("lhs")
    symbolic = [spec.data_layout.index(axis) in names for axis in "HW"]
    size = DType.from_name(spec.dtype).itemsize
    bound = min(extent for extent, sym in zip((h, w), symbolic) if sym)

    def image_at(side: int) -> tuple:
        return tuple(side if sym else extent for extent, sym in zip((h, w), symbolic))

    def fits(block_bytes: int, tn: int) -> bool:
        return aligned(2 * block_bytes * tn) + 4 * aligned(tn * size) + aligned(size) <= arch.spad_bytes

    cycles = global_cycles(spec, arch)

    @functools.cache
    def static(side: int) -> int:
        """The static kernel at this size: one POOL over the whole image per channel tile."""
        ih, iw = image_at(side)
        best = None
        for tn in range(2, max(channels, 2) + 1):
            if aligned(2 * ih * iw * tn * size) + aligned(2 * tn * size) > arch.spad_bytes:
                break
            load = cost.dma_transfer_cycles(arch, ih * iw * tn * size)
            store = cost.dma_transfer_cycles(arch, tn * size)
            total = cost.double_buffered_cycles(arch, cost.BufferedLoop(
                n * -(-channels // tn), load, (cost.pool_cycles(arch, ih * iw * tn),), store, last_work=0,
                whole_last_step=True)).total
            best = total if best is None else min(best, total)
        return best

    def side_of(extent: int, sym: bool, side: int) -> int:
        return side if sym else min(extent, side)

    counts = channel_candidates(channels)
    candidates = sorted({(side_of(h, symbolic[0], bh), side_of(w, symbolic[1], bw), tn)
                         for bh in BLOCK_SIDES for bw in BLOCK_SIDES for tn in counts
                         if fits(side_of(h, symbolic[0], bh) * side_of(w, symbolic[1], bw) * size, tn)})
    if not candidates:
        raise ScratchpadTooSmall(f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold a block of "
                                 "one pixel of two channels twice: describe a larger scratchpad")
    # Powers of two from SMALLEST_SIDE (smaller images are a block or two, whatever the block),
    # and one past each: an image one pixel past a block runs a short block more per row and
    # column (64 channels at 9 x 9 on cgra-8x8 took 1.48x static when only powers were weighed).
    powers = {1 << k for k in range(bound.bit_length() + 1)}
    sides = sorted({min(bound, side) for side in powers | {p + 1 for p in powers}} -
                   set(range(min(bound, SMALLEST_SIDE))))
    references = {side: static(side) for side in sides}
    sides = [side for side in sides if references[side] is not None]

    def regret(candidate) -> tuple:
        worst = max((cycles(*candidate, side) / references[side] for side in sides), default=0)
        return worst, cycles(*candidate, bound)

    bh, bw, tn = min(candidates, key=regret)
    return Tiling(bh, tn, bh * bw, round_up(h, bh), round_up(channels, tn), bh * bw, tw=bw)


def estimate_global_cycles(spec: KernelSpec, tiling: Tiling, arch: HardwareDescription, side: int) -> int:
    """The search's estimate of the block kernel on `tiling` (bh = tm, bw = tw, tn) for an image
    of `side` pixels along its symbolic axes."""
    return global_cycles(spec, arch)(tiling.tm, tiling.tw, tiling.tn, side)


def global_cycles(spec: KernelSpec, arch: HardwareDescription):
    """cycles(bh, bw, tn, side): the estimate of blocks of bh x bw pixels by tn channels for an
    image of `side` pixels along its symbolic axes, each channel tile a double-buffered loop of
    block loads and their POOL and ELTWISE add (cost.double_buffered_cycles)."""
    n, channels, h, w = spec.lhs_shape
    names = spec.symbolic("lhs")
    symbolic = [spec.data_layout.index(axis) in names for axis in "HW"]
    size = DType.from_name(spec.dtype).itemsize

    def image_at(side: int) -> tuple:
        return tuple(side if sym else extent for extent, sym in zip((h, w), symbolic))

    def pool_and_add(bh: int, bw: int, tn: int) -> int:
        """The vector unit's work on one block: its POOL and the ELTWISE add into the sum."""
        return cost.pool_cycles(arch, bh * bw * tn) + cost.eltwise_cycles(arch, tn, tn)

    @functools.cache
    def block(bh: int, bw: int, tn: int) -> int:
        """Cycles between blocks of bh x bw pixels: its load, or half the round trip of its
        buffer (load with the DMA latency, POOL, ELTWISE add) when that is longer."""
        return cost.buffered_step_cycles(arch, cost.BufferedLoop(
            1, cost.dma_transfer_cycles(arch, bh * bw * tn * size), (pool_and_add(bh, bw, tn),)))

    def split(extent: int, side: int, sym: bool) -> tuple:
        """(whole blocks, pixels of the cut last one) along an axis; a static axis's last block
        runs whole."""
        return divmod(extent, side) if sym else (-(-extent // side), 0)

    @functools.cache
    def cycles(bh: int, bw: int, tn: int, side: int) -> int:
        """Per channel tile: the blocks, a last one along a symbolic axis cut to the pixels that
        exist; then the multiply and the store."""
        ih, iw = image_at(side)
        rows, columns = split(ih, bh, symbolic[0]), split(iw, bw, symbolic[1])
        blocks = sum(rows_count * columns_count * block(block_rows, block_columns, tn)
                     for rows_count, block_rows in ((rows[0], bh), (1 if rows[1] else 0, rows[1]))
                     for columns_count, block_columns in ((columns[0], bw), (1 if columns[1] else 0, columns[1]))
                     if rows_count and columns_count)
        # A cut block between whole ones: the next row's first whole block reuses the buffer of
        # this row's last whole block (buffers alternate whole, cut, whole), so its load waits
        # for that block's POOL and add once per block row.
        stalls = rows[0] + (1 if rows[1] else 0) if columns[0] and columns[1] else 0
        finish = cost.vector_cycles(arch, 1, tn) + cost.eltwise_cycles(arch, tn, tn) + \
            cost.dma_transfer_cycles(arch, tn * size) + stalls * pool_and_add(bh, bw, tn)
        first = cost.dma_transfer_cycles(arch, min(bh, ih) * min(bw, iw) * tn * size)
        # the loop's tail (the last block's work, its multiply and store) is in `finish`
        return cost.double_buffered_cycles(arch, cost.BufferedLoop(
            n * -(-channels // tn), first, steady=n * -(-channels // tn) * (blocks + finish), last_work=0)).total

    return cycles
