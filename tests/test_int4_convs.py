"""conv2d with 4-bit weights (issue 37 items 3 and 6): packed two per byte in DRAM, UNPACK4 in the
scratchpad, a GEMM a tap (normalise/int4_convs.py, kernels/gemm/int4_conv.py).

Three ways against each other: the layer's host PrimFunc built by TVM's llvm backend (what a chip
whose tiles do not fit runs), the NPU kernel through the code generator, runtime and simulator,
and numpy's conv of the int4 values (verify_int4.conv_numpy, a sum over taps of padded slices).
And a QDQ model with INT4 conv weights (onnx.helper, opset 21) against onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.version_converter
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import npu_backend
from npu_backend.normalise.int4_convs import Int4ConvLayer, host_prim_func, layer_module, pack_conv_weights
from npu_backend.tools.verify_int4 import conv_numpy


def _unpack_by_hand(packed: np.ndarray, layer: Int4ConvLayer, signed: bool) -> np.ndarray:
    """(F, bytes) -> (F, C, KH, KW) values, a nibble at a time from the tap-major order."""
    out = np.zeros((layer.f, layer.c, layer.kh, layer.kw), np.int64)
    raw = packed.view(np.uint8)
    for f in range(layer.f):
        for r in range(layer.k):
            nibble = (int(raw[f, r // 2]) >> (4 * (r % 2))) & 0xF
            value = (nibble - 16 if nibble >= 8 else nibble) if signed else nibble - 8
            tap, c = divmod(r, layer.c)
            out[f, c, tap // layer.kw, tap % layer.kw] = value
    return out


@settings(max_examples=30, deadline=None)
@given(f=st.integers(1, 5), c=st.integers(1, 5), kh=st.integers(1, 3), kw=st.integers(1, 3),
       mode=st.sampled_from(["int8", "float32"]), seed=st.integers(0, 2**16))
def test_packed_conv_weights_unpack_to_their_values_even_across_taps_and_channels(f, c, kh, kw, mode, seed):
    """Odd C puts a byte's two nibbles in two taps; odd K leaves each channel's last byte half used."""
    values = np.random.default_rng(seed).integers(-8, 8, (f, c, kh, kw))
    layer = Int4ConvLayer(mode, 1, c, 4, 4, f, kh, kw)
    packed = pack_conv_weights(values, mode)
    assert packed.shape == (f, -(-c * kh * kw // 2))
    np.testing.assert_array_equal(_unpack_by_hand(packed, layer, mode == "int8"), values)


def _case(draw_layer: Int4ConvLayer, seed: int):
    """(inputs, consts, numpy's result) of a random layer."""
    layer = draw_layer
    rng = np.random.default_rng(seed)
    values = rng.integers(-8, 8, (layer.f, layer.c, layer.kh, layer.kw))
    if layer.mode == "int8":
        x = rng.integers(-128, 128, (layer.n, layer.c, layer.h, layer.w)).astype(np.int8)
        bias = rng.integers(-3000, 3000, layer.f).astype(np.int32)
        scale = rng.uniform(1e-4, 0.02, layer.f).astype(np.float32)
        acc = conv_numpy(x, values, layer.stride, layer.dilation, layer.padding, layer.fill) + bias.reshape(1, -1, 1, 1)
        zp = layer.zero_point
        want = (np.rint(np.clip(acc.astype(np.float32) * scale.reshape(1, -1, 1, 1), -128 - zp, 127 - zp)) + zp)
        consts = [pack_conv_weights(values, "int8"), bias, scale]
        if layer.corrected:  # a zero point the halo cannot hold: -128 and the correction
            from npu_backend.normalise.qdq_borders import border_correction

            consts.append(border_correction(values, layer.fill, (layer.c, layer.h, layer.w), layer.padding,
                                            layer.stride, layer.dilation, 1)[0])
        return x, consts, want.astype(np.int8)
    x = rng.standard_normal((layer.n, layer.c, layer.h, layer.w)).astype(np.float32)
    scales = rng.uniform(0.01, 0.1, (layer.f, layer.groups)).astype(np.float32)
    rows = np.arange(layer.k) // layer.group  # tap-major row r -> its scale
    tap_scales = scales[:, rows].reshape(layer.f, layer.kh, layer.kw, layer.c).transpose(0, 3, 1, 2)
    want = conv_numpy(x, values * tap_scales, layer.stride, layer.dilation, layer.padding, 0.0)
    return x, [pack_conv_weights(values, "float32"), scales], want.astype(np.float32)


@st.composite
def _layers(draw):
    mode = draw(st.sampled_from(["int8", "float32"]))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = tuple(draw(st.integers(0, 2)) for _ in range(4))
    h = draw(st.integers(dilation[0] * (kh - 1) + 1, 9))
    w = draw(st.integers(dilation[1] * (kw - 1) + 1, 9))
    return Int4ConvLayer(mode, draw(st.integers(1, 2)), draw(st.integers(1, 7)), h, w, draw(st.integers(1, 9)), kh, kw,
                         stride, dilation, padding, draw(st.integers(-128, 127)), draw(st.sampled_from([0, -128, 37, -5])),
                         draw(st.sampled_from([0, 4, 5, 8])))


def _host(layer: Int4ConvLayer, args: list) -> np.ndarray:
    func = host_prim_func(layer).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    tensors = [tvm.runtime.tensor(a) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy()


@settings(max_examples=8, deadline=None)
@given(layer=_layers(), arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]), seed=st.integers(0, 2**16))
def test_int4_conv_three_ways(layer, arch, seed):
    """Host TIR, NPU kernel and numpy agree: int8 exactly, float32 within float32 summation."""
    x, consts, want = _case(layer, seed)
    host = _host(layer, [x, *consts, np.zeros(want.shape, want.dtype)])
    with npu_backend.profile() as prof:
        vm = tvm.relax.VirtualMachine(npu_backend.compile(layer_module(layer, consts), arch), tvm.cpu())
        npu = vm["main"](tvm.runtime.tensor(x)).numpy()
    assert [k.name for k in prof.kernels] == [f"cgra_tir_{'qdq_' if layer.mode == 'int8' else ''}int4_conv2d"]
    if layer.mode == "int8":
        np.testing.assert_array_equal(host, want)
        np.testing.assert_array_equal(npu, want)
    else:
        scale = max(1.0, float(np.abs(want).max()))
        assert np.abs(host - want).max() <= 1e-5 * scale and np.abs(npu - want).max() <= 1e-5 * scale


@pytest.mark.parametrize("arch", ["cgra-4x4", "cgra-8x8", "cgra-16x16"])
@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_verify_conv2d_with_int4_weights_passes(arch, dtype, capsys):
    from cgra_cli.cli import main

    assert main(["verify", "--op", "conv2d", "--shape", "1,5,9,7,6,3,3", "--padding", "1", "--stride", "2,1",
                 "--dtype", dtype, "--weight-dtype", "int4", "--arch", arch]) == 0
    assert capsys.readouterr().out.startswith(f"PASS conv2d 1x5x9x7x6x3x3 {dtype} x int4 weights")


def _int4_qdq_conv_model(seed: int = 0, channels=(5, 6), kernel=3, pad=1, relu=True, rank=2):
    """input -> Q/DQ (int8, zero point -128 after a relu-like range) -> Conv(DQ(INT4 weights per
    output channel), DQ(int32 bias)) [-> Relu] -> Q/DQ: opset 21, onnx.helper."""
    rng = np.random.default_rng(seed)
    cin, cout = channels
    inits, nodes = [], []

    def init(name, value, dtype=None):
        inits.append(numpy_helper.from_array(np.asarray(value), name) if dtype is None
                     else helper.make_tensor(name, dtype, np.shape(value), np.asarray(value).reshape(-1).tolist()))
        return name

    xs, ws = np.float32(0.02), rng.uniform(0.01, 0.05, cout).astype(np.float32)
    w = rng.integers(-8, 8, (cout, cin) + (kernel,) * rank)
    bias = rng.integers(-400, 400, cout).astype(np.int32)
    init("xs", xs), init("xz", np.int8(-128)), init("ys", np.float32(0.05)), init("yz", np.int8(-128 if relu else 3))
    init("w", w, TensorProto.INT4), init("ws", ws), init("wz", np.zeros(cout, np.int64), TensorProto.INT4)
    init("b", bias), init("bs", (xs * ws).astype(np.float32)), init("bz", np.zeros(cout, np.int32))
    nodes += [helper.make_node("QuantizeLinear", ["input", "xs", "xz"], ["xq"]),
              helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
              helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
              helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bd"], axis=0),
              helper.make_node("Conv", ["xd", "wd", "bd"], ["conv"], pads=[pad] * 2 * rank,
                               kernel_shape=[kernel] * rank)]
    last = "conv"
    if relu:
        nodes.append(helper.make_node("Relu", ["conv"], ["relu"]))
        last = "relu"
    nodes += [helper.make_node("QuantizeLinear", [last, "ys", "yz"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["output"])]
    shape, out = [1, cin] + [8] * rank, [1, cout] + [8 + 2 * pad - kernel + 1] * rank
    graph = helper.make_graph(nodes, "int4conv", [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, out),
                               helper.make_tensor_value_info("yq", TensorProto.INT8, out)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model, {"input": rng.uniform(0, 2.5, shape).astype(np.float32)}


@pytest.mark.parametrize("relu, rank", [(True, 2), (False, 2), (True, 1)])
def test_a_qdq_conv_with_int4_weights_loads_half_the_weight_bytes_equal_to_onnxruntime(relu, rank):
    """The conv (a conv1d: one pixel high) is one NPU kernel over the packed weights
    (ceil(C * taps / 2) bytes a channel, not C * taps), its int8 output equal to onnxruntime's."""
    import onnxruntime as ort

    model, feeds = _int4_qdq_conv_model(relu=relu, rank=rank)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    with npu_backend.profile() as prof:
        vm = tvm.relax.VirtualMachine(npu_backend.compile(npu_backend.from_onnx(model), "cgra-8x8"), tvm.cpu())
        outputs = vm["main"](tvm.runtime.tensor(feeds["input"]))
    convs = [k for k in prof.kernels if k.name == "cgra_tir_qdq_int4_conv2d"]
    assert len(convs) == 1
    taps = 3 ** rank
    weights = 6 * -(-5 * taps // 2)  # 6 channels of 45 nibbles (23 bytes) or 15 (8 bytes)
    assert convs[0].dma_load_bytes <= weights + 8 * 6 + taps * 5 * 8 ** rank  # + bias, multiplier, the taps' gathers
    np.testing.assert_array_equal(outputs[1].numpy(), expected[1])
    np.testing.assert_array_equal(outputs[0].numpy(), expected[0])


@pytest.mark.parametrize("mode", ["int8", "float32"])
@pytest.mark.parametrize("pixels_outer", [False, True])
def test_both_loop_orders_over_several_weight_and_pixel_tiles_equal_numpy(mode, pixels_outer, monkeypatch):
    """Weight tiles outer (the image gathered once a weight tile) and pixel tiles outer (the
    weights loaded and unpacked once a pixel tile), each over 3 weight tiles and 4 pixel tiles of
    2 images, so both alternating buffers and the last tile's are used, and the int8 padding's
    correction tile is the output tile's."""
    from npu_backend.kernels.gemm import int4_conv

    monkeypatch.setattr(int4_conv, "choose_tiles", lambda layer, arch: (2, 2, pixels_outer))
    # C 4: a tap an UNPACK4; zero point 37: int8's padding corrected (halo -128 + R per output tile)
    layer = Int4ConvLayer(mode, 2, 4, 4, 5, 6, 3, 2, (1, 2), (1, 1), (1, 0, 1, 1), 7, 37, 4)
    x, consts, want = _case(layer, 5)
    vm = tvm.relax.VirtualMachine(npu_backend.compile(layer_module(layer, consts), "cgra-8x8"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    if mode == "int8":
        np.testing.assert_array_equal(got, want)
    else:
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))


def test_a_resnet_quantized_by_onnxruntime_with_int4_weights_packs_its_convs_bit_exact(tmp_path):
    """onnxruntime's quantize_static with QInt4 weights per channel on a ResNet: the convs whose
    input zero point pads as the halo (after a relu: -128), and the stem's (zero point 15: -128 and
    a correction) are packed int4 kernels, named after
    their ONNX nodes, and every quantized tensor equals onnxruntime's (which computes an int4 layer
    as DequantizeLinear + a float32 conv: a tie could round a step apart; none did here)."""
    import onnxruntime as ort
    from onnx_models import resnet
    from qdq_models import onnxruntime_quantized, with_quantized_outputs

    float_model = onnx.version_converter.convert_version(resnet(size=16), 21)  # INT4 QDQ in the onnx domain
    model = onnxruntime_quantized(float_model, tmp_path, "QInt8", "QInt4", per_channel=True)
    assert sum(init.data_type == TensorProto.INT4 for init in model.graph.initializer) >= 7
    model, names = with_quantized_outputs(model)
    vm = tvm.relax.VirtualMachine(npu_backend.compile(npu_backend.from_onnx(model), "cgra-8x8"), tvm.cpu())
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(3).normal(0, 1, (1, 3, 16, 16)).astype(np.float32)
    with npu_backend.profile() as prof:
        got = dict(zip(names, (t.numpy() for t in vm["main"](tvm.runtime.tensor(x)))))
    theirs = dict(zip(names, session.run(None, {"input": x})))
    packed = [k for k in prof.kernels if k.name.startswith("cgra_tir_qdq_int4_conv2d")]
    assert len(packed) == 6 and all(k.model_nodes for k in packed)  # the stem's input zero point 15 corrected
    for name in names:  # every quantized tensor (and the dequantized output)
        np.testing.assert_array_equal(got[name], theirs[name], err_msg=name)
