"""Writes examples/tiny_cnn.onnx: the bundled example model (a small CNN classifier).

conv3x3+relu -> conv3x3/2+relu -> global average pool -> flatten -> gemm (10 classes), float32,
random weights from a fixed seed. The convolutions, the pooling and the classifier run on the
NPU; the flatten stays on the host. Regenerate with `python examples/make_tiny_cnn.py`.
"""

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def tiny_cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(2026)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    inits = [weight("conv1.w", 16, 3, 3, 3), weight("conv1.b", 16),
             weight("conv2.w", 32, 16, 3, 3), weight("conv2.b", 32),
             weight("fc.w", 10, 32), weight("fc.b", 10)]
    nodes = [
        helper.make_node("Conv", ["image", "conv1.w", "conv1.b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "conv2.w", "conv2.b"], ["c2"], name="conv2", pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["pool"], name="pool"),
        helper.make_node("Flatten", ["pool"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10  # onnxruntime refuses the IR version newer onnx writes by default
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_cnn.onnx")
    onnx.save(tiny_cnn(), path)
    print(f"wrote {path}")
