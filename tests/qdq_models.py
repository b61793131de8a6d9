"""QDQ (QuantizeLinear / DequantizeLinear) int8 ONNX models built with onnx.helper.

Float weights drawn at random are quantized with numpy (round half to even, saturate) to int8,
per output channel or per tensor, biases to int32 at scale x_scale * w_scale, the layout
onnxruntime's quantizer writes: activations int8 with a per-tensor scale and zero point, weights
with zero points 0.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def quantize(values, scale, zero_point, axis=None):
    """ONNX QuantizeLinear in numpy: saturate(rne(values / scale) + zero_point) to int8."""
    scale, zero_point = np.asarray(scale, np.float32), np.asarray(zero_point)
    if axis is not None and scale.ndim == 1:
        shape = [1] * values.ndim
        shape[axis] = -1
        scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
    return np.clip(np.rint(values / scale) + zero_point, -128, 127).astype(np.int8)


class QdqGraph:
    """Appends QDQ layers; each returns the name of its (dequantized, float) output."""

    #: Weights are quantized to [-WEIGHT_LEVELS, WEIGHT_LEVELS]: 63, onnxruntime quantizer's
    #: `reduce_range`. On x86 CPUs without VNNI (AVX2 only), MLAS multiplies u8 activations by s8
    #: weights with vpmaddubsw, which saturates each pair of products to int16: with full-range
    #: weights onnxruntime's QLinearConv is then not exact (seen on an AMD EPYC: 44 of 50 outputs
    #: of qdq_cnn off by a step or two), and no exact kernel can match it. With 7-bit weights a
    #: pair stays below 2**15 and onnxruntime computes the exact integer result on every CPU.
    WEIGHT_LEVELS = 63

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.initializers, self.count = [], [], 0

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}{self.count}"

    def const(self, value, dtype) -> str:
        name = self._name("c")
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(self, op: str, inputs, **attrs) -> str:
        name = self._name(op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [name], name=name, **attrs))
        return name

    def qdq(self, x: str, scale: float, zero_point: int) -> str:
        """Quantize to int8 and dequantize again (an activation's fake-quantization)."""
        s, z = self.const(scale, np.float32), self.const(zero_point, np.int8)
        return self.node("DequantizeLinear", [self.node("QuantizeLinear", [x, s, z]), s, z])

    def weight(self, values, per_channel: bool, axis: int = 0):
        """Dequantized int8 weights; returns (name, float32 scales per output channel)."""
        channels = values.shape[axis]
        other = tuple(d for d in range(values.ndim) if d != axis)
        if per_channel:
            scale = (np.abs(values).max(axis=other) / self.WEIGHT_LEVELS).astype(np.float32)
            q = quantize(values, scale, np.zeros(channels, np.int8), axis)
            zero = np.zeros(channels, np.int8)
        else:
            scale = np.float32(np.abs(values).max() / self.WEIGHT_LEVELS)
            q, zero = quantize(values, scale, 0), np.int8(0)
        name = self.node("DequantizeLinear", [self.const(q, np.int8), self.const(scale, np.float32),
                                              self.const(zero, np.int8)], axis=axis)
        return name, np.broadcast_to(scale, (channels,)).astype(np.float32)

    def bias(self, channels: int, x_scale: float, w_scales) -> str:
        """A dequantized int32 bias at scale x_scale * w_scale (zero point 0)."""
        scale = (np.float32(x_scale) * w_scales).astype(np.float32)
        q = np.rint(self.rng.normal(0, 0.2, channels) / scale).astype(np.int32)
        return self.node("DequantizeLinear", [self.const(q, np.int32), self.const(scale, np.float32),
                                              self.const(np.zeros(channels, np.int32), np.int32)], axis=0)

    def conv(self, x, x_scale, cin, cout, kernel=3, stride=1, pad=1, per_channel=True, bias=True):
        w = self.rng.normal(0, np.sqrt(2.0 / (cin * kernel * kernel)), (cout, cin, kernel, kernel))
        weight, scales = self.weight(w.astype(np.float32), per_channel)
        inputs = [x, weight] + ([self.bias(cout, x_scale, scales)] if bias else [])
        return self.node("Conv", inputs, kernel_shape=[kernel, kernel], strides=[stride, stride],
                         pads=[pad] * 4)

    def gemm(self, x, x_scale, k, n, per_channel=True):
        """Gemm with transB = 1: weights (n, k), per output row."""
        weight, scales = self.weight(self.rng.normal(0, np.sqrt(1.0 / k), (n, k)).astype(np.float32),
                                     per_channel)
        return self.node("Gemm", [x, weight, self.bias(n, x_scale, scales)], transB=1)

    def model(self, x: str, shape, out: str, out_shape) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "qdq", [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)],
                                  self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 10  # onnxruntime refuses the IR version onnx 1.23 writes
        onnx.checker.check_model(model)
        return model


def qdq_cnn(seed: int = 0) -> onnx.ModelProto:
    """Three int8 conv layers (per-channel and per-tensor weights, a relu folded into a -128 zero
    point, a strided conv, a 1x1 conv without bias) and a per-channel Gemm classifier."""
    g = QdqGraph(seed)
    x = g.qdq("input", 0.04, 5)
    y = g.node("Relu", [g.conv(x, 0.04, 3, 8)])
    y = g.qdq(y, 0.03, -128)
    y = g.qdq(g.conv(y, 0.03, 8, 16, stride=2), 0.05, 3)
    y = g.qdq(g.conv(y, 0.05, 16, 16, kernel=1, pad=0, per_channel=False, bias=False), 0.06, -2)
    y = g.qdq(g.node("Flatten", [y]), 0.06, -2)
    out = g.qdq(g.gemm(y, 0.06, 16 * 8 * 8, 10), 0.1, 1)
    return g.model("input", [1, 3, 16, 16], out, [1, 10])


def onnxruntime_quantized(model: onnx.ModelProto, path, activation_type: str = "QUInt8",
                          weight_type: str = "QInt8", per_channel: bool = False) -> onnx.ModelProto:
    """`model` quantized by onnxruntime's own tools, as a user would: `quant_pre_process` (shape
    inference, batch norms folded into the convs) and `quantize_static` to QDQ, calibrated on four
    random inputs. Defaults other than the types: reduce_range, so that the weights have 7 bits (see
    QdqGraph.WEIGHT_LEVELS: onnxruntime is exact on every x86 CPU then). `path`: a directory."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source = model.graph.input[0]
    shape = [d.dim_value for d in source.type.tensor_type.shape.dim]

    class Calibration(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.inputs = iter([{source.name: rng.normal(0, 1, shape).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.inputs, None)

    onnx.save(model, f"{path}/float.onnx")
    quant_pre_process(f"{path}/float.onnx", f"{path}/pre.onnx")
    quantize_static(f"{path}/pre.onnx", f"{path}/qdq.onnx", Calibration(), per_channel=per_channel,
                    reduce_range=True, activation_type=getattr(QuantType, activation_type),
                    weight_type=getattr(QuantType, weight_type))
    return onnx.load(f"{path}/qdq.onnx")


def with_quantized_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """`model` whose every QuantizeLinear output is also a graph output (to compare every layer's
    integer result), and those outputs' names."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    names = [n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    model.graph.output.extend(types[name] for name in names if name in types)
    return model, [o.name for o in model.graph.output]
