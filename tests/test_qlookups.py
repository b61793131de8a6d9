"""Functions of one quantized tensor as 256-entry tables (issue 37 item 0): a QLinearSigmoid and a
requantised SiLU between quantized layers run as one LOOKUP kernel, bit-exact to onnxruntime.

1. normalise/qlookups.py's tables against onnxruntime's own QLinearSigmoid / QLinearMul over all
   256 inputs, for random scales and zero points (onnxruntime computes the sigmoid in float, its
   MLAS logistic, then quantises: the correctly rounded float32 sigmoid quantises the same).
2. What the rewrite leaves alone: a chain without a sigmoid (the qchain kernel's), a tensor of
   another dtype.
3. A QDQ conv -> SiLU -> conv -> sigmoid model compiled for the NPU: each SiLU and sigmoid one
   LOOKUP kernel, nothing on the host but the model's own input quantize and output dequantize,
   the output equal to onnxruntime's.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.script import relax as R

import npu_backend
from npu_backend.normalise.qlookups import quantized_lookups
from qdq_models import QdqGraph

INPUTS = np.arange(-128, 128, dtype=np.int8)


def _table_model(silu: bool, sx, zx, ss, zs, sy, zy):
    """x (int8, 256) -> DequantizeLinear -> Sigmoid -> QDQ [-> Mul by x -> QuantizeLinear]."""
    g = QdqGraph(0)
    x = g.node("DequantizeLinear", ["x", g.const(sx, np.float32), g.const(zx, np.int8)])
    s = g.node("QuantizeLinear", [g.node("Sigmoid", [x]), g.const(ss, np.float32), g.const(zs, np.int8)])
    out = s
    if silu:
        gate = g.node("DequantizeLinear", [s, g.const(ss, np.float32), g.const(zs, np.int8)])
        out = g.node("QuantizeLinear", [g.node("Mul", [x, gate]), g.const(sy, np.float32), g.const(zy, np.int8)])
    from onnx import TensorProto, helper

    graph = helper.make_graph(g.nodes, "lut", [helper.make_tensor_value_info("x", TensorProto.INT8, [256])],
                              [helper.make_tensor_value_info(out, TensorProto.INT8, [256])], g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _table(mod) -> np.ndarray:
    """The table of the one take the rewrite left in `mod`'s main."""
    takes = [b.value for block in mod["main"].body.blocks for b in block.bindings
             if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.take"]
    assert len(takes) == 1, mod
    return takes[0].args[0].value.numpy()


@settings(max_examples=25, deadline=None)
@given(silu=st.booleans(), sx=st.floats(0.003, 0.3), zx=st.integers(-40, 40), ss=st.floats(0.5 / 255, 1.3 / 255),
       zs=st.integers(-128, -100), sy=st.floats(0.003, 0.3), zy=st.integers(-60, 20))
def test_tables_equal_onnxruntimes_qlinear_sigmoid_and_mul_bit_for_bit(silu, sx, zx, ss, zs, sy, zy):
    model = _table_model(silu, sx, zx, ss, zs, sy, zy)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": INPUTS})[0]
    table = _table(quantized_lookups(npu_backend.from_onnx(model)))
    np.testing.assert_array_equal(table, expected)


def _hard_swish_model(sx, zx, sg, zg, sy, zy):
    """x (int8, 256) -> DequantizeLinear -> HardSigmoid -> QDQ -> Mul by x -> QuantizeLinear: a
    hard-swish between quantized layers as onnxruntime's quantizer writes MobileNetV3's."""
    g = QdqGraph(0)
    x = g.node("DequantizeLinear", ["x", g.const(sx, np.float32), g.const(zx, np.int8)])
    gate = g.node("QuantizeLinear", [g.node("HardSigmoid", [x], alpha=1 / 6, beta=0.5), g.const(sg, np.float32),
                                     g.const(zg, np.int8)])
    gate = g.node("DequantizeLinear", [gate, g.const(sg, np.float32), g.const(zg, np.int8)])
    out = g.node("QuantizeLinear", [g.node("Mul", [x, gate]), g.const(sy, np.float32), g.const(zy, np.int8)])
    from onnx import TensorProto, helper

    graph = helper.make_graph(g.nodes, "hswish", [helper.make_tensor_value_info("x", TensorProto.INT8, [256])],
                              [helper.make_tensor_value_info(out, TensorProto.INT8, [256])], g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@settings(max_examples=40, deadline=None)
@given(sx=st.floats(0.003, 0.3), zx=st.integers(-40, 40), sg=st.sampled_from([1 / 255, 0.0039215688593685627]),
       zg=st.integers(-128, -120), sy=st.floats(0.003, 0.3), zy=st.integers(-128, 20), integer=st.booleans())
def test_a_requantised_hard_swish_is_one_table_equal_to_onnxruntime(sx, zx, sg, zg, sy, zy, integer):
    """The gate's quantize inside the chain makes it a table (two kernels otherwise): equal to
    onnxruntime's float HardSigmoid, QuantizeLinear and QLinearMul (its integer kernels with
    session.qdqisint8allowed, and its default float path) over all 256 inputs."""
    model = _hard_swish_model(sx, zx, sg, zg, sy, zy)
    options = ort.SessionOptions()
    if integer:
        options.add_session_config_entry("session.qdqisint8allowed", "1")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    table = _table(quantized_lookups(npu_backend.from_onnx(model)))
    np.testing.assert_array_equal(table, session.run(None, {"x": INPUTS})[0])


def test_a_chain_without_a_sigmoid_is_left_to_the_qchain_kernel():
    """HardSigmoid-like clip of an int8 tensor: exact FABRIC_INT8 kernels exist for it; no table."""
    @tvm.script.ir_module
    class Chain:
        @R.function
        def main(x: R.Tensor((4, 8), "int8")):
            with R.dataflow():
                d = R.dequantize(x, R.const(0.05, "float32"), R.const(3, "int8"))
                y = R.quantize(R.multiply(d, R.const(0.5, "float32")), R.const(0.02, "float32"), R.const(0, "int8"))
                R.output(y)
            return y

    assert "take" not in quantized_lookups(Chain).script()


def _silu_model():
    g = QdqGraph(3)
    x = g.qdq("input", 0.0392, 4)
    c = g.qdq(g.conv(x, 0.0392, 3, 8), 0.0651, -9)
    gate = g.qdq(g.node("Sigmoid", [c]), 0.00390625, -128)
    y = g.qdq(g.node("Mul", [c, gate]), 0.0347, -120)
    c2 = g.qdq(g.conv(y, 0.0347, 8, 8), 0.0711, 5)
    out = g.qdq(g.node("Sigmoid", [c2]), 0.00390625, -128)
    return g.model("input", [1, 3, 12, 12], out, [1, 8, 12, 12])


@pytest.mark.parametrize("arch", ["cgra-4x4", "cgra-8x8"])
def test_a_qdq_silu_and_sigmoid_are_lookup_kernels_equal_to_onnxruntime(arch):
    model = _silu_model()
    x = np.random.default_rng(2).normal(0, 1.2, (1, 3, 12, 12)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input": x})[0]
    vm = relax.VirtualMachine(npu_backend.compile(npu_backend.from_onnx(model), npu_backend.load_arch(arch)),
                              tvm.cpu())
    with npu_backend.profile() as prof:
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(got, expected)
    assert [c.name for c in prof.host_calls] == ["dequantize"]  # the model's output (its input's quantize a kernel)
    assert [k.source_ops[-1] for k in prof.kernels].count("take") == 2  # the SiLU and the sigmoid
    assert len(prof.kernels) == 5
