"""QDQ layers with int16 activations and int8 weights (onnxruntime's `quantize_static(...,
activation_type=QuantType.QInt16, weight_type=QuantType.QInt8)`) in the 16x8 integer form.

Stage: normalise (beside qdq.py, before constant folding turns the dequantized weights into
floats). In: a Relax IRModule as `from_onnx` imports such a model. Out: the same module in which every

    q = quantize([relu](conv2d | matmul(dequantize(x), dequantize(Wq)) [+ dequantize(Bq)]), ys, yzp)

with x int16 (per-tensor scale and zero point) and q int16 is

    acc = conv2d | matmul(x, Wq, out_dtype="int64") + (Bq - xzp * sum(Wq)) [+ correction]   (int64)
    q   = quantize(multiply(astype([relu](acc), "float32"), M), 1.0, yzp)                    (int16)
    M[c] = float32(float32(xs * ws[c]) / ys)

which the conv2d / matmul kernels run as one 16x8 GEMM (int16 x int8 into int64) with a
requantising EPILOGUE to int16 (cgra_sim/int16.py). A conv2d that pads keeps its own zero padding,
and the taps that fall in it, which should have read xzp (the real value 0), are corrected by
xzp * (the sum of the weights over those taps): an int64 constant of the output's shape the
epilogue adds as a residual (the sums come from qdq_borders.py). A symbolic image is padded with
xzp on the host instead.

onnxruntime (1.32) has no integer kernel for these layers: its CPU provider dequantizes, runs the
float32 Conv / MatMul, and quantizes the float32 sum. This form computes the sum exactly, so it
equals onnxruntime's output except where onnxruntime's float32 sum rounds to the neighbouring
int16 step: about one output in a thousand, by one step (tests/test_int16_qdq.py measures it).

Rewritten only where the integer form is exact: int8 weights (zero points 0, per tensor or per
output channel), an int32 bias dequantized with zero zero point, a relu only when yzp is -32768
(onnxruntime's quantizer then drops it as redundant), conv2d in NCHW / OIHW, a 2-D matmul. The
dequantizes may be shared; every value between the conv / matmul and the quantize must have no
other use. Everything else stays as imported (and runs in float32 on the host or the NPU).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..frontend.provenance import with_span
from .qdq_borders import border_correction
from .rewrite import values_and_users


def canonicalize_qdq16(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with its int16-activation QDQ conv2d / matmul layers in 16x8 integer form."""
    updates = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function) and "Composite" not in (func.attrs or {}) and _has_int16(func):
            updates[gvar] = _Qdq16Rewriter(mod, func).visit_expr(func)
    if not updates:
        return mod
    mod = mod.clone()
    for gvar, func in updates.items():
        mod[gvar] = func
    return relax.transform.DeadCodeElimination()(mod)  # the float layers nobody reads now


def _has_int16(func) -> bool:
    """Whether `func` quantizes anything to int16 (most models do not: nothing to visit)."""
    found = []
    relax.analysis.post_order_visit(func.body, lambda e: found.append(
        isinstance(e, relax.Call) and _op_name(e) == "relax.quantize" and str(e.attrs.out_dtype) == "int16"))
    return any(found)


def _op_name(expr) -> str:
    return expr.op.name if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) else ""


def _constant(expr):
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def _scalar(expr, dtype: str):
    value = _constant(expr)
    return value.item() if value is not None and value.ndim == 0 and value.dtype.name == dtype else None


def _spanned(value, span):
    return with_span(value, span) if span is not None else value


@relax.expr_functor.mutator
class _Qdq16Rewriter(relax.PyExprMutator):
    """At each int16 quantize binding that ends an exact 16x8 layer, emits the integer chain."""

    def __init__(self, mod, func):
        super().__init__(mod)
        self.values, self.users = values_and_users(func)

    def visit_var_binding_(self, binding):
        layer = self._plan(binding.value)
        if layer is None:
            super().visit_var_binding_(binding)
            return
        value = self._emit(layer, binding.value)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))

    # ---------------------------------------------------------------- matching

    def _value(self, expr, op: str, shared: bool = False):
        """The call of `op` that `expr` names; unless `shared`, only if it has no other use."""
        value = self.values.get(expr, expr)
        if _op_name(value) != op:
            return None
        if not shared and isinstance(expr, relax.Var) and len(self.users.get(expr, [])) != 1:
            return None
        return value

    def _plan(self, call):
        """The layer (a dict) `call` ends, if it is an int16 quantize of an exact 16x8 layer."""
        if _op_name(call) != "relax.quantize" or str(call.attrs.out_dtype) != "int16":
            return None
        y_scale, y_zero = _scalar(call.args[1], "float32"), _scalar(call.args[2], "int16")
        if y_scale is None or y_zero is None:
            return None
        expr, relu = call.args[0], self._value(call.args[0], "relax.nn.relu")
        if relu is not None:
            if y_zero != -32768:  # onnxruntime keeps Conv + Relu in float then
                return None
            expr = relu.args[0]
        bias, add = None, self._value(expr, "relax.add")
        if add is not None:
            bias = next(((core, b) for core, other in (add.args, add.args[::-1])
                         if (b := self._bias(other)) is not None), None)
            if bias is None:
                return None
            expr, bias = bias
        layer = self._conv2d(expr) or self._matmul(expr)
        if layer is None or (bias is not None and bias.shape != layer["weight_scale"].shape):
            return None
        multiplier = (np.float32(layer["x_scale"]) * layer["weight_scale"]) / np.float32(y_scale)
        layer.update(bias=bias, relu=relu is not None, y_zero=y_zero, multiplier=multiplier.astype(np.float32))
        return layer

    def _bias(self, expr):
        """The int32 values of a dequantized constant bias (through reshapes), else None."""
        while _op_name(self.values.get(expr, expr)) in ("relax.reshape", "relax.expand_dims"):
            expr = self.values.get(expr, expr).args[0]
        dq = self._value(expr, "relax.dequantize", shared=True)
        values, zero = (_constant(dq.args[0]), _constant(dq.args[2])) if dq is not None else (None, None)
        if values is None or values.dtype.name != "int32" or zero is None or np.any(zero != 0):
            return None
        return values.reshape(-1)

    def _activation(self, expr):
        """(int16 tensor, scale, zero point) of a per-tensor dequantized int16 activation."""
        dq = self._value(expr, "relax.dequantize", shared=True)
        if dq is None or str(getattr(dq.args[0].ty, "dtype", "")) != "int16" or str(dq.attrs.out_dtype) != "float32":
            return None
        scale, zero = _scalar(dq.args[1], "float32"), _scalar(dq.args[2], "int16")
        return None if scale is None or zero is None else (dq.args[0], scale, zero)

    def _weight(self, expr, channel_axis: int):
        """(int8 weights, float32 scale per output channel) of a dequantized int8 constant with
        zero zero points, per tensor or per `channel_axis`."""
        dq = self._value(expr, "relax.dequantize", shared=True)
        if dq is None:
            return None
        weight, scale, zero = (_constant(arg) for arg in dq.args)
        if weight is None or scale is None or zero is None or weight.dtype.name != "int8" \
                or scale.dtype.name != "float32" or np.any(zero != 0):
            return None
        channels = weight.shape[channel_axis]
        if scale.size != 1 and (scale.shape != (channels,) or int(dq.attrs.axis) % weight.ndim != channel_axis):
            return None
        return weight, np.broadcast_to(scale.reshape(-1), (channels,)).astype(np.float32)

    def _conv2d(self, expr):
        conv = self._value(expr, "relax.nn.conv2d")
        if conv is None:
            return None
        attrs = conv.attrs
        if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) != ("NCHW", "OIHW", "NCHW"):
            return None
        activation, weight = self._activation(conv.args[0]), self._weight(conv.args[1], 0)
        if activation is None or weight is None:
            return None
        return dict(op="conv2d", call=conv, data=activation[0], x_scale=activation[1], x_zero=activation[2],
                    weight=weight[0], weight_scale=weight[1])

    def _matmul(self, expr):
        matmul = self._value(expr, "relax.matmul")
        if matmul is None:
            return None
        activation, rhs = self._activation(matmul.args[0]), matmul.args[1]
        transposed = self._value(rhs, "relax.permute_dims", shared=True)
        if transposed is not None:  # Gemm's (N, K) weights, a scale per output row
            axes = transposed.attrs.axes
            if axes is not None and [int(a) for a in axes] != [1, 0]:
                return None
            weight = self._weight(transposed.args[0], 0)
            weight = None if weight is None else (np.ascontiguousarray(weight[0].T), weight[1])
        else:
            weight = self._weight(rhs, 1)
        if activation is None or weight is None or weight[0].ndim != 2 or len(activation[0].ty.shape) != 2:
            return None
        return dict(op="matmul", call=matmul, data=activation[0], x_scale=activation[1], x_zero=activation[2],
                    weight=weight[0], weight_scale=weight[1])

    # ---------------------------------------------------------------- rewriting

    def _emit(self, layer: dict, quantize):
        """The 16x8 integer chain of `layer`, ending in the requantising quantize to int16."""
        span = layer["call"].span
        emit = lambda value: self.builder_.emit(_spanned(value, span))  # noqa: E731
        data, weight, zero = self.visit_expr(layer["data"]), layer["weight"], layer["x_zero"]
        correction = None
        if layer["op"] == "conv2d":
            conv, correction = self._int_conv2d(layer, data)
            acc, shape, sums = emit(conv), (1, -1, 1, 1), weight.astype(np.int64).sum(axis=(1, 2, 3))
        else:
            acc = emit(relax.op.matmul(data, relax.const(weight), out_dtype="int64"))
            shape, sums = (-1,), weight.astype(np.int64).sum(axis=0)
        # sum((x - xzp) * w) + b = sum(x * w) + (b - xzp * sum(w)), exact in int64.
        bias = (0 if layer["bias"] is None else layer["bias"].astype(np.int64)) - zero * sums
        acc = emit(relax.op.add(acc, relax.const(np.asarray(bias, np.int64).reshape(shape), "int64")))
        if correction is not None:
            acc = emit(relax.op.add(acc, relax.const(correction, "int64")))
        if layer["relu"]:
            acc = emit(relax.op.nn.relu(acc))
        scaled = self.builder_.emit(_spanned(relax.op.multiply(
            relax.op.astype(acc, "float32"), relax.const(layer["multiplier"].reshape(shape))), quantize.span))
        return _spanned(relax.op.quantize(scaled, relax.const(1.0, "float32"), relax.const(layer["y_zero"], "int16"),
                                          axis=1 if layer["op"] == "conv2d" else -1, out_dtype="int16"), quantize.span)

    def _int_conv2d(self, layer: dict, data):
        """(int16 x int8 -> int64 conv2d, int64 correction or None). A padded conv of a static
        image keeps its zero padding and returns the correction of the padding's taps; a
        symbolic image is padded with its zero point on the host first."""
        attrs, weight, zero = layer["call"].attrs, layer["weight"], layer["x_zero"]
        strides, dilation = tuple(int(v) for v in attrs.strides), tuple(int(d) for d in attrs.dilation)
        padding = [int(p) for p in attrs.padding]
        padding = padding * 2 if len(padding) == 2 else padding
        correction = None
        if zero != 0 and any(padding):
            shape = [getattr(d, "value", None) for d in data.ty.shape]
            top, left, bottom, right = padding
            if None in shape:
                data = self.builder_.emit(_spanned(relax.op.nn.pad(data, [0, 0, 0, 0, top, bottom, left, right],
                                                                   pad_value=float(zero)), layer["call"].span))
                padding = [0, 0, 0, 0]
            else:  # border_correction with zp -127 gives the weights' sums over the padding's taps
                taps = border_correction(weight, -127, tuple(shape[1:]), tuple(padding), strides, dilation,
                                         int(attrs.groups)).astype(np.int64)
                correction = np.ascontiguousarray(np.broadcast_to(taps * zero, (shape[0],) + taps.shape[1:]))
        conv = relax.op.nn.conv2d(data, relax.const(weight), strides=strides, padding=padding, dilation=dilation,
                                  groups=int(attrs.groups), out_dtype="int64")
        return conv, correction
