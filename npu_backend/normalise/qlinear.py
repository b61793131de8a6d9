"""Ops between quantized tensors: adds as onnxruntime's QLinearAdd in fixed point, multiplies
with dequantizes of their own (QLinearMul, kernels/elementwise/qlinear.py).

Stage: normalise (last of the passes, after qdq.py gave every QDQ layer its int8 form and the
scalars pass ran: the constants written here stay 0-d, bound inside the kernel as a FABRIC
body's immediates). In: a Relax IRModule. Out: the same module in which every

    c = quantize([relu](add(dequantize(a, sa, za), dequantize(b, sb, zb))), sc, zc)      (int8)

of int8 tensors a, b of one shape with per-tensor scales and zero points (a residual add of a
QDQ ResNet) is onnxruntime's integer QLinearAdd (MLAS, MlasCalcQLinearAddParameters):

    MA = rne(float32(sa / sc) * 2**S), MB = rne(float32(sb / sc) * 2**S)   (S: 21 - the larger ratio's exponent)
    c  = saturate(((a - za) * MA + (b - zb) * MB + 2**(S - 1)) >> S) + zc)             (int32, then int8)

written with astype, subtract, multiply, add, right_shift and clip on int32, which the host
computes exactly as well, and the qlinear family (kernels/elementwise/qlinear.py) runs as one
FABRIC_INT8 kernel. A relu before the quantize is the saturation itself when zc is -128 (as
onnxruntime drops it); with another zero point, or ratios outside MLAS's fixed-point range
(sa / sc or sb / sc below 2**-14 or from 256 up: onnxruntime computes in float then), the add
stays as imported.

A quantize(multiply(dequantize(a), dequantize(b))) of int8 tensors (a squeeze-excite's scale, a
hard-swish's x * gate, SiLU's x * sigmoid(x) between quantized tensors) keeps its ops; its
dequantizes, which onnxruntime's quantizer shares with other readers, are copied for it alone;
and so is the dequantize of a float chain quantize(chain(dequantize(x))) (a HardSigmoid, a
hard-swish: kernels/elementwise/qchain.py).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..frontend.provenance import with_span
from .rewrite import one_value, op_name, rewrite_each, values_and_users

_MIN_RATIO, _MAX_RATIO = np.float32(2.0 ** -14), np.float32(256.0)


def qlinear_add_parameters(a_scale, b_scale, c_scale):
    """(shift, MA, MB) of onnxruntime's fixed-point QLinearAdd for the three float32 scales, or
    None where onnxruntime computes the add in float (MlasCalcQLinearAddParameters)."""
    ratio_a = np.float32(a_scale) / np.float32(c_scale)
    ratio_b = np.float32(b_scale) / np.float32(c_scale)
    if not all(_MIN_RATIO <= r < _MAX_RATIO for r in (ratio_a, ratio_b)):
        return None
    exponent = int(np.array(max(ratio_a, ratio_b), np.float32).view(np.uint32) >> 23) - 127
    shift = 21 - exponent
    if not 13 <= shift <= 31:
        return None
    power = np.float32(2.0 ** shift)
    ma, mb = (int(np.rint(np.float32(ratio * power))) for ratio in (ratio_a, ratio_b))
    if not (ma < 1 << 22 and mb < 1 << 22 and (ma >= 1 << 21 or mb >= 1 << 21)):
        return None
    return shift, ma, mb


def qlinear_add_reference(a, a_zero, b, b_zero, c_zero, shift, ma, mb) -> np.ndarray:
    """The fixed-point QLinearAdd in numpy (int64: no step wraps for the parameters above)."""
    acc = (a.astype(np.int64) - a_zero) * ma + (b.astype(np.int64) - b_zero) * mb
    return np.clip(((acc + (1 << (shift - 1))) >> shift) + c_zero, -128, 127).astype(np.int8)


def _shape(expr):
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    return None if shape is None else [str(d) for d in shape]


@relax.expr_functor.mutator
class _QlinearAdds(relax.PyExprMutator):
    """Emits the fixed-point chain at each quantize binding that ends an exact QLinearAdd."""

    def __init__(self, mod, func):
        super().__init__(mod)
        self.values, self.users = values_and_users(func)

    def _only(self, expr, op: str):
        """The call of `op` bound to `expr` when its value has that one use."""
        value = self.values.get(expr)
        if op_name(value) != op or len(self.users.get(expr, [])) != 1:
            return None
        return value

    def _dequantized(self, expr):
        """(int8 tensor, float32 scale, int8 zero point) of a per-tensor dequantize, else None."""
        dq = self.values.get(expr)
        if op_name(dq) != "relax.dequantize" or str(dq.attrs.out_dtype) != "float32":
            return None
        data, scale, zero = dq.args[0], one_value(dq.args[1], "float32"), one_value(dq.args[2], "int8")
        if scale is None or zero is None or str(getattr(data.ty, "dtype", "")) != "int8":
            return None
        return data, scale, zero

    def visit_var_binding_(self, binding):
        value = self._plan(binding.value)
        if value is None:
            super().visit_var_binding_(binding)
            return
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))

    def _plan(self, call):
        if op_name(call) != "relax.quantize" or str(call.attrs.out_dtype) != "int8":
            return None
        c_scale, c_zero = one_value(call.args[1], "float32"), one_value(call.args[2], "int8")
        if c_scale is None or c_zero is None:
            return None
        inner = call.args[0]
        multiply = self._only(inner, "relax.multiply")
        if multiply is not None and self._dequantized(multiply.args[0]) and self._dequantized(multiply.args[1]):
            return self._multiply(call, multiply)
        added = self._add(inner, c_scale, c_zero)
        if added is not None:
            return added
        chain = self._chain(inner)
        return self._own_dequantize(call, *chain) if chain is not None else None

    def _add(self, inner, c_scale, c_zero):
        """The fixed-point QLinearAdd (emitted) quantized from `inner`, else None."""
        relu = self._only(inner, "relax.nn.relu")
        if relu is not None:
            if c_zero != -128:  # onnxruntime computes Add + Relu in float then
                return None
            inner = relu.args[0]
        add = self._only(inner, "relax.add")
        operands = [self._dequantized(arg) for arg in add.args] if add is not None else [None]
        if None in operands or _shape(operands[0][0]) != _shape(operands[1][0]) or _shape(operands[0][0]) is None:
            return None
        (a, a_scale, a_zero), (b, b_scale, b_zero) = operands
        parameters = qlinear_add_parameters(a_scale, b_scale, c_scale)
        if parameters is None:
            return None
        return _emit(self, a, a_zero, b, b_zero, c_zero, parameters, add.span)


    def _multiply(self, quantize, multiply):
        """quantize(multiply(dequantize(a), dequantize(b))) of int8 tensors (b may broadcast) with
        dequantizes of its own (a dequantize shared with a squeeze-excite's pool or a hard-swish's
        gate is copied), so that the qlinear family can take the chain whole; the same ops, the
        same values on the host."""
        operands = [self._dequantized(arg) for arg in multiply.args]
        if None in operands:
            return None

        def emit(value, span):
            return self.builder_.emit(with_span(value, span))

        fresh = [emit(relax.op.dequantize(self.visit_expr(data), relax.const(scale, "float32"),
                                          relax.const(zero, "int8"), out_dtype="float32"), multiply.span)
                 for data, scale, zero in operands]
        product = emit(relax.op.multiply(*fresh), multiply.span)
        return relax.op.quantize(product, self.visit_expr(quantize.args[1]), self.visit_expr(quantize.args[2]),
                                 axis=int(quantize.attrs.axis), out_dtype="int8")


    _LINKS = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum",
              "relax.clip", "relax.nn.relu", "relax.nn.leakyrelu")

    def _chain(self, expr):
        """(dequantize var, the chain's calls from the first) of a chain of single-use elementwise
        calls on one dequantized int8 tensor (their other operands constants or that tensor),
        else None."""
        calls, sources = [], set()
        while self._dequantized(expr) is None:
            value = self.values.get(expr)
            if op_name(value) not in self._LINKS or len(self.users.get(expr, [])) != 1 or len(calls) == 6:
                return None
            links = [arg for arg in value.args if isinstance(arg, relax.Var)]
            inner = [arg for arg in links if self._dequantized(arg) is None]
            sources |= {arg for arg in links if self._dequantized(arg) is not None}
            if len(inner) > 1 or not links:
                return None
            calls.append((expr, value))
            expr = inner[0] if inner else links[0]
        sources.add(expr)
        return (expr, calls[::-1]) if calls and len(sources) == 1 else None

    def _own_dequantize(self, quantize, dq_var, calls):
        """quantize(chain(dequantize(x))) with a dequantize of its own (a hard-swish's x is
        also its gate's input): the same ops, the same values."""
        data, scale, zero = self._dequantized(dq_var)
        span = calls[0][1].span
        fresh = self.builder_.emit(with_span(relax.op.dequantize(self.visit_expr(data), relax.const(scale, "float32"),
                                                                relax.const(zero, "int8"), out_dtype="float32"), span))
        renamed = {dq_var: fresh}
        for var, call in calls:
            args = [renamed.get(arg, self.visit_expr(arg)) for arg in call.args]
            renamed[var] = self.builder_.emit(with_span(relax.Call(call.op, args, call.attrs, call.ty_args), call.span))
        return relax.op.quantize(renamed[calls[-1][0]], self.visit_expr(quantize.args[1]),
                                 self.visit_expr(quantize.args[2]), axis=int(quantize.attrs.axis), out_dtype="int8")


def _emit(mutator, a, a_zero, b, b_zero, c_zero, parameters, span):
    """The int32 chain of one QLinearAdd (emitted), its int8 result returned unbound."""
    shift, ma, mb = parameters

    def emit(value):
        return mutator.builder_.emit(with_span(value, span))

    def const(value):
        return relax.const(int(value), "int32")

    def scaled(data, zero, multiplier):
        wide = emit(relax.op.astype(mutator.visit_expr(data), "int32"))
        return emit(relax.op.multiply(emit(relax.op.subtract(wide, const(zero))), const(multiplier)))

    total = emit(relax.op.add(emit(relax.op.add(scaled(a, a_zero, ma), scaled(b, b_zero, mb))),
                              const(1 << (shift - 1))))
    value = emit(relax.op.add(emit(relax.op.right_shift(total, const(shift))), const(c_zero)))
    value = relax.op.astype(emit(relax.op.clip(value, -128, 127)), "int8")
    return with_span(value, span)


def integer_qlinear_adds(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with its exact QLinearAdds in fixed point (see the module doc)."""
    return rewrite_each(mod, _QlinearAdds)


integer_qlinear_adds_pass = tvm.transform.module_pass(lambda m, _ctx: integer_qlinear_adds(m), opt_level=0,
                                                      name="cgra.IntegerQLinearAdds")
