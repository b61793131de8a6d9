"""Ops between quantized tensors (issue 37 item 0): QLinearAdd and QLinearMul as one FABRIC_INT8 kernel.

1. The simulator's FABRIC_INT8 (int8 operands read sign-extended into an int32 body, the output
   saturated to int8) against numpy, on random int32 bodies; what it refuses.
2. normalise/qlinear.py: the fixed-point parameters follow MLAS's rules; what it leaves alone.
3. The compiled QLinearAdd against its numpy fixed-point model (property test): one kernel, no
   host call, bit-exact.
4. The compiled QLinearMul (a squeeze-excite's per-channel scale, x * gate) against its numpy
   float32 model: one kernel, bit-exact.
5. A QDQ residual block (two convs, Add, Relu with zero point -128) against onnxruntime: its Add
   is one NPU kernel; its result is onnxruntime's where the sum is not within 2**-21 of a half
   step (onnxruntime on AVX2 computes QLinearAdd in float32, on Arm in this fixed point).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from cgra_sim import load_arch, simulate
from cgra_sim.isa import FABRIC_INPUT_B, FABRIC_INT8, DType, Op, encode
from cgra_sim.mapping import body as bodies
from npu_backend.normalise.qlinear import integer_qlinear_adds, qlinear_add_parameters, qlinear_add_reference
from qdq_models import QdqGraph
from test_sim_fabric import random_bodies
from sim_records import dma_record

ARCH = load_arch("cgra-4x4")


# ---------------------------------------------------------------- the simulator's FABRIC_INT8

def _int8_stream(body, rows, cols, dtype="int32"):
    words = bodies.encode(body, dtype)
    records = [dma_record(Op.DMA_LOAD, 0, 0, [(rows * cols, 0, 1, 1)]),
               dma_record(Op.DMA_LOAD, 1, 1024, [(rows * cols, 0, 1, 1)]),
               encode(Op.FABRIC, flags=FABRIC_INPUT_B | FABRIC_INT8, dtype=DType.from_name(dtype), rows=rows, cols=cols,
                      a_addr=0, a_row_stride=cols, a_col_stride=1, b_addr=1024, b_row_stride=cols, b_col_stride=1,
                      out_addr=2048, out_stride=cols, nodes=len(words), **{f"node{i}": w for i, w in enumerate(words)}),
               dma_record(Op.DMA_STORE, 2, 2048, [(rows * cols, 0, 1, 1)])]
    return np.array(records, dtype=np.int64)


@settings(max_examples=30, deadline=None)
@given(case=random_bodies(dtype="int32", two_inputs=True), rows=st.integers(1, 6), cols=st.integers(1, 9),
       seed=st.integers(0, 2**32 - 1))
def test_fabric_int8_is_its_int32_body_saturated(case, rows, cols, seed):
    _, body = case
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(-128, 128, rows * cols).astype(np.int8) for _ in range(2))
    out = np.zeros(rows * cols, np.int8)
    simulate(ARCH, _int8_stream(body, rows, cols), [a, b, out])
    expected = bodies.evaluate(body, "int32", a.astype(np.int32), b.astype(np.int32))
    np.testing.assert_array_equal(out, np.clip(expected, -128, 127).astype(np.int8))


@settings(max_examples=8, deadline=None)
@given(case=random_bodies(dtype="float32", two_inputs=True), rows=st.integers(1, 6), cols=st.integers(1, 9),
       seed=st.integers(0, 2**32 - 1))
def test_fabric_int8_float_body_rounds_half_to_even_and_saturates(case, rows, cols, seed):
    _, body = case
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(-128, 128, rows * cols).astype(np.int8) for _ in range(2))
    out = np.zeros(rows * cols, np.int8)
    simulate(ARCH, _int8_stream(body, rows, cols, "float32"), [a, b, out])
    with np.errstate(all="ignore"):
        expected = bodies.evaluate(body, "float32", a.astype(np.float32), b.astype(np.float32))
        expected = np.clip(np.rint(expected), -128, 127)
    np.testing.assert_array_equal(out, np.nan_to_num(expected, nan=out.astype(np.float32)).astype(np.int8))


# ---------------------------------------------------------------- the normalise rewrite

def test_parameters_follow_mlas():
    """The larger ratio's multiplier in [2**21, 2**22), its shift 21 - its exponent; ratios from
    256 up or below 2**-14 are onnxruntime's float path, left alone."""
    shift, ma, mb = qlinear_add_parameters(0.07, 0.04, 0.06)  # ratios 7/6 and 2/3
    assert shift == 21 and 2**21 <= ma < 2**22 and mb == round(np.float32(np.float32(0.04) / np.float32(0.06)) * 2**21)
    assert qlinear_add_parameters(1.0, 1.0, 1 / 300) is None
    assert qlinear_add_parameters(1e-6, 1.0, 1.0) is None


def _add_module(relu: bool, c_zero: int, shape=(1, 4, 6, 6)):
    bb = relax.BlockBuilder()
    a, b = (relax.Var(name, relax.TensorType(shape, "int8")) for name in "ab")
    with bb.function("main", [a, b]):
        with bb.dataflow():
            fa = bb.emit(relax.op.dequantize(a, relax.const(0.07, "float32"), relax.const(-3, "int8")))
            fb = bb.emit(relax.op.dequantize(b, relax.const(0.04, "float32"), relax.const(5, "int8")))
            total = bb.emit(relax.op.add(fa, fb))
            total = bb.emit(relax.op.nn.relu(total)) if relu else total
            out = bb.emit_output(relax.op.quantize(total, relax.const(0.06, "float32"), relax.const(c_zero, "int8"),
                                                   out_dtype="int8"))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("relu, c_zero, integer", [(False, 7, True), (True, -128, True), (True, 7, False)])
def test_the_rewrite_takes_exactly_onnxruntimes_qlinear_adds(relu, c_zero, integer):
    """A relu before the quantize is the saturation when the zero point is -128 (onnxruntime
    drops it then); with another, onnxruntime adds and clips in float, and so does the module."""
    ops = []
    relax.analysis.post_order_visit(integer_qlinear_adds(_add_module(relu, c_zero))["main"], lambda e: ops.append(
        e.op.name) if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    assert ("relax.right_shift" in ops) == integer and ("relax.dequantize" in ops) != integer


# ---------------------------------------------------------------- compiled against numpy

@settings(max_examples=8, deadline=None)
@given(shape=st.sampled_from([(1, 3, 5, 7), (2, 16, 4, 4), (1, 64, 9, 9), (33,)]),
       scales=st.tuples(*[st.floats(0.001953125, 0.5, width=32)] * 3), zeros=st.tuples(*[st.integers(-128, 127)] * 3),
       seed=st.integers(0, 2**16))
def test_qlinear_add_is_one_kernel_bit_exact_to_its_fixed_point_model(shape, scales, zeros, seed):
    parameters = qlinear_add_parameters(*scales)
    if parameters is None:
        return
    (za, zb, zc), (shift, ma, mb) = zeros, parameters
    bb = relax.BlockBuilder()
    a, b = (relax.Var(name, relax.TensorType(shape, "int8")) for name in "ab")
    with bb.function("main", [a, b]):
        with bb.dataflow():
            fa = bb.emit(relax.op.dequantize(a, relax.const(scales[0], "float32"), relax.const(za, "int8")))
            fb = bb.emit(relax.op.dequantize(b, relax.const(scales[1], "float32"), relax.const(zb, "int8")))
            out = bb.emit_output(relax.op.quantize(bb.emit(relax.op.add(fa, fb)), relax.const(scales[2], "float32"),
                                                   relax.const(zc, "int8"), out_dtype="int8"))
        bb.emit_func_output(out)
    rng = np.random.default_rng(seed)
    x, y = (rng.integers(-128, 128, shape).astype(np.int8) for _ in range(2))
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(tvm.compile(bb.get(), target="cgra"), tvm.cpu())["main"](
            tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy()
    assert len(prof.kernels) == 1 and prof.host_calls == []
    np.testing.assert_array_equal(got, qlinear_add_reference(x, za, y, zb, zc, shift, ma, mb))


def _mul_reference(x, y, scales, zeros):
    """The fabric's QLinearMul in numpy: float32 steps in the body's order, 1 / sc, + zc, rne."""
    f32 = np.float32
    with np.errstate(over="ignore"):
        value = ((x.astype(f32) - f32(zeros[0])) * f32(scales[0])) * ((y.astype(f32) - f32(zeros[1])) * f32(scales[1]))
        value = value * (f32(1) / f32(scales[2])) + f32(zeros[2])
    return np.clip(np.rint(value), -128, 127).astype(np.int8)


@settings(max_examples=6, deadline=None)
@given(shapes=st.sampled_from([((1, 16, 6, 6), (1, 16, 1, 1)), ((1, 8, 1, 1), (1, 8, 5, 5)), ((2, 9, 7), (2, 9, 7))]),
       scales=st.tuples(*[st.floats(0.001953125, 0.5, width=32)] * 3), zeros=st.tuples(*[st.integers(-127, 127)] * 3),
       seed=st.integers(0, 2**16))
def test_qlinear_mul_is_one_kernel_bit_exact_to_its_float32_model(shapes, scales, zeros, seed):
    bb = relax.BlockBuilder()
    a, b = (relax.Var(name, relax.TensorType(shape, "int8")) for name, shape in zip("ab", shapes))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            fa = bb.emit(relax.op.dequantize(a, relax.const(scales[0], "float32"), relax.const(zeros[0], "int8")))
            fb = bb.emit(relax.op.dequantize(b, relax.const(scales[1], "float32"), relax.const(zeros[1], "int8")))
            pool = bb.emit(relax.op.mean(fa, axis=[0], keepdims=True))  # a second reader of fa's dequantize
            out = bb.emit(relax.op.quantize(bb.emit(relax.op.multiply(fa, fb)), relax.const(scales[2], "float32"),
                                            relax.const(zeros[2], "int8"), out_dtype="int8"))
            out = bb.emit_output(relax.Tuple([out, pool]))
        bb.emit_func_output(out)
    rng = np.random.default_rng(seed)
    x, y = (rng.integers(-128, 128, shape).astype(np.int8) for shape in shapes)
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(tvm.compile(bb.get(), target="cgra"), tvm.cpu())["main"](
            tvm.runtime.tensor(x), tvm.runtime.tensor(y))[0].numpy()
    assert sum(k.source_ops == ("dequantize", "dequantize", "multiply", "quantize") for k in prof.kernels) == 1
    np.testing.assert_array_equal(got, _mul_reference(x, y, scales, zeros))


# ---------------------------------------------------------------- against onnxruntime

def _residual_block(seed: int):
    g = QdqGraph(seed)
    x = g.qdq("input", 0.0431, 2)
    a = g.qdq(g.conv(x, 0.0431, 3, 8), 0.0713, -3)
    b = g.qdq(g.node("Relu", [g.conv(x, 0.0431, 3, 8)]), 0.0387, -128)
    y = g.qdq(g.node("Relu", [g.node("Add", [a, b])]), 0.0617, -128)
    return g.model("input", [1, 3, 12, 12], y, [1, 8, 12, 12])


def test_a_residual_add_runs_as_one_kernel_next_to_onnxruntimes():
    model = _residual_block(2)
    mod = npu_backend.from_onnx(model)
    placements = npu_backend.explain(mod)
    shifts = [p for p in placements if p.op == "right_shift"]
    assert len(shifts) == 1 and shifts[0].where == "npu" and shifts[0].kernel.startswith("cgra.qlinear_add")
    assert [p.op for p in placements if p.where == "host" and "quantize" in p.op] == ["dequantize"]
    vm = relax.VirtualMachine(tvm.compile(mod, target="cgra"), tvm.cpu())
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.normal(0, 1.5, (1, 3, 12, 12)).astype(np.float32)
        with npu_backend.profile() as prof:
            got = vm["main"](tvm.runtime.tensor(x)).numpy()
        steps = np.rint(np.abs(got - session.run(None, {"input": x})[0]) / np.float32(0.0617))
        assert steps.max() <= 1 and np.count_nonzero(steps) <= 1, steps.sum()
        assert len(prof.kernels) == 4  # the input's quantize, two convs, the add


# ---------------------------------------------------------------- float chains between quantized tensors

def _chain_reference(x, sx, zx, chain, sy, zy):
    """The fabric's quantized chain in numpy: float32 steps, 1 / sy, + zy, rounded half to even."""
    f32 = np.float32
    value = chain((x.astype(f32) - f32(zx)) * f32(sx))
    return np.clip(np.rint(value * (f32(1) / f32(sy)) + f32(zy)), -128, 127).astype(np.int8)


@settings(max_examples=6, deadline=None)
@given(shape=st.sampled_from([(1, 8, 5, 5), (3, 17), (1, 64, 4, 4)]), sx=st.floats(0.001953125, 0.25, width=32),
       sy=st.floats(0.001953125, 0.25, width=32), zx=st.integers(-127, 127), zy=st.integers(-127, 127),
       seed=st.integers(0, 2**16))
def test_a_hard_swish_between_quantized_tensors_is_one_kernel_bit_exact_to_its_float32_model(shape, sx, sy, zx, zy,
                                                                                             seed):
    """quantize(x * clip(x / 6 + 0.5, 0, 1)) of dequantize(x), whose dequantize a pool also reads."""
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType(shape, "int8"))
    sixth = np.float32(1 / 6)
    with bb.function("main", [a]):
        with bb.dataflow():
            x = bb.emit(relax.op.dequantize(a, relax.const(sx, "float32"), relax.const(zx, "int8")))
            gate = bb.emit(relax.op.clip(bb.emit(relax.op.add(bb.emit(relax.op.multiply(x, relax.const(sixth))),
                                                              relax.const(0.5, "float32"))), 0.0, 1.0))
            out = bb.emit(relax.op.quantize(bb.emit(relax.op.multiply(x, gate)), relax.const(sy, "float32"),
                                            relax.const(zy, "int8"), out_dtype="int8"))
            out = bb.emit_output(relax.Tuple([out, bb.emit(relax.op.mean(x, axis=[0], keepdims=True))]))
        bb.emit_func_output(out)
    x = np.random.default_rng(seed).integers(-128, 128, shape).astype(np.int8)
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(tvm.compile(bb.get(), target="cgra"), tvm.cpu())["main"](tvm.runtime.tensor(x))
    assert [k.source_ops for k in prof.kernels if "quantize" in k.source_ops] == [
        ("dequantize", "multiply", "add", "clip", "multiply", "quantize")]
    expected = _chain_reference(x, sx, zx, lambda v: v * np.clip(v * sixth + np.float32(0.5), 0, 1), sy, zy)
    np.testing.assert_array_equal(got[0].numpy(), expected)


def test_a_qdq_hard_sigmoid_and_its_gate_run_on_the_npu_next_to_onnxruntimes():
    """MobileNetV3's hard-swish as onnxruntime's quantizer writes it: HardSigmoid, QDQ, Mul: one
    LOOKUP kernel (a function of the conv's int8 output: normalise/qlookups.py; a quantized chain
    kernel and a QLinearMul kernel before), equal to onnxruntime's integer kernels and within a
    step of its float path."""
    g = QdqGraph(4)
    x = g.qdq("input", 0.0431, 2)
    y = g.qdq(g.conv(x, 0.0431, 3, 8), 0.0713, -3)
    gate = g.qdq(g.node("HardSigmoid", [y], alpha=1 / 6, beta=0.5), 0.00392, -128)
    out = g.qdq(g.node("Mul", [y, gate]), 0.0389, -20)
    model = g.model("input", [1, 3, 10, 10], out, [1, 8, 10, 10])
    vm = relax.VirtualMachine(tvm.compile(npu_backend.from_onnx(model), target="cgra"), tvm.cpu())
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).normal(0, 1.5, (1, 3, 10, 10)).astype(np.float32)
    with npu_backend.profile() as prof:
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    # the output's dequantize on the host; the input's quantize is a kernel (quantize.py)
    assert [c.name for c in prof.host_calls] == ["dequantize"] and len(prof.kernels) == 3
    assert [k.source_ops[-1] for k in prof.kernels].count("take") == 1
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdqisint8allowed", "1")
    integer = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got, integer.run(None, {"input": x})[0])
    steps = np.rint(np.abs(got - session.run(None, {"input": x})[0]) / np.float32(0.0389))
    assert steps.max() <= 1 and np.count_nonzero(steps) <= 2
