"""A safe softmax whose rows that see no key take a weight c for every key, where(kept, P, c)
(normalise/finite_masks.py makes it with c = fl(1 / Sk): HF Bloom's float32-minimum mask, whose
fully masked rows are a uniform softmax over all Sk keys): the whole-row kernel flags those rows
from their max and gives them c 1ᵀ V (kernels/attention/rows.py), the other rows unchanged.

Hypothesis over batches, K / V heads, groups, head dims, lengths with a KV cache, padding (none,
left, random, every key padded) and both chips, against numpy in float64 within test_attention's
bound; a fully masked row exactly the float32 GEMM c 1ᵀ V's value up to summation order.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from test_attention import BOUND, _attention_kernels, _run
from test_attention_causal_rows import _decoder_attention


def _expected(q, k, v, mask, scale, c):
    """where(kept, softmax(q kᵀ scale + mask), c) v in float64, grouped heads."""
    g = q.shape[1] // k.shape[1]
    k, v = (np.repeat(x.astype(np.float64), g, axis=1) for x in (k, v))
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * scale + mask
    top = s.max(-1, keepdims=True)
    dead = np.isneginf(top)
    e = np.exp(s - np.where(dead, 0, top))
    p = np.where(dead, np.float64(c), e / np.where(dead, 1, e.sum(-1, keepdims=True)))
    return p @ v, np.broadcast_to(dead[..., 0], p.shape[:-1])


def _check(b, kv, group, sq, cache, d, padding, arch, seed, one_kernel=True):
    rng = np.random.default_rng(seed)
    sk, h = sq + cache, kv * group
    scale, c = float(d) ** -0.5, np.float32(1) / np.float32(sq + cache)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in
               ((b, h, sq, d), (b, kv, sk, d), (b, kv, sk, d)))
    ids = np.ones((b, sk), np.int64)
    if padding == "random":
        ids = (rng.random((b, sk)) < 0.5).astype(np.int64)
    elif padding == "left":
        ids[:, :min(sk - 1, 3 + cache)] = 0
    elif padding == "all":
        ids[:] = 0
    mod, causal = _decoder_attention(b, h, kv, sq, sk, d, scale, unseen=c)
    out, prof = _run(mod, [q, k, v, ids], arch)
    assert len(_attention_kernels(prof)) == one_kernel, [kernel.name for kernel in prof.kernels]
    mask = np.where(causal & (ids != 0)[:, None, None, :], 0, -np.inf)
    expected, dead = _expected(q, k, v, mask, scale, c)
    assert np.abs(out - expected).max() <= BOUND * max(np.abs(expected).max(), 1e-30)
    if dead.any():  # fl(c v_j) summed: the GEMM's order, a few ulps of the float32 products' sum
        products = (c * np.repeat(v, group, axis=1)).astype(np.float64).sum(-2)  # (b, h, dv)
        rows = np.broadcast_to(products[:, :, None, :], out.shape)[dead]
        assert np.abs(out[dead] - rows).max() <= 1e-6 * max(np.abs(rows).max(), 1e-30)


@settings(max_examples=8, deadline=None)
@given(b=st.integers(1, 2), kv=st.integers(1, 2), group=st.sampled_from([1, 2]), sq=st.integers(2, 40),
       cache=st.sampled_from([0, 0, 3]), d=st.sampled_from([8, 16, 64]),
       padding=st.sampled_from(["none", "left", "random", "all"]), arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]),
       seed=st.integers(0, 2 ** 16))
@example(b=1, kv=4, group=1, sq=32, cache=0, d=16, padding="left", arch="cgra-8x8", seed=0)  # Bloom's shape
@example(b=2, kv=1, group=2, sq=9, cache=0, d=8, padding="all", arch="cgra-8x8", seed=1)
@example(b=1, kv=1, group=1, sq=33, cache=0, d=16, padding="random", arch="cgra-8x8", seed=2)  # a ragged last tile
def test_rows_that_see_no_key_take_c_times_the_sum_of_v(b, kv, group, sq, cache, d, padding, arch, seed):
    _check(b, kv, group, sq, cache, d, padding, arch, seed)


@pytest.mark.slow
def test_too_long_for_the_whole_row_kernel_stays_exact():
    """Over 128 keys on cgra-4x4 the key-tile kernel would be chosen, which gives such rows 0:
    the attention runs as other kernels, the where as written."""
    _check(1, 1, 1, 128, 0, 64, "left", "cgra-4x4", 3, one_kernel=False)
