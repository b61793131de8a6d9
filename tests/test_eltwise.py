"""Standalone elementwise ops end to end: partition, ELTWISE kernels, results against numpy.

add, subtract, multiply, maximum and minimum of two tensors with numpy broadcasting (rank <= 4)
run on the NPU's vector unit; the results must equal numpy's bit for bit (float32 included: one
rounding per element on both sides; integers wrap on both). The adds a conv2d / matmul kernel
fuses as a bias or a residual must stay fused.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import npu_backend
from models import relax_module, run
from npu_backend.tools.workloads import mismatch
from npu_backend.kernels.elementwise.eltwise import eltwise_view
from npu_backend.tools.workloads import eltwise_model
from onnx_models import mobilenet_v2, resnet

PRESETS = npu_backend.preset_names()
FUNCS = ["add", "subtract", "multiply", "maximum", "minimum"]


@st.composite
def broadcast_shapes(draw):
    """Two shapes numpy broadcasts: each a suffix of the output's rank, each dim its own or 1."""
    out = draw(st.lists(st.integers(1, 9), min_size=1, max_size=4))
    shapes = []
    for _ in range(2):
        rank = draw(st.integers(1, len(out)))
        shapes.append(tuple(d if draw(st.booleans()) else 1 for d in out[len(out) - rank:]))
    return shapes


def _kernels(ex, inputs):
    with npu_backend.profile() as prof:
        out = run(ex, inputs)
    return out, prof.kernels


@given(shapes=broadcast_shapes(), func=st.sampled_from(FUNCS),
       dtype=st.sampled_from(["float32", "int32", "int8"]), arch=st.sampled_from(PRESETS))
def test_broadcast_eltwise_matches_numpy_on_the_npu(shapes, func, dtype, arch):
    mod, inputs, ref = eltwise_model(func, *shapes, dtype)
    out, kernels = _kernels(npu_backend.compile(mod, arch), inputs)
    np.testing.assert_array_equal(out, ref)
    (kernel,) = kernels
    assert kernel.source_ops == (func,) and kernel.op_counts["ELTWISE"] >= 1
    assert kernel.op_counts["GEMM"] == 0 and kernel.macs == 0


@pytest.mark.parametrize("arch", PRESETS)
def test_large_add_is_dma_bound(arch):
    """A (1, 64, 56, 56) float32 add of two full tensors streams 8 bytes in per element: the
    load engine sets the pace, within 10% of its bound (ResNet's shortcut add at stage 1)."""
    mod, inputs, ref = eltwise_model("add", (1, 64, 56, 56), (1, 64, 56, 56))
    out, (kernel,) = _kernels(npu_backend.compile(mod, arch), inputs)
    np.testing.assert_array_equal(out, ref)
    bound = ref.size * 8 / npu_backend.load_arch(arch).dma_bytes_per_cycle
    assert bound <= kernel.cycles <= 1.1 * bound


def test_a_bias_like_broadcast_is_loaded_once_per_tile_not_expanded():
    """(1, 64, 56, 56) + (1, 64, 1, 1): the per-channel operand is a column of the tile read with
    stride 0, so the DMA moves barely more than the full operand and the output."""
    mod, inputs, ref = eltwise_model("multiply", (1, 64, 56, 56), (1, 64, 1, 1))
    out, (kernel,) = _kernels(npu_backend.compile(mod, "cgra-8x8"), inputs)
    np.testing.assert_array_equal(out, ref)
    assert kernel.dma_load_bytes < 1.01 * ref.nbytes


def test_view_merges_axes_walked_alike():
    assert eltwise_view((1, 64, 56, 56), (1, 64, 1, 1)) == ((1, 64, 56, 56), (64, 3136), (True, True),
                                                            (True, False))
    assert eltwise_view((8, 16), (16,)) == ((8, 16), (8, 16), (True, True), (False, True))
    assert eltwise_view((2, 1, 3, 1), (1, 4, 1, 5))[1:] == ((2, 4, 3, 5), (True, False, True, False),
                                                           (False, True, False, True))
    assert eltwise_view((4, 64, 64), (4, 64, 64))[1] == (2, 8192)  # one axis: split into rows, cols


def test_explain_shows_a_standalone_add_on_the_npu_and_says_why_others_stay():
    def body(bb, x, y, s):
        total = bb.emit(relax.op.add(x, y))
        scaled = bb.emit(relax.op.multiply(total, relax.const(2.0, "float32")))
        squared = bb.emit(relax.op.multiply(scaled, scaled))
        return relax.op.maximum(squared, s)

    mod = relax_module([("x", (4, 8), "float32"), ("y", (4, 8), "float32"), ("s", (8,), "float32")], body)
    placements = npu_backend.explain(mod, "cgra-8x8")
    where = [(p.op, p.where, p.kernel.split(" ")[0] if p.where == "npu" else p.reason) for p in placements]
    assert where[0] == ("add", "npu", "cgra.eltwise_add")
    assert where[1] == ("multiply", "npu", "cgra.eltwise_multiply")  # the scalar constant, as (1, 1)
    assert where[2][:2] == ("multiply", "host") and "same tensor as both operands" in where[2][2]
    assert where[3] == ("maximum", "npu", "cgra.eltwise_maximum")
    ex = npu_backend.compile(mod, "cgra-8x8")
    inputs = [np.random.default_rng(1).standard_normal(s).astype("float32") for s in ((4, 8), (4, 8), (8,))]
    out, kernels = _kernels(ex, inputs)
    expected = np.maximum(((inputs[0] + inputs[1]) * np.float32(2)) ** 2, inputs[2])
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert [k.source_ops for k in kernels] == [("add",), ("multiply",), ("maximum",)]


def test_mixed_dtypes_are_refused_with_the_reason():
    from npu_backend.kernels import offload_reason

    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    y = relax.Var("y", relax.TensorType((4, 8), "int32"))
    reason = offload_reason("cgra.eltwise_add", {"lhs": x, "rhs": y}, npu_backend.load_arch("cgra-8x8"))
    assert "mixes float32 and int32" in reason and "cast" in reason
    z, w = (relax.Var(n, relax.TensorType((4, 8), "float64")) for n in "zw")
    reason = offload_reason("cgra.eltwise_add", {"lhs": z, "rhs": w}, npu_backend.load_arch("cgra-8x8"))
    assert "float64 is not supported" in reason


def _kernel_ops(placements):
    kernels = collections.defaultdict(list)
    for p in placements:
        if p.where == "npu":
            kernels[p.kernel].append(p.op)
    return sorted(collections.Counter(",".join(ops) for ops in kernels.values()).items())


@pytest.mark.parametrize("name, builder, expected", [
    ("resnet", resnet, [("mean", 1), ("nn.conv2d,add", 1), ("nn.conv2d,add,add,nn.relu", 2),
                        ("nn.conv2d,add,nn.relu", 3), ("nn.max_pool2d", 1), ("permute_dims,matmul,add", 1)]),
    # Each block is one kernel: its expansion, depthwise conv2d and projection (kernels/
    # inverted_residual.py), or without an expansion its depthwise and projection (separable.py).
    ("mobilenet_v2", mobilenet_v2, [("mean", 1), ("nn.conv2d,add,clip", 2), ("nn.conv2d,add,clip,nn.conv2d,add,add", 1),
                                    ("nn.conv2d,add,clip,nn.conv2d,add,clip,nn.conv2d,add", 2),
                                    ("nn.conv2d,add,clip,nn.conv2d,add,clip,nn.conv2d,add,add", 1),
                                    ("permute_dims,matmul,add", 1)]),
])
def test_fused_bias_and_residual_adds_are_not_taken_by_eltwise(name, builder, expected):
    """The kernels and epilogues of the models as before ELTWISE existed: every add is still a
    conv2d / matmul kernel's bias or residual, none a standalone kernel."""
    placements = npu_backend.explain(from_onnx(builder()), "cgra-8x8")
    assert _kernel_ops(placements) == expected
    assert not any("eltwise" in p.kernel for p in placements)


def test_an_add_after_a_host_op_runs_on_the_npu_while_the_fused_bias_stays_fused():
    def body(bb, x, w, b, r):
        y = bb.emit(relax.op.add(relax.op.matmul(x, w), b))  # fused: matmul + bias
        y = bb.emit(relax.op.nn.softmax(y, axis=0))  # host: the NPU's softmax takes the last axis
        return relax.op.subtract(y, r)  # standalone: ELTWISE

    mod = relax_module([("x", (16, 8), "float32"), ("w", (8, 12), "float32"), ("b", (12,), "float32"),
                        ("r", (16, 1), "float32")], body)
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal(s).astype("float32") for s in ((16, 8), (8, 12), (12,), (16, 1))]
    out, kernels = _kernels(npu_backend.compile(mod, "cgra-8x8"), inputs)
    logits = inputs[0] @ inputs[1] + inputs[2]
    soft = np.exp(logits - logits.max(0, keepdims=True))
    np.testing.assert_allclose(out, soft / soft.sum(0, keepdims=True) - inputs[3], rtol=1e-5, atol=1e-6)
    assert [k.source_ops for k in kernels] == [("matmul", "add"), ("subtract",)]


def test_a_scalar_tensor_operand_stays_on_the_host_with_the_reason():
    # A scalar constant is reshaped to (1, ..., 1) by the normalise stage; a rank-0 input is not.
    mod = relax_module([("x", (4, 8), "float32"), ("s", (), "float32")],
                       lambda bb, x, s: bb.emit(relax.op.multiply(x, s)))
    (placement,) = npu_backend.explain(mod, "cgra-8x8")
    assert placement.where == "host" and "scalar right operand" in placement.reason


@pytest.mark.parametrize("dtype, value", [("float32", 0.25), ("int32", -3), ("int8", 5)])
def test_a_scalar_constant_operand_runs_as_a_broadcast(dtype, value):
    mod = relax_module([("x", (2, 3, 5, 7), dtype)],
                       lambda bb, x: bb.emit(relax.op.subtract(relax.const(value, dtype), x)))
    assert [p.where for p in npu_backend.explain(mod, "cgra-4x4")] == ["npu"]
    x = (np.random.default_rng(0).standard_normal((2, 3, 5, 7)) * 20).astype(dtype)
    out = run(npu_backend.compile(mod, "cgra-4x4"), [x])
    assert mismatch(out, (np.array(value, dtype) - x).astype(dtype), dtype) is None
