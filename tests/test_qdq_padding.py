"""An int8 conv2d whose input zero point is -128 pads in its own DMA halo (issue 37 item 0).

A QDQ conv that pads reads its input padded with the input's zero point (the real value 0):
normalise/qdq.py writes conv2d(pad(x, zp), padding 0). With zp = -128, the int8 dtype's lowest
value (every activation after a relu that onnxruntime's quantizer calibrates), the conv2d
family takes the pad into the kernel: its DMA fills the halo with -128 (DMA_FILL_LOWEST)
instead of the host padding the whole image first.

1. conv2d and depthwise conv2d of pad(x, -128) against numpy (property test): one kernel, no
   host call.
2. A pad of another value stays on the host, with the reason.
3. A QDQ layer after a relu (zero point -128) against onnxruntime: bit-exact, no host pad.
4. Another input zero point: the kernel pads with -128 and adds the padding taps' correction
   (normalise/qdq_borders.py) as a residual: the correction against a brute-force numpy conv,
   and QDQ layers of any zero point, padding, stride and groups bit-exact to onnxruntime with no
   host pad.
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
from npu_backend.normalise.qdq_borders import border_correction
from qdq_models import QdqGraph
from test_requantise_sim import reference_requantise


def _padded_conv_module(x_shape, weight, bias, multiplier, widths, stride, groups, pad_value=-128.0):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "int8"))
    top, bottom, left, right = widths
    with bb.function("main", [x]):
        with bb.dataflow():
            data = bb.emit(relax.op.nn.pad(x, [0, 0, 0, 0, top, bottom, left, right], pad_value=pad_value))
            acc = bb.emit(relax.op.nn.conv2d(data, relax.const(weight), strides=[stride, stride], groups=groups,
                                             out_dtype="int32"))
            acc = bb.emit(relax.op.add(acc, relax.const(bias.reshape(1, -1, 1, 1))))
            scaled = bb.emit(relax.op.multiply(relax.op.astype(acc, "float32"),
                                               relax.const(multiplier.reshape(1, -1, 1, 1))))
            out = bb.emit_output(relax.op.quantize(scaled, relax.const(1.0, "float32"), relax.const(3, "int8"),
                                                   axis=1, out_dtype="int8"))
        bb.emit_func_output(out)
    return bb.get()


def _reference(x, weight, bias, multiplier, widths, stride, groups):
    top, bottom, left, right = widths
    padded = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=-128)
    cout, per_group, kh, kw = weight.shape
    oh, ow = (padded.shape[2] - kh) // stride + 1, (padded.shape[3] - kw) // stride + 1
    acc = np.zeros((cout, oh, ow), np.int64)
    for o in range(cout):
        group = o // (cout // groups)
        channels = padded[0, group * per_group:(group + 1) * per_group]
        for i in range(kh):
            for j in range(kw):
                window = channels[:, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
                acc[o] += np.einsum("chw,c->hw", window, weight[o, :, i, j].astype(np.int64))
    acc += bias.reshape(-1, 1, 1)
    return reference_requantise(acc.reshape(cout, -1).T.astype(np.int32), multiplier, 3).T.reshape(1, cout, oh, ow)


@settings(max_examples=6)
@given(depthwise=st.booleans(), channels=st.integers(1, 12), size=st.integers(3, 10), stride=st.sampled_from([1, 2]),
       widths=st.tuples(*[st.integers(0, 2)] * 4), seed=st.integers(0, 2**16))
def test_conv2d_of_a_lowest_value_pad_is_one_kernel_matching_numpy(depthwise, channels, size, stride, widths, seed):
    rng = np.random.default_rng(seed)
    groups = channels if depthwise and channels > 1 else 1
    cout = channels if depthwise else rng.integers(1, 12)
    x = rng.integers(-128, 128, (1, channels, size, size)).astype(np.int8)
    weight = rng.integers(-127, 128, (cout, channels // groups, 3, 3)).astype(np.int8)
    bias = rng.integers(-500, 500, cout).astype(np.int32)
    multiplier = (rng.uniform(0.5, 2.0, cout) / (9 * 64 * channels // groups)).astype(np.float32)
    mod = _padded_conv_module(x.shape, weight, bias, multiplier, widths, stride, groups)
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(tvm.compile(mod, target="cgra"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    # the pad is the DMA's halo, not a host call; a pad of zero widths is no op at all
    # (normalise/no_op_pads.py)
    assert len(prof.kernels) == 1 and ("nn.pad" in prof.kernels[0].source_ops) == any(widths)
    assert prof.host_calls == []
    np.testing.assert_array_equal(got, _reference(x, weight, bias, multiplier, widths, stride, groups))


def test_a_pad_of_another_value_stays_on_the_host_with_the_reason():
    weight = np.ones((4, 4, 3, 3), np.int8)
    mod = _padded_conv_module((1, 4, 6, 6), weight, np.zeros(4, np.int32), np.full(4, 0.01, np.float32),
                              (1, 1, 1, 1), 1, 1, pad_value=5.0)
    placements = npu_backend.explain(mod)
    pad = [p for p in placements if p.op == "nn.pad"]
    assert pad and pad[0].where == "host", npu_backend.format_placements(placements)
    conv = [p for p in placements if p.op == "nn.conv2d"]
    assert conv[0].where == "npu" and "pad" not in conv[0].kernel.split()[0]


def _layer_after_relu(depthwise: bool):
    """QDQ: a conv + relu quantized with zero point -128, then a padded 3x3 (or depthwise) conv."""
    g = QdqGraph(5)
    x = g.qdq("input", 0.05, 2)
    y = g.qdq(g.node("Relu", [g.conv(x, 0.05, 3, 8)]), 0.04, -128)
    if depthwise:
        w = g.rng.normal(0, 0.3, (8, 1, 3, 3)).astype(np.float32)
        weight, scales = g.weight(w, per_channel=True)
        y = g.node("Conv", [y, weight, g.bias(8, 0.04, scales)], kernel_shape=[3, 3], pads=[1] * 4, group=8)
    else:
        y = g.conv(y, 0.04, 8, 8)
    return g.model("input", [1, 3, 10, 10], g.qdq(y, 0.06, 4), [1, 8, 10, 10])


@pytest.mark.parametrize("depthwise", [False, True])
def test_a_qdq_layer_after_a_relu_pads_on_the_npu_bit_exact_to_onnxruntime(depthwise):
    model = _layer_after_relu(depthwise)
    mod = npu_backend.from_onnx(model)
    kernels = [p.kernel.split()[0] for p in npu_backend.explain(mod) if p.op == "nn.conv2d"]
    assert kernels[1].startswith("cgra.conv2d_pad"), kernels
    vm = relax.VirtualMachine(tvm.compile(mod, target="cgra"), tvm.cpu())
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).normal(0, 1.5, (1, 3, 10, 10)).astype(np.float32)
    with npu_backend.profile() as prof:
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    # The output's dequantize runs in a one-group conv's EPILOGUE (qdq_outputs.py); a depthwise
    # conv's stays on the host (the input's quantize is a kernel either way).
    assert [call.name for call in prof.host_calls] == (["dequantize"] if depthwise else [])
    np.testing.assert_array_equal(got, session.run(None, {"input": x})[0])


def _int_conv(padded, weight, stride, groups):
    """A brute-force int64 conv2d (N = 1, no padding) of `padded` (C, H, W)."""
    cout, per_group, kh, kw = weight.shape
    oh, ow = (padded.shape[1] - kh) // stride + 1, (padded.shape[2] - kw) // stride + 1
    out = np.zeros((cout, oh, ow), np.int64)
    for o in range(cout):
        group = o // (cout // groups)
        for i in range(kh):
            for j in range(kw):
                window = padded[group * per_group:(group + 1) * per_group,
                                i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
                out[o] += np.einsum("chw,c->hw", window, weight[o, :, i, j].astype(np.int64))
    return out


@settings(max_examples=20)
@given(zero=st.integers(-127, 127), pads=st.tuples(*[st.integers(0, 2)] * 4), stride=st.sampled_from([1, 2]),
       groups=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_the_border_correction_is_the_zero_point_padding(zero, pads, stride, groups, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (4, 6, 7)).astype(np.int64)
    weight = rng.integers(-127, 128, (6, 4 // groups, 3, 3)).astype(np.int8)
    top, left, bottom, right = pads
    widths = ((0, 0), (top, bottom), (left, right))
    expected = _int_conv(np.pad(x, widths, constant_values=zero), weight, stride, groups)
    lowest = _int_conv(np.pad(x, widths, constant_values=-128), weight, stride, groups)
    got = lowest + border_correction(weight, zero, x.shape, pads, (stride, stride), (1, 1), groups)[0]
    np.testing.assert_array_equal(got, expected)


def _layer_of_zero_point(zero: int, pad: int, stride: int, depthwise: bool):
    g = QdqGraph(zero + 200)
    x = g.qdq("input", 0.05, zero)
    if depthwise:
        w = g.rng.normal(0, 0.3, (3, 1, 3, 3)).astype(np.float32)
        weight, scales = g.weight(w, per_channel=True)
        y = g.node("Conv", [x, weight, g.bias(3, 0.05, scales)], kernel_shape=[3, 3], pads=[pad] * 4,
                   strides=[stride] * 2, group=3)
    else:
        y = g.conv(x, 0.05, 3, 8, stride=stride, pad=pad)
    size = (9 + 2 * pad - 3) // stride + 1
    return g.model("input", [1, 3, 9, 9], g.qdq(y, 0.07, -9), [1, 3 if depthwise else 8, size, size])


@pytest.mark.parametrize("zero, pad, stride, depthwise", [(5, 1, 1, False), (-40, 2, 2, False), (100, 1, 1, True),
                                                          (-3, 1, 2, True)])
def test_a_qdq_layer_of_any_zero_point_pads_on_the_npu_bit_exact_to_onnxruntime(zero, pad, stride, depthwise):
    model = _layer_of_zero_point(zero, pad, stride, depthwise)
    mod = npu_backend.from_onnx(model)
    kernels = [p.kernel.split()[0] for p in npu_backend.explain(mod) if p.op == "nn.conv2d"]
    # a one-group conv dequantises the model's output in its EPILOGUE (qdq_outputs.py)
    assert kernels == ["cgra.conv2d_pad_bias_residual_requant" + ("" if depthwise else "_dequant")], kernels
    vm = relax.VirtualMachine(tvm.compile(mod, target="cgra"), tvm.cpu())
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(zero + 128).normal(0, 1.5, (1, 3, 9, 9)).astype(np.float32)
    with npu_backend.profile() as prof:
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    assert not [call.name for call in prof.host_calls if call.name.startswith("pad")]
    np.testing.assert_array_equal(got, session.run(None, {"input": x})[0])
