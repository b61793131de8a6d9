"""A causal triangle and a padding row (HF's decoders' `where(causal & mask, 0, -inf)`) reach the
attention kernel as its causal offset and a mask row (normalise/causal_rows.py): no s x s mask is
built or read, and the whole-row kernel (kernels/attention/rows.py) computes only the keys up to
each query tile's diagonal. Against numpy in float64, within test_attention's bound.

Hypothesis over batches, K / V heads, groups, head dims 8-128, query and key lengths (a KV cache:
q_len < k_len, the triangle shifted by k_len - q_len), padding rows with and without queries that
see no key (left padding: those give 0 under the safe softmax, as PyTorch's SDPA), both chips.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.kernels.attention import attention_tiles
from npu_backend.kernels.common.spad_layout import a_row_stride
from npu_backend.kernels.attention.attention_tiles import RowTiling, band_width, choose_attention_tiling, tile_keys
from npu_backend.kernels.attention.spec import AttentionSpec
from test_attention import BOUND, _attention_kernels, _reference, _run

op = relax.op


def _decoder_attention(b, h, hk, sq, sk, d, scale, unseen=0.0):
    """HF's eager grouped attention under its causal & padding mask (int64 attention_mask), safe:
    a row that sees no key gives 0, or with `unseen` = c each key's weight there is c
    (where(kept, P, c): a finite mask's split, normalise/finite_masks.py)."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((b, h, sq, d), "float32"))
    k = relax.Var("k", relax.TensorType((b, hk, sk, d), "float32"))
    v = relax.Var("v", relax.TensorType((b, hk, sk, d), "float32"))
    ids = relax.Var("attention_mask", relax.TensorType((b, sk), "int64"))
    causal = np.tril(np.ones((sq, sk), bool), sk - sq).reshape(1, 1, sq, sk)
    g = h // hk
    with bb.function("main", [q, k, v, ids]):
        with bb.dataflow():
            row = bb.emit(op.reshape(bb.emit(op.astype(ids, "bool")), (b, 1, 1, sk)))
            both = bb.emit(op.logical_and(relax.const(causal), row))
            mask = bb.emit(op.where(both, relax.const(np.float32(0)), relax.const(np.float32(-np.inf))))
            kk, vv = k, v
            if g > 1:
                kk, vv = (bb.emit(op.reshape(bb.emit(op.broadcast_to(bb.emit(op.expand_dims(x, [2])),
                                                                    (b, hk, g, sk, d))), (b, h, sk, d))) for x in (k, v))
            s = bb.emit(op.matmul(q, bb.emit(op.permute_dims(kk, [0, 1, 3, 2]))))
            s = bb.emit(op.add(bb.emit(op.multiply(s, relax.const(np.float32(scale)))), mask))
            p = bb.emit(op.nn.softmax(s, axis=-1))
            finite = bb.emit(op.astype(bb.emit(op.not_equal(s, relax.const(-np.inf, "float32"))), "float32"))
            kept = bb.emit(op.greater(bb.emit(op.max(finite, axis=[-1], keepdims=True)), relax.const(0.0, "float32")))
            o = bb.emit_output(op.matmul(bb.emit(op.where(kept, p, relax.const(np.float32(unseen)))), vv))
        bb.emit_func_output(o)
    return bb.get(), causal


@settings(max_examples=10, deadline=None)
@given(b=st.integers(1, 2), kv=st.integers(1, 2), group=st.sampled_from([1, 2, 3]), sq=st.integers(2, 40),
       cache=st.sampled_from([0, 0, 1, 5, 17]), d=st.sampled_from([8, 16, 32, 64, 128]),
       padding=st.sampled_from(["none", "random", "left"]), arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]),
       seed=st.integers(0, 2 ** 16))
@example(b=1, kv=2, group=2, sq=32, cache=0, d=16, padding="left", arch="cgra-8x8", seed=0)  # Llama's shape
@example(b=2, kv=1, group=3, sq=13, cache=5, d=8, padding="left", arch="cgra-4x4", seed=1)
@example(b=1, kv=1, group=1, sq=33, cache=0, d=16, padding="random", arch="cgra-8x8", seed=2)  # a ragged last tile
def test_causal_and_padding_row_attention_matches_float64(b, kv, group, sq, cache, d, padding, arch, seed):
    _check(b, kv, group, sq, cache, d, padding, arch, seed)


@pytest.mark.parametrize("sq, cache", [(128, 0), (96, 32)])
def test_the_key_tile_kernel_takes_the_triangle_and_the_row(sq, cache):
    """Too long for the whole-row kernel on cgra-4x4: the flash kernel, its band of triangles
    and the padding row added to the diagonal tiles, the row alone to the tiles below."""
    spec = AttentionSpec(1, 1, 2, sq, sq + cache, 64, 64, scale=0.125, mask_shape=(1, 1, 1, 1, sq + cache), safe=True,
                         causal=cache)
    assert not isinstance(choose_attention_tiling(spec, npu_backend.load_arch("cgra-4x4")), RowTiling)
    _check(1, 1, 2, sq, cache, 64, "left", "cgra-4x4", 3)


def _check(b, kv, group, sq, cache, d, padding, arch, seed):
    """The decoder attention of these sizes on `arch` against float64 (module docstring)."""
    rng = np.random.default_rng(seed)
    sk, h = sq + cache, kv * group
    scale = float(d) ** -0.5
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in
               ((b, h, sq, d), (b, kv, sk, d), (b, kv, sk, d)))
    ids = np.ones((b, sk), np.int64)
    if padding == "random":
        ids = (rng.random((b, sk)) < 0.7).astype(np.int64) * rng.integers(1, 1 << 40, (b, sk))
    elif padding == "left":  # the first keys padding: the first queries (without a cache) see no key
        ids[:, :min(sk - 1, 3 + cache)] = 0
    mod, causal = _decoder_attention(b, h, kv, sq, sk, d, scale)
    out, prof = _run(mod, [q, k, v, ids], arch)
    kernels = [kernel.name for kernel in prof.kernels]
    assert len(_attention_kernels(prof)) == 1, kernels
    assert not any(name.startswith("fused_relax_add") for name in kernels), kernels  # no s x s mask built
    mask = np.where(causal & (ids != 0)[:, None, None, :], 0, -np.inf)
    expected = _reference(q, k, v, mask, scale, safe=True)
    dead = np.isneginf((np.zeros((b, h, sq, sk)) + mask).max(-1))
    assert np.all(out[dead] == 0)
    assert np.abs(out - expected).max() <= BOUND * max(np.abs(expected).max(), 1e-30)


@pytest.mark.parametrize("sq, cache, tq", [(32, 0, 8), (13, 5, 4), (9, 0, 4), (6, 20, 4)])
def test_each_query_tile_computes_the_keys_up_to_its_diagonal(sq, cache, tq):
    """Query tile r's keys end at its last row's diagonal, its triangle at its first row's."""
    spec = AttentionSpec(1, 1, 1, sq, sq + cache, 16, 16, causal=cache)
    for tile in range(-(-sq // tq)):
        rows = range(tile * tq, (tile + 1) * tq)
        assert tile_keys(spec, tq, tile) == min(sq + cache, rows[-1] + cache + 1)
        seen_by_all = rows[0] + cache + 1  # keys 0 .. rows[0] + cache every row of the tile sees
        assert band_width(spec, tq, tile) == max(0, min(tq - 1, sq + cache - seen_by_all))


def test_llamas_attention_skips_the_masked_keys():
    """Llama's shape at 32 tokens: the whole-row kernel with query tiles shorter than the keys
    (the exps above the diagonal skipped), a group's two heads stacked in an item."""
    arch = npu_backend.load_arch("cgra-8x8")
    spec = AttentionSpec(1, 2, 2, 32, 32, 16, 16, scale=0.25, mask_shape=(1, 1, 1, 1, 32), safe=True, causal=0)
    tiling = choose_attention_tiling(spec, arch)
    assert isinstance(tiling, RowTiling) and tiling.tq < 32 and tiling.stack == 2, tiling


@pytest.mark.parametrize("b, kv, group, sq, cache, d, padding, tq", [
    (1, 2, 2, 32, 0, 16, "left", 4), (2, 1, 3, 13, 5, 8, "random", 4), (1, 1, 4, 9, 0, 32, "left", 8),
    (1, 2, 2, 7, 20, 16, "none", 2)])
def test_stacked_heads_of_a_group(monkeypatch, b, kv, group, sq, cache, d, padding, tq):
    """Items that stack a group's query heads (RowTiling.stack), forced whatever the search says."""
    found = attention_tiles.whole_row_tiling

    def stacked(spec, arch):
        t, rows = found(spec, arch), tq * spec.g
        return dataclasses.replace(t, tq=tq, mp=-(-spec.sq // tq) * tq, stack=spec.g,
                                   q_stride=a_row_stride(rows, spec.d, 4, arch), p_stride=a_row_stride(rows, spec.sk, 4, arch),
                                   sums_on_pe=attention_tiles.sums_on_pe(spec, arch, rows))
    monkeypatch.setattr(attention_tiles, "whole_row_tiling", stacked)
    monkeypatch.setenv("CGRA_KERNEL_CACHE", "off")  # the session's cache holds the search's kernels
    _check(b, kv, group, sq, cache, d, padding, "cgra-8x8", 5)


def test_a_triangle_no_kernel_can_follow_keeps_the_square_mask():
    """317 queries (a prime) of 64 dims on cgra-4x4: no whole-row tile fits, and no key tile
    follows the diagonal; the mask stays one s x s operand, which the key-tile kernel reads, rather
    than an attention no kernel takes (its softmax and where on the host)."""
    mod, _ = _decoder_attention(1, 2, 2, 317, 317, 64, 0.125)
    placements = npu_backend.explain(mod, "cgra-4x4")
    host = [p.op for p in placements if p.where == "host" and p.op not in ("reshape", "memory.view")]
    attentions = {p.kernel.split(" ")[0] for p in placements if "attention" in p.kernel}
    assert not host and attentions == {"cgra.attention_scale_mask_safe"}, (host, attentions)
