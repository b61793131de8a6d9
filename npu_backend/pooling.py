"""The pooling kernel: max_pool2d, avg_pool2d and global average pooling on the vector unit's POOL.

Stage: target hook (kernel definition and schedule). Input: a `KernelSpec` with op "pool" (its
`pool` attributes, strides, padding, dilation and layouts). Output: the TE PrimFunc (blocks
a_pad, acc, out) and its schedule, registered in kernels.COMPUTES and schedule's table:

    a_pad   the input window in the scratchpad, (N, rows, columns, channels) with the padding
            as the DMA's zero halo: window position (py, px) is input pixel (py - top, px - left)
    acc     the pooled tile, one POOL command per (image, channel tile)
    out     the store back to the host tensor, in its layout

A tile is a whole image by `tn` channels (tiling.choose_pool_tiling), so whether a tap lies in the
padding depends only on the output's place in the image, known at compile time: the valid
rectangle is the image, the count rectangle the image (count_include_pad=False) or the padded
image (True). Ceil mode's last windows reach past the padded image into more halo, outside both.
"""

from __future__ import annotations

from tvm import te

from cgra_sim.arch import HardwareDescription

from .intrinsics import SPAD, get_intrin
from .kernels import COMPUTES, KernelSpec, _padded, _prim_func, _stored
from .pool_intrinsic import PoolWindow, pool_value
from .schedule import register_schedule
from .tiling import Tiling, pool_window_extents


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


def pool_compute(spec: KernelSpec, tiling: Tiling):
    """out[b, c, y, x] (in the spec's layout) = the pooled window of image b, channel c."""
    n, _, _, _ = spec.lhs_shape
    _, _, oh, ow = spec.output_shape
    top, left, _, _ = spec.padding
    in_h, in_w = pool_window_extents(spec)
    window = pool_window(spec)
    data_shape = _stored(spec.lhs_shape, "NCHW", spec.data_layout)
    x = te.placeholder(data_shape, spec.dtype, name="data")
    a_pad = te.compute((n, in_h, in_w, tiling.np), lambda b_, py, px, c: _padded(
        x, data_shape, _stored((b_, c, py - top, px - left), "NCHW", spec.data_layout)), name="a_pad")
    acc = te.compute((n, oh, ow, tiling.np), lambda b_, y, ox, c: pool_value(
        lambda py, px, ch: a_pad[b_, py, px, ch], y, ox, c, window, (oh, ow), spec.dtype), name="acc")

    def stored_out(*index):
        axis = dict(zip(spec.out_layout, index))
        return acc[axis["N"], axis["H"], axis["W"], axis["C"]]

    out = te.compute(_stored(spec.output_shape, "NCHW", spec.out_layout), stored_out, name="out")
    return _prim_func(spec, {"lhs": x}, out)


COMPUTES["pool"] = pool_compute


@register_schedule("pool")
def schedule_pool(sch, spec: KernelSpec, tiling: Tiling, arch: HardwareDescription):
    """Per (image, tn channels): one DMA of the input window, one POOL, one DMA store. The tile
    loops are the accumulator's own (it is the anchor), so its output loops keep their extents
    even when they are 1 (a global pool's 1 x 1 output) and the tile can always be tensorized."""
    acc = sch.get_sblock("acc")
    images, rows, cols, channels = sch.get_loops(acc)
    channel_tile, channel = sch.split(channels, [None, tiling.tn])
    sch.reorder(images, channel_tile, rows, cols, channel)
    sch.set_scope(acc, 0, SPAD)
    a_pad = sch.get_sblock("a_pad")
    sch.compute_at(a_pad, channel_tile)
    sch.set_scope(a_pad, 0, SPAD)
    sch.reverse_compute_at(sch.get_sblock("out"), channel_tile)
    _, _, oh, ow = spec.output_shape
    sch.tensorize(rows, get_intrin("pool", oh, ow, tiling.tn, pool_window(spec), spec.dtype))
