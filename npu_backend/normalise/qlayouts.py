"""Concats, splits, reshapes and max pools between quantized tensors on the int8 tensors themselves.

Stage: normalise (after qdq.py gave every QDQ layer its int8 form, before qlinear.py). In: a
Relax IRModule. Out: the same module in which every

    quantize(op(dequantize(x1, s1, z1), ..., dequantize(xn, sn, zn)), s, z)           (int8)

of int8 tensors x1..xn with per-tensor scales and zero points, op a concat, a reshape, a
strided_slice (a split's part since split_slices.py), a max pool or one output of a split
(TupleGetItem(split(dequantize(x)), i)), is op on the int8 tensors:

    op(r1(x1), ..., rn(xn))     ri(x) = x                                  when (si, zi) = (s, z)
                                ri(x) = quantize(dequantize(x, si, zi), s, z)       otherwise

onnxruntime's QLinearConcat and int8 MaxPool, and exact to the imported graph: quantize(
dequantize(x, s, z), s, z) is x for every int8 x (the float32 product (x - z) * s is within
half an ulp of the real one, and dividing it by s rounds back to x - z); the requantisation ri is
elementwise, so it commutes with an op that only moves elements, and monotone non-decreasing, so
it commutes with a max (a max pool's padding is int8's lowest value, below every element, as the
float pool's is below every float). A single-input op requantises its result (fewer elements);
a concat each operand whose scale or zero point differs (onnxruntime calibrates the concat's
output to the union of its inputs' ranges: one operand keeps its values, the others are
requantised, a depth-0 chain of the qchain family, kernels/elementwise/qchain.py).

Why: the dequantizes and quantizes around SqueezeNet's fire-module concats and max pools and
YOLO's C2f splits and concats were host calls, 36 of SqueezeNet's 36 at 64x64, and the ops
between them ran on float32, four times the bytes.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..frontend.provenance import with_span
from .rewrite import one_value, op_name, rewrite_each, values_and_users

#: The ops taken onto int8 (a concat's operands are a tuple, the others' its first argument).
_MOVES = ("relax.reshape", "relax.strided_slice", "relax.nn.max_pool1d", "relax.nn.max_pool2d", "relax.concat")


def _params(call, dtype: str = "int8"):
    """(scale, zero point) of a per-tensor quantize or dequantize between `dtype` and float32."""
    scale, zero = one_value(call.args[1], "float32"), one_value(call.args[2], dtype)
    return None if scale is None or zero is None else (scale, zero)


@relax.expr_functor.mutator
class _QuantizedLayouts(relax.PyExprMutator):
    """Rewrites each quantize binding that ends a layout op or max pool of dequantized tensors
    (of `dtype`: qlayouts16.py takes the int16 ones)."""

    def __init__(self, mod, func, dtype: str = "int8"):
        super().__init__(mod)
        self.DTYPE = dtype
        self.values, self.users = values_and_users(func)
        self.splits = {}  # float split var -> its int8 split (emitted)

    def visit_var_binding_(self, binding):
        value = self._plan(binding.value)
        if value is None:
            super().visit_var_binding_(binding)
            return
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))

    def _dequantized(self, expr):
        """(int8 tensor, (scale, zero point)) of a per-tensor dequantize to float32, else None."""
        dq = self.values.get(expr)
        if op_name(dq) != "relax.dequantize" or str(dq.attrs.out_dtype) != "float32":
            return None
        data, params = dq.args[0], _params(dq, self.DTYPE)
        if params is None or str(getattr(data.ty, "dtype", "")) != self.DTYPE:
            return None
        return data, params

    def _single(self, expr):
        """The value bound to `expr` when the quantize is its one use."""
        return self.values.get(expr) if len(self.users.get(expr, [])) == 1 else None

    def _plan(self, call):
        if op_name(call) != "relax.quantize" or str(call.attrs.out_dtype) != self.DTYPE:
            return None
        target = _params(call, self.DTYPE)
        inner = self._single(call.args[0]) if target is not None else None
        if isinstance(inner, relax.TupleGetItem):
            return self._split_item(inner, target, call.span)
        if op_name(inner) not in _MOVES:
            return None
        if op_name(inner) == "relax.concat":
            fields = self._fields(inner.args[0])
            operands = [self._dequantized(f) for f in fields] if fields is not None else [None]
            if None in operands:
                return None
            tuple_ = relax.Tuple([self._requantized(self.visit_expr(x), params, target, inner.span)
                                  for x, params in operands])
            return with_span(relax.Call(inner.op, [tuple_], inner.attrs), inner.span)
        operand = self._dequantized(inner.args[0])
        if operand is None:
            return None
        args = [self.visit_expr(operand[0])] + [self.visit_expr(arg) for arg in inner.args[1:]]
        moved = self.builder_.emit(with_span(relax.Call(inner.op, args, inner.attrs), inner.span))
        return self._requantized(moved, operand[1], target, call.span, bind=False)

    def _fields(self, expr):
        """The fields of a concat's tuple (inline or bound), else None."""
        value = self.values.get(expr, expr) if isinstance(expr, relax.Var) else expr
        return list(value.fields) if isinstance(value, relax.Tuple) else None

    def _split_item(self, item, target, span):
        """quantize(TupleGetItem(split(dequantize(x)), i)) as the item of an int8 split of x."""
        split = self.values.get(item.tuple_value)
        operand = self._dequantized(split.args[0]) if op_name(split) == "relax.split" else None
        if operand is None:
            return None
        if item.tuple_value not in self.splits:
            self.splits[item.tuple_value] = self.builder_.emit(
                with_span(relax.Call(split.op, [self.visit_expr(operand[0])], split.attrs), split.span))
        part = self.builder_.emit(relax.TupleGetItem(self.splits[item.tuple_value], item.index))
        return self._requantized(part, operand[1], target, span, bind=False)

    def _requantized(self, data, params, target, span, bind=True):
        """`data` (int8, quantized with `params`) quantized with `target`: itself when they agree,
        else quantize(dequantize(data)) (emitted when `bind`)."""
        if params == target:
            return data
        dq = self.builder_.emit(with_span(relax.op.dequantize(
            data, relax.const(params[0], "float32"), relax.const(params[1], self.DTYPE), out_dtype="float32"), span))
        value = with_span(relax.op.quantize(dq, relax.const(target[0], "float32"), relax.const(target[1], self.DTYPE),
                                           out_dtype=self.DTYPE), span)
        return self.builder_.emit(value) if bind else value


def quantized_layouts(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with its layout ops and max pools between quantized tensors on int8 (module doc)."""
    return rewrite_each(mod, _QuantizedLayouts)


quantized_layouts_pass = tvm.transform.module_pass(lambda m, _ctx: quantized_layouts(m), opt_level=0,
                                                   name="cgra.QuantizedLayouts")
