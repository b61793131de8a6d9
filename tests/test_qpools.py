"""A global average pool between quantized tensors (DequantizeLinear -> GlobalAveragePool ->
QuantizeLinear) is onnxruntime's integer QLinearGlobalAveragePool (normalise/qpools.py): the
int32 sum of each channel less zx * H * W, requantised by float32(sx / (sy * H * W)), half to
even. Checked against onnxruntime's kernels (session.qdqisint8allowed, and its default path) at
random scales, at exact ties and one ulp beside them, and saturating; on the NPU one int8 GEMM
kernel, no arithmetic on the host."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import tvm
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from tvm import relax

import npu_backend
from npu_backend.normalise.qpools import pool_multiplier, quantized_pools
from models import host_output, main_op_names
from qdq_models import QdqGraph


def _model(sx, zx, sy, zy, shape):
    """x (int8, NCHW) -> DequantizeLinear -> GlobalAveragePool -> QuantizeLinear (int8)."""
    g = QdqGraph(0)
    x = g.node("DequantizeLinear", ["x", g.const(sx, np.float32), g.const(zx, np.int8)])
    out = g.node("QuantizeLinear", [g.node("GlobalAveragePool", [x]), g.const(sy, np.float32), g.const(zy, np.int8)])
    graph = helper.make_graph(g.nodes, "gap", [helper.make_tensor_value_info("x", TensorProto.INT8, list(shape))],
                              [helper.make_tensor_value_info(out, TensorProto.INT8, [shape[0], shape[1], 1, 1])],
                              g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _onnxruntime(model, x, integer: bool):
    options = ort.SessionOptions()
    if integer:
        options.add_session_config_entry("session.qdqisint8allowed", "1")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]


_TIE = np.float32(0.5)  # sx / (sy * 4) = 0.5 exactly: an odd sum of a 2 x 2 map lands on a half step


@settings(max_examples=30, deadline=None)
@given(sx=st.floats(0.001953125, 0.5, width=32), zx=st.integers(-128, 127), sy=st.floats(0.001953125, 0.5, width=32),
       zy=st.integers(-128, 127), shape=st.tuples(st.integers(1, 2), st.integers(1, 6), st.integers(1, 5),
                                                   st.integers(1, 5)),
       seed=st.integers(0, 2**16), integer=st.booleans())
@example(sx=float(_TIE), zx=0, sy=0.25, zy=0, shape=(1, 8, 2, 2), seed=1, integer=True)  # ties
@example(sx=float(np.nextafter(_TIE, np.float32(1))), zx=0, sy=0.25, zy=0, shape=(1, 8, 2, 2), seed=1,
         integer=True)  # one ulp above them
@example(sx=float(np.nextafter(_TIE, np.float32(0))), zx=0, sy=0.25, zy=0, shape=(1, 8, 2, 2), seed=1,
         integer=True)  # one ulp below
@example(sx=0.5, zx=-128, sy=0.002, zy=100, shape=(1, 4, 3, 3), seed=2, integer=True)  # saturates
def test_the_integer_pool_equals_onnxruntimes(sx, zx, sy, zy, shape, seed, integer):
    if pool_multiplier(sx, sy, shape[2] * shape[3]) is None:
        return  # onnxruntime raises
    model = _model(sx, zx, sy, zy, shape)
    x = np.random.default_rng(seed).integers(-128, 128, shape).astype(np.int8)
    mod = quantized_pools(npu_backend.from_onnx(model))
    assert "relax.mean" not in main_op_names(mod)
    np.testing.assert_array_equal(host_output(mod, x), _onnxruntime(model, x, integer))


def test_the_tie_example_does_tie():
    """The @example above really puts odd sums on half steps (the test would pass vacuously else)."""
    assert pool_multiplier(_TIE, np.float32(0.25), 4) == np.float32(0.5)


def test_a_scale_onnxruntime_refuses_keeps_the_float_pool():
    mod = quantized_pools(npu_backend.from_onnx(_model(0.5, 0, 0.001, 0, (1, 2, 1, 1))))  # 500 >= 256
    assert "relax.mean" in main_op_names(mod)


def test_a_squeeze_excite_pool_is_one_int8_gemm_kernel_on_the_npu():
    model = _model(0.033256065, -128, 0.0047469558, -128, (1, 96, 4, 4))  # MobileNetV3's, at 64 x 64
    x = np.random.default_rng(3).integers(-128, 128, (1, 96, 4, 4)).astype(np.int8)
    vm = relax.VirtualMachine(npu_backend.compile(npu_backend.from_onnx(model), "cgra-8x8"), tvm.cpu())
    with npu_backend.profile() as prof:
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(got, _onnxruntime(model, x, integer=True))
    assert [k.source_ops for k in prof.kernels] == [("matmul", "add", "astype", "multiply", "quantize")]
    # nothing on the host: the (96, 1) result is returned as the (1, 96, 1, 1) view main returns, not
    # copied (device/host_ops.py; it was the runtime's cgra.host.concat)
    assert [c.name for c in prof.host_calls] == []
