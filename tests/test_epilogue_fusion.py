"""Residual add and clip (relu6) fused into the conv2d / matmul kernels' epilogue.

End to end against numpy (property tests over shapes, dtypes, presets and the parts of the chain
conv2d/matmul [+ bias] [+ residual] [relu | clip]), what the partition leaves on the host and
why, and the normalise stage's rewrite of ONNX's maximum / minimum calls into R.clip.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st
from tvm import relax, topi

import npu_backend
from models import assert_matches, conv2d_model, matmul_model, relax_module, run
from npu_backend.normalise.clips import canonicalize_clips

PRESETS = npu_backend.preset_names()
ACTIVATIONS = {"none": (False, None), "relu": (True, None), "relu6": (False, (0, 6)),
               "clip": (False, (-50, 40))}


def _tail(activation, dtype):
    """(relu, clip) for an activation name; float bounds for float32 (as the importers give)."""
    relu, clip = ACTIVATIONS[activation]
    return relu, (None if clip is None else tuple(float(v) if dtype == "float32" else v for v in clip))


def _expected_ops(root, bias, residual, activation):
    ops = [root] + ["add"] * (bias + residual)
    return tuple(ops + ({"none": [], "relu": ["nn.relu"]}.get(activation, ["clip"])))


@given(m=st.integers(1, 90), n=st.integers(1, 90), k=st.integers(1, 90),
       dtype=st.sampled_from(["float32", "int8"]), arch=st.sampled_from(PRESETS), bias=st.booleans(),
       activation=st.sampled_from(sorted(ACTIVATIONS)))
def test_matmul_with_residual_and_clip_matches_numpy(m, n, k, dtype, arch, bias, activation):
    relu, clip = _tail(activation, dtype)
    mod, inputs, ref = matmul_model(m, n, k, dtype, bias=bias, relu=relu, residual=True, clip=clip)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    assert_matches(out, ref, dtype)
    assert [kernel.source_ops for kernel in prof.kernels] == [_expected_ops("matmul", bias, True, activation)]


@given(batch=st.integers(1, 2), channels=st.integers(1, 12), size=st.integers(4, 14),
       filters=st.integers(1, 12), kernel=st.integers(1, 3), stride=st.integers(1, 2),
       pad=st.integers(0, 1), depthwise=st.booleans(), dtype=st.sampled_from(["float32", "int8"]),
       arch=st.sampled_from(PRESETS), bias=st.booleans(), residual=st.booleans(),
       activation=st.sampled_from(sorted(ACTIVATIONS)))
def test_conv2d_with_residual_and_clip_matches_numpy(batch, channels, size, filters, kernel, stride, pad,
                                                     depthwise, dtype, arch, bias, residual, activation):
    relu, clip = _tail(activation, dtype)
    groups, filters = (channels, channels) if depthwise else (1, filters)
    mod, inputs, ref = conv2d_model(batch, channels, size, size + 1, filters, kernel, kernel, (stride, stride),
                                    (pad, pad, pad, pad), dtype, bias=bias, relu=relu, groups=groups,
                                    residual=residual, clip=clip)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    assert_matches(out, ref, dtype)
    assert [k.source_ops for k in prof.kernels] == [_expected_ops("nn.conv2d", bias, residual, activation)]


def test_resnet_block_tail_is_one_kernel():
    """relu(conv(y) + b + x), the end of a ResNet basic block, with the shortcut x added last."""
    mod, inputs, ref = conv2d_model(1, 8, 10, 10, 8, 3, 3, pad=(1, 1, 1, 1), residual=True)
    placements = npu_backend.explain(mod, "cgra-8x8")
    assert {p.where for p in placements} == {"npu"}
    assert placements[0].kernel.startswith("cgra.conv2d_bias_residual_relu")
    with npu_backend.profile() as prof:
        out = run(tvm.compile(mod, target="cgra"), inputs)
    assert_matches(out, ref, "float32")
    assert len(prof.kernels) == 1


def test_pytorch_relu6_is_fused():
    """PyTorch's relu6 imports as R.nn.relu6, which Relax builds as R.clip(x, 0, 6)."""
    def body(bb, x, w, b):
        return bb.emit(relax.op.nn.relu6(bb.emit(relax.op.add(relax.op.matmul(x, w), b))))
    mod = relax_module([("x", (6, 16), "float32"), ("w", (16, 8), "float32"), ("b", (8,), "float32")], body)
    rng = np.random.default_rng(1)
    inputs = [4 * rng.standard_normal(s).astype("float32") for s in ((6, 16), (16, 8), (8,))]
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-4x4"), inputs)
    assert_matches(out, np.clip(inputs[0] @ inputs[1] + inputs[2], 0, 6), "float32")
    assert prof.kernels[0].source_ops == ("matmul", "add", "clip")


def _conv_then(tail):
    """A float32 3x3 conv2d on (1, 4, 6, 6) with 4 filters, then tail(bb, conv, x, extra)."""
    def body(bb, x, w, extra):
        y = bb.emit(relax.op.nn.conv2d(x, w, padding=(1, 1, 1, 1)))
        return tail(bb, y, x, extra)
    return body


@pytest.mark.parametrize("case, extra_shape, tail, expected", [
    ("broadcast add", (1, 4, 6, 1), lambda bb, y, x, e: bb.emit(relax.op.add(y, e)),
     lambda conv, x, e: conv + e),
    # (A residual that is the conv's own data is fused since kernels/gemm/residual_lhs.py:
    # tests/test_residual_lhs.py.)
    ("clip to an empty range", (1,), lambda bb, y, x, e: bb.emit(relax.op.clip(y, 2.0, -1.0)),
     lambda conv, x, e: np.full_like(conv, 2.0)),
])
def test_what_the_epilogue_cannot_take_stays_on_the_host(case, extra_shape, tail, expected):
    mod = relax_module([("x", (1, 4, 6, 6), "float32"), ("w", (4, 4, 3, 3), "float32"),
                        ("e", extra_shape, "float32")], _conv_then(tail))
    rng = np.random.default_rng(2)
    x, w, e = (rng.standard_normal(s).astype("float32") for s in ((1, 4, 6, 6), (4, 4, 3, 3), extra_shape))
    placements = npu_backend.explain(mod, "cgra-8x8")
    assert [(p.op, p.where) for p in placements][0] == ("nn.conv2d", "npu")
    # Not fused into the conv's kernel: on the host, or (an add) a standalone ELTWISE kernel.
    assert placements[-1].where == "host" or placements[-1].kernel.startswith("cgra.eltwise_add "), case
    assert placements[-1].kernel != placements[0].kernel
    conv = run(npu_backend.compile(relax_module([("x", (1, 4, 6, 6), "float32"), ("w", (4, 4, 3, 3), "float32"),
                                                 ("e", extra_shape, "float32")],
                                                _conv_then(lambda bb, y, x, e: y)), "cgra-8x8"), [x, w, e])
    out = run(npu_backend.compile(mod, "cgra-8x8"), [x, w, e])
    assert_matches(out, expected(conv, x, e), "float32")


def test_a_sum_used_elsewhere_is_not_fused_into_the_residual_add():
    """In first = conv(x) + b1; out = first + conv(conv(first)) + b3 (MobileNetV2's x + block(x)),
    `first` feeds the block too: the residual add must go to the block's last conv, not to the
    conv that computes `first` (which would have to output both sums)."""
    def body(bb, x, w1, b1, w2, w3, b3):
        first = bb.emit(relax.op.add(relax.op.nn.conv2d(x, w1), b1))
        mid = bb.emit(relax.op.nn.conv2d(first, w2))
        return bb.emit(relax.op.add(first, bb.emit(relax.op.add(relax.op.nn.conv2d(mid, w3), b3))))
    shapes = [("x", (1, 4, 5, 5), "float32"), ("w1", (4, 4, 1, 1), "float32"), ("b1", (1, 4, 1, 1), "float32"),
              ("w2", (4, 4, 1, 1), "float32"), ("w3", (4, 4, 1, 1), "float32"), ("b3", (1, 4, 1, 1), "float32")]
    rng = np.random.default_rng(3)
    x, w1, b1, w2, w3, b3 = (rng.standard_normal(s).astype("float32") for _, s, _ in shapes)

    def conv(data, weight):
        return np.einsum("nchw,fc->nfhw", data, weight[:, :, 0, 0])
    first = conv(x, w1) + b1
    ref = first + (conv(conv(first, w2), w3) + b3)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(relax_module(shapes, body), "cgra-4x4"), [x, w1, b1, w2, w3, b3])
    assert_matches(out, ref, "float32")
    assert [k.source_ops for k in prof.kernels] == [("nn.conv2d", "add"), ("nn.conv2d",),
                                                    ("nn.conv2d", "add", "add")]


# ---------------------------------------------------------------- ONNX Clip -> R.clip

def _onnx_style_clip(lo, hi, dtype="float32"):
    """What the ONNX importer makes of Clip(x, lo, hi): topi maximum, then topi minimum."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 5), dtype))
    with builder.function("main", [x]):
        with builder.dataflow():
            y = x if lo is None else builder.emit_te(topi.maximum, x, relax.const(lo, dtype))
            y = y if hi is None else builder.emit_te(topi.minimum, y, relax.const(hi, dtype))
            out = builder.emit_output(y)
        builder.emit_func_output(out)
    return builder.get()


def _clips(mod):
    return [b.value for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call)]


@pytest.mark.parametrize("lo, hi, dtype, bounds", [
    (0.0, 6.0, "float32", (0.0, 6.0)),
    (None, 6.0, "float32", (-np.inf, 6.0)),
    (-3, None, "int32", (-3, 2**31 - 1)),
])
def test_onnx_maximum_minimum_become_one_clip(lo, hi, dtype, bounds):
    mod = _onnx_style_clip(lo, hi, dtype)
    rewritten = canonicalize_clips(mod)
    (call,) = _clips(rewritten)
    assert call.op.name == "relax.clip" and (call.args[1].value, call.args[2].value) == bounds
    assert [gv.name_hint for gv in rewritten.functions] == ["main"]  # the PrimFuncs are gone
    data = (np.arange(10).reshape(2, 5) * 3 - 12).astype(dtype)
    results = []
    for module in (mod, rewritten):
        vm = relax.VirtualMachine(tvm.compile(module, target="llvm"), tvm.cpu())
        results.append(vm["main"](tvm.runtime.tensor(data)).numpy())
    np.testing.assert_array_equal(results[0], results[1])


def test_other_elementwise_calls_are_left_alone():
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 5), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit_te(topi.add, x, relax.const(1.0, "float32"))
            z = builder.emit_te(topi.maximum, x, y)  # max against a tensor, not a scalar
            out = builder.emit_output(z)
        builder.emit_func_output(out)
    mod = builder.get()
    assert [c.op.name for c in _clips(canonicalize_clips(mod))] == ["relax.call_tir"] * 2
