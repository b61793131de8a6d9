"""A conv2d's kernel taps that read only padding are cut (normalise/padding_taps.py): the taps
kept run from the first to the last some output lands on the map with, and the cut conv
matches the uncut one on the host and on the NPU (ConvNeXt's 7 x 7 depthwise conv on 2 x 2)."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.padding_taps import padding_taps_cut, used_taps
from npu_backend.normalise.rewrite import op_name
from models import host_output


@given(size=st.integers(1, 6), taps=st.integers(1, 7), before=st.integers(0, 4), stride=st.integers(1, 3),
       after=st.integers(0, 4))
def test_used_taps_are_those_an_output_lands_on_the_map_with(size, taps, before, stride, after):
    outputs = (size + before + after - taps) // stride + 1
    if outputs <= 0:
        return
    used = [t for t in range(taps) if any(0 <= o * stride - before + t < size for o in range(outputs))]
    assert used_taps(size, taps, before, stride, outputs) == ((used[0], used[-1]) if used else None)


def _conv(shape: tuple, channels: int, taps: tuple, padding: list, stride: int, depthwise: bool, layout: str):
    """main(x) -> conv2d(x, a random constant weight) of one layout (NCHW or NHWC, OIHW weights)."""
    rng = np.random.default_rng(sum(shape) + channels)
    groups, out_channels = (channels, channels) if depthwise else (1, 2 * channels)
    weight = rng.standard_normal((out_channels, channels // groups, *taps)).astype(np.float32)
    data = (1, channels, *shape) if layout == "NCHW" else (1, *shape, channels)
    x = relax.Var("x", relax.TensorType(data, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(x, relax.const(weight), strides=stride, padding=padding,
                                                    groups=groups, data_layout=layout, out_layout=layout))
        bb.emit_func_output(out)
    return bb.get(), rng.standard_normal(data).astype(np.float32)


def _weight_shape(mod) -> tuple:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if op_name(e) == "relax.nn.conv2d" else None)
    return tuple(found[0].args[1].value.shape)


@settings(max_examples=10)
@given(shape=st.tuples(st.integers(1, 4), st.integers(1, 4)), channels=st.sampled_from([1, 3, 4]),
       taps=st.tuples(st.integers(1, 7), st.integers(1, 7)), padding=st.lists(st.integers(0, 3), min_size=4, max_size=4),
       stride=st.integers(1, 2), depthwise=st.booleans(), layout=st.sampled_from(["NCHW", "NHWC"]))
def test_the_cut_conv_matches_the_uncut_one(shape, channels, taps, padding, stride, depthwise, layout):
    if any(shape[i] + padding[i] + padding[i + 2] < taps[i] for i in range(2)):
        return  # no output
    mod, x = _conv(shape, channels, taps, padding, stride, depthwise, layout)
    cut = padding_taps_cut(mod)
    np.testing.assert_allclose(host_output(cut, x), host_output(mod, x), rtol=1e-5, atol=1e-5)
    assert _weight_shape(cut)[2:] <= _weight_shape(mod)[2:]


def test_convnexts_last_depthwise_conv_keeps_its_middle_taps_on_the_npu():
    mod, x = _conv((2, 2), 16, (7, 7), [3, 3, 3, 3], 1, True, "NHWC")
    cut = padding_taps_cut(mod)
    assert _weight_shape(cut) == (16, 1, 3, 3)
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), host_output(mod, x), rtol=1e-5, atol=1e-5)
