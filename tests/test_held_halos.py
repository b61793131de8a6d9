"""A padded window's halo is loaded once per buffer copy, later tiles load its inside alone
(lower/held_halos.py): depthwise convs on small maps tiled over channels (ConvNeXt's 7 x 7 on
4 x 4 and 8 x 8) match numpy, and stream fewer bytes through the load engine."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from test_padding_taps import _conv


def _depthwise_reference(x, weight, padding, stride, layout):
    """numpy: a depthwise conv2d (OIHW weights of one input channel each) in float64."""
    data = x.astype(np.float64) if layout == "NCHW" else x.astype(np.float64).transpose(0, 3, 1, 2)
    top, left, bottom, right = padding
    data = np.pad(data, ((0, 0), (0, 0), (top, bottom), (left, right)))
    kh, kw = weight.shape[2:]
    oh, ow = (data.shape[2] - kh) // stride + 1, (data.shape[3] - kw) // stride + 1
    out = np.zeros((1, data.shape[1], oh, ow))
    for ry in range(kh):
        for rx in range(kw):
            window = data[:, :, ry:ry + (oh - 1) * stride + 1:stride, rx:rx + (ow - 1) * stride + 1:stride]
            out += window * weight[None, :, 0, ry, rx, None, None]
    return out if layout == "NCHW" else out.transpose(0, 2, 3, 1)


def _weight(shape: tuple, channels: int, taps: tuple) -> np.ndarray:
    """The depthwise weight test_padding_taps._conv draws for these sizes."""
    rng = np.random.default_rng(sum(shape) + channels)
    return rng.standard_normal((channels, 1, *taps)).astype(np.float32)


def _run(mod, x, arch="cgra-8x8"):
    with npu_backend.profile(keep_timelines=True) as prof:
        out = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    return out, prof


@settings(max_examples=8, deadline=None, print_blob=True)
@given(size=st.integers(2, 6), channels=st.sampled_from([24, 40, 64]), taps=st.sampled_from([3, 5, 7]),
       padding=st.lists(st.integers(0, 3), min_size=4, max_size=4), stride=st.integers(1, 2),
       layout=st.sampled_from(["NCHW", "NHWC"]), arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]))
def test_depthwise_with_held_halos_matches_numpy(size, channels, taps, padding, stride, layout, arch):
    if size + padding[0] + padding[2] < taps or size + padding[1] + padding[3] < taps:
        return  # no output
    mod, x = _conv((size, size), channels, (taps, taps), padding, stride, True, layout)
    out, _ = _run(mod, x, arch)
    expected = _depthwise_reference(x, _weight((size, size), channels, (taps, taps)), padding, stride, layout)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_convnexts_depthwise_on_4x4_loads_its_halo_once_a_copy():
    """ConvNeXt's third stage: 64 channels of 4 x 4, 7 x 7 taps, padding 3, tiles of 8 channels
    on cgra-8x8: two tiles load the 10 x 10 window with its zeros, six its 4 x 4 inside
    (2,700 cycles before)."""
    mod, x = _conv((4, 4), 64, (7, 7), [3, 3, 3, 3], 1, True, "NHWC")
    out, prof = _run(mod, x)
    np.testing.assert_allclose(out, _depthwise_reference(x, _weight((4, 4), 64, (7, 7)), [3] * 4, 1, "NHWC"), rtol=1e-5, atol=1e-5)
    assert prof.total_cycles < 2000
    assert prof.kernels[0].busy_cycles["load"] < 1600  # 2,400 when every tile streamed its halo
