"""A one-dimensional pool as a two-dimensional one, one pixel high.

Stage: normalise (after qlayouts.py, which moves a max pool between quantized tensors onto int8,
so the int8 pool is rewritten too). In: a Relax IRModule. Out: the same module in which every
`max_pool1d` / `avg_pool1d` with NCW data and output is

    squeeze(pool2d(expand_dims(x, 2), pool (1, k), strides (1, s), padding (0, l, 0, r),
                   dilation (1, d), layout NCHW), axis 2)

the same taps, padding, ceil mode and count (expand_dims and squeeze are views on the host). A
pool reading squeeze(y, 2) of a one-pixel-high y (a conv1d computed as a conv2d, conv1ds.py, or
qdq.py's int8 one) reads y itself.

Why: the NPU's POOL kernel pools NCHW images; a conv1d text classifier's max pool over its tokens
(text_cnn's AdaptiveMaxPool1d, exported as MaxPool with a kernel of the whole length) ran on the
host, 1,892 modelled cycles of text_cnn's int8 run on cgra-8x8 and 3,019 of its float32 one.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import shape_dims
from .rewrite import as_pass, op_name, rewrite_functions

_POOLS = {"relax.nn.max_pool1d": relax.op.nn.max_pool2d, "relax.nn.avg_pool1d": relax.op.nn.avg_pool2d}
_HEIGHT = 2  # NCW -> NC1W


def pool1ds_as_pool2ds(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with its NCW max / avg pool1d's as pool2d's one pixel high (module doc)."""
    return rewrite_functions(mod, _Pool1dRewriter)


pool1ds_as_pool2ds_pass = as_pass(pool1ds_as_pool2ds, "cgra.Pool1dsAsPool2ds", ops=tuple(_POOLS))


@relax.expr_functor.mutator
class _Pool1dRewriter(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.squeezed = {}  # var of squeeze(y, [2]) -> y, y one pixel high

    def visit_var_binding_(self, binding):
        value = binding.value
        if op_name(value) == "relax.squeeze" and _unit_height(value.args[0]) and value.attrs.axis is not None \
                and [int(a) for a in value.attrs.axis] == [_HEIGHT]:
            self.squeezed[binding.var] = value.args[0]
        wide = self._pool2d(value) if op_name(value) in _POOLS else None
        if wide is None:
            super().visit_var_binding_(binding)
            return
        wide_var = self.builder_.emit(with_span(wide, value.span))
        narrow = self.builder_.normalize(relax.op.squeeze(wide_var, axis=[_HEIGHT]))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, narrow))

    def _pool2d(self, call):
        """The pool one pixel high (a Relax call), or None when it stays as it is."""
        attrs = call.attrs
        if str(attrs.layout) != "NCW" or str(attrs.out_layout) != "NCW" or len(shape_dims(call.args[0]) or ()) != 3:
            return None
        data = call.args[0]
        data = self.visit_expr(self.squeezed[data]) if data in self.squeezed else \
            self.builder_.emit(relax.op.expand_dims(self.visit_expr(data), axis=_HEIGHT))
        padding = [int(p) for p in attrs.padding]
        padding = padding * (2 // len(padding))
        kwargs = dict(pool_size=(1, int(attrs.pool_size[0])), strides=(1, int(attrs.strides[0])),
                      padding=(0, padding[0], 0, padding[1]), dilation=(1, int(attrs.dilation[0])),
                      ceil_mode=bool(attrs.ceil_mode), layout="NCHW", out_layout="NCHW")
        if op_name(call) == "relax.nn.avg_pool1d":
            kwargs["count_include_pad"] = bool(attrs.count_include_pad)
        return _POOLS[op_name(call)](data, **kwargs)


def _unit_height(expr) -> bool:
    """Whether `expr` is a rank-4 tensor one pixel high (NC1W)."""
    dims = shape_dims(expr)
    return dims is not None and len(dims) == 4 and isinstance(dims[_HEIGHT], int) and dims[_HEIGHT] == 1
