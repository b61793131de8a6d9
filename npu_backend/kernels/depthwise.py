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

from tvm import te

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ..errors import ScratchpadTooSmall
from .epilogue import channel_rows, epilogue_compute, epilogue_intrin, epilogue_operands
from .dynamic import batch_extent
from .family import OpFamily
from .gemm import loops_after
from .intrinsics import SPAD, get_intrin
from .intrinsics.pe_array import window_extent, window_sum
from .operands import kernel_prim_func, padded, stored
from .spad_layout import align_output_rows, align_rows, out_row_stride, store_walks_rows, window_pixel_stride
from .spec import KernelSpec, Tiling, aligned, round_up


def padded_width(spec: KernelSpec) -> int:
    """Output columns a depthwise kernel computes: at least 2, so that no loop of the tile has a
    unit extent (the scheduler's compute_at would drop it and leave nothing to tensorize)."""
    return max(spec.output_shape[3], 2)


def depthwise_compute(spec: KernelSpec, tiling: Tiling):
    """out[b, c, y, x] = the window sum of channel c, in the spec's layouts. Output rows are
    padded to whole tiles (tiling.tm rows) and columns to at least 2."""
    n = batch_extent(spec)  # an int, or the symbolic batch's variable
    _, _, kh, kw = spec.rhs_shape
    top, left, _, _ = spec.padding
    window = (kh, kw, *spec.strides, *spec.dilation)
    rows, cols, width = tiling.mp, tiling.np, padded_width(spec)
    in_h = window_extent(rows, kh, spec.strides[0], spec.dilation[0])
    in_w = window_extent(width, kw, spec.strides[1], spec.dilation[1])
    data_shape = stored((n,) + tuple(spec.lhs_shape[1:]), "NCHW", spec.data_layout)
    weight_shape = stored(spec.rhs_shape, "OIHW", spec.kernel_layout)
    x = te.placeholder(data_shape, spec.dtype, name="data")
    w = te.placeholder(weight_shape, spec.dtype, name="weight")
    a_pad = te.compute((n, in_h, in_w, cols), lambda b_, iy, ix, c: padded(
        x, data_shape, stored((b_, c, iy - top, ix - left), "NCHW", spec.data_layout)), name="a_pad")
    b_pad = te.compute((kh, kw, cols), lambda ry, rx, c: padded(
        w, weight_shape, stored((c, 0, ry, rx), "OIHW", spec.kernel_layout)), name="b_pad")
    acc = te.compute((n, rows, width, cols), lambda b_, y, ox, c: window_sum(
        lambda iy, ix, ch: a_pad[b_, iy, ix, ch], lambda ry, rx, ch: b_pad[ry, rx, ch], y, ox, c,
        window, spec.acc_dtype), name="acc")
    out_shape = stored((n,) + tuple(spec.output_shape[1:]), "NCHW", spec.out_layout)
    operands = epilogue_operands(spec, out_shape)
    epi = epilogue_compute(spec, acc, tiling, operands,
                           out_index=lambda b_, y, ox, c: stored((b_, c, y, ox), "NCHW", spec.out_layout))

    def stored_out(*index):
        axis = dict(zip(spec.out_layout, index))
        return epi[axis["N"], axis["H"], axis["W"], axis["C"]]

    out = te.compute(out_shape, stored_out, name="out")
    return kernel_prim_func(spec, {"lhs": x, "rhs": w, **operands}, out)


def choose_depthwise_tiling(spec: KernelSpec, arch: HardwareDescription) -> Tiling:
    """`tm` whole output rows (>= 2) by `tn` channels (a multiple of the PE array's columns,
    >= 2), all taps at once (tk = kp = kh * kw): among the tiles whose double-buffered input
    window, weights, accumulator, output, bias and residual fit the scratchpad, the one with the
    fewest estimated cycles. mp and np: output rows and channels padded to whole tiles."""
    _, channels, _, _ = spec.lhs_shape
    _, _, kh, kw = spec.rhs_shape
    (sh, sw), (dh, dw) = spec.strides, spec.dilation
    rows, width = max(spec.output_shape[2], 2), padded_width(spec)
    in_bytes, acc_bytes = DType.from_name(spec.dtype).itemsize, DType.from_name(spec.acc_dtype).itemsize
    in_w = (width - 1) * sw + (kw - 1) * dw + 1
    first_tn = round_up(2, arch.cols)
    store_rows = store_walks_rows(spec)
    best = None
    for tm in range(2, rows + 1):
        in_h = (tm - 1) * sh + (kh - 1) * dh + 1
        for tn in range(first_tn, max(round_up(channels, arch.cols), first_tn) + 1, arch.cols):
            pixel = window_pixel_stride(tn, in_bytes, sw, width, arch)  # padded pixels (spad_layout.py)
            footprint = aligned(2 * in_h * in_w * pixel * in_bytes) + aligned(2 * kh * kw * tn * in_bytes)
            compact_tiles = 2 if spec.residual_shape else 1  # accumulator (, residual)
            footprint += compact_tiles * aligned(2 * tm * width * tn * acc_bytes)
            # the output tile, its pixels padded against bank conflicts (spad_layout.py)
            footprint += aligned(2 * tm * width * out_row_stride(tn, acc_bytes, store_rows, arch) * acc_bytes)
            footprint += aligned(2 * tn * acc_bytes) if spec.bias_shape else 0
            footprint += aligned(2 * tn * 4) if spec.scale_shape else 0
            if footprint > arch.spad_bytes:
                continue
            tiling = Tiling(tm, tn, kh * kw, round_up(rows, tm), round_up(channels, tn), kh * kw)
            loaded = (in_h * in_w + kh * kw) * tn * in_bytes
            loaded += tm * width * tn * acc_bytes if spec.residual_shape else 0
            key = (_estimate_cycles(tiling, spec, width, cost.dma_transfer_cycles(arch, loaded), arch), -tm * tn)
            if best is None or key < best[0]:
                best = (key, tiling)
    if best is None:
        raise ScratchpadTooSmall(
            f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold two output rows "
            f"of a {spec.lhs_shape} depthwise conv2d ({kh}x{kw}): describe a larger scratchpad")
    return best[1]


def _estimate_cycles(t: Tiling, spec: KernelSpec, width: int, load: int, arch: HardwareDescription) -> int:
    """First-order cycles of a tiled depthwise kernel, each command priced by the simulator's
    cost model (cgra_sim.cost): with double buffering the busiest unit per tile sets the pace
    (its DEPTHWISE, its loads (`load`), one EPILOGUE per output row, its store), plus the first
    load and the last store."""
    images = spec.lhs_shape[0]
    tiles = images * (t.mp // t.tm) * (t.np // t.tn)
    pixels = t.tm * width
    compute = cost.depthwise_compute_cycles(arch, pixels, t.tn, t.tk, spec.dtype)
    store = cost.dma_transfer_cycles(arch, pixels * t.tn * DType.from_name(spec.acc_dtype).itemsize)
    vector = t.tm * cost.vector_cycles(arch, width, t.tn)
    return tiles * max(compute, load, store, vector) + load + store + 2 * arch.dma_latency


def schedule_depthwise(sch, spec: KernelSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """Tiles of `tm` output rows x `tn` channels (whole output rows); per tile the input window
    and the weights are loaded into the scratchpad, one DEPTHWISE computes the tile on the PE
    array and one EPILOGUE per output row applies bias, residual, relu and clip on the vector unit."""
    epi = sch.get_sblock("epi")
    _, rows, width, channels = sch.get_loops(epi)
    row_outer, row_inner = sch.split(rows, [None, tiling.tm])
    col_outer, col_inner = sch.split(channels, [None, tiling.tn])
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
    align_output_rows(sch, spec, tiling, arch)


DEPTHWISE = OpFamily(
    name="depthwise", ops=("depthwise",), choose_tiling=choose_depthwise_tiling, compute=depthwise_compute,
    schedule=schedule_depthwise)
