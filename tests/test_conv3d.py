"""A conv3d runs on the NPU as conv2d's over its frames, one per temporal tap, each next tap
adding the sum so far as its residual (npu_backend/normalise/conv3ds.py); the bias add, batch
norm and relu after it run in the frames-as-batch form too. Against numpy for every stride,
padding, dilation and group count; a stack with no transposes between its layers."""

from __future__ import annotations

import itertools

import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from models import assert_matches, conv_stack


def conv3d_reference(x, w, strides, pads, dilation, groups):
    """out[n, o, t, y, z] = sum over the group's channels and the taps (i, j, k) of the padded
    x[n, c, t * sd + i * dd, y * sh + j * dh, z * sw + k * dw] w[o, c, i, j, k]."""
    x = np.pad(x, [(0, 0), (0, 0)] + list(pads)).astype(np.float64)
    cout, per_group = w.shape[:2]
    extents = [(x.shape[2 + a] - dilation[a] * (w.shape[2 + a] - 1) - 1) // strides[a] + 1 for a in range(3)]
    out = np.zeros((x.shape[0], cout, *extents))
    for o in range(cout):
        first = o // (cout // groups) * per_group
        for i, j, k in itertools.product(*(range(e) for e in w.shape[2:])):
            window = x[:, first:first + per_group,
                       i * dilation[0]:i * dilation[0] + strides[0] * (extents[0] - 1) + 1:strides[0],
                       j * dilation[1]:j * dilation[1] + strides[1] * (extents[1] - 1) + 1:strides[1],
                       k * dilation[2]:k * dilation[2] + strides[2] * (extents[2] - 1) + 1:strides[2]]
            out[:, o] += np.einsum("nctyz,c->ntyz", window, w[o, :, i, j, k])
    return out.astype(np.float32)


@settings(deadline=None, max_examples=10)
@given(data=st.data(), groups=st.sampled_from([1, 2]), bias=st.booleans(), relu=st.booleans())
def test_a_conv3d_on_the_npu_matches_numpy(data, groups, bias, relu):
    kernel = tuple(data.draw(st.integers(1, 3)) for _ in range(3))
    strides = tuple(data.draw(st.integers(1, 2)) for _ in range(3))
    dilation = (data.draw(st.integers(1, 2)), 1, 1)
    pads = [(data.draw(st.integers(0, 1)), data.draw(st.integers(0, 1))) for _ in range(3)]
    spans = [dilation[a] * (kernel[a] - 1) + 1 for a in range(3)]
    size = [data.draw(st.integers(max(1, spans[a] - sum(pads[a])), 7)) for a in range(3)]
    cin, cout = groups * data.draw(st.integers(1, 4)), groups * data.draw(st.integers(1, 5))
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
    x = rng.standard_normal((1, cin, *size)).astype("float32")
    w = rng.standard_normal((cout, cin // groups, *kernel)).astype("float32")
    b = rng.standard_normal((1, cout, 1, 1, 1)).astype("float32") if bias else None
    how = dict(strides=strides, dilation=dilation, groups=groups,
               padding=[p for p, _ in pads] + [p for _, p in pads])
    mod = conv_stack(x.shape, relax.op.nn.conv3d, [(w, b, relu, how)])

    placements = npu_backend.explain(mod, "cgra-8x8")
    assert npu_backend.npu_mac_fraction(placements) == 1.0, npu_backend.format_placements(placements)
    assert not any(p.op in ("add", "nn.relu") and p.where == "host" for p in placements)
    expected = conv3d_reference(x, w, strides, pads, dilation, groups)
    if bias:
        expected = expected + b
    if relu:
        expected = np.maximum(expected, 0)
    out = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(x))
    assert_matches(out.numpy(), expected, "float32")


def test_a_stack_of_conv3ds_moves_its_frames_once_each_way():
    """R3D-style: a 3x7x7 stem and two 3x3x3 layers with bias and relu; one transpose into the
    frames-as-batch form before the first and one back after the last."""
    rng = np.random.default_rng(0)
    layers = []
    for cin, cout, kernel, stride in [(3, 8, (3, 7, 7), (1, 2, 2)), (8, 8, (3, 3, 3), (1, 1, 1)),
                                      (8, 16, (3, 3, 3), (2, 2, 2))]:
        w = (rng.standard_normal((cout, cin, *kernel)) / np.sqrt(cin * np.prod(kernel))).astype("float32")
        layers.append((w, rng.standard_normal((1, cout, 1, 1, 1)).astype("float32"), True,
                       dict(strides=stride, padding=[k // 2 for k in kernel] * 2)))
    x = rng.standard_normal((1, 3, 8, 16, 16)).astype("float32")
    mod = conv_stack(x.shape, relax.op.nn.conv3d, layers)
    placements = npu_backend.explain(mod, "cgra-8x8")
    assert npu_backend.npu_mac_fraction(placements) == 1.0
    # Two transposes in all (on the NPU as layout copies: kernels/layout/), none between the layers.
    assert [p.op for p in placements].count("permute_dims") == 2
    expected = x
    for w, b, _, how in layers:
        pads = [(p, p) for p in how["padding"][:3]]
        expected = np.maximum(conv3d_reference(expected, w, how["strides"], pads, (1, 1, 1), 1) + b, 0)
    out = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(x))
    assert_matches(out.numpy(), expected, "float32")


def test_a_conv3d_with_weights_given_at_run_time_stays_on_the_host_with_its_macs_counted():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 2, 4, 5, 5), "float32"))
    w = relax.Var("w", relax.TensorType((3, 2, 2, 2, 2), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.conv3d(x, w)))
        bb.emit_func_output(out)
    placements = npu_backend.explain(bb.get(), "cgra-8x8")
    (conv,) = placements
    assert (conv.op, conv.where, conv.macs) == ("nn.conv3d", "host", 3 * 4 * 4 * 3 * 2 * 8)


def test_an_int8_conv3d_is_exact():
    """Each tap's int8 x int8 -> int32 conv2d adds the taps before it as an int32 residual."""
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (1, 4, 5, 6, 6)).astype("int8")
    w = rng.integers(-128, 128, (8, 4, 3, 3, 3)).astype("int8")
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "int8"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.conv3d(xv, relax.const(w), padding=1, out_dtype="int32")))
        bb.emit_func_output(out)
    mod = bb.get()
    assert npu_backend.npu_mac_fraction(npu_backend.explain(mod, "cgra-8x8")) == 1.0
    out = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(x))
    expected = conv3d_reference(x.astype("float32"), w.astype("float32"), (1, 1, 1), [(1, 1)] * 3, (1, 1, 1), 1)
    np.testing.assert_array_equal(out.numpy(), expected.astype("int32"))  # sums below 2**24: exact in float32
