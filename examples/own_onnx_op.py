"""Your own TensorIR for ONNX operators (docs/own-kernels.md; seed 001's last question: replace an
operator of an imported model with our own TensorIR).

The model below has a custom-domain op the importer does not know (`my.ops::ScaledMatMul`:
alpha * A @ B, alpha an attribute), then a Relu and a standard MatMul. `from_onnx(...,
custom_ops=...)` turns every ScaledMatMul node into a call_tir of the PrimFunc its builder
writes in TE, sized from the node's inputs; the compiler finds the GEMM in it and runs it on the
PE array, like any call_tir PrimFunc. A second import also replaces the model's standard MatMul
with the same kind of TensorIR (a builder returning None would keep TVM's conversion). Results
are checked against numpy; cycles are printed per kernel.

    python examples/own_onnx_op.py [--arch cgra-8x8]
"""

from __future__ import annotations

import argparse

import numpy as np
import tvm
from tvm import relax, te

import npu_backend

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((64, 48)).astype("float32")
W2 = RNG.standard_normal((48, 16)).astype("float32")
ALPHA = 0.5


def model():
    """x (32, 64) -> my.ops::ScaledMatMul(x, w1, alpha) -> Relu -> MatMul(., w2)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("ScaledMatMul", ["x", "w1"], ["y"], name="scaled_mm", domain="my.ops", alpha=ALPHA),
             helper.make_node("Relu", ["y"], ["z"], name="relu"),
             helper.make_node("MatMul", ["z", "w2"], ["out"], name="classifier")]
    graph = helper.make_graph(nodes, "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [32, 16])],
                              [numpy_helper.from_array(W1, "w1"), numpy_helper.from_array(W2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.ops", 1)])


def matmul_builder(node):
    """The node's A @ B in TE, sized from its inputs (node: npu_backend's CustomNode). A PrimFunc
    offloads as one GEMM block, so alpha is folded into the weights first (scaled_weights)."""
    if float(node.attrs.get("alpha", 1.0)) != 1.0:
        raise ValueError(f"{node.name}: fold alpha into the weights first (scaled_weights)")
    (m, k), (_, n) = node.input_shapes
    a, b = te.placeholder((m, k), "float32", "A"), te.placeholder((k, n), "float32", "B")
    r = te.reduce_axis((0, k), "r")
    return te.create_prim_func([a, b, te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), "C")])


def scaled_weights(model_proto):
    """Fold each ScaledMatMul's alpha into its weight initializer (alpha becomes 1)."""
    from onnx import numpy_helper

    weights = {init.name: init for init in model_proto.graph.initializer}
    for node in model_proto.graph.node:
        if node.op_type == "ScaledMatMul":
            alpha = next(a for a in node.attribute if a.name == "alpha")
            init = weights[node.input[1]]
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * alpha.f, init.name))
            alpha.f = 1.0
    return model_proto


def run(mod, arch):
    x = RNG.standard_normal((32, 64)).astype("float32")
    vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    with npu_backend.profile() as prof:
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out, np.maximum(ALPHA * (x @ W1), 0) @ W2, rtol=1e-4, atol=1e-4)
    return {f"{kernel.name} [{','.join(kernel.model_nodes)}]": kernel.cycles for kernel in prof.kernels}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cgra-8x8", help="preset name or JSON file (default cgra-8x8)")
    arch = parser.parse_args(argv).arch
    custom = npu_backend.from_onnx(scaled_weights(model()), custom_ops={"ScaledMatMul": matmul_builder})
    print(npu_backend.format_placements(npu_backend.explain(custom, arch)))
    first = run(custom, arch)
    print(f"custom op as your TensorIR on {arch} (matches numpy): {first}")
    replaced = npu_backend.from_onnx(scaled_weights(model()),
                                     custom_ops={"ScaledMatMul": matmul_builder, "MatMul": matmul_builder})
    second = run(replaced, arch)
    print(f"...and the model's MatMul replaced too (matches numpy): {second}")
    return {"custom": first, "replaced": second}


if __name__ == "__main__":
    main()
