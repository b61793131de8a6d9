"""Chains of elementwise ops on one tensor run as one dataflow body on the PE fabric
(kernels/elementwise/fabric.py, the FABRIC command): the activations the vector unit has no command for
(leaky relu, hard-swish, hard-sigmoid as ONNX and PyTorch write them) and any chain of add,
subtract, multiply, divide by a constant, maximum, minimum, clip and relu with one-element
constants. Checked against onnxruntime and against TVM's own llvm build on random chains
(Hypothesis), with the reasons a chain stays elsewhere."""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import npu_backend
from npu_backend.tools.workloads import mismatch, run
from tvm.relax.frontend.onnx import from_onnx

RNG = np.random.default_rng(0)
SHAPE = (1, 8, 12, 12)


def _onnx_between_convs(op: str, **attrs):
    """conv -> op -> conv, float32 (the activation between two NPU kernels)."""
    w = numpy_helper.from_array((RNG.random((8, 8, 3, 3)) - 0.5).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node(op, ["c"], ["a"], **attrs),
             helper.make_node("Conv", ["a", "w"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


@pytest.mark.parametrize("op, attrs", [("LeakyRelu", {"alpha": 0.1}), ("LeakyRelu", {"alpha": 1.7}),
                                       ("LeakyRelu", {"alpha": -0.3}), ("HardSwish", {}),
                                       ("HardSigmoid", {"alpha": 0.25, "beta": 0.4})],
                         ids=["leaky", "leaky-steep", "leaky-negative", "hard-swish", "hard-sigmoid"])
def test_onnx_activations_run_as_one_fabric_kernel(op, attrs):
    model = _onnx_between_convs(op, **attrs)
    mod = from_onnx(model)
    placements = npu_backend.explain(mod, "cgra-8x8")
    assert all(p.where == "npu" for p in placements), [(p.op, p.reason) for p in placements]
    chain = {p.kernel for p in placements if p.kernel.startswith("cgra.fabric_chain")}
    assert len(chain) == 1, [p.kernel for p in placements]  # the whole activation, one kernel
    x = RNG.standard_normal(SHAPE).astype(np.float32) * 4
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), [x])
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    assert mismatch(out, expected, "float32") is None
    assert len(prof.kernels) == 3
    counts = {op: n for op, n in prof.kernels[1].op_counts.items() if n}
    assert set(counts) == {"DMA_LOAD", "FABRIC", "DMA_STORE"}, counts


def _module(shape, dtype, body, inputs=1):
    bb = relax.BlockBuilder()
    params = [relax.Var(name, relax.TensorType(shape, dtype)) for name in "ab"[:inputs]]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def _llvm(mod, inputs):
    return run(tvm.compile(mod, target="llvm"), inputs)


def test_pytorch_hard_swish_with_its_two_clips():
    """torch.export's hardswish: x * clip(clip(x + 3, 0, inf), -inf, 6) / 6: one body (a clip
    to +-inf is one node)."""
    def body(bb, x):
        t = bb.emit(relax.op.clip(bb.emit(relax.op.add(x, relax.const(3.0))), 0, float("inf")))
        t = bb.emit(relax.op.multiply(x, bb.emit(relax.op.clip(t, float("-inf"), 6))))
        return relax.op.divide(t, relax.const(6.0))

    mod = _module((2, 33, 7), "float32", body)
    assert {p.kernel.split()[0] for p in npu_backend.explain(mod, "cgra-4x4")} == {"cgra.fabric_chain4"}
    x = RNG.standard_normal((2, 33, 7)).astype(np.float32) * 5
    assert mismatch(run(npu_backend.compile(mod, "cgra-4x4"), [x]), _llvm(mod, [x]), "float32") is None


_UNARY = st.sampled_from(["relu", "clip", "leakyrelu"])
_BINARY = st.sampled_from(["add", "subtract", "multiply", "maximum", "minimum", "divide"])


@st.composite
def chains(draw, dtype):
    steps = []
    for _ in range(draw(st.integers(2, 5))):
        if draw(st.booleans()):
            op = draw(_UNARY)
            if dtype == "int32" and op == "leakyrelu":
                op = "relu"
            steps.append((op, draw(st.floats(-2, 2, width=32)), draw(st.booleans())))
        else:
            op = draw(_BINARY)
            if dtype == "int32" and op == "divide":
                op = "multiply"
            value = draw(st.integers(-9, 9)) if dtype == "int32" else draw(st.floats(-3, 3, width=32))
            if op == "divide" and value == 0:
                value = 2.5
            # the other operand: a constant, or the chain's input x; the constant first or second
            steps.append((op, value if draw(st.booleans()) else "x", draw(st.booleans())))
    return steps


def _chain_body(steps, dtype):
    def body(bb, x):
        value = x
        for op, other, flip in steps:
            if op == "relu":
                value = bb.emit(relax.op.nn.relu(value))
            elif op == "clip":
                lo = (int(other) if dtype == "int32" else float(other)) - 1
                value = bb.emit(relax.op.clip(value, lo, lo + 2))
            elif op == "leakyrelu":
                value = bb.emit(relax.op.nn.leakyrelu(value, float(other)))
            else:
                operand = x if isinstance(other, str) else relax.const(other, dtype)
                pair = (operand, value) if flip and op != "divide" else (value, operand)
                if op == "divide" and isinstance(other, str):
                    pair = (value, relax.const(2.0, dtype))
                value = bb.emit(getattr(relax.op, op)(*pair))
        return value
    return body


@settings(max_examples=int(os.environ.get("CGRA_CHAIN_EXAMPLES", 25)), deadline=None)
@given(data=st.data(), dtype=st.sampled_from(["float32", "int32"]),
       shape=st.lists(st.integers(1, 20), min_size=1, max_size=3).map(tuple),
       arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]))
def test_random_chains_match_the_llvm_build(data, dtype, shape, arch):
    steps = data.draw(chains(dtype))
    mod = _module(shape, dtype, _chain_body(steps, dtype))
    x = (RNG.integers(-50, 50, shape) if dtype == "int32" else RNG.standard_normal(shape) * 4).astype(dtype)
    placements = npu_backend.explain(mod, arch)
    # What stays on the host says why (x + x + x: TVM folds it to 3x, and an add of one tensor to
    # itself has no NPU kernel); everything else is on the NPU, most of it in fabric chains.
    assert all(p.where == "npu" or p.reason for p in placements)
    out = run(npu_backend.compile(mod, arch), [x])
    expected = _llvm(mod, [x])
    if dtype == "int32":
        np.testing.assert_array_equal(out, expected)
    else:
        assert mismatch(out, expected, "float32") is None


def test_a_second_tensor_is_not_taken_for_the_chains_input():
    """relu(a + b) reads two tensors: not a fabric body (which reads one), but the eltwise add and
    the standalone relu, as before."""
    mod = _module((4, 9), "float32", lambda bb, a, b: relax.op.nn.relu(bb.emit(relax.op.add(a, b))), inputs=2)
    assert [p.kernel.split()[0] for p in npu_backend.explain(mod, "cgra-8x8")] == ["cgra.eltwise_add", "cgra.relu"]


def test_a_lone_vector_unit_op_stays_on_the_vector_unit():
    mod = _module((4, 9), "float32", lambda bb, x: relax.op.multiply(x, relax.const(0.5)))
    assert [p.kernel.split()[0] for p in npu_backend.explain(mod, "cgra-8x8")] == ["cgra.eltwise_multiply"]


def test_why_a_chain_stays_on_the_host():
    mod = _module((4, 9), "float16", lambda bb, x: relax.op.nn.leakyrelu(x, 0.1))
    (placement,) = npu_backend.explain(mod, "cgra-8x8")
    assert placement.where == "host" and "the PE fabric computes float32 or int32" in placement.reason


@pytest.mark.parametrize("slope_shape", [(8, 1, 1), (1,)], ids=["per-channel", "shared"])
def test_onnx_prelu_runs_on_the_fabric(slope_shape):
    """PRelu's slope is FABRIC's input B, read per row (a channel) with stride 0 along the pixels."""
    slope = numpy_helper.from_array((RNG.random(slope_shape) * 0.5 - 0.1).astype(np.float32), "s")
    w = numpy_helper.from_array((RNG.random((8, 8, 3, 3)) - 0.5).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("PRelu", ["c", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], initializer=[w, slope])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    mod = from_onnx(model)
    assert [p.kernel.split()[0] for p in npu_backend.explain(mod, "cgra-8x8")] == ["cgra.conv2d", "cgra.eltwise_prelu"]
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), [x])
    assert mismatch(out, ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0], "float32") is None
    assert prof.kernels[1].op_counts["FABRIC"] >= 1


@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(1, 12), min_size=1, max_size=4).map(tuple), data=st.data(),
       arch=st.sampled_from(["cgra-4x4", "cgra-16x16"]))
def test_prelu_over_any_axis_matches_the_llvm_build(shape, data, arch):
    axis = data.draw(st.integers(0, len(shape) - 1))
    slope_shape = data.draw(st.sampled_from([(shape[axis],), (1,)]))
    bb = relax.BlockBuilder()
    x, s = relax.Var("x", relax.TensorType(shape, "float32")), relax.Var("s", relax.TensorType(slope_shape, "float32"))
    with bb.function("main", [x, s]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.prelu(x, s, axis=axis)))
        bb.emit_func_output(out)
    mod = bb.get()
    inputs = [RNG.standard_normal(shape).astype(np.float32), (RNG.random(slope_shape) - 0.5).astype(np.float32)]
    placement, = npu_backend.explain(mod, arch)
    assert placement.where == "npu", placement.reason
    assert mismatch(run(npu_backend.compile(mod, arch), inputs), _llvm(mod, inputs), "float32") is None


@pytest.mark.parametrize("op, attrs", [("LeakyRelu", {"alpha": 0.1}), ("HardSwish", {}), ("HardSigmoid", {})],
                         ids=["leaky", "hard-swish", "hard-sigmoid"])
@pytest.mark.parametrize("arch", ["cgra-4x4", "cgra-8x8"])
def test_with_fuse_chains_the_conv_runs_the_chain_on_its_output_tiles(op, attrs, arch):
    """CompileOptions.fuse_chains: the activation is a FABRIC inside the conv2d kernel, in place on
    each output tile after its EPILOGUE: two kernels instead of three, less DRAM traffic, the
    same numbers."""
    model = _onnx_between_convs(op, **attrs)
    x = RNG.standard_normal(SHAPE).astype(np.float32) * 4
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    traffic = {}
    for fuse in (False, True):
        with npu_backend.profile() as prof:
            out = run(npu_backend.compile(from_onnx(model), arch, fuse_chains=fuse), [x])
        assert mismatch(out, expected, "float32") is None
        traffic[fuse] = sum(k.dma_load_bytes + k.dma_store_bytes for k in prof.kernels)
        assert len(prof.kernels) == (2 if fuse else 3)
    assert prof.kernels[0].op_counts["FABRIC"] >= 1 and prof.kernels[0].op_counts["GEMM"] >= 1
    assert traffic[True] < traffic[False]


def test_fuse_chains_leaves_a_relu_to_the_epilogue():
    mod = _module((6, 16), "float32", lambda bb, x: relax.op.nn.relu(bb.emit(relax.op.matmul(
        x, relax.const(RNG.standard_normal((16, 8)).astype(np.float32))))))
    x = RNG.standard_normal((6, 16)).astype(np.float32)
    with npu_backend.profile() as prof:
        run(npu_backend.compile(mod, "cgra-8x8", fuse_chains=True), [x])
    assert prof.kernels[0].op_counts.get("FABRIC", 0) == 0 and prof.kernels[0].op_counts["EPILOGUE"] >= 1


@settings(max_examples=int(os.environ.get("CGRA_CHAIN_EXAMPLES", 15)), deadline=None)
@given(data=st.data(), bias=st.booleans(), conv=st.booleans(), arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]))
def test_random_chains_after_a_conv_or_matmul_match_the_llvm_build_with_fuse_chains(data, bias, conv, arch):
    """Any chain the fabric family takes, after a conv2d or a matmul (+ bias): with fuse_chains
    the kernel runs it on its output tiles; the numbers are TVM's llvm build's. (CGRA_CHAIN_EXAMPLES
    runs more: 300 found nothing but rounding.)"""
    steps = data.draw(chains("float32"))
    shape = (1, 6, 7, 9) if conv else (10, 12)
    chain = _chain_body(steps, "float32")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))

    def body(bb, x):
        if conv:
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(rng.standard_normal((6, 6, 3, 3)).astype(np.float32)),
                                           padding=1))
            b = relax.const(rng.standard_normal((1, 6, 1, 1)).astype(np.float32))
        else:
            y = bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((12, 12)).astype(np.float32))))
            b = relax.const(rng.standard_normal((12,)).astype(np.float32))
        return chain(bb, bb.emit(relax.op.add(y, b)) if bias else y)

    mod = _module(shape, "float32", body)
    x = rng.standard_normal(shape).astype(np.float32)
    out = run(npu_backend.compile(mod, arch, fuse_chains=True), [x])
    # the product's float32 tolerance: the conv's sums (another order than llvm's, ~1e-6) pass
    # through the chain, whose subtractions can leave a small result of large operands
    assert mismatch(out, _llvm(mod, [x]), "float32", tolerance=1e-4) is None


def test_with_fuse_chains_a_chain_that_does_not_map_stays_out_of_the_conv():
    """On a fabric with one context per PE the whole hard-swish does not map: the conv2d kernel
    runs without it (a shorter chain that maps is a kernel of its own), the numbers unchanged,
    rather than a kernel whose FABRIC the device would refuse."""
    import dataclasses

    from cgra_sim import load_arch

    arch = load_arch("cgra-4x4")
    arch = dataclasses.replace(arch, fabric={**arch.fabric, "context_depth": 1})
    model = _onnx_between_convs("HardSwish")
    x = RNG.standard_normal(SHAPE).astype(np.float32)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(from_onnx(model), arch, fuse_chains=True), [x])
    conv = prof.kernels[0]
    assert conv.op_counts["GEMM"] >= 1 and conv.op_counts.get("FABRIC", 0) == 0
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    assert mismatch(out, expected, "float32") is None
