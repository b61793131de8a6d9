"""Small ResNet- and MobileNetV2-style ONNX networks built with onnx.helper (no downloads).

Random weights with He scaling and random batch-norm statistics, so activations stay O(1) through
the network and a wrong kernel shows up as a large relative error, not as a difference near zero.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Graph:
    """Appends nodes and initializers; each layer returns its output's name."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.initializers = [], []
        self.count = 0

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}{self.count}"

    def _const(self, name: str, value) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    def node(self, op: str, inputs, **attrs) -> str:
        name = self._name(op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [name], name=name, **attrs))
        return name

    def conv_bn(self, x, cin, cout, kernel=3, stride=1, groups=1, act="relu"):
        """Conv (no bias) + BatchNormalization + relu / relu6 (Clip) / hardswish / leaky (0.1) / silu /
        nothing."""
        fan_in = cin // groups * kernel * kernel
        w = self.rng.standard_normal((cout, cin // groups, kernel, kernel)) * np.sqrt(2.0 / fan_in)
        name = self._name("w")
        y = self.node("Conv", [x, self._const(name, w)], kernel_shape=[kernel, kernel],
                      strides=[stride, stride], pads=[kernel // 2] * 4, group=groups)
        stats = [self.rng.uniform(0.5, 1.5, cout), self.rng.normal(0, 0.1, cout),
                 self.rng.normal(0, 0.1, cout), self.rng.uniform(0.5, 1.5, cout)]
        names = [self._const(f"{name}_{part}", value)
                 for part, value in zip(("scale", "shift", "mean", "var"), stats)]
        y = self.node("BatchNormalization", [y, *names], epsilon=1e-5)
        if act == "relu":
            return self.node("Relu", [y])
        if act == "relu6":
            return self.node("Clip", [y, self._const(self._name("lo"), 0.0), self._const(self._name("hi"), 6.0)])
        if act == "hardswish":
            return self.node("HardSwish", [y])
        if act == "leaky":  # darknet's
            return self.node("LeakyRelu", [y], alpha=0.1)
        if act == "silu":  # YOLOv5-v8's, as the exporters write it
            return self.node("Mul", [y, self.node("Sigmoid", [y])])
        return y

    def classifier(self, x, channels, classes):
        pooled = self.node("Flatten", [self.node("GlobalAveragePool", [x])])
        w = self.rng.standard_normal((classes, channels)) / np.sqrt(channels)
        return self.node("Gemm", [pooled, self._const(self._name("fc_w"), w),
                                  self._const(self._name("fc_b"), self.rng.normal(0, 0.1, classes))],
                         transB=1)

    def model(self, name, input_shape, output, output_shape) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name, [helper.make_tensor_value_info("input", TensorProto.FLOAT, input_shape)],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, output_shape)], self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 10  # onnxruntime refuses newer IR versions
        onnx.checker.check_model(model)
        return model


def resnet(size: int | str = 32, width: int = 16, classes: int = 10, seed: int = 0, stages=None,
           blocks: int = 1, stem_kernel: int = 3, stem_stride: int = 1, batch: int | str = 1,
           columns: int | str | None = None) -> onnx.ModelProto:
    """Stem conv + max pool, basic residual blocks, global average pool, fully connected.

    `stages`: output channels per stage (default (width, 2 * width)), `blocks` basic blocks per
    stage; the first block of every stage after the first is strided, with a 1x1 projection
    shortcut. The default is a small two-block network; `resnet18` is the real one. `batch`: an
    int, or a name for a dynamic batch (an ONNX dim_param); `size` the image height (and width,
    unless `columns` gives it), each an int or a name for a dynamic size."""
    stages = (width, 2 * width) if stages is None else tuple(stages)
    g = _Graph(seed)
    x = g.conv_bn("input", 3, stages[0], kernel=stem_kernel, stride=stem_stride)
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = stages[0]
    for stage, cout in enumerate(stages):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            y = g.conv_bn(x, cin, cout, stride=stride)
            y = g.conv_bn(y, cout, cout, act=None)
            shortcut = x if stride == 1 and cin == cout else \
                g.conv_bn(x, cin, cout, kernel=1, stride=stride, act=None)
            x = g.node("Relu", [g.node("Add", [y, shortcut])])
            cin = cout
    out = g.classifier(x, cin, classes)
    return g.model("resnet_style", [batch, 3, size, size if columns is None else columns], out, [batch, classes])


def resnet18(size: int = 224, classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """ResNet-18: 7x7/2 stem, 3x3/2 max pool, stages of 64-128-256-512 channels with two basic
    blocks each (stride-2 projections), batch norm after every conv, global average pool, FC."""
    return resnet(size, classes=classes, seed=seed, stages=(64, 128, 256, 512), blocks=2,
                  stem_kernel=7, stem_stride=2)


def mobilenet_v2(size: int | str = 32, classes: int = 10, seed: int = 0) -> onnx.ModelProto:
    """Strided stem, inverted residual blocks (1x1 expand, 3x3 depthwise, 1x1 linear project,
    a residual add where shapes allow), a 1x1 head conv, global average pool, fully connected.
    `size`: the image's height and width, or a name for a dynamic square size."""
    g = _Graph(seed)
    x = g.conv_bn("input", 3, 16, stride=2, act="relu6")
    channels = 16
    for expand, cout, stride in ((1, 16, 1), (4, 24, 2), (4, 24, 1), (4, 32, 2)):
        hidden = channels * expand
        y = x if expand == 1 else g.conv_bn(x, channels, hidden, kernel=1, act="relu6")
        y = g.conv_bn(y, hidden, hidden, stride=stride, groups=hidden, act="relu6")
        y = g.conv_bn(y, hidden, cout, kernel=1, act=None)
        x = g.node("Add", [x, y]) if stride == 1 and cout == channels else y
        channels = cout
    x = g.conv_bn(x, channels, 128, kernel=1, act="relu6")
    out = g.classifier(x, 128, classes)
    return g.model("mobilenet_v2_style", [1, 3, size, size], out, [1, classes])


def yolo_silu_backbone(size: int | str = "S", seed: int = 0) -> onnx.ModelProto:
    """A YOLOv5-style stem and backbone at a dynamic image size (an ONNX dim_param): conv-bn-SiLU
    layers of stride 2, 1, 2 and 1, SiLU written as x * Sigmoid(x), the exporters' form."""
    g = _Graph(seed)
    x = g.conv_bn("input", 3, 8, stride=2, act="silu")
    x = g.conv_bn(x, 8, 8, act="silu")
    x = g.conv_bn(x, 8, 16, stride=2, act="silu")
    x = g.conv_bn(x, 16, 16, kernel=1, act="silu")
    return g.model("yolo_silu_backbone", [1, 3, size, size], x, [1, 16, None, None])


def text_line_encoder(height: int = 16, channels: int = 16, width="W", seed: int = 0) -> onnx.ModelProto:
    """The convolutional front of an OCR recogniser (CRNN-like): a grey text line of fixed height
    and variable `width` (an ONNX dim_param), conv-bn-relu, a stride-2 conv-bn-relu, conv-bn-relu,
    a 2x2 max pool."""
    g = _Graph(seed)
    x = g.conv_bn("input", 1, channels // 2)
    x = g.conv_bn(x, channels // 2, channels, stride=2)
    x = g.conv_bn(x, channels, channels)
    x = g.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    return g.model("text_line_encoder", [1, 1, height, width], x, [1, channels, height // 4, None])
