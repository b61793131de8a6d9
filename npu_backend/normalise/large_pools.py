"""Large pooling windows in passes of at most MAX_TAPS taps: rows, then columns.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which every
max_pool2d / avg_pool2d whose window has more than MAX_TAPS taps is a pool over (1, kw) followed
by a pool over (kh, 1), with the strides, padding, dilation, ceil mode and count mode split
between them; and every global average (`mean` over H and W, `adaptive_avg_pool2d` to 1 x 1, or
a window over the whole unpadded map) of a map that large, or whose side alone is longer than
MAX_TAPS (a map one pixel high or wide included), is a chain of non-overlapping pools along W,
then along H, each window at most MAX_TAPS taps (`axis_windows`: 1 x 6,400 -> (1, 80), (1, 80)).

Why: the POOL command's description (and the kernel's compute, which must match it to be
tensorized) writes a window as one expression over all its taps. An expression as deep as the
window is large reaches TE and TIR as a deep recursion: a global average over an 80 x 80 map
(6,400 taps) overflowed the stack inside te.create_prim_func (SIGSEGV), and a 64 x 64 one took
minutes to compile; so did one over a 1 x 6,400 map, one row of 6,400 taps. Split, no expression
has more than MAX_TAPS taps; a window that cannot be split so stays on the host (kernels/pool.py
refuses it).

Exact where it matters: a max is a max of maxes; an average over a rectangle of valid taps is the
average over its columns of the averages over its rows, since the rectangle's count is the
product of its two sides (both with and without count_include_pad). A side split into windows
that do not divide it is padded with zeros that count, and the average scaled by (taps covered) /
(taps of the map). Only float32 averages are split (integer averages round at each division);
what stays on the host is unchanged in value, up to float32 rounding order.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import dtype_of, static_shape
from .rewrite import as_pass, rewrite_functions

#: Windows with more taps than this are split (16 x 16; the crash was at about 4,100).
MAX_TAPS = 256

_MAX_POOL = tvm.ir.Op.get("relax.nn.max_pool2d")
_AVG_POOL = tvm.ir.Op.get("relax.nn.avg_pool2d")
_MEAN = tvm.ir.Op.get("relax.mean")
_ADAPTIVE = tvm.ir.Op.get("relax.nn.adaptive_avg_pool2d")


def split_large_pools(mod: tvm.IRModule) -> tvm.IRModule:
    """The module with every pooling window of more than MAX_TAPS taps in two passes."""
    return rewrite_functions(mod, _PoolSplitter)


split_large_pools_pass = as_pass(split_large_pools, "cgra.SplitLargePools",
                                 ops=("relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.mean",
                                      "relax.nn.adaptive_avg_pool2d"))


@relax.expr_functor.mutator
class _PoolSplitter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not isinstance(call, relax.Call):
            return call
        if call.op.same_as(_MAX_POOL) or call.op.same_as(_AVG_POOL):
            return self._split_window(clip_window(call))
        if call.op.same_as(_MEAN) or call.op.same_as(_ADAPTIVE):
            return self._split_global(call)
        return call

    def _split_window(self, call):
        attrs = call.attrs
        kh, kw = (int(k) for k in attrs.pool_size)
        average = call.op.same_as(_AVG_POOL)
        if kh * kw <= MAX_TAPS or (average and dtype_of(call.args[0]) != "float32"):
            return call
        if max(kh, kw) > MAX_TAPS or kh == 1 or kw == 1:  # one pass each way would still be too deep
            return self._split_whole_window(call, kh, kw)
        sh, sw = (int(s) for s in attrs.strides)
        dh, dw = (int(d) for d in attrs.dilation)
        top, left, bottom, right = (int(p) for p in attrs.padding)
        layout, out_layout = str(attrs.layout), str(attrs.out_layout)
        extra = {"count_include_pad": bool(attrs.count_include_pad)} if average else {}
        pool = relax.op.nn.avg_pool2d if average else relax.op.nn.max_pool2d
        rows = self.builder_.emit(with_span(pool(
            call.args[0], (1, kw), (1, sw), (0, left, 0, right), (1, dw), bool(attrs.ceil_mode),
            layout=layout, out_layout=layout, **extra), call.span))
        return with_span(pool(rows, (kh, 1), (sh, 1), (top, 0, bottom, 0), (dh, 1), bool(attrs.ceil_mode),
                              layout=layout, out_layout=out_layout, **extra), call.span)

    def _split_whole_window(self, call, kh: int, kw: int):
        """A window over the whole unpadded map (a global pool written as a window: one output)
        in passes of at most MAX_TAPS taps; any other window this long stays as it is (the NPU's
        POOL kernel refuses it and the host runs it)."""
        attrs, shape = call.attrs, static_shape(call.args[0])
        layout = str(attrs.layout)
        if shape is None or len(shape) != 4 or str(attrs.out_layout) != layout or \
                (shape[layout.index("H")], shape[layout.index("W")]) != (kh, kw) or \
                any(int(p) for p in attrs.padding) or any(int(d) != 1 for d in attrs.dilation):
            return call
        return self._global_passes(call, layout, kh, kw, average=call.op.same_as(_AVG_POOL))

    def _split_global(self, call):
        """mean over the two spatial axes of a 4-D tensor (NCHW: 2, 3; NHWC: 1, 2) or
        adaptive_avg_pool2d to 1 x 1, of a float32 map of more than MAX_TAPS pixels."""
        shape = static_shape(call.args[0])
        if shape is None or len(shape) != 4 or dtype_of(call.args[0]) != "float32":
            return call
        if call.op.same_as(_MEAN):
            axes = sorted(int(a) % 4 for a in call.attrs.axis) if call.attrs.axis is not None else []
            layout = {(2, 3): "NCHW", (1, 2): "NHWC"}.get(tuple(axes))
            keepdims = bool(call.attrs.keepdims)
        else:
            size = call.attrs.output_size
            layout, keepdims = str(call.attrs.layout), True
            if size is None or [int(s) for s in size] not in ([1], [1, 1]) or layout not in ("NCHW", "NHWC") \
                    or str(call.attrs.out_layout) != layout:
                return call
        if layout is None:
            return call
        h, w = shape[layout.index("H")], shape[layout.index("W")]
        if h * w <= MAX_TAPS:
            return call
        pooled = self._global_passes(call, layout, h, w)
        if keepdims:
            return pooled
        channels = shape[layout.index("C")]
        return with_span(relax.op.reshape(self.builder_.emit(pooled), (shape[0], channels)), call.span)

    def _global_passes(self, call, layout: str, h: int, w: int, average: bool = True):
        """The average (or the max) over the h x w map of call.args[0] as pools along W, then
        along H, each of at most MAX_TAPS taps (axis_windows), kept as `layout`; where the windows
        cover more than the map (padded past its end: zeros, counted in an average), an average is
        scaled back by their product / (h * w)."""
        pool = relax.op.nn.avg_pool2d if average else relax.op.nn.max_pool2d
        passes = [(axis, window) for axis, extent in (("W", w), ("H", h)) for window in axis_windows(extent)]
        value, covered, extents = call.args[0], 1, {"W": w, "H": h}
        for index, (axis, window) in enumerate(passes):
            pad = -extents[axis] % window
            size, pads = ((1, window), (0, 0, 0, pad)) if axis == "W" else ((window, 1), (0, 0, pad, 0))
            extra = {"count_include_pad": True} if pad and average else {}  # the zeros past the end count
            value = with_span(pool(value, size, size, pads, layout=layout, out_layout=layout, **extra), call.span)
            if index + 1 < len(passes) or average and covered * window != h * w:
                value = self.builder_.emit(value)
            extents[axis], covered = (extents[axis] + pad) // window, covered * window
        if covered == h * w or not average:
            return value
        scale = relax.const(np.array([covered / (h * w)], "float32"))  # shape (1,): the NPU broadcasts it
        return with_span(relax.op.multiply(value, scale), call.span)


def clip_window(call: relax.Call) -> relax.Call:
    """A pool whose window is longer than its padded map on an axis with one output there (Hugging
    Face's EfficientNet pools a 1 x 1 map with AvgPool2d(2560, ceil_mode=True)) with the window cut
    to the padded map on that axis: the same taps, so the same value and count (with or without
    count_include_pad, as the taps past the padded map are never counted), and no host run padding
    a 2560 x 2560 window's worth of zeros around every channel (67 GB: std::bad_alloc)."""
    attrs, shape, out = call.attrs, static_shape(call.args[0]), static_shape(call)
    layout = str(attrs.layout)
    if shape is None or out is None or len(shape) != 4 or sorted(layout) != sorted("NCHW") or \
            str(attrs.out_layout) != layout or any(int(d) != 1 for d in attrs.dilation):
        return call
    pads = [int(p) for p in attrs.padding]
    window = [int(k) for k in attrs.pool_size]
    for axis, name in enumerate("HW"):
        padded = pads[axis] + shape[layout.index(name)] + pads[axis + 2]
        if window[axis] > padded and out[layout.index(name)] == 1:
            window[axis] = padded
    if window == [int(k) for k in attrs.pool_size]:
        return call
    extra = {"count_include_pad": bool(attrs.count_include_pad)} if call.op.same_as(_AVG_POOL) else {}
    pool = relax.op.nn.avg_pool2d if call.op.same_as(_AVG_POOL) else relax.op.nn.max_pool2d
    return with_span(pool(call.args[0], window, [int(s) for s in attrs.strides], pads, (1, 1),
                          bool(attrs.ceil_mode), layout=layout, out_layout=layout, **extra), call.span)


def axis_windows(extent: int) -> list[int]:
    """Windows, each of at most MAX_TAPS, that average an axis of `extent` in as few passes as
    can: each pass's window divides what is left where a divisor near the even split exists
    (e.g. 6,400 -> 80, 80; 3,200 -> 50, 64), else it is that split rounded up, the axis padded
    past its end with zeros (5,209, a prime -> 73, 72: 73 x 72 = 5,256 taps). A side of 1 is none."""
    windows = []
    while extent > MAX_TAPS:
        passes = 1
        while MAX_TAPS ** passes < extent:
            passes += 1
        even = math.ceil(extent ** (1 / passes))
        smallest = math.ceil(extent / MAX_TAPS ** (passes - 1))
        divisors = [d for d in range(max(smallest, 2), MAX_TAPS + 1) if extent % d == 0]
        window = min(divisors, key=lambda d: (abs(d - even), d)) if divisors else even
        windows.append(window)
        extent = -(-extent // window)
    return windows + ([extent] if extent > 1 else [])
