"""The attention kernel (kernels/attention/) and its normal form (normalise/attentions.py) against
numpy in float64: multi-head, grouped- and multi-query K / V, masks (none, a constant causal
tile, a run-time padding row, a run-time tile with whole rows of -inf under a safe softmax),
head dims 16-128, cgra-4x4 and cgra-8x8.

Stated bound: the output within 4e-6 of the largest |O| (measured up to 8e-7: the scores' GEMM
in float32, exp within 1 ulp, the row sum over Sk (a REDUCE, or the GEMM P 1 of rows.py), one reciprocal). A row
whose every score is -inf gives exactly 0 under a safe softmax (PyTorch's SDPA), NaN under a
plain one (PyTorch's softmax). The kernel's DMA moves Q, K, V, the mask and O once each: the
scores never leave the scratchpad.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.kernels.attention.spec import AttentionSpec
from npu_backend.kernels.attention.attention_tiles import choose_attention_tiling
from npu_backend.kernels.attention.flash_tiles import FlashTiling

BOUND = 4e-6


def _graph(b, h, hk, sq, sk, d, scale, mask_shape=None, mask_const=None, safe=False, tail=None):
    """HF's eager form (repeat_kv's expand + broadcast + reshape for grouped K / V), with the
    scores' mask a constant or a run-time input; `safe` adds softmaxes.py's guard; `tail(bb, o)`
    (if given) emits what follows the attention's output and returns the function's result."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((b, h, sq, d), "float32"))
    k = relax.Var("k", relax.TensorType((b, hk, sk, d), "float32"))
    v = relax.Var("v", relax.TensorType((b, hk, sk, d), "float32"))
    params = [q, k, v]
    mask = relax.const(mask_const) if mask_const is not None else None
    if mask_shape is not None:
        mask = relax.Var("mask", relax.TensorType(mask_shape, "float32"))
        params.append(mask)
    g = h // hk
    with bb.function("main", params):
        with bb.dataflow():
            kk, vv = k, v
            if g > 1:
                kk, vv = (bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(
                    bb.emit(relax.op.expand_dims(x, [2])), (b, hk, g, sk, d))), (b, h, sk, d))) for x in (k, v))
            s = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(kk, [0, 1, 3, 2]))))
            s = bb.emit(relax.op.multiply(s, relax.const(np.float32(scale))))
            if mask is not None:
                s = bb.emit(relax.op.add(s, mask))
            p = bb.emit(relax.op.nn.softmax(s, axis=-1))
            if safe:
                finite = bb.emit(relax.op.astype(bb.emit(relax.op.not_equal(s, relax.const(-np.inf, "float32"))),
                                                 "float32"))
                kept = bb.emit(relax.op.greater(bb.emit(relax.op.max(finite, axis=[-1], keepdims=True)),
                                                relax.const(0.0, "float32")))
                p = bb.emit(relax.op.where(kept, p, relax.const(0.0, "float32")))
            o = relax.op.matmul(p, vv)
            if tail is not None:
                o = tail(bb, bb.emit(o))
            o = bb.emit_output(o)
        bb.emit_func_output(o)
    return bb.get()


def _reference(q, k, v, mask, scale, safe):
    g = q.shape[1] // k.shape[1]
    k, v = (np.repeat(x.astype(np.float64), g, axis=1) for x in (k, v))
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = s + mask
    top = s.max(-1, keepdims=True)
    dead = np.isneginf(top)
    e = np.exp(s - np.where(dead, 0, top))
    total = e.sum(-1, keepdims=True)
    p = e / np.where(total == 0, 1, total)
    if not safe:
        p = np.where(dead, np.nan, p)
    return p @ v


def _run(mod, arrays, arch):
    executable = npu_backend.compile(mod, arch)
    with npu_backend.profile() as prof:
        out = tvm.relax.VirtualMachine(executable, tvm.cpu())["main"](*map(tvm.runtime.tensor, arrays)).numpy()
    return out, prof


def _attention_kernels(prof):
    return [k for k in prof.kernels if "softmax" in k.name and "matmul" in k.name]


@settings(max_examples=8, deadline=None)
@given(b=st.integers(1, 2), kv=st.integers(1, 2), group=st.sampled_from([1, 2, 4]), sq=st.integers(1, 40),
       sk=st.integers(2, 40), d=st.sampled_from([16, 32, 64, 128]), mask=st.sampled_from(["none", "causal", "row"]),
       arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]), seed=st.integers(0, 2 ** 16))
def test_attention_kernel_matches_float64(b, kv, group, sq, sk, d, mask, arch, seed):
    rng = np.random.default_rng(seed)
    h, scale = kv * group, float(d) ** -0.5
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in
               ((b, h, sq, d), (b, kv, sk, d), (b, kv, sk, d)))
    arrays, mask_value, mask_shape, mask_const = [q, k, v], None, None, None
    if mask == "causal":  # a constant, -inf above the diagonal (each row keeps its first key)
        mask_const = mask_value = np.triu(np.full((sq, sk), -np.inf, np.float32), 1)[None, None]
    elif mask == "row":  # a run-time padding row per batch, additive (HF's finfo.min form)
        mask_shape = (b, 1, 1, sk)
        mask_value = np.where(rng.random(mask_shape) < 0.3, np.finfo(np.float32).min, 0).astype(np.float32)
        arrays.append(mask_value)
    mod = _graph(b, h, kv, sq, sk, d, scale, mask_shape, mask_const)
    out, prof = _run(mod, arrays, arch)
    assert len(_attention_kernels(prof)) == 1, [kernel.name for kernel in prof.kernels]
    expected = _reference(q, k, v, mask_value, scale, safe=False)
    assert np.abs(out - expected).max() <= BOUND * np.abs(expected).max()


def test_a_row_all_minus_infinity_gives_zeros_under_a_safe_softmax_and_nan_under_a_plain_one():
    rng = np.random.default_rng(1)
    b, h, sq, sk, d = 1, 2, 8, 8, 16
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((b, h, sq, d), (b, h, sk, d), (b, h, sk, d)))
    mask = np.triu(np.full((sq, sk), -np.inf, np.float32), 1)[None, None].copy()
    mask[..., 3, :] = -np.inf  # query row 3 sees no key
    for safe in (True, False):
        mod = _graph(b, h, h, sq, sk, d, 0.25, mask_shape=mask.shape, safe=safe)
        out, prof = _run(mod, [q, k, v, mask], "cgra-8x8")
        assert len(_attention_kernels(prof)) == 1
        expected = _reference(q, k, v, mask, 0.25, safe)
        if safe:
            assert np.all(out[:, :, 3] == 0)
        else:
            assert np.all(np.isnan(out[:, :, 3]))
        live = np.arange(sq) != 3
        assert np.abs(out[:, :, live] - expected[:, :, live]).max() <= BOUND * np.abs(expected[:, :, live]).max()


@pytest.mark.parametrize("kv, masked", [(4, False), (2, True), (1, True)])  # multi-head, grouped, multi-query
def test_the_scores_never_reach_dram(kv, masked):
    """One attention's DMA: Q, K, V, the mask (shared by the heads: loaded whole, once) and O
    once each, K / V once per group of query heads."""
    rng = np.random.default_rng(2)
    b, h, s, d = 1, 4, 32, 16
    arrays = [rng.standard_normal(x).astype(np.float32) for x in ((b, h, s, d), (b, kv, s, d), (b, kv, s, d))]
    if masked:
        arrays.append(np.triu(np.full((s, s), -np.inf, np.float32), 1)[None, None])
    out, prof = _run(_graph(b, h, kv, s, s, d, 0.25, arrays[3].shape if masked else None), arrays, "cgra-8x8")
    (kernel,) = _attention_kernels(prof)
    assert kernel.dma_load_bytes == sum(x.nbytes for x in arrays)
    assert kernel.dma_store_bytes == out.nbytes


def test_an_attention_too_long_for_whole_score_rows_runs_over_key_tiles():
    """160 keys of 64 dims do not fit cgra-4x4 (64 KiB) as whole score rows beside a K / V head:
    the tile search takes the key-tile kernel (flash.py; tests/test_flash_attention.py), and the
    grouped attention is one kernel (it was two matmul and a softmax kernel, its scores in DRAM)."""
    spec = AttentionSpec(1, 2, 2, 160, 160, 64, 64)
    assert isinstance(choose_attention_tiling(spec, npu_backend.load_arch("cgra-4x4")), FlashTiling)
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal(x).astype(np.float32) for x in ((1, 4, 160, 64), (1, 2, 160, 64), (1, 2, 160, 64)))
    out, prof = _run(_graph(1, 4, 2, 160, 160, 64, 0.125), [q, k, v], "cgra-4x4")
    assert len(prof.kernels) == 1 and len(_attention_kernels(prof)) == 1, [kernel.name for kernel in prof.kernels]
    expected = _reference(q, k, v, None, 0.125, safe=False)
    assert np.abs(out - expected).max() <= BOUND * np.abs(expected).max()


def _sdpa_graph(b, h, hk, s, d, k_axes=(0, 1, 3, 2)):
    """torch SDPA's decomposition as exported: the scale split between Q and Kᵀ, repeat_kv's
    expand + broadcast + reshape, the scores through (B * H, S, S) and back; `k_axes` is K's
    permutation before the matmul (with S = D, (0, 1, 2, 3) keeps the shapes but is no Kᵀ)."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((b, h, s, d), "float32"))
    k = relax.Var("k", relax.TensorType((b, hk, s, d), "float32"))
    v = relax.Var("v", relax.TensorType((b, hk, s, d), "float32"))
    mask = relax.Var("mask", relax.TensorType((b, 1, s, s), "float32"))
    g, root = h // hk, float(d) ** -0.25
    with bb.function("main", [q, k, v, mask]):
        with bb.dataflow():
            kk, vv = (bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(
                bb.emit(relax.op.expand_dims(x, [2])), (b, hk, g, s, d))), (b, h, s, d))) for x in (k, v))
            qs = bb.emit(relax.op.reshape(bb.emit(relax.op.multiply(q, relax.const(np.float32(root)))), (b * h, s, d)))
            kt = bb.emit(relax.op.multiply(bb.emit(relax.op.permute_dims(kk, list(k_axes))), relax.const(np.float32(root))))
            scores = bb.emit(relax.op.matmul(qs, bb.emit(relax.op.reshape(kt, (b * h, d, s)))))
            x = bb.emit(relax.op.add(bb.emit(relax.op.reshape(scores, (b, h, s, s))), mask))
            p = bb.emit(relax.op.reshape(bb.emit(relax.op.nn.softmax(x, axis=-1)), (b * h, s, s)))
            out = bb.emit(relax.op.matmul(p, bb.emit(relax.op.reshape(vv, (b * h, s, d)))))
            out = bb.emit_output(relax.op.reshape(out, (b, h, s, d)))
        bb.emit_func_output(out)
    return bb.get()


def _llvm(mod, arrays):
    executable = tvm.compile(mod, target="llvm")
    return tvm.relax.VirtualMachine(executable, tvm.cpu())["main"](*map(tvm.runtime.tensor, arrays)).numpy()


@pytest.mark.parametrize("k_axes, rewritten", [((0, 1, 3, 2), True), ((0, 1, 2, 3), False)])
def test_sdpa_with_grouped_kv_becomes_the_normal_form_and_a_foreign_view_does_not(k_axes, rewritten):
    from npu_backend.normalise.attentions import attentions_as_normal_form

    b, h, hk, s, d = 1, 4, 2, 16, 16  # S = D: only the index check tells K from Kᵀ
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(x).astype(np.float32) for x in ((b, h, s, d), (b, hk, s, d), (b, hk, s, d))]
    arrays.append(np.where(rng.random((b, 1, s, s)) < 0.2, -1e9, 0).astype(np.float32))
    before = _sdpa_graph(b, h, hk, s, d, k_axes)
    after = attentions_as_normal_form(before)
    assert ("axes=[0, 1, 2, 4, 3]" in after.script()) == rewritten
    np.testing.assert_allclose(_llvm(after, arrays), _llvm(before, arrays), rtol=1e-5, atol=1e-6)


def test_query_tiles_smaller_than_the_sequence_with_a_ragged_last_one():
    """100 keys of 64 dims on cgra-4x4 leave room for a few query rows a tile: 37 queries run in
    several tiles, the last one cut, the mask tile per query tile (too big to hold whole)."""
    arch = npu_backend.load_arch("cgra-4x4")
    spec = AttentionSpec(1, 1, 2, 37, 100, 64, 64, scale=0.125, mask_shape=(1, 1, 1, 37, 100))
    tiling = choose_attention_tiling(spec, arch)
    assert tiling.tm < 37 and 37 % tiling.tm, tiling
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal(x).astype(np.float32) for x in ((1, 2, 37, 64), (1, 1, 100, 64), (1, 1, 100, 64)))
    mask = np.where(rng.random((1, 1, 37, 100)) < 0.5, -np.inf, 0).astype(np.float32)
    mask[..., 0] = 0  # every row keeps a key
    out, prof = _run(_graph(1, 2, 1, 37, 100, 64, 0.125, mask.shape), [q, k, v, mask], arch)
    assert len(_attention_kernels(prof)) == 1
    expected = _reference(q, k, v, mask, 0.125, safe=False)
    assert np.abs(out - expected).max() <= BOUND * np.abs(expected).max()


def test_a_constant_bias_of_zeros_is_no_mask():
    """SDPA's folded attn_bias without a mask (ViT, BERT without an attention mask) adds nothing."""
    from npu_backend.normalise.attentions import attentions_as_normal_form

    before = _graph(1, 2, 2, 8, 8, 16, 0.25, mask_const=np.zeros((1, 1, 8, 8), np.float32))
    after = attentions_as_normal_form(before).script()
    assert "axes=[0, 1, 2, 4, 3]" in after and "R.add" not in after
