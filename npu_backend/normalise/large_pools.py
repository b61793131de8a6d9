"""Large pooling windows in two passes: a row pass, then a column pass.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which every
max_pool2d / avg_pool2d whose window has more than MAX_TAPS taps, and every global average
(`mean` over H and W, `adaptive_avg_pool2d` to 1 x 1) of a map that large, is a pool over
(1, kw) followed by a pool over (kh, 1), with the strides, padding, dilation, ceil mode and
count mode split between them.

Why: the POOL command's description (and the kernel's compute, which must match it to be
tensorized) writes a window as one expression over all its taps. An expression as deep as the
window is large reaches TE and TIR as a deep recursion: a global average over an 80 x 80 map
(6,400 taps) overflowed the stack inside te.create_prim_func (SIGSEGV), and a 64 x 64 one took
minutes to compile. Split, the deepest expression has max(kh, kw) taps.

Exact where it matters: a max is a max of maxes; an average over a rectangle of valid taps is the
average over its columns of the averages over its rows, since the rectangle's count is the
product of its two sides (both with and without count_include_pad). Only float32 averages are
split (integer averages round at each division); what stays on the host is unchanged in value,
up to float32 rounding order.
"""

from __future__ import annotations

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
            return self._split_window(call)
        if call.op.same_as(_MEAN) or call.op.same_as(_ADAPTIVE):
            return self._split_global(call)
        return call

    def _split_window(self, call):
        attrs = call.attrs
        kh, kw = (int(k) for k in attrs.pool_size)
        average = call.op.same_as(_AVG_POOL)
        if kh * kw <= MAX_TAPS or kh == 1 or kw == 1 or (average and dtype_of(call.args[0]) != "float32"):
            return call
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
        if h * w <= MAX_TAPS or h == 1 or w == 1:
            return call
        rows = self.builder_.emit(with_span(relax.op.nn.avg_pool2d(
            call.args[0], (1, w), (1, w), layout=layout, out_layout=layout), call.span))
        pooled = with_span(relax.op.nn.avg_pool2d(rows, (h, 1), (h, 1), layout=layout, out_layout=layout),
                           call.span)
        if keepdims:
            return pooled
        channels = shape[layout.index("C")]
        return with_span(relax.op.reshape(self.builder_.emit(pooled), (shape[0], channels)), call.span)
