"""Pooling end to end: relax max_pool2d, avg_pool2d, adaptive_avg_pool2d and mean -> POOL kernels
-> C++ runtime -> simulator, against numpy (PyTorch's rules for padding, ceil mode and
count_include_pad), and the reasons a pooling call stays on the host."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import assume, given
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from models import assert_matches, pool_model, relax_module, run

PRESETS = npu_backend.preset_names()


@st.composite
def pool_cases(draw):
    kind = draw(st.sampled_from(["max", "avg"]))
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    dilation = (1, 1) if kind == "avg" else (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    # Padding below the window's extent, as PyTorch and ONNX require (a window never lies wholly
    # in the padding), asymmetric allowed.
    pad = tuple(draw(st.integers(0, (kernel[i % 2] - 1) * dilation[i % 2] // 2)) for i in range(4))
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilation)]
    return dict(kind=kind, n=draw(st.integers(1, 2)), c=draw(st.integers(1, 12)),
                h=draw(st.integers(max(1, span[0] - pad[0] - pad[2]), 12)),
                w_=draw(st.integers(max(1, span[1] - pad[1] - pad[3]), 12)), kernel=kernel,
                stride=(draw(st.integers(1, 3)), draw(st.integers(1, 3))), pad=pad, dilation=dilation,
                ceil_mode=draw(st.booleans()), count_include_pad=draw(st.booleans()),
                dtype="float32" if kind == "avg" else draw(st.sampled_from(["float32", "int8"])),
                layout=draw(st.sampled_from(["NCHW", "NHWC"])))


def every_tap_reaches_the_image(case):
    """Whether each window row and column lies in the image for some output: the POOL kernel
    refuses images smaller than the window (see the refusals below)."""
    for axis, size in enumerate((case["h"], case["w_"])):
        stride, spacing, lo = case["stride"][axis], case["dilation"][axis], case["pad"][axis]
        span = size + lo + case["pad"][axis + 2] - spacing * (case["kernel"][axis] - 1) - 1
        out = (-(-span // stride) if case["ceil_mode"] else span // stride) + 1
        out -= case["ceil_mode"] and (out - 1) * stride >= size + lo
        for tap in range(case["kernel"][axis]):
            if not any(0 <= o * stride + tap * spacing - lo < size for o in range(out)):
                return False
    return True


@given(case=pool_cases(), arch=st.sampled_from(PRESETS))
def test_pool2d_runs_as_pool_commands_and_matches_numpy(case, arch):
    assume(every_tap_reaches_the_image(case))
    mod, inputs, ref = pool_model(**case)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    assert_matches(out, ref, case["dtype"])
    (kernel,) = prof.kernels  # on the NPU, not the host
    assert kernel.op_counts["POOL"] >= 1 and kernel.op_counts["GEMM"] == kernel.op_counts["DEPTHWISE"] == 0
    assert kernel.source_ops == (f"nn.{case['kind']}_pool2d",)


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_the_reference_is_relax_own_pooling(ceil_mode, count_include_pad):
    """pool_reference agrees with TVM's host implementation (the legalised relax op), the
    borders where ceil mode and count_include_pad differ included."""
    for kind, (h, kernel, stride, pad) in (("avg", (7, 3, 2, 1)), ("avg", (8, 3, 2, 1)), ("max", (9, 3, 3, 1)),
                                           ("avg", (10, 4, 3, 2))):
        mod, inputs, ref = pool_model(kind, 1, 3, h, h, (kernel, kernel), (stride, stride), (pad,) * 4,
                                      ceil_mode=ceil_mode, count_include_pad=count_include_pad)
        out = run(tvm.compile(mod, target="llvm"), inputs)
        np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


def _global_model(op, shape, layout):
    def body(bb, x):
        if op == "adaptive":
            return bb.emit(relax.op.nn.adaptive_avg_pool2d(x, (1, 1), layout=layout))
        axes = [2, 3] if layout == "NCHW" else [1, 2]
        return bb.emit(relax.op.mean(x, axes, keepdims=op == "mean_keepdims"))
    return relax_module([("x", shape, "float32")], body)


@pytest.mark.parametrize("op", ["mean_keepdims", "mean", "adaptive"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_global_average_pool_is_one_window_of_the_whole_image(op, layout):
    n, c, h, w = 2, 20, 7, 9
    shape = (n, c, h, w) if layout == "NCHW" else (n, h, w, c)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    axes = (2, 3) if layout == "NCHW" else (1, 2)
    ref = x.mean(axis=axes, keepdims=op != "mean")
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(_global_model(op, shape, layout), "cgra-8x8"), [x])
    assert_matches(out, ref, "float32")
    (kernel,) = prof.kernels
    assert kernel.op_counts["POOL"] >= 1


def test_resnet18_max_pool_fits_the_scratchpad_as_whole_images():
    """The 112 x 112 x 64 max pool of ResNet-18 (3x3, stride 2, pad 1) on cgra-8x8: two channels
    of the padded image fit the 256 KiB scratchpad twice over."""
    mod, _, _ = pool_model("max", 1, 64, 112, 112, (3, 3), (2, 2), (1, 1, 1, 1))
    (placement,) = npu_backend.explain(mod, "cgra-8x8")
    assert placement.where == "npu", placement.reason


def _reason(mod, arch="cgra-8x8"):
    (placement,) = [p for p in npu_backend.explain(mod, arch) if p.op != "reshape"]
    assert placement.where == "host"
    return placement.reason


REFUSED = {
    "average of int8": (lambda: pool_model("avg", 1, 4, 8, 8, (2, 2), (2, 2), dtype="int8")[0],
                        "avg_pool2d on int8: the NPU's POOL takes float32 for an average"),
    "dilated average": (lambda: pool_model("avg", 1, 4, 8, 8, (2, 2), dilation=(2, 2))[0],
                        "avg_pool2d with dilation (2, 2)"),
    "adaptive to 2 x 2": (lambda: relax_module([("x", (1, 4, 8, 8), "float32")], lambda bb, x: bb.emit(
        relax.op.nn.adaptive_avg_pool2d(x, (2, 2)))), "adaptive_avg_pool2d to (2, 2)"),
    "mean over channels": (lambda: relax_module([("x", (1, 4, 8, 8), "float32")], lambda bb, x: bb.emit(
        relax.op.mean(x, [1]))), "mean over axes (1,) is not a global average pool"),
    # (one that leaves the padding out of the count is cut to the image, normalise/pool_taps.py)
    "window larger than the image": (lambda: pool_model("avg", 1, 4, 2, 2, (3, 3), pad=(0, 0, 1, 1),
                                                        count_include_pad=True)[0],
                                     "window row 2 lies in the padding for every output"),
    "padding-excluding average beyond the scratchpad": (
        lambda: pool_model("avg", 1, 4, 200, 200, (3, 3), (1, 1), (1, 1, 1, 1), count_include_pad=False)[0],
        "cannot hold the whole image that an average pool in ceil mode or leaving its padding out of the count"),
}


@st.composite
def large_pool_cases(draw):
    """Images whose whole window of two channels exceeds cgra-4x4's 64 KiB scratchpad: pooled in
    blocks of output rows. Averages count their padding (or have none) and are not in ceil mode."""
    kind = draw(st.sampled_from(["max", "avg"]))
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    pad = tuple(draw(st.integers(0, (kernel[i % 2] - 1) // 2)) for i in range(4))
    return dict(kind=kind, n=1, c=draw(st.integers(1, 5)), h=draw(st.integers(72, 110)), w_=draw(st.integers(72, 110)),
                kernel=kernel, stride=(draw(st.integers(1, 3)), draw(st.integers(1, 3))), pad=pad,
                ceil_mode=kind == "max" and draw(st.booleans()), count_include_pad=True,
                layout=draw(st.sampled_from(["NCHW", "NHWC"])))


@given(case=large_pool_cases())
def test_an_image_beyond_the_scratchpad_pools_in_blocks_of_rows(case):
    """Before, such a pool stayed on the host (Tiny YOLOv3's first max pool: 16 x 416 x 416)."""
    mod, inputs, ref = pool_model(**case)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-4x4"), inputs)
    assert_matches(out, ref, "float32")
    (kernel,) = prof.kernels
    assert kernel.op_counts["POOL"] > -(-case["c"] // 2)  # more than one block per channel tile


@pytest.mark.parametrize("name", REFUSED)
def test_pooling_the_npu_cannot_do_stays_on_the_host_with_a_reason(name):
    build, reason = REFUSED[name]
    assert reason in _reason(build(), "cgra-4x4")
