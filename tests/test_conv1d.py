"""A conv1d runs on the NPU as a conv2d one pixel high (npu_backend/normalise/conv1ds.py), its
bias add, relu and clip fused as a conv2d's: every stride, padding, dilation and group count
against numpy, a symbolic width, and what stays on the host with its MACs counted."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from models import assert_matches, conv_stack
from npu_backend.normalise.conv1ds import conv1ds_as_conv2ds


def conv1d_reference(x, w, stride, pad, dilation, groups):
    """out[n, o, t] = sum over the group's channels c and taps j of x[n, c, t * stride + j * dilation - pad_left] w[o, c, j]."""
    n, cin, _ = x.shape
    cout, per_group, k = w.shape
    x = np.pad(x, ((0, 0), (0, 0), pad)).astype(np.float64)
    width = (x.shape[2] - dilation * (k - 1) - 1) // stride + 1
    out = np.zeros((n, cout, width))
    for o in range(cout):
        first = o // (cout // groups) * per_group
        for j in range(k):
            taps = x[:, first:first + per_group, j * dilation:j * dilation + stride * (width - 1) + 1:stride]
            out[:, o] += np.einsum("ncw,c->nw", taps, w[o, :, j])
    return out.astype(np.float32)


@settings(deadline=None, max_examples=12)
@given(data=st.data(), groups=st.sampled_from(["one", "some", "depthwise"]), k=st.integers(1, 7),
       stride=st.integers(1, 3), dilation=st.integers(1, 2), bias=st.booleans(), relu=st.booleans(),
       arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]))
def test_a_conv1d_on_the_npu_matches_numpy(data, groups, k, stride, dilation, bias, relu, arch):
    per_group = data.draw(st.integers(1, 6))
    count = {"one": 1, "some": data.draw(st.integers(2, 3)), "depthwise": data.draw(st.integers(2, 12))}[groups]
    cin = per_group * count if groups != "depthwise" else count
    cout = (data.draw(st.integers(1, 5)) * count) if groups != "depthwise" else count
    pad = (data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3)))
    span = dilation * (k - 1) + 1
    width = data.draw(st.integers(max(1, span - sum(pad)), 60))
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
    x = rng.standard_normal((1, cin, width)).astype("float32")
    w = rng.standard_normal((cout, cin // count, k)).astype("float32")
    b = rng.standard_normal((1, cout, 1)).astype("float32") if bias else None
    how = dict(strides=stride, padding=pad, dilation=dilation, groups=count)
    mod = conv_stack(x.shape, relax.op.nn.conv1d, [(w, b, relu, how)])

    placements = npu_backend.explain(mod, arch)
    assert npu_backend.npu_mac_fraction(placements) == 1.0, npu_backend.format_placements(placements)
    assert len({p.kernel for p in placements if p.where == "npu"}) == 1  # bias and relu fused
    vm = tvm.relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    expected = conv1d_reference(x, w, stride, pad, dilation, count)
    if bias:
        expected = expected + b
    if relu:
        expected = np.maximum(expected, 0)
    assert_matches(vm["main"](tvm.runtime.tensor(x)).numpy(), expected, "float32")


def test_stacked_conv1ds_pass_no_narrow_tensor_between_them_and_take_any_width():
    """Wav2Vec2's feature extractor: strided conv1d layers with relu, one kernel each, compiled
    once for a symbolic number of samples; the reshapes only at the stack's two ends."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    samples = tvm.tirx.Var("samples", "int64")
    x = relax.Var("x", relax.TensorType((1, 1, samples), "float32"))
    weights = [rng.standard_normal(shape).astype("float32") / 3 for shape in [(16, 1, 10), (16, 16, 3), (16, 16, 3)]]
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for w, stride in zip(weights, (5, 2, 2)):
                y = bb.emit(relax.op.nn.relu(relax.op.nn.conv1d(y, relax.const(w), strides=stride)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    rewritten = relax.transform.DeadCodeElimination()(conv1ds_as_conv2ds(relax.transform.Normalize()(mod)))
    ops = [b.value.op.name for b in rewritten["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    assert ops.count("relax.expand_dims") == 1 and ops.count("relax.squeeze") == 1 and "relax.nn.conv1d" not in ops

    executable = npu_backend.compile(mod, "cgra-8x8", shape_bounds={"samples": 4000})
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
    for length in (400, 1601, 4000):
        signal = rng.standard_normal((1, 1, length)).astype("float32")
        expected = signal
        for w, stride in zip(weights, (5, 2, 2)):
            expected = np.maximum(conv1d_reference(expected, w, stride, (0, 0), 1, 1), 0)
        with npu_backend.profile() as prof:
            out = vm["main"](tvm.runtime.tensor(signal)).numpy()
        assert_matches(out, expected, "float32")
        assert len(prof.kernels) == 3


def test_a_conv1d_with_weights_given_at_run_time_runs_on_the_npu():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((1, 8, 20)).astype("float32"), rng.standard_normal((4, 8, 3)).astype("float32")
    bb = relax.BlockBuilder()
    xv, wv = relax.Var("x", relax.TensorType(x.shape, "float32")), relax.Var("w", relax.TensorType(w.shape, "float32"))
    with bb.function("main", [xv, wv]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.conv1d(xv, wv, padding=1)))
        bb.emit_func_output(out)
    mod = bb.get()
    placements = npu_backend.explain(mod, "cgra-8x8")
    assert npu_backend.npu_mac_fraction(placements) == 1.0
    host = [p for p in placements if p.where == "host"]
    assert {p.op for p in host} == {"expand_dims", "squeeze"}
    assert all(p.reason.startswith("changes only the shape") for p in host)
    vm = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    assert_matches(out, conv1d_reference(x, w, 1, (1, 1), 1, 1), "float32")


def test_a_channels_last_conv1d_stays_on_the_host_with_its_macs_counted():
    """Only NCW / OIW / NCW is rewritten (the conv2d kernels' own layouts are read the same
    way); another layout stays a conv1d on the host, and counts against the NPU's share."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 20, 8)).astype("float32")
    w = rng.standard_normal((3, 8, 4)).astype("float32")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = relax.op.nn.conv1d(xv, relax.const(w), data_layout="NWC", kernel_layout="WIO")
            out = bb.emit_output(bb.emit(y))
        bb.emit_func_output(out)
    mod = bb.get()
    placements = npu_backend.explain(mod, "cgra-8x8")
    (conv,) = [p for p in placements if p.op == "nn.conv1d"]
    assert conv.where == "host" and conv.macs == 18 * 4 * 8 * 3
    assert npu_backend.npu_mac_fraction(placements) == 0.0
    out = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(x))
    expected = conv1d_reference(x.transpose(0, 2, 1), w.transpose(2, 1, 0), 1, (0, 0), 1, 1).transpose(0, 2, 1)
    assert_matches(out.numpy(), expected, "float32")


def test_an_int8_conv1d_is_exact():
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (1, 8, 30)).astype("int8")
    w = rng.integers(-128, 128, (16, 4, 3)).astype("int8")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "int8"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = relax.op.nn.conv1d(xv, relax.const(w), strides=2, padding=1, groups=2, out_dtype="int32")
            out = bb.emit_output(bb.emit(y))
        bb.emit_func_output(out)
    mod = bb.get()
    assert npu_backend.npu_mac_fraction(npu_backend.explain(mod, "cgra-8x8")) == 1.0
    out = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(x))
    expected = conv1d_reference(x.astype("float32"), w.astype("float32"), 2, (1, 1), 1, 2)  # exact in float64
    np.testing.assert_array_equal(out.numpy(), expected.astype("int32"))


def test_whispers_conv1d_gelus_are_their_convs_epilogue():
    """Whisper's front end: conv1d + bias, GELU (erf form), a strided conv1d + bias, GELU. The
    GELUs widen with the convs (conv1ds.py), so each is the conv2d kernel's epilogue: two kernels,
    not four, within 1e-5 of float64."""
    import math

    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 16, 24)).astype("float32")
    layers = [(rng.standard_normal((16, 16, 3)).astype("float32") / 4, rng.standard_normal(16).astype("float32"), s)
              for s in (1, 2)]
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = xv
            for w, b, stride in layers:
                conv = relax.op.nn.conv1d(y, relax.const(w), strides=stride, padding=1)
                y = bb.emit(relax.op.nn.gelu(relax.op.add(conv, relax.const(b.reshape(1, 16, 1)))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    with npu_backend.profile() as prof:
        got = tvm.relax.VirtualMachine(npu_backend.compile(bb.get(), "cgra-8x8"), tvm.cpu())["main"](
            tvm.runtime.tensor(x)).numpy()
    expected = x.astype(np.float64)
    for w, b, stride in layers:
        h = conv1d_reference(expected.astype(np.float32), w, stride, (1, 1), 1, 1).astype(np.float64) + b[None, :, None]
        expected = h * 0.5 * (1 + np.vectorize(math.erf)(h / np.sqrt(2)))
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    assert len(prof.kernels) == 2 and all("gelu" in k.name for k in prof.kernels), [k.name for k in prof.kernels]
