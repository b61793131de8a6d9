"""Model-zoo-shaped ONNX networks: the layer shapes of the classics (AlexNet, ZFNet, VGG-19,
ResNet-50, DenseNet-121, Inception v1, SqueezeNet 1.1, ShuffleNet v2, MobileNet v1, MobileNetV3-Small
with its hard-swish and hard-sigmoid, Tiny YOLOv3's leaky-relu backbone, a YOLOv8n-style SiLU
detector) with random
weights, built with onnx.helper (no downloads), for test_model_zoo.py and benchmarks/bench_zoo.py.
Shapes are what the figures depend on.

Each builder takes the input size (the zoo's 224 by default) so a test can use a smaller one.
"""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from onnx_models import _Graph, mobilenet_v2, resnet18


class ZooGraph(_Graph):
    """_Graph plus the layers the classics use: biased conv, pools, dense, concat, shuffle."""

    def conv(self, x, cin, cout, kernel, stride=1, pad=None, groups=1, relu=True):
        fan_in = cin // groups * kernel * kernel
        w = self.rng.standard_normal((cout, cin // groups, kernel, kernel)) * np.sqrt(2.0 / fan_in)
        name = self._name("w")
        y = self.node("Conv", [x, self._const(name, w), self._const(name + "_b", self.rng.normal(0, 0.1, cout))],
                      kernel_shape=[kernel, kernel], strides=[stride, stride],
                      pads=[kernel // 2 if pad is None else pad] * 4, group=groups)
        return self.node("Relu", [y]) if relu else y

    def max_pool(self, x, kernel=3, stride=2, pad=0):
        return self.node("MaxPool", [x], kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4)

    def avg_pool(self, x, kernel=2, stride=2):
        return self.node("AveragePool", [x], kernel_shape=[kernel, kernel], strides=[stride, stride])

    def dense(self, x, cin, cout, relu=True):
        w = self.rng.standard_normal((cout, cin)) * np.sqrt(2.0 / cin)
        name = self._name("fc_w")
        y = self.node("Gemm", [x, self._const(name, w), self._const(name + "_b", self.rng.normal(0, 0.1, cout))],
                      transB=1)
        return self.node("Relu", [y]) if relu else y

    def concat(self, xs):
        return self.node("Concat", xs, axis=1)

    def shuffle(self, x, channels, size, groups=2):
        """ShuffleNet's channel shuffle: reshape to (groups, C/groups), transpose, flatten back."""
        split = self._const(self._name("shape"), [1, groups, channels // groups, size, size])
        y = self.node("Transpose", [self.node("Reshape", [x, self._int64(split)])], perm=[0, 2, 1, 3, 4])
        return self.node("Reshape", [y, self._int64(self._const(self._name("shape"), [1, channels, size, size]))])

    def split(self, x, half):
        """Two halves of the channels (ShuffleNet v2's channel split)."""
        name = self._name("split")
        sizes = self._int64(self._const(self._name("sizes"), [half, half]))
        self.nodes.append(helper.make_node("Split", [x, sizes], [name + "_a", name + "_b"], name=name, axis=1))
        return name + "_a", name + "_b"

    def _int64(self, name):
        init = next(i for i in self.initializers if i.name == name)
        self.initializers.remove(init)
        self.initializers.append(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.int64), name))
        return name


def _out(size, kernel, stride, pad):
    return (size + 2 * pad - kernel) // stride + 1


def alexnet(size=224, classes=1000, seed=0, widths=(64, 192, 384, 256, 256), first=(11, 4, 2), second_stride=1,
            name="alexnet"):
    g = ZooGraph(seed)
    kernel, stride, pad = first
    x = g.conv("input", 3, widths[0], kernel, stride, pad)
    s = _out(size, kernel, stride, pad)
    x, s = g.max_pool(x), _out(s, 3, 2, 0)
    x, s = g.conv(x, widths[0], widths[1], 5, second_stride), _out(s, 5, second_stride, 2)
    x, s = g.max_pool(x), _out(s, 3, 2, 0)
    x = g.conv(x, widths[1], widths[2], 3)
    x = g.conv(x, widths[2], widths[3], 3)
    x = g.conv(x, widths[3], widths[4], 3)
    x, s = g.max_pool(x), _out(s, 3, 2, 0)
    x = g.node("Flatten", [x])
    x = g.dense(x, widths[4] * s * s, 4096)
    x = g.dense(x, 4096, 4096)
    return g.model(name, [1, 3, size, size], g.dense(x, 4096, classes, relu=False), [1, classes])


def zfnet(size=224, classes=1000, seed=0):
    return alexnet(size, classes, seed, widths=(96, 256, 384, 384, 256), first=(7, 2, 1), second_stride=2, name="zfnet")


def vgg19(size=224, classes=1000, seed=0):
    g = ZooGraph(seed)
    x, cin, s = "input", 3, size
    for cout, repeats in ((64, 2), (128, 2), (256, 4), (512, 4), (512, 4)):
        for _ in range(repeats):
            x, cin = g.conv(x, cin, cout, 3), cout
        x, s = g.max_pool(x, 2, 2), s // 2
    x = g.node("Flatten", [x])
    x = g.dense(g.dense(x, 512 * s * s, 4096), 4096, 4096)
    return g.model("vgg19", [1, 3, size, size], g.dense(x, 4096, classes, relu=False), [1, classes])


def resnet50(size=224, classes=1000, seed=0):
    g = ZooGraph(seed)
    x = g.max_pool(g.conv_bn("input", 3, 64, 7, 2), 3, 2, 1)
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for block in range(blocks):
            step = stride if block == 0 else 1
            y = g.conv_bn(x, cin, width, 1)
            y = g.conv_bn(y, width, width, 3, step)
            y = g.conv_bn(y, width, 4 * width, 1, act=None)
            shortcut = g.conv_bn(x, cin, 4 * width, 1, step, act=None) if block == 0 else x
            x, cin = g.node("Relu", [g.node("Add", [y, shortcut])]), 4 * width
    return g.model("resnet50", [1, 3, size, size], g.classifier(x, cin, classes), [1, classes])


def densenet121(size=224, classes=1000, seed=0, growth=32, blocks=(6, 12, 24, 16)):
    g = ZooGraph(seed)
    x = g.max_pool(g.conv_bn("input", 3, 64, 7, 2), 3, 2, 1)
    channels = 64
    for index, layers in enumerate(blocks):
        for _ in range(layers):
            y = g.conv_bn(g.conv_bn(x, channels, 4 * growth, 1), 4 * growth, growth, 3)
            x, channels = g.concat([x, y]), channels + growth
        if index < len(blocks) - 1:
            x = g.avg_pool(g.conv_bn(x, channels, channels // 2, 1))
            channels //= 2
    return g.model("densenet121", [1, 3, size, size], g.classifier(x, channels, classes), [1, classes])


#: GoogLeNet's inception modules: (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection), a
#: "pool" entry between stages.
INCEPTION = [(64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64), "pool",
             (192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
             (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128), "pool",
             (256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128)]


def inception_v1(size=224, classes=1000, seed=0):
    g = ZooGraph(seed)
    x = g.max_pool(g.conv("input", 3, 64, 7, 2), 3, 2, 1)
    x = g.conv(g.conv(x, 64, 64, 1), 64, 192, 3)
    x, cin = g.max_pool(x, 3, 2, 1), 192
    for module in INCEPTION:
        if module == "pool":
            x = g.max_pool(x, 3, 2, 1)
            continue
        c1, r3, c3, r5, c5, proj = module
        branches = [g.conv(x, cin, c1, 1), g.conv(g.conv(x, cin, r3, 1), r3, c3, 3),
                    g.conv(g.conv(x, cin, r5, 1), r5, c5, 5),
                    g.conv(g.max_pool(x, 3, 1, 1), cin, proj, 1)]
        x, cin = g.concat(branches), c1 + c3 + c5 + proj
    return g.model("inception_v1", [1, 3, size, size], g.classifier(x, cin, classes), [1, classes])


def squeezenet11(size=224, classes=1000, seed=0):
    g = ZooGraph(seed)
    x = g.max_pool(g.conv("input", 3, 64, 3, 2, 0))
    cin = 64
    for index, (squeeze, expand) in enumerate(((16, 64), (16, 64), (32, 128), (32, 128), (48, 192), (48, 192),
                                               (64, 256), (64, 256))):
        s = g.conv(x, cin, squeeze, 1)
        x, cin = g.concat([g.conv(s, squeeze, expand, 1), g.conv(s, squeeze, expand, 3)]), 2 * expand
        if index in (1, 3):
            x = g.max_pool(x)
    x = g.conv(x, cin, classes, 1)
    y = g.node("Flatten", [g.node("GlobalAveragePool", [x])])
    return g.model("squeezenet1.1", [1, 3, size, size], y, [1, classes])


def shufflenet_v2(size=224, classes=1000, seed=0, widths=(116, 232, 464)):
    g = ZooGraph(seed)
    x = g.max_pool(g.conv_bn("input", 3, 24, 3, 2), 3, 2, 1)
    cin, s = 24, size // 4
    for cout, repeats in zip(widths, (4, 8, 4)):
        half = cout // 2
        left = g.conv_bn(g.conv_bn(x, cin, cin, 3, 2, groups=cin, act=None), cin, half, 1)
        right = g.conv_bn(x, cin, half, 1)
        right = g.conv_bn(g.conv_bn(right, half, half, 3, 2, groups=half, act=None), half, half, 1)
        s //= 2
        x = g.shuffle(g.concat([left, right]), cout, s)
        for _ in range(repeats - 1):
            keep = g.split(x, half)
            branch = g.conv_bn(keep[1], half, half, 1)
            branch = g.conv_bn(g.conv_bn(branch, half, half, 3, groups=half, act=None), half, half, 1)
            x = g.shuffle(g.concat([keep[0], branch]), cout, s)
        cin = cout
    x = g.conv_bn(x, cin, 1024, 1)
    return g.model("shufflenet_v2", [1, 3, size, size], g.classifier(x, 1024, classes), [1, classes])


def mobilenet_v1(size=224, classes=1000, seed=0):
    g = ZooGraph(seed)
    x, cin = g.conv_bn("input", 3, 32, 3, 2), 32
    for cout, stride in ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), *[(512, 1)] * 5,
                         (1024, 2), (1024, 1)):
        x = g.conv_bn(g.conv_bn(x, cin, cin, 3, stride, groups=cin), cin, cout, 1)
        cin = cout
    return g.model("mobilenet_v1", [1, 3, size, size], g.classifier(x, cin, classes), [1, classes])


def _make_divisible(value: float, divisor: int = 8) -> int:
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def mobilenet_v3_small(size=224, classes=1000, seed=0):
    """MobileNetV3-Small (Howard et al. 2019; torchvision's configuration): hard-swish and relu
    inverted residuals with 3x3 / 5x5 depthwise convs, squeeze-and-excitation gated by a
    hard-sigmoid, a hard-swish classifier."""
    g = ZooGraph(seed)
    x, cin = g.conv_bn("input", 3, 16, 3, 2, act="hardswish"), 16
    for kernel, expand, cout, se, act, stride in (
            (3, 16, 16, True, "relu", 2), (3, 72, 24, False, "relu", 2), (3, 88, 24, False, "relu", 1),
            (5, 96, 40, True, "hardswish", 2), (5, 240, 40, True, "hardswish", 1), (5, 240, 40, True, "hardswish", 1),
            (5, 120, 48, True, "hardswish", 1), (5, 144, 48, True, "hardswish", 1), (5, 288, 96, True, "hardswish", 2),
            (5, 576, 96, True, "hardswish", 1), (5, 576, 96, True, "hardswish", 1)):
        y = x if expand == cin else g.conv_bn(x, cin, expand, 1, act=act)
        y = g.conv_bn(y, expand, expand, kernel, stride, groups=expand, act=act)
        if se:
            squeeze = _make_divisible(expand // 4)
            s = g.conv(g.node("GlobalAveragePool", [y]), expand, squeeze, 1)
            s = g.node("HardSigmoid", [g.conv(s, squeeze, expand, 1, relu=False)], alpha=1 / 6, beta=0.5)
            y = g.node("Mul", [y, s])
        y = g.conv_bn(y, expand, cout, 1, act=None)
        x = g.node("Add", [x, y]) if stride == 1 and cin == cout else y
        cin = cout
    x = g.node("Flatten", [g.node("GlobalAveragePool", [g.conv_bn(x, cin, 576, 1, act="hardswish")])])
    x = g.node("HardSwish", [g.dense(x, 576, 1024, relu=False)])
    return g.model("mobilenet_v3_small", [1, 3, size, size], g.dense(x, 1024, classes, relu=False), [1, classes])


def tiny_yolo_v3(size=416, seed=0):
    """Tiny YOLOv3's darknet backbone and its first detection head (Redmon and Farhadi 2018):
    3x3 convs with batch norm and leaky relu (0.1) between 2x2 max pools, then 1x1 / 3x3 convs and
    the 255-channel 1x1 output conv (3 anchors x (80 classes + 5)), linear."""
    g = ZooGraph(seed)
    x, cin = "input", 3
    for cout in (16, 32, 64, 128, 256):
        x, cin = g.max_pool(g.conv_bn(x, cin, cout, act="leaky"), 2, 2), cout
    x = g.conv_bn(g.conv_bn(x, cin, 512, act="leaky"), 512, 1024, act="leaky")
    x = g.conv_bn(g.conv_bn(x, 1024, 256, 1, act="leaky"), 256, 512, act="leaky")
    out = g.conv(x, 512, 255, 1, relu=False)
    return g.model("tiny_yolo_v3", [1, 3, size, size], out, [1, 255, size // 32, size // 32])


def _c2f(g, x, cin, cout, blocks):
    """YOLOv8's C2f: a 1x1 conv, its channels split in two, `blocks` residual pairs of 3x3 convs
    on the second half, every half concatenated and a 1x1 conv."""
    half = cout // 2
    a, b = g.split(g.conv_bn(x, cin, cout, 1, act="silu"), half)
    parts = [a, b]
    for _ in range(blocks):
        b = g.node("Add", [b, g.conv_bn(g.conv_bn(b, half, half, act="silu"), half, half, act="silu")])
        parts.append(b)
    return g.conv_bn(g.concat(parts), (2 + blocks) * half, cout, 1, act="silu")


def yolo_v8n(size=416, seed=0):
    """A YOLOv8n-style detector (Ultralytics' layout at width 0.25): conv + batch norm + SiLU
    (as the exporters write it, x * sigmoid(x)) everywhere, stride-2 3x3 convs between C2f
    blocks, SPPF (three 5x5 max pools), and one box-and-class head at stride 32 (64 box bins +
    80 classes); no upsampling neck."""
    g = ZooGraph(seed)
    x = g.conv_bn(g.conv_bn("input", 3, 16, 3, 2, act="silu"), 16, 32, 3, 2, act="silu")
    x, cin = _c2f(g, x, 32, 32, 1), 32
    for cout, blocks in ((64, 2), (128, 2), (256, 1)):
        x, cin = _c2f(g, g.conv_bn(x, cin, cout, 3, 2, act="silu"), cout, cout, blocks), cout
    y = g.conv_bn(x, 256, 128, 1, act="silu")
    pools = [y]
    for _ in range(3):
        pools.append(g.max_pool(pools[-1], 5, 1, 2))
    x = g.conv_bn(g.concat(pools), 512, 256, 1, act="silu")
    x = g.conv_bn(g.conv_bn(x, 256, 64, act="silu"), 64, 64, act="silu")
    out = g.conv(x, 64, 144, 1, relu=False)
    return g.model("yolo_v8n", [1, 3, size, size], out, [1, 144, size // 32, size // 32])


#: name -> builder(size) of every network the benchmarks measure.
ZOO = {
    "alexnet": alexnet, "zfnet": zfnet, "vgg19": vgg19, "resnet18": lambda size=224: resnet18(size),
    "resnet50": resnet50, "densenet121": densenet121, "inception_v1": inception_v1,
    "squeezenet1.1": squeezenet11, "shufflenet_v2": shufflenet_v2, "mobilenet_v1": mobilenet_v1,
    "mobilenet_v2": lambda size=224: mobilenet_v2(size, classes=1000),
    "mobilenet_v3_small": mobilenet_v3_small, "tiny_yolo_v3": tiny_yolo_v3,
    "yolo_v8n": yolo_v8n,
}
