"""The causal whole-row kernel's exps over each row's visible keys only, into P per query tile
(kernels/attention/diagonal_exps.py, rows.py): every visible entry exp'd, every skipped one
masked (its P +0 from the buffer's fill); the outputs bit for bit those of the single exp over
the item's keys, and within test_attention's bound of float64.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import npu_backend
from npu_backend.kernels import registry
from npu_backend.kernels.attention import attention_tiles
from npu_backend.kernels.attention.attention_tiles import RowTiling, choose_attention_tiling, estimate_attention_cycles
from npu_backend.kernels.attention.diagonal_exps import applies, exp_groups, group_keys
from npu_backend.kernels.attention.spec import AttentionSpec
from npu_backend.target import relax_ext
from test_attention import BOUND, _reference, _run
from test_attention_causal_rows import _decoder_attention


@given(tq=st.integers(1, 40), stack=st.sampled_from([1, 2, 3, 4]), c=st.integers(0, 9), sk=st.integers(1, 80),
       tile=st.integers(0, 5))
def test_the_groups_cover_every_visible_entry_and_skip_only_masked_ones(tq, stack, c, sk, tile):
    """Each row of each stacked head: the groups' commands cover exactly its keys up to its own
    diagonal, plus (in a pair's first row) masked ones; what no command covers is masked."""
    spec = AttentionSpec(1, 1, stack, tq * (tile + 1), sk, 8, 8, causal=c)
    covered = np.zeros((stack * tq, sk), int)
    for first, rows, stride, last in exp_groups(tq, stack):
        keys = group_keys(spec, tq, tile, last)
        for r in range(rows):
            row = first + r * stride
            covered[row, :keys] += 1
            assert last == row % tq or (stack == 1 and last == row % tq + 1)
    for row in range(stack * tq):
        sees = min(sk, tile * tq + row % tq + c + 1)  # keys j <= i + c
        assert np.all(covered[row, :sees] == 1), (row, covered[row])
        assert np.all(covered[row, sees:] <= 1)
    if stack > 1:  # row i of every head: no masked entry exp'd
        assert covered.sum() == sum(min(sk, tile * tq + i % tq + c + 1) for i in range(stack * tq))


def test_bloom_takes_the_diagonal_exps_on_cgra_8x8():
    """bench_transformers' Bloom (a row per head, 8-row tiles) at 32 tokens: the search takes the
    diagonal exps, estimated cheaper than the single exp (Llama's stacked 4-row items: the search keeps the
    single exp: a short command on the lanes costs the exp's pipeline steps a lane, which its
    2-row commands of a few keys pay more than the masked entries saved)."""
    arch = npu_backend.load_arch("cgra-8x8")
    bloom = AttentionSpec(1, 4, 1, 32, 32, 16, 16, scale=0.25, mask_shape=(1, 4, 1, 1, 32), safe=True, causal=0,
                          unseen=1 / 32)
    t = choose_attention_tiling(bloom, arch)
    assert isinstance(t, RowTiling) and t.diagonal and applies(bloom, t.tq), t
    assert estimate_attention_cycles(bloom, arch, t) < estimate_attention_cycles(
        bloom, arch, dataclasses.replace(t, diagonal=False))
    llama = AttentionSpec(1, 2, 2, 32, 32, 16, 16, scale=0.25, mask_shape=(1, 1, 1, 1, 32), safe=True, causal=0)
    t = choose_attention_tiling(llama, arch)
    assert estimate_attention_cycles(llama, arch, t) <= \
        estimate_attention_cycles(llama, arch, dataclasses.replace(t, diagonal=not t.diagonal))


def _forced(monkeypatch, diagonal: bool, tq: int):
    """The search's tiling with tq rows and `diagonal` forced (its other switches as found)."""
    found = attention_tiles.whole_row_tiling

    def forced(spec, arch):
        return dataclasses.replace(found(spec, arch), tq=tq, mp=-(-spec.sq // tq) * tq)
    monkeypatch.setattr(attention_tiles, "whole_row_tiling", forced)
    monkeypatch.setattr(attention_tiles, "diagonal_tiling", lambda spec, arch, t: dataclasses.replace(t, diagonal=diagonal))


def _decoder(b, kv, group, sq, cache, d, seed, padding):
    rng = np.random.default_rng(seed)
    sk, h = sq + cache, kv * group
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in
               ((b, h, sq, d), (b, kv, sk, d), (b, kv, sk, d)))
    ids = np.ones((b, sk), np.int64)
    if padding:
        ids[:, :min(sk - 1, 3 + cache)] = 0  # left padding: the first queries see no key
    mod, causal = _decoder_attention(b, h, kv, sq, sk, d, float(d) ** -0.5, unseen=0.25 if padding else 0.0)
    return mod, [q, k, v, ids], causal, ids


@pytest.mark.slow
@settings(max_examples=4, deadline=None)
@given(kv=st.integers(1, 2), group=st.sampled_from([1, 2]), sq=st.integers(4, 24), cache=st.sampled_from([0, 3]),
       tq=st.sampled_from([4, 8]), padding=st.booleans(), seed=st.integers(0, 2 ** 16))
@example(kv=2, group=1, sq=13, cache=3, tq=4, padding=True, seed=1)  # a ragged last tile
def test_diagonal_exps_give_the_single_exps_bits(kv, group, sq, cache, tq, padding, seed):
    _same_bits(1, kv, group, sq, cache, 16, tq, padding, seed)


@pytest.mark.parametrize("b, kv, group, sq, cache, tq, padding", [(1, 2, 1, 16, 0, 8, True), (2, 1, 2, 9, 2, 4, False)])
def test_diagonal_exps_cases(b, kv, group, sq, cache, tq, padding):
    _same_bits(b, kv, group, sq, cache, 16, tq, padding, 7)


def _same_bits(b, kv, group, sq, cache, d, tq, padding, seed):
    """The attention with the diagonal exps and with the single exp: the same bits, within BOUND
    of float64 (rows that see no key: HF's uniform 0.25 weights, or 0)."""
    mod, arrays, causal, ids = _decoder(b, kv, group, sq, cache, d, seed, padding)
    outs, cycles = [], []
    for diagonal in (True, False):
        relax_ext.clear_kernel_cache()
        registry._TILINGS.clear()  # the process's tiling cache would hand the second run the first's tiling
        with pytest.MonkeyPatch.context() as patch:  # not the fixture: Hypothesis runs examples in one test
            patch.setenv("CGRA_KERNEL_CACHE", "off")
            _forced(patch, diagonal, tq)
            out, prof = _run(mod, arrays, "cgra-8x8")
            outs.append(out)
            cycles.append(prof.total_cycles)
    relax_ext.clear_kernel_cache()
    assert cycles[0] != cycles[1]  # the forced tilings reached the kernels: different commands
    np.testing.assert_array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    mask = np.where(causal & (ids != 0)[:, None, None, :], 0, -np.inf)
    expected = _reference(*arrays[:3], mask, float(d) ** -0.5, safe=True)
    seen = ~np.isneginf((np.zeros(expected.shape[:3] + (mask.shape[-1],)) + mask).max(-1))
    scale = max(np.abs(expected[seen]).max(), 1e-30)
    assert np.abs(outs[0][seen] - expected[seen]).max() <= BOUND * scale


@pytest.mark.parametrize("diagonal", [False, True])
def test_a_stacked_items_estimate_prices_the_p_fill(diagonal):
    """test_length_attention's grouped-query attention at 128 tokens (tq 4, two query heads
    stacked) on cgra-8x8: with the diagonal exps the kernel first fills 32 P buffers of 8 rows
    (4,130 vector cycles, against 222 the exps save). Unpriced, the estimate called the diagonal
    exps 0.5% cheaper (46,640 against 46,874) where they ran 6% dearer (49,609 against 46,784);
    priced, each estimate is within 0.5% of its run and the search keeps the single exp."""
    from test_length_attention import HEADS, KV_HEADS, DEPTH, _projected_attention

    arch = npu_backend.load_arch("cgra-8x8")
    spec = AttentionSpec(1, KV_HEADS, HEADS // KV_HEADS, 128, 128, DEPTH, DEPTH, scale=0.25, causal=0)
    found = choose_attention_tiling(spec, arch)
    assert found.stack == 2 and not found.diagonal, found
    x = np.random.default_rng(0).standard_normal((1, 128, HEADS + 2 * KV_HEADS, DEPTH)).astype(np.float32)
    relax_ext.clear_kernel_cache()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CGRA_KERNEL_CACHE", "off")
        tiling = dataclasses.replace(found, diagonal=diagonal)
        patch.setattr(attention_tiles, "diagonal_tiling", lambda spec, arch, t: tiling)
        patch.setattr(registry, "_TILINGS", {})  # not the tiling an earlier compile chose
        _, prof = _run(_projected_attention(length=128), [x], "cgra-8x8")
    relax_ext.clear_kernel_cache()
    estimate = estimate_attention_cycles(spec, arch, tiling)
    assert abs(estimate - prof.total_cycles) <= 0.005 * prof.total_cycles, (estimate, prof.total_cycles)
