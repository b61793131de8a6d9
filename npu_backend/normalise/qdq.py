"""QDQ layers in integer form: dequantize -> conv2d / matmul -> quantize becomes int8 x int8 -> int32
with an int32 bias and a requantisation to int8, the arithmetic onnxruntime runs for them.

Stage: normalise (first, before constant folding turns the dequantized weights into floats).
In: a Relax IRModule as `from_onnx` imports a QDQ model. Out: the same module in which every

    q = quantize([relu](conv2d | matmul(dequantize(x), dequantize(Wq)) [+ dequantize(Bq)]), ys, yzp)

that onnxruntime's CPU provider fuses into QLinearConv / QLinearMatMul / QGemm is

    acc = conv2d | matmul(x', Wq, out_dtype="int32") + (Bq - xzp * sum(Wq))     (int32)
    q   = quantize(multiply(astype([relu](acc), "float32"), M), 1.0, yzp)        (int8)
    M[c] = float32(float32(xs * ws[c]) / ys)                                     (onnxruntime's order)

(x' is x, or x padded on the host with its zero point when the conv2d pads: the padding then
stands for the real value 0, as QLinearConv pads.) The patterns fuse that chain into one NPU
kernel whose EPILOGUE requantises (docs/simulator.md gives the arithmetic); a chain the NPU
refuses runs on the host with the same arithmetic (relax's quantize rounds half to even).

Rewritten only where it is exact against onnxruntime: int8 activations with a per-tensor scale
and zero point; int8 constant weights with zero zero points, per tensor or per output channel;
the bias, if any, an int32 constant dequantized with zero zero point (onnxruntime adds its
integers as they are); a relu only when yzp is -128 (onnxruntime then drops it as redundant; with
another zero point it runs the float conv and relu, and so does this module); a 2-D matmul;
conv2d in NCHW / OIHW. Every value between the dequantize and the quantize must have no other
use. Everything else stays as imported.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import relax

_LAYOUTS = ("NCHW", "OIHW", "NCHW")


@dataclasses.dataclass
class _Layer:
    """What one QDQ layer computes, read off the imported graph."""

    op: str  # "conv2d" or "matmul"
    data: relax.Expr  # the int8 activation
    x_zero_point: int
    weight: np.ndarray  # int8: OIHW, or (K, N) for a matmul
    weight_scale: np.ndarray  # float32, one per output channel
    x_scale: np.float32
    bias: np.ndarray | None  # int32 per output channel
    relu: bool
    conv: relax.Call | None = None


def canonicalize_qdq(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with its exact QDQ conv2d / matmul layers in integer form (see the module doc)."""
    updates = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function) and "Composite" not in (func.attrs or {}):
            updates[gvar] = _QdqRewriter(mod, func).visit_expr(func)
    mod = mod.clone()
    for gvar, func in updates.items():
        mod[gvar] = func
    return relax.transform.DeadCodeElimination()(mod)  # the float layers nobody reads now


def _op_name(expr) -> str:
    return expr.op.name if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) else ""


def _constant(expr):
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def _scalar(expr, dtype: str):
    value = _constant(expr)
    return value.item() if value is not None and value.ndim == 0 and value.dtype.name == dtype else None


@relax.expr_functor.mutator
class _QdqRewriter(relax.PyExprMutator):
    """At each quantize binding that ends an exact QDQ layer, emits the integer chain."""

    def __init__(self, mod, func):
        super().__init__(mod)
        self.values, self.users = {}, {}
        for block in func.body.blocks:
            self.values.update({b.var: b.value for b in block.bindings})
            if isinstance(block, relax.DataflowBlock):
                self.users.update(relax.analysis.udchain(block))

    def visit_var_binding_(self, binding):
        plan = self._plan(binding.value)
        if plan is None:
            super().visit_var_binding_(binding)
            return
        layer, y_zero_point, multiplier = plan
        value = self._emit_layer(layer, y_zero_point, multiplier)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))

    # ---------------------------------------------------------------- matching

    def _value(self, expr, op: str):
        """The call of `op` that `expr` names (through its binding), if it is only used once."""
        value = self.values.get(expr, expr)
        if _op_name(value) != op:
            return None
        if isinstance(expr, relax.Var) and len(self.users.get(expr, [])) != 1:
            return None
        return value

    def _plan(self, call):
        """(layer, output zero point, requantisation multiplier) if `call` ends an exact QDQ layer."""
        if _op_name(call) != "relax.quantize" or str(call.attrs.out_dtype) != "int8":
            return None
        y_scale, y_zero_point = _scalar(call.args[1], "float32"), _scalar(call.args[2], "int8")
        if y_scale is None or y_zero_point is None:
            return None
        layer = self._layer(call.args[0], y_zero_point)
        if layer is None:
            return None
        # onnxruntime: output_scales[c] = X_scale * W_scale[c] / Y_scale, in float32, left to right.
        multiplier = (layer.x_scale * layer.weight_scale) / np.float32(y_scale)
        return layer, y_zero_point, multiplier.astype(np.float32)

    def _layer(self, expr, y_zero_point: int):
        relu = self._value(expr, "relax.nn.relu")
        if relu is not None:
            if y_zero_point != -128:  # onnxruntime keeps Conv + Relu in float then
                return None
            expr = relu.args[0]
        bias = None
        add = self._value(expr, "relax.add")
        if add is not None:
            lhs, rhs = add.args
            for core, other in ((lhs, rhs), (rhs, lhs)):
                bias = self._bias(other)
                if bias is not None:
                    expr = core
                    break
            else:
                return None
        layer = self._conv2d(expr) or self._matmul(expr)
        if layer is None or (bias is not None and bias.shape != layer.weight_scale.shape):
            return None
        layer.bias, layer.relu = bias, relu is not None
        return layer

    def _bias(self, expr):
        """The int32 values of a dequantized constant bias (through reshapes), else None."""
        while _op_name(self.values.get(expr, expr)) in ("relax.reshape", "relax.expand_dims"):
            expr = self._value(expr, _op_name(self.values.get(expr, expr)))
            if expr is None:
                return None
            expr = expr.args[0]
        dq = self._value(expr, "relax.dequantize")
        values = _constant(dq.args[0]) if dq is not None else None
        zero = _constant(dq.args[2]) if dq is not None else None
        if values is None or values.dtype.name != "int32" or zero is None or np.any(zero != 0):
            return None
        return values.reshape(-1)

    def _activation(self, expr):
        """(int8 tensor, scale, zero point) of a per-tensor dequantized activation, else None."""
        dq = self._value(expr, "relax.dequantize")
        if dq is None or str(getattr(dq.args[0].ty, "dtype", "")) != "int8":
            return None
        scale, zero_point = _scalar(dq.args[1], "float32"), _scalar(dq.args[2], "int8")
        if scale is None or zero_point is None or str(dq.attrs.out_dtype) != "float32":
            return None
        return dq.args[0], np.float32(scale), zero_point

    def _weight(self, expr, channel_axis: int):
        """(int8 weights, float32 scale per output channel) of a dequantized constant with zero
        zero points, per tensor or per `channel_axis`; else None."""
        dq = self._value(expr, "relax.dequantize")
        if dq is None:
            return None
        weight, scale, zero = (_constant(arg) for arg in dq.args)
        if weight is None or scale is None or zero is None or weight.dtype.name != "int8" \
                or scale.dtype.name != "float32" or np.any(zero != 0):
            return None
        channels = weight.shape[channel_axis]
        if scale.size == 1:
            return weight, np.full(channels, scale.reshape(-1)[0], np.float32)
        axis = int(dq.attrs.axis) % weight.ndim
        if scale.shape != (channels,) or axis != channel_axis:
            return None
        return weight, scale

    def _conv2d(self, expr):
        conv = self._value(expr, "relax.nn.conv2d")
        if conv is None:
            return None
        attrs = conv.attrs
        layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
        activation, weight = self._activation(conv.args[0]), self._weight(conv.args[1], 0)
        if layouts != _LAYOUTS or activation is None or weight is None:
            return None
        return _Layer("conv2d", activation[0], activation[2], weight[0], weight[1], activation[1],
                      None, False, conv)

    def _matmul(self, expr):
        matmul = self._value(expr, "relax.matmul")
        if matmul is None:
            return None
        activation = self._activation(matmul.args[0])
        rhs, transposed = matmul.args[1], self._value(matmul.args[1], "relax.permute_dims")
        if transposed is not None:
            axes = transposed.attrs.axes
            if axes is not None and [int(a) for a in axes] != [1, 0]:
                return None
            weight = self._weight(transposed.args[0], 0)  # Gemm's (N, K), per output row
            weight = None if weight is None else (np.ascontiguousarray(weight[0].T), weight[1])
        else:
            weight = self._weight(rhs, 1)
        if activation is None or weight is None or weight[0].ndim != 2 \
                or len(activation[0].ty.shape) != 2:
            return None
        return _Layer("matmul", activation[0], activation[2], weight[0], weight[1], activation[1],
                      None, False)

    # ---------------------------------------------------------------- rewriting

    def _emit_layer(self, layer: _Layer, y_zero_point: int, multiplier: np.ndarray):
        """The integer chain of `layer` (emitted), ending in the requantising quantize."""
        emit = self.builder_.emit
        data = self.visit_expr(layer.data)
        if layer.op == "conv2d":
            acc = emit(self._int_conv2d(layer, data))
            channel_shape, axis = (1, -1, 1, 1), 1
            weight_sums = layer.weight.astype(np.int64).sum(axis=(1, 2, 3))
        else:
            acc = emit(relax.op.matmul(data, relax.const(layer.weight), out_dtype="int32"))
            channel_shape, axis = (-1,), -1
            weight_sums = layer.weight.astype(np.int64).sum(axis=0)
        # sum((x - xzp) * w) + b = sum(x * w) + (b - xzp * sum(w)); int32 wraps as onnxruntime's does.
        bias = (0 if layer.bias is None else layer.bias.astype(np.int64)) - layer.x_zero_point * weight_sums
        if layer.bias is not None or layer.x_zero_point != 0:
            wrapped = ((bias + 2**31) % 2**32 - 2**31).astype(np.int32)
            acc = emit(relax.op.add(acc, relax.const(wrapped.reshape(channel_shape))))
        if layer.relu:
            acc = emit(relax.op.nn.relu(acc))
        scaled = emit(relax.op.multiply(relax.op.astype(acc, "float32"),
                                        relax.const(multiplier.reshape(channel_shape))))
        return relax.op.quantize(scaled, relax.const(1.0, "float32"), relax.const(y_zero_point, "int8"),
                                 axis=axis, out_dtype="int8")

    def _int_conv2d(self, layer: _Layer, data):
        """int8 x int8 -> int32 conv2d; a padded one pads x with its zero point first (the
        padding is the real value 0), then convolves without padding."""
        attrs = layer.conv.attrs
        padding = [int(p) for p in attrs.padding]
        if layer.x_zero_point != 0 and any(padding):
            top, left, bottom, right = padding if len(padding) == 4 else padding * 2
            data = self.builder_.emit(relax.op.nn.pad(data, [0, 0, 0, 0, top, bottom, left, right],
                                                      pad_value=float(layer.x_zero_point)))
            padding = [0, 0, 0, 0]
        return relax.op.nn.conv2d(data, relax.const(layer.weight), strides=attrs.strides, padding=padding,
                                  dilation=attrs.dilation, groups=int(attrs.groups), out_dtype="int32")
