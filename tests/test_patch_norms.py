"""A patch embedding's layer norm in its patch conv's epilogue (kernels/gemm/patch_norm.py):
layer_norm(reshape(conv2d(x, w, stride = kernel, NHWC) + b)) as one kernel, within 1e-5 of
float64 relative to the output's largest value (also at a patch mean of 20 standard deviations),
on cgra-4x4, 8x8 and 16x16; a norm the kernel cannot take keeps its own kernel and explain says
why; Swin's and ConvNeXt's stems run no norm kernel."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tvm
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.errors import UnsupportedOperator
from npu_backend.kernels.gemm import post_norm
from npu_backend.tools.explain import format_placements


def _patch_norm(c, h, w, f, k, eps, seed, bias=True, reshape=True, offset=0.0):
    """main(x) = LN([reshape](conv2d(x, W, stride k, NHWC) [+ b]), gamma, beta), and its weights."""
    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((f, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    b = (rng.standard_normal(f) + offset).astype(np.float32) if bias else np.zeros(f, np.float32)
    gamma = rng.uniform(0.5, 1.5, f).astype(np.float32)
    beta = rng.standard_normal(f).astype(np.float32)
    x = relax.Var("x", relax.TensorType((1, c, h, w), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), strides=(k, k), out_layout="NHWC"))
            y = bb.emit(relax.op.add(y, relax.const(b.reshape(1, 1, 1, f)))) if bias else y
            y = bb.emit(relax.op.reshape(y, (1, (h // k) * (w // k), f))) if reshape else y
            out = bb.emit_output(relax.op.nn.layer_norm(y, relax.const(gamma), relax.const(beta), axes=[-1],
                                                        epsilon=eps))
        bb.emit_func_output(out)
    return bb.get(), (weight, b, gamma, beta)


def _reference(x, k, eps, weight, b, gamma, beta):
    _, c, h, w = x.shape
    f = weight.shape[0]
    patches = x.astype(np.float64).reshape(c, h // k, k, w // k, k).transpose(1, 3, 0, 2, 4).reshape(-1, c * k * k)
    y = patches @ weight.reshape(f, -1).T.astype(np.float64) + b
    d = y - y.mean(-1, keepdims=True)
    return d / np.sqrt((d ** 2).mean(-1, keepdims=True) + eps) * gamma + beta


def _kernels(mod, arch):
    return [(p.kernel or "").split(" ")[0] for p in npu_backend.explain(mod, arch)]


def _run(mod, x, arch):
    vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    with npu_backend.profile() as prof:
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    return got, prof


@pytest.fixture(autouse=True)
def _no_kernel_cache(monkeypatch):
    """No kernel cache, so no partition plan: its key sees shapes, not weights."""
    monkeypatch.setitem(os.environ, "CGRA_KERNEL_CACHE", "off")


@settings(max_examples=6, deadline=None)
@given(arch=st.sampled_from(["cgra-4x4", "cgra-8x8", "cgra-16x16"]), c=st.sampled_from([1, 3]),
       k=st.sampled_from([2, 4]), side=st.sampled_from([1, 2, 4]), f=st.sampled_from([16, 32]),
       eps=st.sampled_from([1e-12, 1e-5, 0.1]), bias=st.booleans(), reshape=st.booleans(),
       offset=st.sampled_from([0.0, 20.0]), seed=st.integers(0, 99))
@example(arch="cgra-4x4", c=1, k=2, side=1, f=16, eps=1e-12, bias=False, reshape=False, offset=0.0, seed=0)
@example(arch="cgra-8x8", c=3, k=4, side=1, f=32, eps=1e-5, bias=True, reshape=True, offset=20.0, seed=0)
def test_a_patch_norm_runs_in_its_conv_within_float_rounding(arch, c, k, side, f, eps, bias, reshape, offset, seed):
    """The examples: output rows of 6 patches, which pieces of 4 or 8 rows split (post_norm_pieces)."""
    h, w = 8 * side, 4 * side * k // 2 + 4 * k  # wider than tall, whole patches
    mod, weights = _patch_norm(c, h, w, f, k, eps, seed, bias, reshape, offset)
    kernels = _kernels(mod, arch)
    x = np.random.default_rng(seed + 1).standard_normal((1, c, h, w)).astype(np.float32)
    got, _ = _run(mod, x, arch)
    ref = _reference(x, k, eps, *weights)
    assert np.abs(got.reshape(ref.shape) - ref).max() <= 1e-5 * np.abs(ref).max(), kernels


@pytest.mark.parametrize("arch, c, h, w, f, k", [
    ("cgra-8x8", 3, 64, 64, 16, 4),  # Swin's and ConvNeXt's stems (tests/transformer_models.py)
    ("cgra-4x4", 3, 64, 64, 16, 4),
    ("cgra-16x16", 3, 64, 64, 16, 4),
    ("cgra-8x8", 3, 16, 24, 32, 4),
    ("cgra-4x4", 1, 8, 12, 16, 2),
])
def test_the_fold_is_one_kernel_and_costs_less_than_the_two(monkeypatch, arch, c, h, w, f, k):
    """What patch_norm.py's module doc says of the fold it does not price: one kernel, fewer
    cycles than the conv's and the norm's kernels apart, the same result within rounding."""
    mod, weights = _patch_norm(c, h, w, f, k, 1e-5, 0)
    assert set(_kernels(mod, arch)) == {"cgra.conv2d_post_norm_rms_beta"}  # normalise/centred_patches.py
    x = np.random.default_rng(1).standard_normal((1, c, h, w)).astype(np.float32)
    got, fused = _run(mod, x, arch)
    ref = _reference(x, k, 1e-5, *weights)
    assert np.abs(got.reshape(ref.shape) - ref).max() <= 1e-5 * np.abs(ref).max()

    def refuse(*_):
        raise UnsupportedOperator("apart")
    monkeypatch.setattr(post_norm, "with_patch_norm", refuse)
    assert not any(k.startswith("cgra.conv2d_post_norm") for k in _kernels(mod, arch))
    apart_got, apart = _run(mod, x, arch)
    assert np.abs(apart_got.reshape(ref.shape) - ref).max() <= 1e-5 * np.abs(ref).max()
    assert len(fused.kernels) == 1 and fused.total_cycles < apart.total_cycles


@pytest.mark.parametrize("c, h, w, f, k, why", [
    (3, 16, 16, 12, 4, "pad to whole columns"),  # a padded column would join the variance
    (12, 16, 16, 16, 4, "fused after a float32 patch conv"),  # 12 channels: the tap form, not a patch conv
])
def test_a_norm_the_kernel_cannot_take_keeps_its_kernel_and_explain_says_why(c, h, w, f, k, why):
    mod, weights = _patch_norm(c, h, w, f, k, 1e-5, 0)
    placements = npu_backend.explain(mod, "cgra-8x8")
    norm = [p for p in placements if p.op == "nn.layer_norm"][0]
    assert norm.kernel.startswith("cgra.layer_norm") and why in norm.reason, norm
    assert why in format_placements(placements)
    x = np.random.default_rng(1).standard_normal((1, c, h, w)).astype(np.float32)
    got, _ = _run(mod, x, "cgra-8x8")
    ref = _reference(x, k, 1e-5, *weights)
    assert np.abs(got.reshape(ref.shape) - ref).max() <= 1e-5 * np.abs(ref).max()
