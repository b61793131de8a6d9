"""conv2d in other layouts (NHWC data, HWIO / OHWI weights) and batched matmul, on the NPU.

Property tests against numpy over every preset, float32 and int8 -> int32: each must run as one
NPU kernel (a host fallback would also match numpy, so the kernel count is asserted too).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from models import assert_matches, conv2d_model, conv2d_reference, relax_module, run
from npu_backend.kernels import spec_from_match
from npu_backend.tools.workloads import batch_matmul_model

PRESETS = npu_backend.preset_names()
DTYPES = st.sampled_from(["float32", "int8"])


def _run_on_npu(mod, inputs, arch):
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    assert len(prof.kernels) == 1, [k.name for k in prof.kernels]  # on the NPU, not the host
    return out


@st.composite
def conv2d_layouts(draw):
    """(data, kernel, out) layouts: NHWC or NCHW data, the weight layouts Relax users write, and
    mostly the data's layout for the output (any order works, but the host cannot run a mixed one)."""
    data = draw(st.sampled_from(["NHWC", "NCHW"]))
    kernel = draw(st.sampled_from(["HWIO", "OHWI", "OIHW"]))
    out = draw(st.sampled_from([data, data, "NHWC", "NCHW"]))
    return data, kernel, out


@given(batch=st.integers(1, 2), groups=st.sampled_from([1, 1, 2, 3]), per_group=st.integers(1, 6),
       filters_per_group=st.integers(1, 6), size=st.integers(3, 12), kernel=st.integers(1, 3),
       stride=st.integers(1, 2), pad=st.tuples(*[st.integers(0, 2)] * 4), dilation=st.integers(1, 2),
       layouts=conv2d_layouts(), dtype=DTYPES, arch=st.sampled_from(PRESETS))
def test_conv2d_layouts_property(batch, groups, per_group, filters_per_group, size, kernel, stride, pad,
                                 dilation, layouts, dtype, arch):
    channels, filters = groups * per_group, groups * filters_per_group
    height = size + dilation * (kernel - 1)  # at least one output row
    mod, inputs, ref = conv2d_model(batch, channels, height, size + 1, filters, kernel, kernel,
                                    (stride, stride), pad, dtype, dilation=(dilation, dilation),
                                    groups=groups, layouts=layouts)
    assert_matches(_run_on_npu(mod, inputs, arch), ref, dtype)


def test_depthwise_nhwc_with_a_channel_bias():
    """MobileNet's depthwise layer as TVMScript users write it: NHWC data, HWIO weights (one
    input channel per group), a 1-D bias of one value per channel."""
    def body(bb, x, w, b):
        y = bb.emit(relax.op.nn.conv2d(x, w, strides=2, padding=1, groups=16, data_layout="NHWC",
                                       kernel_layout="HWIO"))
        return bb.emit(relax.op.nn.relu(relax.op.add(y, b)))
    shapes = [("x", (1, 9, 10, 16), "float32"), ("w", (3, 3, 1, 16), "float32"), ("b", (16,), "float32")]
    rng = np.random.default_rng(4)
    inputs = [rng.standard_normal(shape).astype("float32") for _, shape, _ in shapes]
    x, w = inputs[0].transpose(0, 3, 1, 2), inputs[1].transpose(3, 2, 0, 1)  # NCHW, OIHW
    ref = np.maximum(conv2d_reference(x, w, (2, 2), (1, 1, 1, 1), groups=16).transpose(0, 2, 3, 1) + inputs[2], 0)
    assert_matches(_run_on_npu(relax_module(shapes, body), inputs, "cgra-8x8"), ref, "float32")


@st.composite
def batched_operands(draw):
    """(lhs shape, rhs shape as stored, transposed): equal batches, shared weights (rhs 2-D or
    with batch dims of 1) or a shared left operand, of rank 3 or 4."""
    m, n, k = draw(st.integers(1, 40)), draw(st.integers(1, 40)), draw(st.integers(1, 40))
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    form = draw(st.sampled_from(["equal", "shared_rhs", "unit_rhs", "shared_lhs"]))
    lhs_batch, rhs_batch = {"equal": (batch, batch), "shared_rhs": (batch, ()),
                            "unit_rhs": (batch, (1,) * len(batch)), "shared_lhs": ((), batch)}[form]
    transposed = draw(st.booleans())
    return lhs_batch + (m, k), rhs_batch + ((n, k) if transposed else (k, n)), transposed


@given(operands=batched_operands(), dtype=DTYPES, arch=st.sampled_from(PRESETS), bias=st.booleans(),
       relu=st.booleans())
def test_batched_matmul_property(operands, dtype, arch, bias, relu):
    lhs, rhs, transposed = operands
    mod, inputs, ref = batch_matmul_model(lhs, rhs, dtype, bias=bias, relu=relu, transposed=transposed)
    assert_matches(_run_on_npu(mod, inputs, arch), ref, dtype)


@pytest.mark.parametrize("lhs, rhs, batch", [((3, 20, 17), (17, 9), 1), ((3, 20, 17), (1, 17, 9), 1),
                                              ((3, 20, 17), (3, 17, 9), 3), ((20, 17), (2, 2, 17, 9), 4)])
def test_shared_weights_fold_into_rows(lhs, rhs, batch):
    """Shared weights make one 2-D GEMM over all the batch's rows; batched weights one image each."""
    mod, inputs, ref = batch_matmul_model(lhs, rhs, "int8", bias=False, relu=False)
    (call,) = [b.value for b in mod["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    spec = spec_from_match("cgra.matmul", {"root": call, "lhs": call.args[0], "rhs": call.args[1]})
    assert spec.batch == batch and spec.macs == ref.size * lhs[-1]
    assert_matches(_run_on_npu(mod, inputs, "cgra-4x4"), ref, "int8")
