"""The key-tile (flash) attention kernel (kernels/attention/flash.py, flash_tiles.py) against numpy
in float64: random lengths, head dims, groups, masks (none, a constant causal tile, a run-time
tile with whole rows and whole key tiles of -inf, a padding row), safe and plain softmaxes, and
scratchpads of several sizes, so that the tile search picks many query and key tile sizes (a last
key tile shorter than the others, a last query tile cut).

Stated bound: the output within 4e-6 of the largest |O|, as the whole-row kernel's (measured up
to 1.2e-6 at 512 keys in 16 tiles without a mask, 1.3e-7 at 2048 causal keys in 512 tiles: the
online softmax's rescales add a rounding per key tile to O and the sum, each by a factor at most
1). Under a constant causal mask the kernel builds the mask and skips the tiles above the
diagonal (the bytes asserted). A row whose every score is
-inf gives exactly 0 under a safe softmax and NaN under a plain one, also when only its first key
tiles are -inf (those give exp(0) = 1 as the rescale, not NaN).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import npu_backend
from npu_backend.errors import ScratchpadTooSmall
from npu_backend.kernels.attention import attention_tiles
from npu_backend.kernels.attention.attention_tiles import RowTiling, choose_attention_tiling, whole_row_dma_bytes
from npu_backend.kernels.attention.flash_tiles import BYTES_SLACK, FlashTiling, flash_dma_bytes
from npu_backend.kernels.attention.spec import AttentionSpec
from test_attention import BOUND, _attention_kernels, _graph, _reference, _run

#: Scratchpad sizes no other test compiles for (the kernel cache's key holds the chip, not the
#: tiling), from a few query rows a tile to many.
SPADS = (24 * 1024, 40 * 1024, 96 * 1024)


def _chip(spad: int):
    return dataclasses.replace(npu_backend.load_arch("cgra-4x4"), name=f"cgra-4x4-spad{spad}", spad_bytes=spad)


@pytest.fixture
def flash_only(monkeypatch):
    """The whole-row kernel refused: every attention runs over key tiles (for every example:
    nothing in the test undoes it)."""
    def refuse(spec, arch):
        raise ScratchpadTooSmall("the test takes the key-tile kernel")
    monkeypatch.setattr(attention_tiles, "whole_row_tiling", refuse)
    npu_backend.kernels.registry._TILINGS.clear()
    yield
    npu_backend.kernels.registry._TILINGS.clear()


def _inputs(rng, b, h, kv, sq, sk, d):
    return [rng.standard_normal(shape).astype(np.float32) for shape in ((b, h, sq, d), (b, kv, sk, d), (b, kv, sk, d))]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(b=st.integers(1, 2), kv=st.integers(1, 2), group=st.sampled_from([1, 2]), sq=st.integers(1, 70),
       sk=st.integers(2, 90), d=st.sampled_from([16, 32, 64]), mask=st.sampled_from(["none", "causal", "tile", "row"]),
       safe=st.booleans(), spad=st.sampled_from(SPADS), seed=st.integers(0, 2 ** 16))
def test_flash_kernel_matches_float64(flash_only, b, kv, group, sq, sk, d, mask, safe, spad, seed):
    rng = np.random.default_rng(seed)
    h, scale, arch = kv * group, float(d) ** -0.5, _chip(spad)
    arrays, mask_value, mask_shape, mask_const = _inputs(rng, b, h, kv, sq, sk, d), None, None, None
    if mask == "causal":  # a constant, -inf above the diagonal (each row keeps its first key)
        mask_const = mask_value = np.triu(np.full((sq, sk), -np.inf, np.float32), 1)[None, None]
    elif mask == "tile":  # run time, per head: some rows all -inf, some leading keys -inf
        mask_shape = (b, h, sq, sk)
        mask_value = np.where(rng.random(mask_shape) < 0.3, -np.inf, 0).astype(np.float32)
        mask_value[..., : rng.integers(0, sk)] = -np.inf
        mask_value[..., rng.integers(0, sq), :] = -np.inf
        arrays.append(mask_value)
    elif mask == "row":  # a run-time padding row per batch, additive (HF's finfo.min form)
        mask_shape = (b, 1, 1, sk)
        mask_value = np.where(rng.random(mask_shape) < 0.3, np.finfo(np.float32).min, 0).astype(np.float32)
        arrays.append(mask_value)
    out, prof = _run(_graph(b, h, kv, sq, sk, d, scale, mask_shape, mask_const, safe=safe), arrays, arch)
    assert len(_attention_kernels(prof)) == 1, [kernel.name for kernel in prof.kernels]
    expected = _reference(*arrays[:3], mask_value, scale, safe)
    assert np.array_equal(np.isnan(out), np.isnan(expected))
    live = ~np.isnan(expected)
    if safe:
        assert not np.isnan(out).any()
    if live.any():
        assert np.abs(out[live] - expected[live]).max() <= BOUND * max(np.abs(expected[live]).max(), 1e-30)


def test_leading_key_tiles_of_minus_infinity_and_dead_rows(flash_only):
    """Left padding: a row's first key tiles all -inf (alpha would be exp(-inf + inf) = NaN with
    the max starting at -inf), and a row with no key: 0 (safe) or NaN (plain), as PyTorch."""
    rng = np.random.default_rng(7)
    b, h, sq, sk, d = 1, 2, 24, 80, 32
    q, k, v = _inputs(rng, b, h, h, sq, sk, d)
    mask = np.zeros((b, 1, sq, sk), np.float32)
    mask[..., :50] = -np.inf  # the first 50 keys hidden from every row
    mask[..., 5, :] = -np.inf  # row 5 sees nothing
    arch = _chip(SPADS[0])
    for safe in (True, False):
        out, prof = _run(_graph(b, h, h, sq, sk, d, 0.25, mask.shape, safe=safe), [q, k, v, mask], arch)
        tiling = choose_attention_tiling(AttentionSpec(b, h, 1, sq, sk, d, d, 0.25, (1, 1, 1, sq, sk), safe), arch)
        assert isinstance(tiling, FlashTiling) and tiling.tk < 50, tiling
        assert (np.all(out[:, :, 5] == 0) if safe else np.all(np.isnan(out[:, :, 5])))
        live = np.arange(sq) != 5
        expected = _reference(q, k, v, mask, 0.25, safe)
        assert np.abs(out[:, :, live] - expected[:, :, live]).max() <= BOUND * np.abs(expected[:, :, live]).max()


@pytest.mark.parametrize("masked", [False, True])
def test_dma_bytes_are_the_estimate(masked):
    """Q and O once, K and V once per query tile and head, a mask shared by the heads once
    (its rows held for the heads of a query tile) or once per head (blocks)."""
    rng = np.random.default_rng(3)
    b, h, s, d = 1, 2, 200, 64  # a K / V head of 100 KiB: more than the whole scratchpad
    arch = npu_backend.load_arch("cgra-4x4")
    arrays = _inputs(rng, b, h, h, s, s, d)
    if masked:
        arrays.append(np.triu(np.full((s, s), -np.inf, np.float32), 1)[None, None])
    out, prof = _run(_graph(b, h, h, s, s, d, 0.2, arrays[3].shape if masked else None), arrays, arch)
    spec = AttentionSpec(b, h, 1, s, s, d, d, 0.2, (1, 1, 1, s, s) if masked else (), param_roles=())
    tiling = choose_attention_tiling(spec, arch)
    (kernel,) = _attention_kernels(prof)
    assert isinstance(tiling, FlashTiling)
    assert kernel.dma_load_bytes + kernel.dma_store_bytes == flash_dma_bytes(spec, tiling)
    expected = _reference(*arrays[:3], arrays[3] if masked else None, 0.2, safe=False)
    assert np.abs(out - expected).max() <= BOUND * np.abs(expected).max()


def test_the_tile_search_takes_the_kernel_moving_fewer_bytes():
    """128 tokens keep the whole-row kernel (everything once); 512 tokens on cgra-8x8 (a K / V
    head is the whole scratchpad) run over key tiles, the tiling of fewest cycles among those
    within BYTES_SLACK of the fewest bytes (K and V twice: the narrowest key tiles' many short
    commands cost more time than the bytes they save); on cgra-16x16 the kernel taken never moves
    more bytes than the whole-row kernel would."""
    def spec(s, masked):
        return AttentionSpec(1, 4, 1, s, s, 64, 64, 0.125, (1, 1, 1, s, s) if masked else ())

    for chip in ("cgra-8x8", "cgra-16x16"):
        assert not isinstance(choose_attention_tiling(spec(128, True), npu_backend.load_arch(chip)), FlashTiling)
    t8 = choose_attention_tiling(spec(512, False), npu_backend.load_arch("cgra-8x8"))
    once = 4 * 512 * 64 * 4 * 2  # Q and O, or K and V, of 4 heads
    assert isinstance(t8, FlashTiling) and 3 * once <= t8.dma_bytes <= (1 + BYTES_SLACK) * 3 * once
    arch16 = npu_backend.load_arch("cgra-16x16")
    t16 = choose_attention_tiling(spec(512, True), arch16)
    rows = attention_tiles.whole_row_tiling(spec(512, True), arch16)
    whole_row = attention_tiles.whole_row_dma_bytes(spec(512, True), rows)
    # (the whole-row kernel may put a share of its exps on the fabric: the same bytes)
    assert (t16.dma_bytes < whole_row) if isinstance(t16, FlashTiling) else \
        t16 == dataclasses.replace(rows, fabric_rows=t16.fabric_rows)
    assert not isinstance(choose_attention_tiling(spec(512, False), npu_backend.load_arch("cgra-16x16")), FlashTiling)


def test_nothing_fits_refuses_with_the_reason():
    """Head dims of 4096 on cgra-4x4: two keys' K and V tiles alone overflow its 64 KiB."""
    with pytest.raises(ScratchpadTooSmall, match="K and V tiles"):
        choose_attention_tiling(AttentionSpec(1, 1, 1, 8, 8, 4096, 4096), npu_backend.load_arch("cgra-4x4"))


@pytest.mark.slow
def test_a_long_sequence_on_a_small_chip():
    """2048 tokens of 64 dims on cgra-4x4 (one K / V head is twice its scratchpad): one kernel,
    the bound held over 256 key tiles."""
    rng = np.random.default_rng(11)
    s, d = 2048, 64
    arrays = _inputs(rng, 1, 1, 1, s, s, d)
    arrays.append(np.triu(np.full((s, s), -np.inf, np.float32), 1)[None, None])
    out, prof = _run(_graph(1, 1, 1, s, s, d, 0.125, arrays[3].shape), arrays, "cgra-4x4")
    assert len(_attention_kernels(prof)) == 1
    expected = _reference(*arrays, 0.125, safe=False)
    assert np.abs(out - expected).max() <= BOUND * np.abs(expected).max()


@pytest.mark.parametrize("sq, sk, chip", [(64, 64, "cgra-4x4"), (48, 112, "cgra-4x4"), (512, 512, "cgra-8x8"),
                                          (256, 256, "cgra-4x4")])
def test_a_constant_causal_mask_is_built_and_its_masked_tiles_skipped(sq, sk, chip):
    """torch's is_causal (top-left, Sq = Sk) and the last Sq queries of Sk keys (bottom-right):
    no mask operand (the kernel builds the diagonal tiles' triangles). The key-tile kernel reads
    K and V only up to each query tile's diagonal: fewer bytes than one pass over them per query
    tile; the whole-row kernel (where its K and V fit: it reads them once, which moves fewer
    bytes) computes each query tile's keys up to its diagonal (test_attention_causal_rows.py)."""
    rng = np.random.default_rng(sq)
    h, d = 2, 32
    arrays = _inputs(rng, 1, h, h, sq, sk, d)
    mask = np.triu(np.full((sq, sk), -np.inf, np.float32), 1 + sk - sq)[None, None]
    out, prof = _run(_graph(1, h, h, sq, sk, d, 0.2, mask_const=mask), arrays, chip)
    (kernel,) = _attention_kernels(prof)
    spec = AttentionSpec(1, h, 1, sq, sk, d, d, 0.2, causal=sk - sq)
    tiling = choose_attention_tiling(spec, npu_backend.load_arch(chip))
    moved = kernel.dma_load_bytes + kernel.dma_store_bytes
    if isinstance(tiling, RowTiling):
        assert tiling.mask == "none" and moved == whole_row_dma_bytes(spec, tiling) == sum(x.nbytes for x in arrays) + arrays[0].nbytes
    else:
        assert tiling.mask == "causal" and moved == flash_dma_bytes(spec, tiling)
        every_tile = -(-sq // tiling.tq) * sum(x.nbytes for x in arrays[1:]) + 2 * arrays[0].nbytes
        assert moved < every_tile if sq > tiling.tq else moved == every_tile
    assert isinstance(tiling, RowTiling) == (chip != "cgra-4x4" or sq < 256)
    expected = _reference(*arrays, mask, 0.2, safe=False)
    assert np.abs(out - expected).max() <= BOUND * np.abs(expected).max()


def test_causal_offset_reads_only_a_causal_triangle():
    from npu_backend.normalise.attentions import causal_offset

    triangle = np.triu(np.full((4, 6), -np.inf, np.float32), 3)
    assert causal_offset(triangle, 4, 6) == 2 and causal_offset(triangle[None, None], 4, 6) == 2
    assert causal_offset(np.where(np.isinf(triangle), np.float32(-1e9), 0).astype(np.float32), 4, 6) is None
    assert causal_offset(np.tril(np.full((4, 6), -np.inf, np.float32), -1), 4, 6) is None
    assert causal_offset(np.zeros((4, 6), np.float32), 4, 6) is None


def test_a_causal_mask_the_key_tiles_cannot_follow_is_read_as_a_mask():
    """Three queries over two keys under torch's top-left triangle: the last query tile's diagonal
    passes the last key, so the mask stays an operand of the kernel (the failing input of the
    first causal version: a DMA past K)."""
    rng = np.random.default_rng(5)
    arrays = _inputs(rng, 1, 1, 1, 3, 2, 16)
    mask = np.triu(np.full((3, 2), -np.inf, np.float32), 1)[None, None]
    out, prof = _run(_graph(1, 1, 1, 3, 2, 16, 0.25, mask_const=mask), arrays, "cgra-4x4")
    assert len(_attention_kernels(prof)) == 1
    expected = _reference(*arrays, mask, 0.25, safe=False)
    assert np.abs(out - expected).max() <= BOUND * np.abs(expected).max()
