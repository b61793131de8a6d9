"""A pool's window taps that lie in the padding for every output are cut from its window.

Stage: normalise (before large_pools.py). In: a Relax IRModule. Out: the same module in which a
max_pool2d, or an avg_pool2d that does not count the padding, (static shapes, any order of the
NCHW axes, dilation 1, not in ceil mode) whose window reaches past the map on every output has
the rows and columns of taps no output ever lands on the map with cut from its window, and its
padding cut to match: padding_taps.py's rule for a conv's taps (`axis_cut`), the outputs the same.

Exact: a cut tap only ever reads padding, which a max never takes over a valid tap (the dtype's
lowest value, or -inf) and an average without count_include_pad neither sums nor counts; a window
with no valid tap stays so. Why: the NPU's POOL kernel takes whole windows, and refused (the host
ran it) a window larger than its image: YOLOv8n's SPPF max pools (5 x 5, padding 2) on the 2 x 2
map of a 64 x 64 input, 3 host calls of 42,132 modelled cycles on cgra-8x8 in the float32 and
the int8 model alike; cut to 3 x 3, padding 1, they are POOL kernels.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import static_shape
from .padding_taps import axis_cut
from .rewrite import as_pass, rewrite_functions

_MAX_POOL = tvm.ir.Op.get("relax.nn.max_pool2d")
_AVG_POOL = tvm.ir.Op.get("relax.nn.avg_pool2d")


def pool_taps_cut(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every pool's window taps that read only padding cut (see the module doc)."""
    return rewrite_functions(mod, _PoolTapCutter)


pool_taps_pass = as_pass(pool_taps_cut, "cgra.PoolTaps", ops=("relax.nn.max_pool2d", "relax.nn.avg_pool2d"))


def _cut(call):
    """The pool `call` with its padding-only taps cut, or None."""
    attrs = call.attrs
    average = call.op.same_as(_AVG_POOL)
    data, out = static_shape(call.args[0]), static_shape(call)
    layout, out_layout = str(attrs.layout), str(attrs.out_layout)
    if data is None or out is None or len(data) != 4 or sorted(layout) != sorted("NCHW") or out_layout != layout \
            or bool(attrs.ceil_mode) or any(int(d) != 1 for d in attrs.dilation) \
            or (average and bool(attrs.count_include_pad)):
        return None
    window, strides, padding = [int(k) for k in attrs.pool_size], [int(s) for s in attrs.strides], \
        [int(p) for p in attrs.padding]
    cuts = [axis_cut(data[layout.index(axis)], window[i], padding[i], strides[i], out[layout.index(axis)])
            for i, axis in enumerate("HW")]
    if cuts == [None, None]:
        return None
    for i in range(2):
        if cuts[i] is None:
            cuts[i] = (0, window[i], padding[i], padding[i + 2])
    extra = {"count_include_pad": False} if average else {}
    pool = relax.op.nn.avg_pool2d if average else relax.op.nn.max_pool2d
    return with_span(pool(call.args[0], (cuts[0][1], cuts[1][1]), strides,
                          (cuts[0][2], cuts[1][2], cuts[0][3], cuts[1][3]), (1, 1), False,
                          layout=layout, out_layout=layout, **extra), call.span)


@relax.expr_functor.mutator
class _PoolTapCutter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if isinstance(call, relax.Call) and (call.op.same_as(_MAX_POOL) or call.op.same_as(_AVG_POOL)):
            cut = _cut(call)
            return call if cut is None else cut
        return call
