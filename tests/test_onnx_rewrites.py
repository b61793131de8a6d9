"""What ONNX importers write that the NPU's patterns would not see, rewritten in the normalise
stage: Sum (a stack and a reduction) as adds (normalise/sums.py), so a ResNet-style block joined
with Sum then Relu runs on the NPU; a batch norm no conv2d took as a per-channel scale and shift
(normalise/batch_norms.py). Results equal onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import npu_backend
from npu_backend.tools.workloads import mismatch

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def block_with_sum(operands: int = 2):
    rng = np.random.default_rng(0)
    weights = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype("float32") * 0.3, "w")
    extra = [helper.make_tensor_value_info(f"e{i}", TensorProto.FLOAT, [1, 4, 6, 6]) for i in range(operands - 2)]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Sum", ["c", "x"] + [e.name for e in extra], ["s"], name="sum1"),
             helper.make_node("Relu", ["s"], ["y"], name="relu1")]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])]
                              + extra, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("operands", [2, 3])
def test_a_sum_of_a_block_and_its_shortcut_runs_on_the_npu(operands):
    model = block_with_sum(operands)
    mod = npu_backend.from_onnx(model)
    placements = npu_backend.explain(mod, "cgra-8x8")
    assert {p.where for p in placements} == {"npu"}, [(p.op, p.reason) for p in placements if p.where == "host"]
    assert any(p.nodes == "sum1" for p in placements)  # the adds keep the Sum node's name
    rng = np.random.default_rng(1)
    inputs = {value.name: rng.standard_normal((1, 4, 6, 6)).astype("float32") for value in model.graph.input}
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in inputs.values()]).numpy()
    expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, inputs)[0]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_a_batch_norm_after_a_pool_runs_as_scale_and_shift_on_the_npu():
    rng = np.random.default_rng(0)
    stats = [numpy_helper.from_array(value.astype("float32"), name) for name, value in
             [("g", rng.uniform(0.5, 1.5, 4)), ("b", rng.normal(0, 0.1, 4)), ("m", rng.normal(0, 0.1, 4)),
              ("v", rng.uniform(0.5, 1.5, 4))]]
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("BatchNormalization", ["p", "g", "b", "m", "v"], ["y"], name="bn1")]
    graph = helper.make_graph(nodes, "pool_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])], stats)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    mod = npu_backend.from_onnx(model)
    placements = npu_backend.explain(mod, "cgra-8x8")
    assert [(p.op, p.where) for p in placements] == [("nn.max_pool2d", "npu"), ("multiply", "npu"), ("add", "npu")]
    assert {p.nodes for p in placements[1:]} == {"bn1"}
    x = rng.standard_normal((1, 4, 8, 8)).astype("float32")
    out = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("center, scale", [(True, False), (False, True)])
def test_a_standalone_batch_norm_without_its_shift_or_scale_matches_the_host(center, scale):
    from npu_backend.normalise.batch_norms import batch_norms_as_scale_shift

    rng = np.random.default_rng(2)
    stats = [relax.const(v.astype("float32")) for v in (rng.uniform(0.5, 1.5, 4), rng.normal(0, 0.5, 4),
                                                        rng.normal(0, 0.5, 4), rng.uniform(0.5, 1.5, 4))]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4, 3, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            norm = bb.emit(relax.op.nn.batch_norm(x, *stats, axis=1, center=center, scale=scale))
            out = bb.emit_output(relax.TupleGetItem(norm, 0))
        bb.emit_func_output(out)
    mod = bb.get()
    data = tvm.runtime.tensor(rng.standard_normal((2, 4, 3, 3)).astype("float32"))

    def host(module):
        return relax.VirtualMachine(tvm.compile(module, target="llvm"), tvm.cpu())["main"](data).numpy()

    np.testing.assert_allclose(host(batch_norms_as_scale_shift(mod)), host(mod), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("std", [(58.4, 57.1, 57.4), (0.0, 1.0, 2.0), (1e38, 1.0, 2.0)],
                         ids=["imagenet", "a-zero", "a-subnormal-reciprocal"])
def test_a_division_by_constants_is_a_multiplication_by_their_reciprocals(std):
    """(x - mean) / std, torchvision's normalisation as exported models carry it: the division
    runs on the NPU as a multiplication by 1 / std (within 1.5 ulp); a divisor with a zero, or
    one whose reciprocal is subnormal (too few bits for 1.5 ulp), stays a division on the host."""
    import onnxruntime

    mean = numpy_helper.from_array(np.array([123.7, 116.3, 103.5], np.float32).reshape(1, 3, 1, 1), "m")
    scale = numpy_helper.from_array(np.array(std, np.float32).reshape(1, 3, 1, 1), "s")
    nodes = [helper.make_node("Sub", ["x", "m"], ["a"]), helper.make_node("Div", ["a", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])],
                              initializer=[mean, scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod = npu_backend.from_onnx(model)
    placements = {p.op: p.where for p in npu_backend.explain(mod, "cgra-8x8")}
    assert placements == ({"subtract": "npu", "multiply": "npu"} if max(std) < 1e30 and 0.0 not in std else
                          {"subtract": "npu", "divide": "host"})
    x = (np.random.default_rng(0).random((1, 3, 8, 8)) * 255).astype(np.float32)
    out = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](
        tvm.runtime.tensor(x)).numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    assert mismatch(out, expected, "float32") is None
