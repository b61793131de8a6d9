"""float32 -> int8 QuantizeLinear and 1-d pools on the NPU (issue 37: text_cnn's host calls).

The quantising EPILOGUE (a float32 accumulator, flag REQUANTISE: rne(clamp(x / scale, -128 - zp,
127 - zp)) + zp) against onnxruntime's QuantizeLinear and a per-element numpy model, at ties,
near-ties and saturation; the quantize kernel (kernels/elementwise/quantize.py) and the 1-d pools
(normalise/pool1ds.py) end to end; and a QDQ conv1d text classifier, onnxruntime-quantized, bit
for bit onnxruntime's integer kernels with no host call but its output's dequantize, int8 cycles
below its float32 twin's on today's presets.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from hypothesis import example, given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import npu_backend
from cgra_sim import load_arch, simulate
from cgra_sim.functional import quantise
from cgra_sim.isa import EPILOGUE_REQUANTISE, DType, Op, encode
from qdq_models import onnxruntime_quantized
from test_requantise_sim import SCALES
from sim_records import dma_record, matrix_load, matrix_store

ARCH = load_arch("cgra-8x8")


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "m", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def quantize_model(shape, scale, zero_point, dtype="int8"):
    """One QuantizeLinear of a float32 input, per tensor."""
    code = TensorProto.INT8 if dtype == "int8" else TensorProto.UINT8
    return _model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                  [helper.make_tensor_value_info("y", code, list(shape))],
                  [numpy_helper.from_array(np.array(scale, np.float32), "s"),
                   numpy_helper.from_array(np.array(zero_point, dtype), "z")])


def onnxruntime_quantize(x, scale, zero_point, dtype="int8"):
    model = quantize_model(x.shape, scale, zero_point, dtype)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def reference_quantize(x, scale, zero_point):
    """One element at a time: the float32 quotient, Python's round (half to even), + zp, saturated."""
    out = np.empty(x.shape, np.int8)
    for index, value in np.ndenumerate(x):
        with np.errstate(over="ignore", invalid="ignore"):
            quotient = np.float32(value) / np.float32(scale)  # numpy float32 scalars: correctly rounded
        if np.isnan(quotient):
            out[index] = -128
            continue
        rounded = round(float(quotient)) if np.isfinite(quotient) else (10**9 if quotient > 0 else -10**9)
        out[index] = min(max(rounded + zero_point, -128), 127)
    return out


def hard_values(seed: int, scale: float, count: int) -> np.ndarray:
    """float32 values at and around half steps of `scale` (ties; x / s and x * (1 / s) part
    there), ordinary ones, and ones that saturate (up to +-inf)."""
    rng = np.random.default_rng(seed)
    s = np.float32(scale)
    halves = (rng.integers(-300, 300, count) + np.float32(0.5)).astype(np.float32)
    near = (halves * s).astype(np.float32)
    up, down = np.nextafter(near, np.float32(np.inf)), np.nextafter(near, np.float32(-np.inf))
    ordinary = (rng.normal(0, 60, count) * s).astype(np.float32)
    huge = np.array([np.inf, -np.inf, 3e38, -3e38, 1e6 * s, -1e6 * s], np.float32)
    return rng.permutation(np.concatenate([near, up, down, ordinary, huge])).astype(np.float32)


def simulate_quantise(x: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """x (m, n) through one quantising EPILOGUE (its scale row all `scale`) in the simulator."""
    m, n = x.shape
    row = np.full(n, scale, np.float32)
    out = np.zeros((m, n), np.int8)
    acc_addr, scale_addr = 0, 4 * m * n
    out_addr = scale_addr + 4 * n
    records = [matrix_load(0, acc_addr, m, n, n), dma_record(Op.DMA_LOAD, 1, scale_addr, [(n, 0, 1, 1)]),
               encode(Op.EPILOGUE, flags=EPILOGUE_REQUANTISE, acc_dtype=DType.FLOAT32, out_dtype=DType.INT8, m=m,
                      n=n, acc_addr=acc_addr, acc_stride=n, out_addr=out_addr, out_stride=n, scale_addr=scale_addr,
                      out_zero_point=zero_point),
               matrix_store(2, out_addr, m, n, n)]
    simulate(ARCH, np.array(records), [x, row, out])
    return out


@given(seed=st.integers(0, 2**32 - 1), scale=SCALES, zero_point=st.integers(-128, 127))
@example(seed=0, scale=0.0173, zero_point=-3)  # text_cnn's kind of input scale
@example(seed=1, scale=0.25, zero_point=0)  # exact ties
def test_quantising_epilogue_is_onnxruntimes_quantize_linear(seed, scale, zero_point):
    """Bit for bit onnxruntime's QuantizeLinear and the per-element model, ties and saturation included."""
    x = hard_values(seed, scale, 40).reshape(-1, 2)
    got = simulate_quantise(x, scale, zero_point)
    np.testing.assert_array_equal(got, onnxruntime_quantize(x, scale, zero_point))
    np.testing.assert_array_equal(got, reference_quantize(x, scale, zero_point))


def test_quantise_divides_where_a_reciprocal_product_would_not():
    """A scale and value for which x * (1 / s) rounds across the half step and x / s does not:
    the reason the EPILOGUE divides (the kind of input a multiply would get wrong)."""
    rng = np.random.default_rng(7)
    scales = rng.uniform(1e-3, 0.1, 200).astype(np.float32)
    halves = (rng.integers(-100, 100, (200, 64)) + np.float32(0.5)).astype(np.float32)
    x = np.nextafter((halves * scales[:, None]).astype(np.float32), np.float32(0))
    for s, row in zip(scales, x):
        product = np.clip(np.rint(row * (np.float32(1) / s)), -128, 127).astype(np.int8)
        exact = quantise(row[None], np.float32([s]), 0)[0]
        np.testing.assert_array_equal(exact, onnxruntime_quantize(row, s, 0))
        if np.any(product != exact):
            return
    pytest.fail("no input where the reciprocal product differs: the test shows nothing")


def test_a_nan_quantises_to_the_lowest_value():
    x = np.array([[np.nan, 1.0]], np.float32)
    np.testing.assert_array_equal(simulate_quantise(x, 0.5, 3), [[-128, 5]])


def _run(model, x, arch="cgra-8x8"):
    vm = relax.VirtualMachine(npu_backend.compile(npu_backend.from_onnx(model), npu_backend.load_arch(arch)),
                              tvm.cpu())
    with npu_backend.profile() as prof:
        got = vm["main"](tvm.runtime.tensor(x))
    return (got.numpy() if hasattr(got, "numpy") else got[0].numpy()), prof


@pytest.mark.parametrize("shape, dtype, zero_point", [((1, 32, 64), "int8", -3), ((3, 70), "uint8", 131),
                                                      ((2, 3, 5, 9), "int8", 127)])
def test_quantize_linear_runs_on_the_npu_bit_exact(shape, dtype, zero_point):
    """A model's QuantizeLinear (a uint8 one through its int8 twin) as one NPU kernel, ties included."""
    scale = np.float32(0.0173)
    rng = np.random.default_rng(0)
    x = rng.normal(0, 2.5, shape).astype(np.float32)
    x.reshape(-1)[::3] = ((rng.integers(-140, 140, x.size)[::3] + 0.5) * scale).astype(np.float32)
    got, prof = _run(quantize_model(shape, scale, zero_point, dtype), x)
    np.testing.assert_array_equal(got, onnxruntime_quantize(x, scale, zero_point, dtype))
    assert [k.source_ops for k in prof.kernels][0] == ("quantize",)
    assert [c.name for c in prof.host_calls if "quantize" in c.name] == []


def _max_pool_model(length, channels, kernel, stride, pads):
    return _model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[kernel], strides=[stride], pads=pads)],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, length])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


@pytest.mark.parametrize("length, kernel, stride, pads", [(64, 64, 64, [0, 0]), (21, 3, 2, [1, 1])])
def test_max_pool1d_runs_on_the_npu(length, kernel, stride, pads):
    model = _max_pool_model(length, 16, kernel, stride, pads)
    x = np.random.default_rng(2).normal(0, 1, (1, 16, length)).astype(np.float32)
    got, prof = _run(model, x)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, expected)
    assert [k.source_ops for k in prof.kernels] == [("nn.max_pool2d",)]
    # (a squeeze that is the model's output is a host copy, no arithmetic)
    assert [c.name for c in prof.host_calls if c.ops] == []


@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool1d_runs_on_the_npu(count_include_pad):
    model = _model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3], strides=[2], pads=[1, 1],
                                     count_include_pad=count_include_pad)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 15])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    x = np.random.default_rng(3).normal(0, 1, (1, 8, 15)).astype(np.float32)
    got, prof = _run(model, x)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    assert [k.source_ops for k in prof.kernels] == [("nn.avg_pool2d",)]
    assert [c.name for c in prof.host_calls if c.ops] == []


def text_cnn(length: int = 64, seed: int = 0):
    """bench_quantized's text_cnn as torch exports it (Conv1d 32 -> 64 -> 64 with ReLU, a max pool
    over the whole length, Flatten, Linear 64 -> 4), built with onnx.helper at random weights."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    y = "input"
    for i, (cin, cout) in enumerate(((32, 64), (64, 64))):
        w = const(f"w{i}", rng.normal(0, np.sqrt(2 / (3 * cin)), (cout, cin, 3)))
        nodes += [helper.make_node("Conv", [y, w, const(f"b{i}", rng.normal(0, 0.1, cout))], [f"c{i}"],
                                   kernel_shape=[3], pads=[1, 1]), helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        y = f"r{i}"
    nodes += [helper.make_node("MaxPool", [y], ["p"], kernel_shape=[length], strides=[length]),
              helper.make_node("Flatten", ["p"], ["f"]),
              helper.make_node("Gemm", ["f", const("fc_w", rng.normal(0, 0.125, (4, 64))),
                                        const("fc_b", rng.normal(0, 0.1, 4))], ["logits"], transB=1)]
    return _model(nodes, [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 32, length])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])], inits)


@pytest.mark.parametrize("arch", ["cgra-8x8", "cgra-16x16"])
def test_qdq_text_cnn_is_integer_onnxruntime_and_cheaper_than_float(tmp_path, arch):
    """Its input quantize and max pool run on the NPU, and its output's dequantize in the Gemm's
    EPILOGUE (normalise/qdq_outputs.py): no host call left; bit for bit onnxruntime's integer kernels; NPU + host cycles below float32's."""
    model = text_cnn()
    twin = onnxruntime_quantized(model, tmp_path, "QInt8", "QInt8", per_channel=True)
    x = np.random.default_rng(1).normal(0, 1, (1, 32, 64)).astype(np.float32)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdqisint8allowed", "1")
    expected = ort.InferenceSession(twin.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, {"input": x})[0]
    got, prof = _run(twin, x, arch)
    np.testing.assert_array_equal(got, expected)
    assert prof.host_calls == []
    assert ("quantize",) in [k.source_ops for k in prof.kernels]
    _, float_prof = _run(model, x, arch)
    assert not float_prof.host_calls
    assert prof.total_cycles + prof.host_cycles < float_prof.total_cycles
