"""A global average pool between quantized tensors as onnxruntime's QLinearGlobalAveragePool.

Stage: normalise (before large_pools.py splits a float mean of a large map). In: a Relax
IRModule. Out: the same module in which every

    y = quantize(mean(dequantize(x, sx, zx), axis=[2, 3], keepdims=True), sy, zy)     (int8)

(ONNX's DequantizeLinear -> GlobalAveragePool -> QuantizeLinear: a squeeze-excite's pool, a
classifier's) of an int8 NCHW x of static shape with per-tensor scales is onnxruntime's integer
kernel (MlasQLinearGlobalAveragePoolNchw, which its QDQ transformer puts there, with and without
session.qdqisint8allowed; a uint8 x reaches here as its int8 twin, qdq.py, whose sum is the same):

    acc = sum of x over the H x W map - zx * H * W                        (int32)
    y   = saturate(rne(float32(acc) * M) + zy),  M = float32(sx / float32(sy * float32(H * W)))

written as an int8 matmul of the map's (N C, H W) view by a column of H W ones (out_dtype int32),
the constant added, and the requantisation qdq.py writes for a QDQ matmul; the matmul family
runs the chain as one int8 GEMM kernel whose EPILOGUE requantises. (A depthwise conv of ones over
the whole map computes the same, slower: 3,445 cycles against the GEMM's 919 for 576 x 2 x 2
on cgra-8x8, 973 against 773 for 16 x 16 x 16.) Before: the dequantize of the whole map ran
on the host, the mean was a float POOL kernel and the quantize a kernel of its own, and the float
mean, rounded otherwise, could land a step from onnxruntime's result (MobileNetV3-Small at 64 x 64
on cgra-8x8: ten of each, 25,067 host cycles and 12,632 NPU cycles, now ten GEMM kernels of
6,976). Where onnxruntime refuses the kernel (M below 2**-32 or from 256 up: it raises) the
chain stays as imported.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import static_shape
from .rewrite import as_pass, one_value, op_name, rewrite_each

_MIN_SCALE, _MAX_SCALE = np.float32(2.0 ** -32), np.float32(256.0)


def pool_multiplier(x_scale, y_scale, pixels: int):
    """onnxruntime's float32 requantisation scale of a QLinearGlobalAveragePool over `pixels`
    values a channel (CheckQLinearGlobalAveragePoolScaleAndSize), or None where it raises."""
    scale = np.float32(x_scale) / (np.float32(y_scale) * np.float32(pixels))
    return scale if pixels < 1 << 24 and _MIN_SCALE <= scale < _MAX_SCALE else None


@relax.expr_functor.mutator
class _QuantizedPools(relax.PyExprMutator):
    """At each int8 quantize of a global mean of a dequantized int8 map, emits the integer pool."""

    def __init__(self, mod, func):
        super().__init__(mod)
        self.values = {b.var: b.value for block in func.body.blocks for b in block.bindings}

    def visit_var_binding_(self, binding):
        value = self._plan(binding.value)
        if value is None:
            super().visit_var_binding_(binding)
            return
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))

    def _plan(self, call):
        if op_name(call) != "relax.quantize" or str(call.attrs.out_dtype) != "int8":
            return None
        y_scale, y_zero = one_value(call.args[1], "float32"), one_value(call.args[2], "int8")
        mean = self.values.get(call.args[0])
        if y_scale is None or y_zero is None or op_name(mean) != "relax.mean" or not bool(mean.attrs.keepdims) \
                or mean.attrs.axis is None or sorted(int(a) % 4 for a in mean.attrs.axis) != [2, 3]:
            return None
        dq = self.values.get(mean.args[0])
        if op_name(dq) != "relax.dequantize" or str(dq.attrs.out_dtype) != "float32":
            return None
        x, x_scale, x_zero = dq.args[0], one_value(dq.args[1], "float32"), one_value(dq.args[2], "int8")
        shape = static_shape(x)
        if x_scale is None or x_zero is None or shape is None or len(shape) != 4 \
                or str(getattr(x.ty, "dtype", "")) != "int8":
            return None
        multiplier = pool_multiplier(x_scale, y_scale, shape[2] * shape[3])
        if multiplier is None:
            return None
        return self._emit(x, shape, x_zero, multiplier, y_zero, mean.span, call.span)

    def _emit(self, x, shape, x_zero: int, multiplier, y_zero: int, mean_span, quantize_span):
        """The integer pool (emitted but its last reshape, which is returned)."""
        _, channels, height, width = shape

        def emit(value, span):
            return self.builder_.emit(with_span(value, span) if span is not None else value)

        pixels = height * width
        # (N C, H W) int8 x a column of ones: the GEMM sums each channel's map (a view in and out).
        rows = emit(relax.op.reshape(self.visit_expr(x), (shape[0] * channels, pixels)), mean_span)
        acc = emit(relax.op.matmul(rows, relax.const(np.ones((pixels, 1), np.int8)), out_dtype="int32"), mean_span)
        if x_zero:
            acc = emit(relax.op.add(acc, relax.const(np.array([-x_zero * pixels], np.int32))), mean_span)
        scaled = emit(relax.op.multiply(emit(relax.op.astype(acc, "float32"), quantize_span),
                                        relax.const(np.array([multiplier], np.float32))), quantize_span)
        quantized = emit(relax.op.quantize(scaled, relax.const(1.0, "float32"), relax.const(y_zero, "int8"), axis=-1,
                                           out_dtype="int8"), quantize_span)
        quantized = relax.op.reshape(quantized, (shape[0], channels, 1, 1))
        return with_span(quantized, quantize_span) if quantize_span is not None else quantized


def quantized_pools(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with its global average pools between int8 tensors in integers (see the module doc)."""
    return rewrite_each(mod, _QuantizedPools)


quantized_pools_pass = as_pass(quantized_pools, "cgra.QuantizedPools", ops=("relax.mean",))
