"""A depthwise conv2d and the 1x1 conv2d after it as one kernel (kernels/fused/separable.py).

Against numpy over shapes, strides, padding and the epilogues of both convs (property test),
on tiles that fit and, with a small scratchpad, pairs that do not (then two kernels, and the
partitioner's check says why); a MobileNetV2 block partitioned into the fused kernel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from cgra_sim.arch import load_arch
from models import assert_matches, conv2d_reference, relax_module, run
from npu_backend.kernels import offload_reason
from npu_backend.kernels import registry
from npu_backend.kernels.fused import separable_tiles
from npu_backend.kernels.registry import pattern_table
from npu_backend.kernels.fused.separable import SEPARABLE
from npu_backend.options import CompileOptions
from npu_backend.pipeline import STAGES
from npu_backend.target.relax_pipeline import run_stages

ACTIVATIONS = {"none": None, "relu": (0.0, float("inf")), "relu6": (0.0, 6.0)}
SMALL_SPAD = dataclasses.replace(load_arch("cgra-8x8"), name="cgra-8x8-64k", spad_bytes=64 * 1024)


def _activate(bb, y, activation):
    if activation == "relu":
        return bb.emit(relax.op.nn.relu(y))
    return bb.emit(relax.op.clip(y, 0.0, 6.0)) if activation == "relu6" else y


def separable_model(n, c, h, w, f, kernel=3, stride=1, pad=1, dw_bias=True, dw_act="relu6", pw_bias=True,
                    pw_act="none", residual=None, seed=0, expansion=None, ex_bias=True, ex_act="relu6"):
    """[conv2d(x, ew) [+ b0] [act] to `expansion` channels ->] conv2d(., dw, groups) [+ b1] [act] ->
    conv2d(., pw) [+ b2] [+ x or + r] [act]: (module, inputs, numpy reference). residual: None,
    "shortcut" (x itself, the block's input) or "tensor"."""
    rng = np.random.default_rng(seed)
    e = expansion or c
    oh, ow = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
    shapes = [("x", (n, c, h, w))] + ([("ew", (e, c, 1, 1))] + ([("b0", (1, e, 1, 1))] if ex_bias else [])
                                      if expansion else []) + \
        [("dw", (e, 1, kernel, kernel))] + ([("b1", (1, e, 1, 1))] if dw_bias else []) + \
        [("pw", (f, e, 1, 1))] + ([("b2", (1, f, 1, 1))] if pw_bias else []) + \
        ([("r", (n, f, oh, ow))] if residual == "tensor" else [])
    inputs = {name: rng.standard_normal(shape).astype("float32") for name, shape in shapes}

    def body(bb, *params):
        p = dict(zip(inputs, params))
        y = p["x"]
        if expansion:
            y = bb.emit(relax.op.nn.conv2d(y, p["ew"]))
            y = _activate(bb, bb.emit(relax.op.add(y, p["b0"])) if ex_bias else y, ex_act)
        y = bb.emit(relax.op.nn.conv2d(y, p["dw"], strides=stride, padding=pad, groups=e))
        y = _activate(bb, bb.emit(relax.op.add(y, p["b1"])) if dw_bias else y, dw_act)
        y = bb.emit(relax.op.nn.conv2d(y, p["pw"]))
        y = bb.emit(relax.op.add(y, p["b2"])) if pw_bias else y
        if residual:
            y = bb.emit(relax.op.add(p["x"] if residual == "shortcut" else p["r"], y))
        return _activate(bb, y, pw_act)

    mod = relax_module([(name, shape, "float32") for name, shape in shapes], body)
    ref = inputs["x"]
    if expansion:
        ref = np.einsum("nchw,ec->nehw", ref, inputs["ew"][:, :, 0, 0])
        ref = _reference_tail(ref + inputs["b0"] if ex_bias else ref, ex_act)
    ref = conv2d_reference(ref, inputs["dw"], (stride, stride), (pad,) * 4, groups=e)
    ref = _reference_tail(ref + inputs["b1"] if dw_bias else ref, dw_act)
    ref = np.einsum("nchw,fc->nfhw", ref, inputs["pw"][:, :, 0, 0])
    ref = ref + inputs["b2"] if pw_bias else ref
    ref = ref + (inputs["x"] if residual == "shortcut" else inputs["r"]) if residual else ref
    return mod, list(inputs.values()), _reference_tail(ref, pw_act)


def _reference_tail(ref, activation):
    bounds = ACTIVATIONS[activation]
    return ref if bounds is None else np.clip(ref, *bounds)


def _ops(dw_bias, dw_act, pw_bias, residual, pw_act):
    act = {"none": (), "relu": ("nn.relu",), "relu6": ("clip",)}
    return ("nn.conv2d",) + ("add",) * dw_bias + act[dw_act] + ("nn.conv2d",) + ("add",) * (pw_bias + bool(residual)) \
        + act[pw_act]


@given(n=st.integers(1, 2), c=st.integers(2, 20), h=st.integers(3, 12), w=st.integers(3, 12), f=st.integers(1, 20),
       kernel=st.sampled_from([3, 5]), stride=st.integers(1, 2), pad=st.integers(0, 2), dw_bias=st.booleans(),
       dw_act=st.sampled_from(sorted(ACTIVATIONS)), pw_bias=st.booleans(), pw_act=st.sampled_from(sorted(ACTIVATIONS)),
       residual=st.sampled_from([None, "shortcut", "tensor"]), arch=st.sampled_from(npu_backend.preset_names()))
def test_separable_pair_is_one_kernel_and_matches_numpy(n, c, h, w, f, kernel, stride, pad, dw_bias, dw_act,
                                                        pw_bias, pw_act, residual, arch):
    """Every pair that fits, fused even where the tile search would estimate two kernels faster
    (tiny images), so that the kernel's numbers are checked over every shape."""
    if min(h, w) + 2 * pad < kernel:
        pad = kernel // 2
    oh, ow = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
    if residual == "shortcut" and (f, oh, ow) != (c, h, w):
        residual = "tensor"
    mod, inputs, ref = separable_model(n, c, h, w, f, kernel, stride, pad, dw_bias, dw_act, pw_bias, pw_act, residual)
    with _always_fused(), npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    assert_matches(out, ref, "float32")
    assert [k.source_ops for k in prof.kernels] == [_ops(dw_bias, dw_act, pw_bias, residual, pw_act)]


@contextlib.contextmanager
def _always_fused(tiles=separable_tiles, alternative="_separate_cycles"):
    """The partitioner fuses a pair that fits whatever the two kernels' estimates (or, for
    another tile search module `tiles`, whatever its `alternative` estimates); the searches
    remembered before and meanwhile are forgotten."""
    tiles._search.cache_clear()
    try:
        with mock.patch.object(tiles, alternative, lambda spec, arch: math.inf):
            yield
    finally:
        registry._TILINGS.clear()
        tiles._search.cache_clear()


def test_mobilenet_v2_block_is_partitioned_into_the_fused_kernel():
    """An inverted residual block without an expansion (MobileNetV2's first): depthwise 3x3 +
    relu6, project 1x1, + x, as one kernel. Its 24 channels are one block, so the residual is read
    from the depthwise's window, not loaded again."""
    mod, inputs, ref = separable_model(1, 24, 14, 14, 24, dw_act="relu6", residual="shortcut")
    kernels = {p.kernel.split(" ")[0] for p in npu_backend.explain(mod, "cgra-8x8")}
    assert kernels == {"cgra.separable_bias_shortcut"}
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), inputs)
    assert_matches(out, ref, "float32")
    (kernel,) = prof.kernels
    assert kernel.source_ops == ("nn.conv2d", "add", "clip", "nn.conv2d", "add", "add")
    assert kernel.macs == 24 * 14 * 14 * (9 + 24)
    weights = sum(array.nbytes for array in inputs[1:])  # the windows load each input pixel once or
    assert kernel.dma_load_bytes < 2 * inputs[0].nbytes + weights  # twice (halo), a residual tile once more


def test_onnx_mobilenet_v2_blocks_fuse_and_move_fewer_bytes():
    """The ONNX MobileNetV2-style model: each block's depthwise and projection are one kernel,
    the expanded map between them never stored, and the result is onnxruntime's. (The blocks
    with an expansion before the depthwise are one inverted-residual kernel each, expansion
    included: tests/test_inverted_residual.py.)"""
    import onnx_models
    prof = onnx_profile(onnx_models.mobilenet_v2(32), (1, 3, 32, 32))
    fused = [k for k in prof.kernels if k.source_ops.count("nn.conv2d") >= 2]
    assert [k.source_ops.count("nn.conv2d") for k in fused] == [2, 3, 3, 3]
    assert all(k.source_ops[:3] == ("nn.conv2d", "add", "clip") for k in fused)


def onnx_profile(model, shape):
    """The profile of `model` run on cgra-8x8 once its result was checked against onnxruntime's."""
    onnxruntime = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(npu_backend.from_onnx(model), "cgra-8x8"), [x])
    session = onnxruntime.InferenceSession(model.SerializeToString())
    assert_matches(out, session.run(None, {session.get_inputs()[0].name: x})[0], "float32")
    return prof


def _pair_reason(mod, arch, family=SEPARABLE) -> str | None:
    """The partitioner's check on the matches of `family`'s patterns in `mod` (a depthwise -> 1x1
    pair by default): None if one of them fuses, else the first one's reason."""
    mod = run_stages(mod, arch, CompileOptions(), [stage for stage in STAGES if stage[0] == "normalise"])
    var2val = relax.analysis.get_var2val(mod["main"])
    reasons = []
    for entry in (entry for entry in pattern_table() if entry.family is family):
        for value in var2val.values():
            matched = entry.pattern.extract_matched_expr(value, var2val)
            if matched is not None:
                roles = {role: matched[node] for role, node in entry.annotations.items() if node in matched}
                reasons.append(offload_reason(entry.name, roles, arch))
    if not reasons:
        raise AssertionError(f"no match of the {family.name} patterns in the module")
    return None if None in reasons else reasons[0]


def test_pair_that_does_not_fit_stays_two_kernels_with_a_reason():
    """Many output channels on a 64 KiB scratchpad: each conv alone tiles, the fused pair's
    smallest tile (2 x 8 pixels of all 256 output channels, with the pointwise weights) does
    not; the check says so."""
    mod, inputs, ref = separable_model(1, 16, 8, 8, 256, dw_act="relu6")
    reason = _pair_reason(mod, SMALL_SPAD)
    assert reason is not None and "scratchpad" in reason and "separate kernels" in reason
    assert _pair_reason(mod, load_arch("cgra-8x8")) is None
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, SMALL_SPAD), inputs)
    assert_matches(out, ref, "float32")
    assert [k.source_ops for k in prof.kernels] == [("nn.conv2d", "add", "clip"), ("nn.conv2d", "add")]


def test_pair_faster_as_two_kernels_stays_two_kernels_with_a_reason():
    """MobileNetV1's deep pairs (512 channels on a 14 x 14 map): a fused tile holds all 512 output
    channels, so it is a few pixels, and it reloads the 512 x 512 pointwise weights for each."""
    mod, inputs, ref = separable_model(1, 512, 14, 14, 512, dw_act="relu", pw_act="relu")
    reason = _pair_reason(mod, load_arch("cgra-8x8"))
    assert reason is not None and "as two kernels" in reason and "pointwise weights" in reason
    kernels = [p.kernel.split(" ")[0] for p in npu_backend.explain(mod, "cgra-8x8") if p.op == "nn.conv2d"]
    assert kernels == ["cgra.conv2d_bias_relu", "cgra.conv2d_bias_relu"]


def test_int8_pair_stays_two_kernels_with_a_reason():
    """An int8 depthwise's int32 accumulator would need requantising before the pointwise GEMM."""
    params = [relax.Var(name, relax.TensorType(shape, dtype)) for name, shape, dtype in
              (("x", (1, 8, 6, 6), "int8"), ("dw", (8, 1, 3, 3), "int8"), ("pw", (8, 8, 1, 1), "int32"))]
    builder = relax.BlockBuilder()
    with builder.function("main", params):
        with builder.dataflow():
            x, dw, pw = params
            y = builder.emit(relax.op.nn.conv2d(x, dw, padding=1, groups=8, out_dtype="int32"))
            out = builder.emit_output(relax.op.nn.conv2d(y, pw, out_dtype="int32"))
        builder.emit_func_output(out)
    reason = _pair_reason(builder.get(), load_arch("cgra-8x8"))
    assert reason is not None and "int8" in reason and "float32 pairs fuse" in reason
