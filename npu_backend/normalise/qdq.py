"""QDQ layers in integer form: dequantize -> conv2d / matmul -> quantize becomes int8 x int8 -> int32
with an int32 bias and a requantisation to int8, the arithmetic onnxruntime runs for them.

Stage: normalise (first, before constant folding turns the dequantized weights into floats).
In: a Relax IRModule as `from_onnx` imports a QDQ model. Out: the same module in which every

    q = quantize([relu](conv2d | matmul(dequantize(x), dequantize(Wq)) [+ dequantize(Bq)]), ys, yzp)

that onnxruntime's CPU provider fuses into QLinearConv / QLinearMatMul / QGemm is

    acc = conv2d | matmul(x', Wq, out_dtype="int32") + (Bq - xzp * sum(Wq))     (int32)
    q   = quantize(multiply(astype([relu](acc), "float32"), M), 1.0, yzp)        (int8)
    M[c] = float32(float32(xs * ws[c]) / ys)                                     (onnxruntime's order)

A conv1d (NCW / OIW: a QDQ text or audio model) is computed as a conv2d one pixel high: its
int8 input viewed NC1W, its weights OI1W, its int8 result viewed NCW again (views on the host),
so the conv2d kernels take it with its requantisation, as conv1ds.py does for a float one.
(x' is x, or pad(x) with its zero point when the conv2d pads: the padding then stands for the
real value 0, as QLinearConv pads. The conv2d kernel takes a pad of -128, int8's lowest value,
into its DMA halo, kernels/gemm/conv2d.py; a static image of another zero point is padded with
-128 and the padding taps' correction added as a residual, qdq_borders.py; a symbolic one is
padded with its zero point on the host.) The patterns fuse that chain into one NPU
kernel whose EPILOGUE requantises (docs/simulator.md gives the arithmetic); a chain the NPU
refuses runs on the host with the same arithmetic (relax's quantize rounds half to even).

Rewritten only where it is exact against onnxruntime: int8 or uint8 activations with a
per-tensor scale and zero point; constant weights, per tensor or per output channel, whose values
minus their zero points fit int8 (int8 weights with zero zero points, as onnxruntime's quantizer
writes them; uint8 ones centred on 128; int4 ones, which import as int8 values); the bias, if
any, an int32 constant dequantized with zero zero point (onnxruntime adds its integers as they
are); a relu only when yzp is the lowest value (onnxruntime then drops it as redundant; with
another zero point it runs the float conv and relu, and so does this module); a matmul of 2-D
weights and an activation of rank 2 or more (a decoder's (1, tokens, K)); conv2d in NCHW / OIHW.
The dequantizes may be shared with other consumers (onnxruntime's quantizer gives a branch or a
shortcut one DequantizeLinear for all of its readers); every value between the conv / matmul and
the quantize must have no other use. Everything else stays as imported.

uint8 tensors are computed as int8 "twins", q - 128 with zero point zp - 128, which is exact:
quantize(x, s, zp) to uint8 saturates round(x / s) + zp to [0, 255], and the same to int8 with
zp - 128 to [-128, 127], 128 lower. Every uint8 quantize gets its twin (the integer layer ending
in it, or the same quantize to int8), and every dequantize of a tensor with a twin reads the twin;
the uint8 tensor itself (twin + 128) stays only where something else reads it (a model output).

The calls made here carry the model nodes of the calls they stand for (the conv's, the bias add's,
the relu's, the QuantizeLinear's), so the kernels report their ONNX node names.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import relax

from ..frontend.provenance import with_span
from .qdq_borders import border_correction
from .int4_convs import emit_int4_conv
from .qdq_int4 import added_functions, emit_int4_matmul
from .rewrite import values_and_users

_LAYOUTS = {"relax.nn.conv2d": ("NCHW", "OIHW", "NCHW"), "relax.nn.conv1d": ("NCW", "OIW", "NCW")}
_QUANTIZED = ("int8", "uint8")
_SHIFT = {"int8": 0, "uint8": 128}  # what a dtype's values lose to become int8


@dataclasses.dataclass
class _Layer:
    """What one QDQ layer computes, read off the imported graph."""

    op: str  # "conv2d", "conv1d" (computed as a conv2d one pixel high) or "matmul"
    data: relax.Expr  # the activation (int8 or uint8) as the graph has it
    x_zero_point: int  # int8: the zero point of the activation's int8 form
    weight: np.ndarray  # int8, its zero point 0: OIHW, or (K, N) for a matmul
    weight_scale: np.ndarray  # float32, one per output channel
    x_scale: np.float32
    bias: np.ndarray | None  # int32 per output channel
    relu: bool
    conv: relax.Call | None = None
    spans: tuple = ()  # (the conv / matmul's, the bias add's, the relu's): their model nodes


def canonicalize_qdq(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with its exact QDQ conv2d / matmul layers in integer form (see the module doc)."""
    updates = {}
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function) and "Composite" not in (func.attrs or {}):
            rewriter = _QdqRewriter(mod, func)
            updates[gvar] = rewriter.visit_expr(func)
            updates.update(added_functions(rewriter.builder_, mod))  # packed int4 layers' PrimFuncs
    mod = mod.clone()
    for gvar, func in updates.items():
        mod[gvar] = func
    return relax.transform.DeadCodeElimination()(mod)  # the float layers nobody reads now


def _op_name(expr) -> str:
    return expr.op.name if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) else ""


def _constant(expr):
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def _scalar(expr, dtypes):
    value = _constant(expr)
    return value.item() if value is not None and value.ndim == 0 and value.dtype.name in dtypes else None


def _dtype(expr) -> str:
    return str(getattr(getattr(expr, "ty", None), "dtype", ""))


@relax.expr_functor.mutator
class _QdqRewriter(relax.PyExprMutator):
    """At each quantize binding that ends an exact QDQ layer, emits the integer chain; gives
    every uint8 quantize an int8 twin and lets the dequantizes read it."""

    def __init__(self, mod, func):
        super().__init__(mod)
        self.values, self.users = values_and_users(func)
        self.twins = {}  # uint8 var of the graph -> its int8 twin (emitted)

    def visit_var_binding_(self, binding):
        call = binding.value
        if _op_name(call) == "relax.dequantize" and call.args[0] in self.twins:
            self._bind(binding, self._dequantize_twin(call))
            return
        plan = self._plan(call)
        if plan is not None:
            layer, y_zero_point, multiplier = plan
            value = self._emit_layer(layer, y_zero_point, multiplier, call.span)
        elif self._unsigned_quantize(call):
            zero_point = call.args[2].value.numpy().astype(np.int16) - 128
            value = relax.op.quantize(self.visit_expr(call.args[0]), self.visit_expr(call.args[1]),
                                      relax.const(zero_point.astype(np.int8)), axis=int(call.attrs.axis),
                                      out_dtype="int8")
        else:
            super().visit_var_binding_(binding)
            return
        if str(call.attrs.out_dtype) == "uint8":  # the int8 twin; the uint8 tensor is twin + 128
            twin = self.builder_.emit(_spanned(value, call.span))
            self.twins[binding.var] = twin
            value = relax.op.astype(relax.op.add(relax.op.astype(twin, "int32"), relax.const(128, "int32")),
                                    "uint8")
        self._bind(binding, _spanned(value, call.span))

    def _bind(self, binding, value):
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))

    # ---------------------------------------------------------------- matching

    def _value(self, expr, op: str, shared: bool = False):
        """The call of `op` that `expr` names (through its binding); unless `shared`, only if
        that value has no other use."""
        value = self.values.get(expr, expr)
        if _op_name(value) != op:
            return None
        if not shared and isinstance(expr, relax.Var) and len(self.users.get(expr, [])) != 1:
            return None
        return value

    @staticmethod
    def _unsigned_quantize(call) -> bool:
        """A quantize to uint8 whose zero point is a constant (one value, or one per channel)."""
        if _op_name(call) != "relax.quantize" or str(call.attrs.out_dtype) != "uint8":
            return False
        zero_point = _constant(call.args[2])
        return zero_point is not None and zero_point.dtype.name == "uint8"

    def _dequantize_twin(self, call):
        """dequantize(x, s, zp) of a uint8 x as dequantize(twin, s, zp - 128): the same values."""
        zero_point = _constant(call.args[2])
        if zero_point is None:
            return call
        return _spanned(relax.op.dequantize(self.twins[call.args[0]], self.visit_expr(call.args[1]),
                                            relax.const((zero_point.astype(np.int16) - 128).astype(np.int8)),
                                            axis=int(call.attrs.axis), out_dtype=str(call.attrs.out_dtype)),
                        call.span)

    def _plan(self, call):
        """(layer, output zero point, requantisation multiplier) if `call` ends an exact QDQ layer
        (the zero point of the int8 form of its output)."""
        if _op_name(call) != "relax.quantize" or str(call.attrs.out_dtype) not in _QUANTIZED:
            return None
        out_dtype = str(call.attrs.out_dtype)
        y_scale, y_zero_point = _scalar(call.args[1], ("float32",)), _scalar(call.args[2], (out_dtype,))
        if y_scale is None or y_zero_point is None:
            return None
        y_zero_point -= _SHIFT[out_dtype]
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
        bias, add = None, self._value(expr, "relax.add")
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
        layer.spans += (getattr(add, "span", None), getattr(relu, "span", None))
        return layer

    def _bias(self, expr):
        """The int32 values of a dequantized constant bias (through reshapes), else None."""
        while _op_name(self.values.get(expr, expr)) in ("relax.reshape", "relax.expand_dims"):
            expr = self._value(expr, _op_name(self.values.get(expr, expr)), shared=True).args[0]
        dq = self._value(expr, "relax.dequantize", shared=True)
        values = _constant(dq.args[0]) if dq is not None else None
        zero = _constant(dq.args[2]) if dq is not None else None
        if values is None or values.dtype.name != "int32" or zero is None or np.any(zero != 0):
            return None
        return values.reshape(-1)

    def _activation(self, expr):
        """(int8 or uint8 tensor, scale, zero point of its int8 form) of a per-tensor dequantized
        activation, else None."""
        dq = self._value(expr, "relax.dequantize", shared=True)
        dtype = _dtype(dq.args[0]) if dq is not None else ""
        if dtype not in _QUANTIZED:
            return None
        scale, zero_point = _scalar(dq.args[1], ("float32",)), _scalar(dq.args[2], (dtype,))
        if scale is None or zero_point is None or str(dq.attrs.out_dtype) != "float32":
            return None
        return dq.args[0], np.float32(scale), zero_point - _SHIFT[dtype]

    def _weight(self, expr, channel_axis: int):
        """(int8 weights with zero point 0, float32 scale per output channel) of a dequantized
        constant, per tensor or per `channel_axis`, whose values minus their zero points fit int8;
        else None."""
        dq = self._value(expr, "relax.dequantize", shared=True)
        if dq is None:
            return None
        weight, scale, zero = (_constant(arg) for arg in dq.args)
        if weight is None or scale is None or zero is None or weight.dtype.name not in _QUANTIZED \
                or zero.dtype != weight.dtype or scale.dtype.name != "float32":
            return None
        channels = weight.shape[channel_axis]
        axis = int(dq.attrs.axis) % weight.ndim
        if scale.size != 1 and (scale.shape != (channels,) or axis != channel_axis):
            return None
        if zero.size != 1 and (zero.shape != (channels,) or axis != channel_axis):
            return None
        shape = [1] * weight.ndim
        shape[channel_axis] = -1
        centred = weight.astype(np.int32) - zero.astype(np.int32).reshape(shape if zero.size != 1 else ())
        if centred.min(initial=0) < -128 or centred.max(initial=0) > 127:
            return None  # the products would need wider weights than the PE array multiplies
        return centred.astype(np.int8), np.broadcast_to(scale.reshape(-1), (channels,)).astype(np.float32)

    def _conv2d(self, expr):
        """A conv2d layer, or a conv1d one as a conv2d one pixel high (its weights OI1W)."""
        conv = self._value(expr, "relax.nn.conv2d")
        conv = self._value(expr, "relax.nn.conv1d") if conv is None else conv
        if conv is None:
            return None
        attrs = conv.attrs
        layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
        activation, weight = self._activation(conv.args[0]), self._weight(conv.args[1], 0)
        if layouts != _LAYOUTS[conv.op.name] or activation is None or weight is None:
            return None
        op, centred = "conv2d", weight[0]
        if conv.op.name == "relax.nn.conv1d":
            op, centred = "conv1d", centred[:, :, None, :]
        return _Layer(op, activation[0], activation[2], centred, weight[1], activation[1],
                      None, False, conv, (conv.span,))

    def _matmul(self, expr):
        matmul = self._value(expr, "relax.matmul")
        if matmul is None:
            return None
        activation = self._activation(matmul.args[0])
        rhs, transposed = matmul.args[1], self._value(matmul.args[1], "relax.permute_dims", shared=True)
        if transposed is not None:
            axes = transposed.attrs.axes
            if axes is not None and [int(a) for a in axes] != [1, 0]:
                return None
            weight = self._weight(transposed.args[0], 0)  # Gemm's (N, K), per output row
            weight = None if weight is None else (np.ascontiguousarray(weight[0].T), weight[1])
        else:
            weight = self._weight(rhs, 1)
        if activation is None or weight is None or weight[0].ndim != 2 \
                or len(activation[0].ty.shape) < 2:
            return None
        return _Layer("matmul", activation[0], activation[2], weight[0], weight[1], activation[1],
                      None, False, spans=(matmul.span,))

    # ---------------------------------------------------------------- rewriting

    def _signed(self, data):
        """The int8 form of the activation `data` (emitted): itself, its twin, or data - 128."""
        if _dtype(data) == "int8":
            return self.visit_expr(data)
        if data not in self.twins:  # a uint8 input of the model, or made by an op other than quantize
            self.twins[data] = self.builder_.emit(relax.op.astype(
                relax.op.subtract(relax.op.astype(self.visit_expr(data), "int32"), relax.const(128, "int32")), "int8"))
        return self.twins[data]

    def _emit_layer(self, layer: _Layer, y_zero_point: int, multiplier: np.ndarray, quantize_span):
        """The integer chain of `layer` (emitted), ending in the requantising quantize to int8."""
        conv_span, add_span, relu_span = layer.spans

        def emit(value, span):
            return self.builder_.emit(_spanned(value, span))

        data = self._signed(layer.data)
        correction = None
        if layer.op == "conv1d":  # NCW -> NC1W, a view
            data = emit(relax.op.expand_dims(data, axis=2), conv_span)
        packed = emit_int4_matmul(self.builder_, data, layer, multiplier, y_zero_point, conv_span)
        if packed is not None:  # a matmul whose weights fit 4 bits: packed two per byte (qdq_int4.py)
            return packed
        packed = emit_int4_conv(self.builder_, data, layer, multiplier, y_zero_point, conv_span)
        if packed is not None:  # a conv2d whose weights fit 4 bits: likewise (int4_convs.py)
            return relax.op.squeeze(emit(packed, conv_span), axis=[2]) if layer.op == "conv1d" else packed
        if layer.op in ("conv2d", "conv1d"):
            conv, correction = self._int_conv2d(layer, data)
            acc = emit(conv, conv_span)
            channel_shape, axis = (1, -1, 1, 1), 1
            weight_sums = layer.weight.astype(np.int64).sum(axis=(1, 2, 3))
        else:
            acc = emit(relax.op.matmul(data, relax.const(layer.weight), out_dtype="int32"), conv_span)
            channel_shape, axis = (-1,), -1
            weight_sums = layer.weight.astype(np.int64).sum(axis=0)
        # sum((x - xzp) * w) + b = sum(x * w) + (b - xzp * sum(w)); int32 wraps as onnxruntime's does.
        bias = (0 if layer.bias is None else layer.bias.astype(np.int64)) - layer.x_zero_point * weight_sums
        if layer.bias is not None or layer.x_zero_point != 0:
            wrapped = ((bias + 2**31) % 2**32 - 2**31).astype(np.int32)
            acc = emit(relax.op.add(acc, relax.const(wrapped.reshape(channel_shape))), add_span or conv_span)
        if correction is not None:  # the zero-point padding's taps (qdq_borders.py)
            acc = emit(relax.op.add(acc, relax.const(correction)), conv_span)
        if layer.relu:
            acc = emit(relax.op.nn.relu(acc), relu_span)
        scaled = emit(relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(multiplier.reshape(channel_shape))),
                      quantize_span)
        quantized = relax.op.quantize(scaled, relax.const(1.0, "float32"), relax.const(y_zero_point, "int8"),
                                      axis=axis, out_dtype="int8")
        if layer.op == "conv1d":  # NC1W -> NCW, a view
            return relax.op.squeeze(emit(quantized, quantize_span), axis=[2])
        return quantized

    def _int_conv2d(self, layer: _Layer, data):
        """(int8 x int8 -> int32 conv2d, int32 correction or None); a padded one pads x with its
        zero point first (the padding is the real value 0), then convolves without padding. A
        static image whose zero point is neither 0 nor -128 is padded with -128 (the kernel's DMA
        halo) and the correction of the padding's taps returned (qdq_borders.py)."""
        attrs = layer.conv.attrs
        strides, padding, dilation = ([int(v) for v in attrs.strides], [int(p) for p in attrs.padding],
                                      [int(d) for d in attrs.dilation])
        if layer.op == "conv1d":  # one pixel high: (left, right) -> (0, left, 0, right)
            strides, padding, dilation = [1] + strides, [0, padding[0], 0, padding[1]], [1] + dilation
        correction, pad_value = None, layer.x_zero_point
        if layer.x_zero_point != 0 and any(padding):
            top, left, bottom, right = padding if len(padding) == 4 else padding * 2
            shape = [getattr(d, "value", None) for d in data.ty.shape]
            if layer.x_zero_point != -128 and None not in shape:
                pad_value = -128
                correction = border_correction(
                    layer.weight, layer.x_zero_point, tuple(shape[1:]), (top, left, bottom, right),
                    tuple(strides), tuple(dilation), int(attrs.groups))
                correction = np.ascontiguousarray(np.broadcast_to(correction, (shape[0],) + correction.shape[1:]))
            data = self.builder_.emit(_spanned(relax.op.nn.pad(data, [0, 0, 0, 0, top, bottom, left, right],
                                                               pad_value=float(pad_value)), layer.conv.span))
            padding = [0, 0, 0, 0]
        return relax.op.nn.conv2d(data, relax.const(layer.weight), strides=strides, padding=padding,
                                  dilation=dilation, groups=int(attrs.groups), out_dtype="int32"), correction


def _spanned(value, span):
    """`value` (a call) carrying `span`, and so its model nodes."""
    return with_span(value, span) if span is not None else value
