"""conv2d_transpose runs on the NPU as one conv2d per output phase (normalise/conv_transposes.py).

Against numpy's definition (every input pixel scatters its taps) over random shapes, strides,
paddings and output paddings, float32 and int8, on every preset; the phases' MACs are the model's;
what the rewrite does not take stays on the host with its results unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.kernels.layout.layout import LAYOUT
from npu_backend.normalise.conv_transposes import conv_transposes_as_convs

PRESETS = npu_backend.preset_names()


def reference(x, w, strides, padding, output_padding, out_dtype):
    """y[n, f, iy * s + kh - top, ix * s + kw - left] += x[n, c, iy, ix] * w[c, f, kh, kw]."""
    n, _, h, wd = x.shape
    _, f, kh, kw = w.shape
    (sh, sw), (top, left, bottom, right) = strides, padding
    full = np.zeros((n, f, (h - 1) * sh + kh + output_padding[0], (wd - 1) * sw + kw + output_padding[1]), np.int64
                    if out_dtype == "int32" else np.float64)
    for i in range(kh):
        for j in range(kw):
            contribution = np.einsum("nchw,cf->nfhw", x.astype(full.dtype), w[:, :, i, j].astype(full.dtype))
            full[:, :, i:i + (h - 1) * sh + 1:sh, j:j + (wd - 1) * sw + 1:sw] += contribution
    out_h = (h - 1) * sh + kh - top - bottom + output_padding[0]
    out_w = (wd - 1) * sw + kw - left - right + output_padding[1]
    return full[:, :, top:top + out_h, left:left + out_w].astype(out_dtype)


def module(x_shape, weight, strides, padding, output_padding, dtype, out_dtype):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d_transpose(
                x, relax.const(weight), strides=strides, padding=padding, output_padding=output_padding,
                out_dtype=out_dtype))
        bb.emit_func_output(out)
    return bb.get()


def data(rng, shape, dtype):
    if dtype == "int8":
        return rng.integers(-128, 128, shape).astype(np.int8)
    return rng.standard_normal(shape).astype(np.float32)


@settings(deadline=None)
@given(batch=st.integers(1, 2), cin=st.integers(1, 12), cout=st.integers(1, 12), size=st.tuples(st.integers(1, 9), st.integers(1, 9)),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 3)), extra=st.tuples(st.integers(0, 2), st.integers(0, 2)),
       pads=st.tuples(*[st.integers(0, 2)] * 4), output_padding=st.tuples(st.integers(0, 2), st.integers(0, 2)),
       dtype=st.sampled_from(["float32", "int8"]), arch=st.sampled_from(PRESETS), seed=st.integers(0, 2**16))
def test_conv2d_transpose_runs_on_the_npu_as_numpy_defines_it(batch, cin, cout, size, stride, extra, pads,
                                                              output_padding, dtype, arch, seed):
    kernel = (stride[0] + extra[0], stride[1] + extra[1])  # at least the stride: every phase has taps
    output_padding = tuple(min(p, s - 1) for p, s in zip(output_padding, stride))  # as ONNX and TVM require
    pads = tuple(min(p, k - 1) for p, k in zip(pads, kernel * 2))
    out_dtype = "int32" if dtype == "int8" else "float32"
    rng = np.random.default_rng(seed)
    x, w = data(rng, (batch, cin) + size, dtype), data(rng, (cin, cout) + kernel, dtype)
    expected = reference(x, w, stride, pads, output_padding, out_dtype)
    assume(min(expected.shape) > 0)
    mod = module(x.shape, w, stride, pads, output_padding, dtype, out_dtype)
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    if dtype == "int8":
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    convs = [k for k in prof.kernels if "nn.conv2d" in k.source_ops]
    assert len(convs) <= stride[0] * stride[1]  # one conv2d kernel per output phase
    # the phases' interleave may run as the layout family's DMA copies, nothing else
    copies = [{op.split(".")[-1] for op in k.source_ops} for k in prof.kernels if k not in convs]
    assert all(ops <= set(LAYOUT.ops) for ops in copies), copies
    # No multiplications by inserted zeros: an output takes at most ceil(k / s) taps per axis.
    taps = -(-kernel[0] // stride[0]) * -(-kernel[1] // stride[1])
    assert prof.total_macs <= expected.size * cin * taps


def test_explain_puts_the_phases_on_the_npu_and_counts_the_models_macs():
    rng = np.random.default_rng(0)
    w = data(rng, (16, 8, 4, 4), "float32")
    mod = module((1, 16, 10, 10), w, (2, 2), (1, 1, 1, 1), (0, 0), "float32", "float32")
    placements = npu_backend.explain(mod)
    convs = [p for p in placements if p.op == "nn.conv2d"]
    assert len(convs) == 4 and all(p.where == "npu" for p in convs)
    assert npu_backend.npu_mac_fraction(placements) == 1.0
    # A 4x4 kernel at stride 2, padding 1: each of the 4 phases has 10 x 10 outputs of 2 x 2 taps,
    # as many MACs as the model's (100 input pixels x 16 taps x 16 x 8 channels).
    assert sum(p.macs for p in convs) == 4 * 100 * 4 * 16 * 8 == 100 * 16 * 16 * 8


@pytest.mark.parametrize("change", ["groups", "dilation", "kernel smaller than stride"])
def test_what_the_rewrite_does_not_take_stays_as_it_is(change):
    rng = np.random.default_rng(1)
    kwargs = dict(strides=(2, 2), padding=(0, 0, 0, 0))
    cin, cout, kernel = 4, 4, (3, 3)
    if change == "groups":
        kwargs["groups"], cout = 2, 2
    elif change == "dilation":
        kwargs["dilation"] = (2, 2)
    else:
        kernel = (1, 1)
    w = data(rng, (cin, cout) + kernel, "float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 5, 5), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d_transpose(x, relax.const(w), **kwargs))
        bb.emit_func_output(out)
    mod = bb.get()
    rewritten = conv_transposes_as_convs(mod)
    tvm.ir.assert_structural_equal(rewritten["main"], mod["main"])
    value = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    run = {target: relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())["main"](
        tvm.runtime.tensor(value)).numpy() for target in ("cgra", "llvm")}
    np.testing.assert_allclose(run["cgra"], run["llvm"], rtol=1e-5, atol=1e-5)


def test_an_onnx_conv_transpose_with_bias_matches_onnxruntime():
    """ONNX ConvTranspose (a detector's 2x upsampling: 4x4 kernel, stride 2, pads 1, a bias) as
    onnxruntime runs it, its phases and bias on the NPU and named after the node."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    weight, bias = data(rng, (8, 6, 4, 4), "float32"), data(rng, (6,), "float32")
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="up1", strides=[2, 2], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 7, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 14, 18])],
                              [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    x = data(rng, (1, 8, 7, 9), "float32")
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    mod = npu_backend.from_onnx(model)
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(tvm.compile(mod, target="cgra"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert {k.model_nodes for k in prof.kernels} == {("up1",)} and len(prof.kernels) >= 4
    assert npu_backend.npu_mac_fraction(npu_backend.explain(mod)) == 1.0
