"""A conv2d's kernel taps that read only zero padding, for every output, are cut from its weights.

Stage: normalise (after nhwc_convs.py). In: a Relax IRModule. Out: the same module in which a
conv2d (any data and kernel layout, dilation 1, a constant weight) whose kernel is wider than
the map it slides over has the rows and columns of taps that no output ever lands on the map
with cut from its weight, and its padding cut to match: tap t of an axis of size n, padding
p before, stride s and m outputs is used when 0 <= o s - p + t < n for some output o; the taps
kept are the first used one t_lo to the last, the padding before p - t_lo and after
(m - 1) s + taps - n - (p - t_lo), so that the outputs stay m.

Exact: a cut tap only ever multiplies a padding zero, so every output sums the same non-zero
products (the zeros it no longer adds change no float32 sum). Why: ConvNeXt's last stage runs its
7 x 7 depthwise conv (padding 3) on a 2 x 2 map, where only the middle 3 x 3 taps meet the map:
the kernel computed 49 taps of 128 channels at 4 outputs, 3,883 cycles of the 156 k of
tests/transformer_models.py's ConvNeXt at 64 x 64 on cgra-8x8.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, static_shape
from .rewrite import as_pass, rewrite_functions

_CONV = tvm.ir.Op.get("relax.nn.conv2d")


def padding_taps_cut(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every conv2d's taps that read only padding cut from its weights."""
    return rewrite_functions(mod, _TapCutter)


padding_taps_pass = as_pass(padding_taps_cut, "cgra.PaddingTaps", ops=("relax.nn.conv2d",))


def used_taps(size: int, taps: int, before: int, stride: int, outputs: int) -> tuple[int, int] | None:
    """(first, last) tap of one axis that some output lands on the map with (size n, padding
    before p, stride s, m outputs: 0 <= o s - p + t < n for some o < m), None when none does."""
    used = [t for t in range(taps) if any(0 <= o * stride - before + t < size for o in range(outputs))]
    return (used[0], used[-1]) if used else None


def axis_cut(size, taps, before, stride, outputs):
    """(first tap, taps kept, padding before, padding after) of one axis, or None: nothing to cut
    (also normalise/pool_taps.py's, for a pool's window)."""
    found = used_taps(size, taps, before, stride, outputs)
    if found is None:
        return None  # the conv adds no product at all: left as it is
    first, kept = found[0], found[1] - found[0] + 1
    if kept == taps:
        return None
    after = (outputs - 1) * stride + kept - size - (before - first)
    return (first, kept, before - first, after) if after >= 0 else None


def _cut(call):
    """The conv2d `call` with its padding-only taps cut, or None."""
    attrs = call.attrs
    weight, data, out = call.args[1], static_shape(call.args[0]), static_shape(call)
    if not isinstance(weight, tvm.ir.GenericConst) or data is None or out is None or \
            any(int(d) != 1 for d in attrs.dilation):
        return None
    layout, kernel_layout = str(attrs.data_layout), str(attrs.kernel_layout)
    out_layout = str(attrs.out_layout) or layout
    if sorted(layout) != sorted("NCHW") or sorted(kernel_layout) != sorted("OIHW"):
        return None
    padding = [int(p) for p in attrs.padding]
    cuts = [axis_cut(data[layout.index(axis)], weight.value.shape[kernel_layout.index(axis)], padding[i],
                      int(attrs.strides[i]), out[out_layout.index(axis)]) for i, axis in enumerate("HW")]
    if cuts == [None, None]:
        return None
    values = weight.value.numpy()
    cut = [slice(None)] * values.ndim
    for i, axis in enumerate("HW"):
        if cuts[i] is None:
            cuts[i] = (0, values.shape[kernel_layout.index(axis)], padding[i], padding[i + 2])
        first, kept = cuts[i][:2]
        cut[kernel_layout.index(axis)] = slice(first, first + kept)
    new_weight = relax.const(np.ascontiguousarray(values[tuple(cut)]))
    new_padding = [cuts[0][2], cuts[1][2], cuts[0][3], cuts[1][3]]
    return relax.op.nn.conv2d(call.args[0], new_weight, strides=attrs.strides, padding=new_padding,
                              dilation=attrs.dilation, groups=int(attrs.groups), data_layout=layout,
                              kernel_layout=kernel_layout, out_layout=out_layout,
                              out_dtype=dtype_of(call))


@relax.expr_functor.mutator
class _TapCutter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if isinstance(call, relax.Call) and call.op.same_as(_CONV):
            cut = _cut(call)
            return call if cut is None else cut
        return call
