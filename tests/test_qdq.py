"""int8 QDQ models on the NPU, bit-exact to onnxruntime.

1. onnxruntime's requantisation is the simulator's: an adversarial QLinearConv (accumulators up
   to 2**31, where float32(acc) itself rounds, and random scales) against
   cgra_sim.functional.requantise.
2. The normalise stage's rewrite (qdq_form.py): what it turns into integer form, what it leaves.
3. Requantising kernels end to end against numpy (property test).
4. A QDQ CNN (three convs and a Gemm, per-channel weights) compiled for the NPU gives
   onnxruntime's output bit for bit, every MAC on the NPU.
"""

from __future__ import annotations

import collections

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import npu_backend
from cgra_sim.functional import requantise
from npu_backend.normalise.qdq import canonicalize_qdq
from qdq_models import QdqGraph, onnxruntime_quantized, qdq_cnn, with_quantized_outputs
from test_requantise_sim import reference_requantise


def _session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


# ---------------------------------------------------------------- onnxruntime's arithmetic

def _one_by_one_conv(bias, w_scale, x_scale, y_scale, x_zero, y_zero, dtype=np.int8):
    """QDQ 1x1 conv of one `dtype` input channel with weights 1: acc = x - x_zero + bias[c]."""
    g = QdqGraph(0)
    channels = len(bias)
    x = g.node("DequantizeLinear", ["xq", g.const(x_scale, np.float32), g.const(x_zero, dtype)])
    w = g.node("DequantizeLinear", [g.const(np.ones((channels, 1, 1, 1)), np.int8), g.const(w_scale, np.float32),
                                    g.const(np.zeros(channels), np.int8)], axis=0)
    b = g.node("DequantizeLinear", [g.const(bias, np.int32), g.const(np.float32(x_scale) * w_scale, np.float32),
                                    g.const(np.zeros(channels), np.int32)], axis=0)
    y = g.node("Conv", [x, w, b])
    out = g.node("QuantizeLinear", [y, g.const(y_scale, np.float32), g.const(y_zero, dtype)])
    onnx_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(g.nodes, "adversarial", [helper.make_tensor_value_info("xq", onnx_type, [1, 1, 16, 16])],
                              [helper.make_tensor_value_info(out, onnx_type, [1, len(bias), 16, 16])], g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("seed", range(4))
def test_onnxruntime_requantises_as_the_simulator_does(seed):
    """Every int8 input against biases that put acc * M in [-128, 128] with accumulators up to
    2**31: float32 products (not float64) and round half to even (not away) are what match."""
    rng = np.random.default_rng(seed)
    x_scale, y_scale = (np.float32(rng.uniform(0.001, 0.1)) for _ in range(2))
    w_scale = rng.uniform(1e-6, 1e-3, 32).astype(np.float32)
    multiplier = (x_scale * w_scale) / y_scale
    bias = np.clip(rng.uniform(-128, 128, 32) / multiplier, -2**31 + 300, 2**31 - 300).astype(np.int32)
    x_zero, y_zero = (int(v) for v in rng.integers(-128, 128, 2))
    xq = np.arange(-128, 128, dtype=np.int8).reshape(1, 1, 16, 16)
    got = _session(_one_by_one_conv(bias, w_scale, x_scale, y_scale, x_zero, y_zero)).run(None, {"xq": xq})[0]
    acc = (xq.reshape(1, -1).astype(np.int64) - x_zero + bias.reshape(-1, 1)).astype(np.int32)  # (c, pixels)
    expected = requantise(acc.T, multiplier, y_zero).T.reshape(got.shape)
    np.testing.assert_array_equal(got, expected)


def test_a_uint8_model_input_and_output_are_exact_against_onnxruntime():
    """uint8 in, uint8 out, zero points away from 128: the int8 form (x - 128, zp - 128) reads
    the model's input and gives its output back as uint8, every value of 0..255 bit-exact."""
    rng = np.random.default_rng(7)
    w_scale = rng.uniform(1.0, 5.0, 8).astype(np.float32)  # multipliers 0.4 to 2: both ends saturate
    bias = rng.integers(-50, 50, 8).astype(np.int32)
    model = _one_by_one_conv(bias, w_scale, np.float32(0.02), np.float32(0.05), 150, 100, dtype=np.uint8)
    xq = np.arange(256, dtype=np.uint8).reshape(1, 1, 16, 16)
    expected = _session(model).run(None, {"xq": xq})[0]
    mod = npu_backend.from_onnx(model)
    assert [p.kernel.split()[0] for p in npu_backend.explain(mod) if p.op == "nn.conv2d"] == ["cgra.conv2d_bias_requant"]
    got = relax.VirtualMachine(tvm.compile(mod, target="cgra"), tvm.cpu())["main"](tvm.runtime.tensor(xq)).numpy()
    assert got.dtype == np.uint8 and len(np.unique(expected)) > 100 and {0, 255} <= set(expected.flat)
    np.testing.assert_array_equal(got, expected)


# ---------------------------------------------------------------- the normalise rewrite

def _layer_model(relu=False, y_zero=-5, w_zero=0, per_channel_axis=0, pad=1):
    g = QdqGraph(1)
    x = g.qdq("input", 0.05, 3)
    w = g.rng.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32)
    scale = (np.abs(w).max(axis=(1, 2, 3)) / 127).astype(np.float32)
    if per_channel_axis == 0:
        wq = np.clip(np.rint(w / scale.reshape(-1, 1, 1, 1)), -127, 127).astype(np.int8)
        weight = g.node("DequantizeLinear", [g.const(wq, np.int8), g.const(scale, np.float32),
                                             g.const(np.full(8, w_zero), np.int8)], axis=0)
    else:  # per input channel: not what QLinearConv takes
        scale = scale[:4]
        wq = np.clip(np.rint(w / scale.reshape(1, -1, 1, 1)), -127, 127).astype(np.int8)
        weight = g.node("DequantizeLinear", [g.const(wq, np.int8), g.const(scale, np.float32),
                                             g.const(np.zeros(4), np.int8)], axis=1)
    y = g.node("Conv", [x, weight], kernel_shape=[3, 3], pads=[pad] * 4)
    y = g.node("Relu", [y]) if relu else y
    return g.model("input", [1, 4, 8, 8], g.qdq(y, 0.1, y_zero), [1, 8, 8 + 2 * pad - 2, 8 + 2 * pad - 2])


def _ops(mod):
    names = []
    relax.analysis.post_order_visit(mod["main"], lambda e: names.append(
        (e.op.name, str(e.attrs.out_dtype) if "conv2d" in e.op.name else "")
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None))
    return [n for n in names if n]


@pytest.mark.parametrize("kwargs, integer", [
    ({}, True),
    ({"relu": True, "y_zero": -128}, True),  # onnxruntime drops the relu: saturation does it
    ({"relu": True, "y_zero": -5}, False),  # onnxruntime runs float Conv + Relu
    ({"w_zero": 1}, True),  # weights with a zero point: w - 1 fits int8 (QLinearConv takes them too)
    ({"w_zero": -100}, False),  # w + 100 reaches 227: wider than the PE array's int8 multiplier
    ({"per_channel_axis": 1}, False),  # scales per input channel
])
def test_normalise_rewrites_exactly_the_layers_onnxruntime_fuses(kwargs, integer):
    ops = _ops(canonicalize_qdq(from_onnx(_layer_model(**kwargs), keep_params_in_input=False)))
    assert (("relax.nn.conv2d", "int32") in ops) == integer
    assert any(op == "relax.nn.conv2d" and dtype != "int32" for op, dtype in ops) != integer
    if integer:  # x's zero point 3 pads the int8 input: the padding is the real value 0
        assert ("relax.nn.pad", "") in ops


# ---------------------------------------------------------------- requantising kernels end to end

def _requant_module(op, x_shape, weight, bias, multiplier, zero_point, relu):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "int8"))
    channel = (1, -1, 1, 1) if op == "conv2d" else (-1,)
    with bb.function("main", [x]):
        with bb.dataflow():
            if op == "conv2d":
                acc = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), padding=[1, 1, 1, 1], out_dtype="int32"))
            else:
                acc = bb.emit(relax.op.matmul(x, relax.const(weight), out_dtype="int32"))
            acc = bb.emit(relax.op.add(acc, relax.const(bias.reshape(channel))))
            acc = bb.emit(relax.op.nn.relu(acc)) if relu else acc
            scaled = bb.emit(relax.op.multiply(relax.op.astype(acc, "float32"),
                                               relax.const(multiplier.reshape(channel))))
            out = bb.emit_output(relax.op.quantize(scaled, relax.const(1.0, "float32"),
                                                   relax.const(zero_point, "int8"), axis=-1, out_dtype="int8"))
        bb.emit_func_output(out)
    return bb.get()


def _reference(op, x, weight, bias, multiplier, zero_point, relu):
    if op == "conv2d":
        padded = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        _, _, h, w = x.shape
        acc = sum(np.einsum("nchw,oc->nhwo", padded[:, :, i:i + h, j:j + w], weight[:, :, i, j].astype(np.int64))
                  for i in range(3) for j in range(3))
        acc = acc.reshape(-1, weight.shape[0])  # (pixels, channels)
    else:
        acc = x.astype(np.int64) @ weight.astype(np.int64)
    acc = acc + bias
    acc = np.maximum(acc, 0) if relu else acc
    out = reference_requantise(acc.astype(np.int32), multiplier, zero_point)
    if op == "conv2d":
        n, _, h, w = x.shape
        out = out.reshape(n, h, w, -1).transpose(0, 3, 1, 2)
    return out


@settings(max_examples=8)
@given(op=st.sampled_from(["matmul", "conv2d"]), size=st.integers(2, 12), channels=st.integers(1, 20),
       depth=st.integers(1, 24), relu=st.booleans(), zero_point=st.integers(-128, 127),
       seed=st.integers(0, 2**16))
def test_requantising_kernels_match_numpy(op, size, channels, depth, relu, zero_point, seed):
    rng = np.random.default_rng(seed)
    x_shape = (1, depth, size, size) if op == "conv2d" else (size, depth)
    w_shape = (channels, depth, 3, 3) if op == "conv2d" else (depth, channels)
    x = rng.integers(-128, 128, x_shape).astype(np.int8)
    weight = rng.integers(-127, 128, w_shape).astype(np.int8)
    bias = rng.integers(-5000, 5000, channels).astype(np.int32)
    multiplier = (rng.uniform(0.5, 2.0, channels) / (depth * 9 * 64)).astype(np.float32)
    ex = tvm.compile(_requant_module(op, x_shape, weight, bias, multiplier, zero_point, relu), target="cgra")
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert len(prof.kernels) == 1  # one NPU kernel, requantisation included
    np.testing.assert_array_equal(got, _reference(op, x, weight, bias, multiplier, zero_point, relu))


@pytest.mark.parametrize("groups, cin, cout", [(16, 16, 16), (4, 16, 8)])  # depthwise, grouped
def test_requantising_grouped_and_depthwise_conv2d_match_numpy(groups, cin, cout):
    rng = np.random.default_rng(groups)
    x = rng.integers(-128, 128, (1, cin, 9, 9)).astype(np.int8)
    weight = rng.integers(-127, 128, (cout, cin // groups, 3, 3)).astype(np.int8)
    bias, multiplier = rng.integers(-500, 500, cout).astype(np.int32), rng.uniform(1e-3, 1e-2, cout).astype(np.float32)
    bb = relax.BlockBuilder()
    data = relax.Var("x", relax.TensorType(x.shape, "int8"))
    with bb.function("main", [data]):
        with bb.dataflow():
            acc = bb.emit(relax.op.nn.conv2d(data, relax.const(weight), padding=[1, 1, 1, 1], groups=groups,
                                             out_dtype="int32"))
            acc = bb.emit(relax.op.add(acc, relax.const(bias.reshape(1, -1, 1, 1))))
            scaled = bb.emit(relax.op.multiply(relax.op.astype(acc, "float32"),
                                               relax.const(multiplier.reshape(1, -1, 1, 1))))
            out = bb.emit_output(relax.op.quantize(scaled, relax.const(1.0, "float32"), relax.const(7, "int8"),
                                                   axis=1, out_dtype="int8"))
        bb.emit_func_output(out)
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(tvm.compile(bb.get(), target="cgra"), tvm.cpu())["main"](
            tvm.runtime.tensor(x)).numpy()
    assert len(prof.kernels) == 1
    padded, per_group, outs_per_group = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1))), cin // groups, cout // groups
    acc = np.zeros((cout, 9, 9), np.int64)
    for o in range(cout):
        channels = padded[0, o // outs_per_group * per_group:(o // outs_per_group + 1) * per_group]
        for i in range(3):
            for j in range(3):
                acc[o] += np.einsum("chw,c->hw", channels[:, i:i + 9, j:j + 9], weight[o, :, i, j].astype(np.int64))
    acc += bias.reshape(-1, 1, 1)
    expected = reference_requantise(acc.reshape(cout, -1).T.astype(np.int32), multiplier, 7).T
    np.testing.assert_array_equal(got.reshape(cout, -1), expected)


def test_equal_layers_with_different_zero_points_get_a_kernel_each():
    """Partitioning gives the two structurally equal layers one function; their zero points
    (bound at compile time) differ, so each gets its own copy."""
    rng = np.random.default_rng(0)
    weight, multiplier = rng.integers(-127, 128, (16, 8)).astype(np.int8), np.full(8, 0.01, np.float32)
    bb = relax.BlockBuilder()
    data = relax.Var("x", relax.TensorType((4, 16), "int8"))
    with bb.function("main", [data]):
        with bb.dataflow():
            outs = []
            for zero_point in (-5, 9):
                acc = bb.emit(relax.op.matmul(data, relax.const(weight), out_dtype="int32"))
                scaled = bb.emit(relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(multiplier)))
                outs.append(bb.emit(relax.op.quantize(scaled, relax.const(1.0, "float32"),
                                                      relax.const(zero_point, "int8"), axis=-1, out_dtype="int8")))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    x = rng.integers(-128, 128, (4, 16)).astype(np.int8)
    got = relax.VirtualMachine(tvm.compile(bb.get(), target="cgra"), tvm.cpu())["main"](tvm.runtime.tensor(x))
    acc = (x.astype(np.int64) @ weight.astype(np.int64)).astype(np.int32)
    for result, zero_point in zip(got, (-5, 9)):
        np.testing.assert_array_equal(result.numpy(), reference_requantise(acc, multiplier, zero_point))


# ---------------------------------------------------------------- a whole QDQ model

def test_qdq_cnn_is_bit_exact_to_onnxruntime_with_its_macs_on_the_npu():
    model = qdq_cnn()
    mod = from_onnx(model, keep_params_in_input=False)
    placements = npu_backend.explain(mod, arch="cgra-8x8")
    heavy = [p for p in placements if p.op in ("nn.conv2d", "matmul")]
    kinds = ("_requant", "_requant_dequant")  # the Gemm's output dequantized too (qdq_outputs.py)
    assert len(heavy) == 4 and all(p.where == "npu" and p.kernel.split()[0].endswith(kinds)
                                   for p in heavy), npu_backend.format_placements(placements)
    assert npu_backend.npu_mac_fraction(placements) == 1.0
    vm = relax.VirtualMachine(tvm.compile(mod, target="cgra"), tvm.cpu())
    session = _session(model)
    rng = np.random.default_rng(0)
    ties = (rng.integers(-200, 200, (1, 3, 16, 16)) * np.float32(0.02)).astype(np.float32)  # x / 0.04 = k / 2
    for x in (rng.normal(0, 1.5, (1, 3, 16, 16)).astype(np.float32), ties):
        expected = session.run(None, {"input": x})[0]
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("activation_type, weight_type, per_channel", [
    ("QUInt8", "QInt8", False),  # onnxruntime's quantize_static defaults before 1.21
    ("QUInt8", "QInt8", True),
    ("QUInt8", "QUInt8", False),  # uint8 weights with zero points: centred, they fit int8
    ("QInt8", "QInt8", False),  # the defaults since
])
def test_a_resnet_quantized_by_onnxruntime_is_bit_exact_layer_by_layer(tmp_path, activation_type, weight_type,
                                                                      per_channel):
    """A ResNet (shortcuts: onnxruntime's quantizer gives a branch's readers one shared
    DequantizeLinear) quantized by onnxruntime itself: every conv and the Gemm run as integer NPU
    kernels named after their ONNX nodes, and each one's integer result (every QuantizeLinear
    output after a Conv or Gemm, uint8 or int8) equals onnxruntime's whenever its input does. The
    shortcut Add is onnxruntime's QLinearAdd in fixed point (normalise/qlinear.py: MLAS's
    arithmetic on Arm and without AVX2; with AVX2 onnxruntime computes it in float32): with the
    same inputs its result is onnxruntime's or, where the sum lies within 2**-21 of a half step,
    one step away. The global average pool is onnxruntime's QLinearGlobalAveragePool (qpools.py):
    its result is onnxruntime's with the same input. The other quantized ops (the max pool) run
    as stock TVM runs them: their results equal the llvm build's."""
    from onnx_models import resnet

    model = onnxruntime_quantized(resnet(size=16), tmp_path, activation_type, weight_type, per_channel)
    shared = collections.Counter(i for n in model.graph.node for i in n.input)
    assert any(shared[n.output[0]] > 1 for n in model.graph.node if n.op_type == "DequantizeLinear")
    model, names = with_quantized_outputs(model)
    mod = npu_backend.from_onnx(model)
    heavy = [p for p in npu_backend.explain(mod) if p.op in ("nn.conv2d", "matmul")]
    # 7 layers and the global average pool's int32 sum (QLinearGlobalAveragePool, qpools.py)
    assert len(heavy) == 8 and all(p.kernel.split()[0].endswith("_requant") for p in heavy), \
        npu_backend.format_placements(heavy)
    vm = relax.VirtualMachine(tvm.compile(mod, target="cgra"), tvm.cpu())
    stock = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    session = _session(model)
    producer = {n.output[0]: n for n in model.graph.node}
    quantized_inputs = {}  # Q output -> the Q outputs its producer reads (through DequantizeLinear)
    for name in names:
        if producer[name].op_type != "QuantizeLinear" or producer[name].input[0] not in producer:
            continue  # the model's own output, the input's quantization
        op = producer[producer[name].input[0]]
        quantized_inputs[name] = (op.op_type, [producer[i].input[0] for i in op.input
                                               if i in producer and producer[i].op_type == "DequantizeLinear"])
    rng = np.random.default_rng(3)
    for scale in (0.5, 1.0, 3.0):
        x = rng.normal(0, scale, (1, 3, 16, 16)).astype(np.float32)
        with npu_backend.profile() as prof:
            got = {name: t.numpy() for name, t in zip(names, vm["main"](tvm.runtime.tensor(x)))}
        theirs = dict(zip(names, session.run(None, {"input": x})))
        host = {name: t.numpy() for name, t in zip(names, stock["main"](tvm.runtime.tensor(x)))}
        same = {name for name in names if got[name].dtype == theirs[name].dtype
                and np.array_equal(got[name], theirs[name])}
        for name, (op, inputs) in quantized_inputs.items():
            if op in ("Conv", "Gemm", "GlobalAveragePool") and set(inputs) <= same:
                assert name in same, f"{name} ({op}) differs from onnxruntime's with the same input"
            elif op == "Add" and set(inputs) <= same:
                steps = np.abs(got[name].astype(np.int32) - theirs[name].astype(np.int32))
                assert steps.max() <= 1 and np.count_nonzero(steps) <= max(1, steps.size // 1000), name
            elif op not in ("Conv", "Gemm", "Add", "GlobalAveragePool") and name not in same:
                np.testing.assert_array_equal(got[name], host[name], err_msg=f"{name} ({op})")
    convs = {n.name for n in model.graph.node if n.op_type in ("Conv", "Gemm")}
    assert convs <= {node for k in prof.kernels for node in k.model_nodes}  # each layer names its node


def test_kernels_come_out_in_the_same_order_on_every_compile(tmp_path):
    """The QDQ CNN's scalar-bound kernel variants once went into the object in the order of
    their GlobalVars' addresses (a set): each compile wrote another LLVM module."""
    mod = from_onnx(qdq_cnn(), keep_params_in_input=False)
    modules = set()
    for attempt in range(4):
        npu_backend.compile(mod, "cgra-8x8", dump_dir=str(tmp_path / str(attempt)))
        modules.add((tmp_path / str(attempt) / "llvm" / "kernels.ll").read_text())
    assert len(modules) == 1
