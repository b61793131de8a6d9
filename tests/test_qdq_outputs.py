"""A quantized model's last DequantizeLinear on the NPU: the requantising GEMM's EPILOGUE dequantises
(EPILOGUE_DEQUANTISE; normalise/qdq_outputs.py writes the interleaved table, kernels/gemm/
dequant_epilogue.py fuses it). Bit for bit against onnxruntime, and no operator left on the host."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import npu_backend
from npu_backend.normalise.qdq_outputs import dequantized_outputs
from qdq_models import QdqGraph, qdq_cnn


def _f32s(lo: float, hi: float):
    return st.floats(float(np.float32(lo)), float(np.float32(hi)), width=32)


def _run_both(model, inputs):
    """(the NPU build's outputs, onnxruntime's, the NPU run's profile)."""
    mod = from_onnx(model, keep_params_in_input=False)
    vm = relax.VirtualMachine(tvm.compile(mod, target="cgra"), tvm.cpu())
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got, expected = [], []
    with npu_backend.profile() as prof:
        for x in inputs:
            got.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    for x in inputs:
        expected.append(session.run(None, {"input": x})[0])
    return got, expected, prof


def test_qdq_cnn_runs_with_no_host_operator_and_is_bit_exact():
    model = qdq_cnn()
    placements = npu_backend.explain(from_onnx(model, keep_params_in_input=False), arch="cgra-8x8")
    dequantize = [p for p in placements if p.op == "dequantize"]
    assert len(dequantize) == 1 and dequantize[0].where == "npu" and \
        dequantize[0].kernel.split()[0] == "cgra.matmul_bias_requant_dequant", npu_backend.format_placements(placements)
    rng = np.random.default_rng(1)
    inputs = [rng.normal(0, 1.5, (1, 3, 16, 16)).astype(np.float32),
              (rng.integers(-200, 200, (1, 3, 16, 16)) * np.float32(0.02)).astype(np.float32)]  # ties
    got, expected, prof = _run_both(model, inputs)
    for mine, theirs in zip(got, expected):
        np.testing.assert_array_equal(mine.view(np.int32), theirs.view(np.int32))
    assert prof.host_calls == [] and prof.host_cycles == 0, [call.name for call in prof.host_calls]


def _gemm_model(seed, x_scale, x_zero, y_scale, y_zero, per_channel, k, n):
    """input -> QDQ -> Gemm (int8 weights, int32 bias) -> QuantizeLinear -> DequantizeLinear."""
    g = QdqGraph(seed)
    x = g.qdq("input", x_scale, x_zero)
    out = g.qdq(g.gemm(x, x_scale, k, n, per_channel=per_channel), y_scale, y_zero)
    return g.model("input", [2, k], out, [2, n])


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**16), x_scale=_f32s(0.005, 0.1), x_zero=st.integers(-128, 127),
       y_scale=_f32s(0.002, 0.5), y_zero=st.integers(-128, 127), per_channel=st.booleans(),
       k=st.integers(1, 40), n=st.integers(1, 24))
def test_a_gemm_dequantized_on_the_npu_equals_onnxruntime(seed, x_scale, x_zero, y_scale, y_zero, per_channel,
                                                         k, n):
    model = _gemm_model(seed, x_scale, x_zero, y_scale, y_zero, per_channel, k, n)
    rng = np.random.default_rng(seed)
    inputs = [rng.normal(0, 128 * x_scale, (2, k)).astype(np.float32)]  # saturating both ways too
    got, expected, prof = _run_both(model, inputs)
    np.testing.assert_array_equal(got[0].view(np.int32), expected[0].view(np.int32))
    assert prof.host_cycles == 0, [call.name for call in prof.host_calls]


# ---------------------------------------------------------------- the normalise rewrite alone

def _chain(multiplier, zero_point, y_scale, dq_zero_point=None, quantized_output=False):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 4), "int8"))
    weight = np.arange(-12, 12, dtype=np.int8).reshape(4, 6) * 5
    with bb.function("main", [x]):
        with bb.dataflow():
            acc = bb.emit(relax.op.matmul(x, relax.const(weight), out_dtype="int32"))
            scaled = bb.emit(relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(multiplier)))
            q = bb.emit(relax.op.quantize(scaled, relax.const(1.0, "float32"), relax.const(zero_point, "int8"),
                                          axis=-1, out_dtype="int8"))
            zp = zero_point if dq_zero_point is None else dq_zero_point
            y = bb.emit(relax.op.dequantize(q, relax.const(y_scale, "float32"), relax.const(zp, "int8"), axis=-1))
            out = bb.emit_output(relax.Tuple([y, q]) if quantized_output else y)
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod) -> list:
    return [b.value.op.name for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


def _host(mod, x):
    out = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x))
    return out.numpy() if hasattr(out, "numpy") else [t.numpy() for t in out]


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16), zero_point=st.integers(-128, 127), y_scale=_f32s(1e-3, 1.0))
def test_the_table_computes_what_the_chain_did(seed, zero_point, y_scale):
    rng = np.random.default_rng(seed)
    multiplier = rng.uniform(1e-3, 2e-2, 6).astype(np.float32)
    mod = _chain(multiplier, zero_point, y_scale)
    rewritten = dequantized_outputs(mod)
    assert _ops(rewritten).count("relax.take") == 2
    x = rng.integers(-128, 128, (3, 4)).astype(np.int8)
    np.testing.assert_array_equal(_host(rewritten, x).view(np.int32), _host(mod, x).view(np.int32))


def test_left_alone_when_the_int8_result_is_read_elsewhere_or_the_zero_points_differ():
    multiplier = np.full(6, 0.01, np.float32)
    for mod in (_chain(multiplier, 3, 0.1, quantized_output=True), _chain(multiplier, 3, 0.1, dq_zero_point=4)):
        assert "relax.take" not in _ops(dequantized_outputs(mod))


# ---------------------------------------------------------------- a conv2d's output dequantized

def _conv_model(seed, x_scale, x_zero, y_scale, y_zero, per_channel, cin, cout, kernel, size):
    """input -> QDQ -> Conv (int8 weights, int32 bias) -> QuantizeLinear -> DequantizeLinear: a
    detector's or SqueezeNet's last conv, whose float32 result is the model's."""
    g = QdqGraph(seed)
    x = g.qdq("input", x_scale, x_zero)
    out = g.qdq(g.conv(x, x_scale, cin, cout, kernel=kernel, pad=kernel // 2, per_channel=per_channel),
                y_scale, y_zero)
    return g.model("input", [1, cin, size, size], out, [1, cout, size, size])


def test_a_conv_dequantized_in_its_epilogue_leaves_no_host_operator():
    model = _conv_model(3, 0.04, 5, 0.05, -7, True, 8, 12, 3, 10)
    placements = npu_backend.explain(from_onnx(model, keep_params_in_input=False), arch="cgra-8x8")
    dequantize = [p for p in placements if p.op == "dequantize"]
    assert len(dequantize) == 1 and dequantize[0].where == "npu" and \
        dequantize[0].kernel.split()[0].endswith("_requant_dequant"), npu_backend.format_placements(placements)
    x = np.random.default_rng(3).normal(0, 1.5, (1, 8, 10, 10)).astype(np.float32)
    got, expected, prof = _run_both(model, [x])
    np.testing.assert_array_equal(got[0].view(np.int32), expected[0].view(np.int32))
    assert prof.host_calls == [] and prof.host_cycles == 0, [call.name for call in prof.host_calls]


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**16), x_scale=_f32s(0.005, 0.1), x_zero=st.integers(-128, 127),
       y_scale=_f32s(0.002, 0.5), y_zero=st.integers(-128, 127), per_channel=st.booleans(),
       cin=st.integers(1, 12), cout=st.integers(1, 20), kernel=st.sampled_from([1, 3]), size=st.integers(1, 9))
def test_a_conv_dequantized_on_the_npu_equals_onnxruntime(seed, x_scale, x_zero, y_scale, y_zero, per_channel,
                                                         cin, cout, kernel, size):
    model = _conv_model(seed, x_scale, x_zero, y_scale, y_zero, per_channel, cin, cout, kernel, size)
    x = np.random.default_rng(seed).normal(0, 128 * x_scale, (1, cin, size, size)).astype(np.float32)
    got, expected, prof = _run_both(model, [x])
    np.testing.assert_array_equal(got[0].view(np.int32), expected[0].view(np.int32))
    assert prof.host_cycles == 0, [call.name for call in prof.host_calls]
