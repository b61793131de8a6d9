"""ONNX nodes as one's own TensorIR: `npu_backend.from_onnx(model, custom_ops={op_type: builder})`
turns custom-domain ops the importer does not know, or chosen nodes of known ops, into call_tir
of the builder's PrimFunc, which then runs on the NPU (tests/test_call_tir.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, te

import npu_backend

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((32, 24)).astype("float32")
W2 = RNG.standard_normal((24, 8)).astype("float32")


def model(first_op="MyMatmul", domain="my.ops"):
    """x (16, 32) -> first_op(x, w1) -> Relu -> MatMul(., w2): node names mm1, relu1, mm2."""
    nodes = [helper.make_node(first_op, ["x", "w1"], ["y"], name="mm1", domain=domain),
             helper.make_node("Relu", ["y"], ["z"], name="relu1"),
             helper.make_node("MatMul", ["z", "w2"], ["out"], name="mm2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 32])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [16, 8])],
                              [numpy_helper.from_array(W1, "w1"), numpy_helper.from_array(W2, "w2")])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets)


def te_matmul(node):
    """A builder: the node's matmul in TE, sized from its inputs."""
    (m, k), (_, n) = node.input_shapes
    a, b = te.placeholder((m, k), node.input_dtypes[0], "A"), te.placeholder((k, n), node.input_dtypes[1], "B")
    r = te.reduce_axis((0, k), "r")
    return te.create_prim_func([a, b, te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), "C")])


def run(mod, arch="cgra-8x8"):
    x = RNG.standard_normal((16, 32)).astype("float32")
    vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    with npu_backend.profile() as prof:
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out, np.maximum(x @ W1, 0) @ W2, rtol=1e-4, atol=1e-4)
    return prof


def test_a_custom_domain_op_runs_on_the_npu_as_its_builders_tensorir():
    seen = []
    mod = npu_backend.from_onnx(model(), custom_ops={"MyMatmul": lambda node: seen.append(node) or te_matmul(node)})
    node, = seen
    assert (node.name, node.op_type, node.input_shapes, node.input_dtypes) == \
        ("mm1", "MyMatmul", ((16, 32), (32, 24)), ("float32", "float32"))
    placement = npu_backend.explain(mod, "cgra-8x8")[0]
    assert (placement.op, placement.where, placement.nodes) == ("call_tir mm1", "npu", "mm1")
    prof = run(mod)
    assert prof.kernels[0].source_ops == ("call_tir mm1",) and prof.kernels[0].model_nodes == ("mm1",)


def test_a_builder_replaces_chosen_nodes_of_a_known_op_and_leaves_the_others():
    """MatMul mm1 becomes the user's TensorIR; MatMul mm2 stays TVM's (and the NPU's own kernel)."""
    mod = npu_backend.from_onnx(model("MatMul", ""), custom_ops={
        "MatMul": lambda node: te_matmul(node) if node.name == "mm1" else None})
    ops = [(p.op, p.where) for p in npu_backend.explain(mod, "cgra-8x8")]
    assert ops[0] == ("call_tir mm1", "npu") and ("matmul", "npu") in ops
    prof = run(mod)
    assert [k.source_ops[0] for k in prof.kernels][:1] == ["call_tir mm1"]


def test_an_op_without_a_converter_or_builder_says_how_to_supply_one():
    with pytest.raises(npu_backend.InvalidModel, match="no converter for MyMatmul.*custom_ops"):
        npu_backend.from_onnx(model())


def _copy_of_first_input():
    """A PrimFunc of one input and the output: one parameter short for a two-input node."""
    a = te.placeholder((16, 32), "float32", "A")
    return te.create_prim_func([a, te.compute((16, 32), lambda i, j: a[i, j], "C")])


@pytest.mark.parametrize("builder, message", [
    (lambda node: "not a function", "returned str, not a PrimFunc"),
    (lambda node: _copy_of_first_input(), "takes 2 parameters"),
    (lambda node: te_matmul(type(node)(node.name, node.op_type, node.attrs, ((16, 30), (30, 24)),
                                       node.input_dtypes)), r"parameter 'A' is \(16, 30\) float32, but input 0"),
])
def test_a_builders_mistake_is_named(builder, message):
    with pytest.raises(npu_backend.InvalidModel, match=message):
        npu_backend.from_onnx(model(), custom_ops={"MyMatmul": builder})


def test_the_own_onnx_op_example_runs_its_custom_op_on_the_npu(capsys):
    import pathlib
    import runpy

    example = runpy.run_path(str(pathlib.Path(__file__).parent.parent / "examples" / "own_onnx_op.py"))
    figures = example["main"](["--arch", "cgra-4x4"])
    assert any(name.startswith("cgra_tir_scaled_mm") for name in figures["custom"])
    # Every kernel names its node, the replaced MatMul too (it is the graph's output: its span was lost).
    assert "cgra_tir_classifier [classifier]" in figures["replaced"]
    assert all(not name.endswith("[]") for name in figures["custom"] | figures["replaced"])
    assert "100.00% of" in capsys.readouterr().out
