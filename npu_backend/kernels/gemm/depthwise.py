"""The depthwise family: conv2d with groups == C == F, on the PE array's DEPTHWISE command.

Stage: kernel definition, tiling and schedule; the spec comes from the conv2d family's reader
(conv2d.py), which names a depthwise conv2d's op "depthwise". A depthwise conv2d is not a GEMM
(each output channel reads one input channel): its acc is a sliding-window sum over an input
window tile (`window_sum`, the DEPTHWISE intrinsic's own expression), a_pad that window with the
halo zero-filled by its DMA (each input element loaded once per tile, not once per tap), b_pad
the (kh, kw, channels) weights. Tiles are `tm` output rows (whole rows) by `tn` channels; one
DEPTHWISE computes a tile with a PE per output and one EPILOGUE per output row applies bias,
residual, relu and clip. Data, weights and output may be stored in any layout.
"""

from __future__ import annotations

import dataclasses

from tvm import sym, te, tirx

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ...errors import ScratchpadTooSmall
from .channel_rows import channel_rows
from .epilogue import epilogue_compute, epilogue_intrin, epilogue_operands
from ..common.dynamic import CUT_LOOP, CUT_PARAMS, GATHERS, batch_extent, dim_var, spatial_extents
from ..family import OpFamily
from .gemm_schedule import loops_after
from ..intrinsics import SPAD, get_intrin
from ..intrinsics.pe_array import window_extent, window_sum
from ..common.operands import kernel_prim_func, padded, stored
from ..common.spad_layout import align_output_rows, align_rows, out_row_stride, store_walks_rows, window_pixel_stride
from ..common.spec import HELD_HALO_TRIPS, KernelSpec, Tiling, aligned, round_up


def padded_width(spec: KernelSpec) -> int:
    """Output columns a depthwise kernel computes: at least 2, so that no loop of the tile has a
    unit extent (the scheduler's compute_at would drop it and leave nothing to tensorize)."""
    return max(spec.output_shape[3], 2)


def depthwise_compute(spec: KernelSpec, tiling: Tiling):
    """out[b, c, y, x] = the window sum of channel c, in the spec's layouts. Output rows are
    padded to whole tiles (tiling.tm rows) and columns to at least 2."""
    n = batch_extent(spec)  # an int, or the symbolic batch's variable
    _, channels, h, w = spec.lhs_shape
    _, _, kh, kw = spec.rhs_shape
    top, left, _, _ = spec.padding
    window = (kh, kw, *spec.strides, *spec.dilation)
    rows, cols, width = tiling.mp, tiling.np, padded_width(spec)
    oh, ow = spec.output_shape[2:]
    image = [h, w]
    if spec.symbolic_image:  # output rows and columns as expressions, padded to whole tiles
        names = spec.symbolic("lhs")
        oh, ow = spatial_extents(spec)
        image = [dim_var(names[spec.data_layout.index(a)]) if spec.data_layout.index(a) in names else e
                 for a, e in zip("HW", (h, w))]
        if not isinstance(oh, int):
            rows = _whole(oh, tiling.tm)
        if not isinstance(ow, int):
            width = _whole(ow, tiling.tw)
    in_h = window_extent(rows, kh, spec.strides[0], spec.dilation[0])
    in_w = window_extent(width, kw, spec.strides[1], spec.dilation[1])
    data_shape = stored((n, channels, *image), "NCHW", spec.data_layout)
    weight_shape = stored(spec.rhs_shape, "OIHW", spec.kernel_layout)
    x = te.placeholder(data_shape, spec.dtype, name="data")
    w = te.placeholder(weight_shape, spec.dtype, name="weight")
    a_pad = te.compute((n, in_h, in_w, cols), lambda b_, iy, ix, c: padded(
        x, data_shape, stored((b_, c, iy - top, ix - left), "NCHW", spec.data_layout), spec.image_fill), name="a_pad")
    b_pad = te.compute((kh, kw, cols), lambda ry, rx, c: padded(
        w, weight_shape, stored((c, 0, ry, rx), "OIHW", spec.kernel_layout)), name="b_pad")
    acc = te.compute((n, rows, width, cols), lambda b_, y, ox, c: window_sum(
        lambda iy, ix, ch: a_pad[b_, iy, ix, ch], lambda ry, rx, ch: b_pad[ry, rx, ch], y, ox, c,
        window, spec.acc_dtype), name="acc")
    out_shape = stored((n, spec.output_shape[1], oh, ow), "NCHW", spec.out_layout)
    operands = epilogue_operands(spec, out_shape)
    epi = epilogue_compute(spec, acc, tiling, operands,
                           out_index=lambda b_, y, ox, c: stored((b_, c, y, ox), "NCHW", spec.out_layout))

    def stored_out(*index):
        axis = dict(zip(spec.out_layout, index))
        return epi[axis["N"], axis["H"], axis["W"], axis["C"]]

    out = te.compute(out_shape, stored_out, name="out")
    func = kernel_prim_func(spec, {"lhs": x, "rhs": w, **operands}, out)
    if not spec.symbolic_image:
        return func
    # A symbolic image's last tiles, cut to what exists by their tile loops (lower/ragged.py;
    # `cut_levels`): a last row tile's DEPTHWISE rows, EPILOGUEs (one per row, schedule_depthwise)
    # and window and residual rows; a last column tile's DEPTHWISE columns, EPILOGUEs' m and
    # window and residual columns. Stores are cut to the image.
    cuts = {"data": [], "residual": []}
    params = {"cgra_depthwise": [], "cgra_epilogue": []}
    for level, axis in enumerate(cut_levels(spec, tiling)):
        index = "HW".index(axis)
        step, span = spec.strides[index], (spec.rhs_shape[2 + index] - 1) * spec.dilation[index] + 1
        cuts["data"].append([spec.data_layout.index(axis), step, 1, span - step, level])
        cuts["residual"].append([spec.out_layout.index(axis), 1, 1, 0, level])
        params["cgra_depthwise"].append("oh" if axis == "H" else "ow")
        params["cgra_epilogue"].append("" if axis == "H" else "m")
    return func.with_attr(GATHERS, cuts).with_attr(CUT_PARAMS, params)


def cut_levels(spec: KernelSpec, tiling: Tiling) -> list:
    """The image axes ("H", "W") a symbolic-image kernel's tile loops run over in tiles of a
    symbolic extent, outermost first: its symbolic tile loop levels (lower/ragged.py)."""
    names = spec.symbolic("lhs")
    return [axis for axis, tiled in (("H", True), ("W", bool(tiling.tw))) if spec.data_layout.index(axis) in names
            and tiled]


def _whole(extent, tile: int):
    """A symbolic extent padded to whole tiles (at least one: max(.., 1) tells TVM's analyzer
    that a tensor the kernel runs on is not empty)."""
    return sym.Analyzer().simplify(tirx.ceildiv(tirx.max(extent, 1), tile) * tile)


def choose_depthwise_tiling(spec: KernelSpec, arch: HardwareDescription, held: bool = True) -> Tiling:
    """`tm` whole output rows (>= 2) by `tn` channels (a multiple of the PE array's columns,
    >= 2), all taps at once (tk = kp = kh * kw): among the tiles whose double-buffered input
    window, weights, accumulator, output, bias and residual fit the scratchpad, the one with the
    fewest estimated cycles. mp and np: output rows and channels padded to whole tiles. A
    symbolic image: `_choose_symbolic_tiling`. `held`: False for the estimate's older form
    (`estimate_depthwise_cycles`)."""
    if spec.symbolic_image:
        return _choose_symbolic_tiling(spec, arch)
    _, channels, _, _ = spec.lhs_shape
    _, _, kh, kw = spec.rhs_shape
    rows, width = max(spec.output_shape[2], 2), padded_width(spec)
    best = None
    for tm in range(2, rows + 1):
        for tn in _channel_tiles(channels, arch):
            loaded = _fitting_load(spec, arch, tm, width, tn)
            if loaded is None:
                continue
            tiling = Tiling(tm, tn, kh * kw, round_up(rows, tm), round_up(channels, tn), kh * kw)
            key = (_static_cycles(tiling, spec, width, cost.dma_transfer_cycles(arch, loaded), arch, held), -tm * tn)
            if best is None or key < best[0]:
                best = (key, tiling)
    if best is None:
        raise ScratchpadTooSmall(
            f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold two output rows "
            f"of a {spec.lhs_shape} depthwise conv2d ({kh}x{kw}): describe a larger scratchpad")
    return best[1]


def _channel_tiles(channels: int, arch: HardwareDescription):
    first = round_up(2, arch.cols)
    return range(first, max(round_up(channels, arch.cols), first) + 1, arch.cols)


def _fitting_load(spec: KernelSpec, arch: HardwareDescription, tm: int, width: int, tn: int):
    """Bytes a tile of tm output rows x `width` columns x tn channels loads, or None when its
    double-buffered input window, weights, accumulator, output, bias and residual do not fit."""
    _, _, kh, kw = spec.rhs_shape
    (sh, sw), (dh, dw) = spec.strides, spec.dilation
    in_bytes, acc_bytes = DType.from_name(spec.dtype).itemsize, DType.from_name(spec.acc_dtype).itemsize
    in_h, in_w = (tm - 1) * sh + (kh - 1) * dh + 1, (width - 1) * sw + (kw - 1) * dw + 1
    pixel = window_pixel_stride(tn, in_bytes, sw, width, arch)  # padded pixels (spad_layout.py)
    footprint = aligned(2 * in_h * in_w * pixel * in_bytes) + aligned(2 * kh * kw * tn * in_bytes)
    compact_tiles = 2 if spec.residual_shape else 1  # accumulator (, residual)
    footprint += compact_tiles * aligned(2 * tm * width * tn * acc_bytes)
    # the output tile, its pixels padded against bank conflicts (spad_layout.py)
    footprint += aligned(2 * tm * width * out_row_stride(tn, acc_bytes, store_walks_rows(spec), arch) * acc_bytes)
    footprint += aligned(2 * tn * acc_bytes) if spec.bias_shape else 0
    footprint += aligned(2 * tn * 4) if spec.scale_shape else 0
    if footprint > arch.spad_bytes:
        return None
    loaded = (in_h * in_w + kh * kw) * tn * in_bytes
    return loaded + (tm * width * tn * acc_bytes if spec.residual_shape else 0)


def _choose_symbolic_tiling(spec: KernelSpec, arch: HardwareDescription) -> Tiling:
    """A symbolic height and / or width: tiles of tm rows x tw columns (powers of two, >= 2; a
    static width whole, a static height in powers of two or whole) x tn channels. The last row
    and column tiles are cut to the rows and columns that exist; the tile is chosen
    by minimax regret over images from 8 to the bound's extent along the symbolic axes (square
    when both are), each priced by `_estimate_cycles`."""
    _, channels, _, _ = spec.lhs_shape
    _, _, kh, kw = spec.rhs_shape
    names = spec.symbolic("lhs")
    symbolic = [spec.data_layout.index(axis) in names for axis in "HW"]
    static = (max(spec.output_shape[2], 2), padded_width(spec))
    bound = max(e for e, s in zip(spec.output_shape[2:], symbolic) if s)

    def extents(limit: int):
        return [1 << k for k in range(1, limit.bit_length() + 1) if 1 << k <= max(limit, 2)]

    candidates = []
    for tm in extents(bound) if symbolic[0] else sorted(set(extents(static[0])) | {static[0]}):
        for tw in extents(bound) if symbolic[1] else [static[1]]:
            for tn in _channel_tiles(channels, arch):
                loaded = _fitting_load(spec, arch, tm, tw, tn)
                if loaded is not None:
                    candidates.append((tm, tw, tn, cost.dma_transfer_cycles(arch, loaded)))
    if not candidates:
        raise ScratchpadTooSmall(
            f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold a 2x2 output tile of a "
            f"{spec.lhs_shape} depthwise conv2d ({kh}x{kw}): describe a larger scratchpad")

    def cycles(candidate, side: int) -> int:
        tm, tw, tn, load = candidate
        in_bytes = DType.from_name(spec.dtype).itemsize
        window = window_extent(tm, kh, spec.strides[0], spec.dilation[0]) * \
            window_extent(tw, kw, spec.strides[1], spec.dilation[1]) * in_bytes * \
            window_pixel_stride(tn, in_bytes, spec.strides[1], tw, arch)  # its span, even when cut
        if symbolic[0] and tm > side:  # one row tile, cut to the rows that exist
            tm = side
            load = cost.dma_transfer_cycles(arch, _fitting_load(spec, arch, tm, tw, tn))
        rows = round_up(side, tm) if symbolic[0] else round_up(static[0], tm)
        if symbolic[1] and tw > side:  # the last column tile is cut to the columns that exist
            tw = side
            load = cost.dma_transfer_cycles(arch, _fitting_load(spec, arch, tm, tw, tn))
        width = round_up(side, tw) if symbolic[1] else static[1]
        tiling = Tiling(tm, tn, kh * kw, rows, round_up(channels, tn), kh * kw, tw=tw)
        return _estimate_cycles(tiling, spec, width, load, arch, trips=("load", "store"), window_bytes=window)

    sides = sorted({min(bound, 8 << k) for k in range(bound.bit_length())} | {bound})
    fastest = {side: min(cycles(c, side) for c in candidates) for side in sides}
    tm, tw, tn, _ = min(candidates, key=lambda c: (max(cycles(c, s) / fastest[s] for s in sides), cycles(c, bound)))
    rows = round_up(bound if symbolic[0] else static[0], tm)
    return Tiling(tm, tn, kh * kw, rows, round_up(channels, tn), kh * kw, tw=tw if symbolic[1] else 0)


def estimate_depthwise_cycles(spec: KernelSpec, tiling: Tiling, arch: HardwareDescription, held: bool = True) -> int:
    """The tile search's estimate of a static-shape depthwise kernel on `tiling`. `held` False:
    its older form, no halo held and no buffer round trip, which separable_tiles.py weighs a
    fused pair against (priced, ShuffleNet's pairs on cgra-16x16 ran as two kernels, 0.3%
    faster but not the same output bits)."""
    width = padded_width(spec)
    load = cost.dma_transfer_cycles(arch, _fitting_load(spec, arch, tiling.tm, width, tiling.tn) or 0)
    return _static_cycles(tiling, spec, width, load, arch, held)


def _static_cycles(t: Tiling, spec: KernelSpec, width: int, load: int, arch: HardwareDescription,
                   held: bool = True) -> int:
    """`_estimate_cycles` of a static image: the input buffer's round trip, the held halos
    (`_held_load`), the DEPTHWISE's window streaming and the last tile's work past its step
    priced (with the halos loaded every tile they hid one another: 20% over to 6% under), or
    with `held` False none of them (the older form)."""
    if not held:
        return _estimate_cycles(t, spec, width, load, arch, trips=())
    _, _, kh, kw = spec.rhs_shape
    in_bytes = DType.from_name(spec.dtype).itemsize
    window = window_extent(t.tm, kh, spec.strides[0], spec.dilation[0]) * \
        window_extent(width, kw, spec.strides[1], spec.dilation[1]) * in_bytes * \
        window_pixel_stride(t.tn, in_bytes, spec.strides[1], width, arch)
    return _estimate_cycles(t, spec, width, load, arch, trips=("load",), window_bytes=window,
                            held_load=_held_load(spec, arch, t, width), last_beyond_step=True)


def _held_load(spec: KernelSpec, arch: HardwareDescription, t: Tiling, width: int) -> int | None:
    """Cycles of a static tile's loads once its window's halo is held in its buffer copy (the
    tiles after the first two load the window's inside alone, lower/held_halos.py), or None when
    the halo is not held: the window has none, or its origin moves (row tiles; symbolic images),
    or the tiles' boxes differ (a last channel tile cut to the channels), or the two buffer
    copies are all the tiles."""
    tiles = spec.lhs_shape[0] * (t.np // t.tn)
    if spec.symbolic_image or t.tw or t.mp != t.tm or t.np != spec.lhs_shape[1] or \
            not 2 < tiles <= HELD_HALO_TRIPS:
        return None
    _, _, h, w = spec.lhs_shape
    _, _, kh, kw = spec.rhs_shape
    top, left = spec.padding[:2]
    in_h = window_extent(t.tm, kh, spec.strides[0], spec.dilation[0])
    in_w = window_extent(width, kw, spec.strides[1], spec.dilation[1])
    inside = min(in_h - top, h) * min(in_w - left, w)  # the window's rows and columns in the image
    if inside >= in_h * in_w:
        return None
    in_bytes, acc_bytes = DType.from_name(spec.dtype).itemsize, DType.from_name(spec.acc_dtype).itemsize
    loaded = (inside + kh * kw) * t.tn * in_bytes + (t.tm * width * t.tn * acc_bytes if spec.residual_shape else 0)
    return cost.dma_transfer_cycles(arch, loaded)


def _estimate_cycles(t: Tiling, spec: KernelSpec, width: int, load: int, arch: HardwareDescription,
                     trips: tuple = ("load", "store"), window_bytes: int = 0, held_load: int | None = None,
                     last_beyond_step: bool = False) -> int:
    """First-order cycles of a tiled depthwise kernel, each command priced by the simulator's
    cost model (cgra_sim.cost), the tiles a double-buffered loop (cost.double_buffered_cycles):
    the busiest unit per tile sets the pace (its DEPTHWISE, its loads (`load`), one EPILOGUE per
    output row, its store), plus the first load and the last store."""
    images = spec.lhs_shape[0]
    tiles = images * (t.mp // t.tm) * (t.np // t.tn) * (width // t.tw if t.tw else 1)
    width = t.tw or width  # a tile's columns
    pixels = t.tm * width
    compute = cost.depthwise_compute_cycles(arch, pixels, t.tn, t.tk, spec.dtype)
    if window_bytes:  # the DEPTHWISE streams its window's span (a cut tile's too), the timing model's bound
        acc_bytes = DType.from_name(spec.acc_dtype).itemsize
        compute = cost.depthwise_steady_cycles(arch, pixels, t.tn, t.tk, spec.dtype, window_bytes + t.tk * t.tn *
                                               DType.from_name(spec.dtype).itemsize + pixels * t.tn * acc_bytes)
    store = cost.dma_transfer_cycles(arch, pixels * t.tn * DType.from_name(spec.acc_dtype).itemsize)
    vector = t.tm * cost.vector_cycles(arch, width, t.tn)
    # With two buffers a window is loaded (latency, transfer) and computed on before it is
    # loaded again, and an output is made and stored before it is written again: small tiles
    # wait for the DMA (`trips`). The symbolic search prices both round trips; the static search
    # the input's alone (with the output's it picks a slower tile for 32 channels at 16 x 16 on
    # cgra-4x4: 6356 -> 6896 cycles; without the input's, whose held halos made it the bound,
    # that kernel's estimate is 4.1% under). Both price the last tile as a whole step (the plain
    # tail picks slower tiles: 16 channels at 56 x 56, stride 2, on cgra-16x16 8311 -> 8466; the
    # symbolic 9 x 9 and 14 x 14 images on cgra-4x4).
    loop = cost.BufferedLoop(tiles, load, (compute, vector), store, last_work=0, round_trips=trips,
                             whole_last_step=True, held_load=held_load)
    if last_beyond_step:  # the last tile's DEPTHWISE and EPILOGUEs past its step, which nothing overlaps
        last = cost.buffered_step_cycles(arch, dataclasses.replace(loop, load=held_load or load))
        loop = dataclasses.replace(loop, last_work=max(0, compute + vector - last))
    return cost.double_buffered_cycles(arch, loop).total


def schedule_depthwise(sch, spec: KernelSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """Tiles of `tm` output rows x `tn` channels (whole output rows); per tile the input window
    and the weights are loaded into the scratchpad, one DEPTHWISE computes the tile on the PE
    array and one EPILOGUE per output row applies bias, residual, relu and clip on the vector unit."""
    epi = sch.get_sblock("epi")
    _, rows, width, channels = sch.get_loops(epi)
    row_outer, row_inner = sch.split(rows, [None, tiling.tm])
    col_outer, col_inner = sch.split(channels, [None, tiling.tn])
    if tiling.tw:  # a symbolic width: tiles of tw columns too
        width_outer, width = sch.split(width, [None, tiling.tw])
        sch.reorder(row_outer, width_outer, col_outer, row_inner, width, col_inner)
    else:
        sch.reorder(row_outer, col_outer, row_inner, width, col_inner)
    staged = ("acc", "a_pad", "b_pad") + channel_rows(spec) + (("res_pad",) if spec.residual_shape else ())
    for name in staged:
        block = sch.get_sblock(name)
        sch.compute_at(block, col_outer)
        sch.set_scope(block, 0, SPAD)
    sch.reverse_compute_at(sch.get_sblock("out"), col_outer)
    sch.set_scope(epi, 0, SPAD)
    kh, kw = spec.rhs_shape[2:]
    window = (kh, kw, *spec.strides, *spec.dilation)
    tile_rows = loops_after(sch, sch.get_sblock("acc"), col_outer)[0]
    width_loop = sch.get_loops(epi)[-2]
    out_width = sch.get(width_loop).extent.value
    # A strided window's output pixels are `sw` input pixels apart: pad its pixels if the
    # DEPTHWISE's full-width beats would find them in the same banks.
    align_rows(sch, sch.get_sblock("a_pad"), tiling.tn, window_pixel_stride(
        tiling.tn, DType.from_name(spec.dtype).itemsize, spec.strides[1], out_width, arch), spec.dtype, arch)
    sch.tensorize(tile_rows, get_intrin("depthwise", tiling.tm, out_width, tiling.tn, window, spec.dtype,
                                        spec.acc_dtype))
    sch.tensorize(width_loop, epilogue_intrin(spec, tiling, rows=out_width))
    levels = cut_levels(spec, tiling)
    if "H" in levels:  # a last row tile's EPILOGUEs: one per row that exists
        sch.annotate(row_inner, CUT_LOOP, levels.index("H"))
    align_output_rows(sch, spec, tiling, arch)


DEPTHWISE = OpFamily(
    name="depthwise", ops=("depthwise",), choose_tiling=choose_depthwise_tiling, compute=depthwise_compute,
    schedule=schedule_depthwise, checks_pe_dtype=True)
