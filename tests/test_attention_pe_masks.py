"""The whole-row attention kernel's work on the PE array (kernels/attention/rows.py): the row sums
as a GEMM P 1, a mask row (per key) or column (per query) added by a GEMM of k = 1 accumulating
onto the scores, against numpy in float64.

Hypothesis over batches, K / V heads, groups, lengths, head dims, safe and plain softmaxes and
masks of -inf and HF's finfo.min, with rows that see no key (a column of -inf, or a padding row
of -inf: every query of that batch): those give 0 under a safe softmax and NaN under a plain one,
the others within test_attention's bound.
"""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

import npu_backend
from npu_backend.kernels.attention.attention_tiles import RowTiling, choose_attention_tiling, mask_on_pe
from npu_backend.kernels.attention.spec import AttentionSpec
from test_attention import BOUND, _attention_kernels, _graph, _reference, _run

FLT_MIN = np.finfo(np.float32).min


def _mask(rng, shape, kind: str, dead: bool):
    """A mask of `shape`: 0, -inf or finfo.min entries; `dead` makes one whole line -inf."""
    value = -np.inf if kind == "inf" else FLT_MIN
    mask = np.where(rng.random(shape) < 0.35, value, 0).astype(np.float32)
    if dead:
        mask[0] = -np.inf  # the first batch's row, or the column's first entries
        if mask.shape[-1] == 1:
            mask[...] = np.where(np.arange(mask.shape[-2])[:, None] % 3 == 0, -np.inf, mask)
    return mask


@settings(max_examples=8, deadline=None)
@given(b=st.integers(1, 2), kv=st.integers(1, 2), group=st.sampled_from([1, 2, 3]), sq=st.integers(1, 33),
       sk=st.integers(2, 33), d=st.sampled_from([8, 16, 32]), axis=st.sampled_from(["row", "column"]),
       kind=st.sampled_from(["inf", "min"]), dead=st.booleans(), safe=st.booleans(),
       arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]), seed=st.integers(0, 2 ** 16))
@example(b=2, kv=1, group=2, sq=5, sk=7, d=16, axis="row", kind="inf", dead=True, safe=True, arch="cgra-8x8", seed=1)
@example(b=1, kv=2, group=1, sq=9, sk=4, d=8, axis="column", kind="inf", dead=True, safe=False, arch="cgra-4x4",
         seed=2)
def test_row_and_column_masks_and_row_sums_on_the_pe_array(b, kv, group, sq, sk, d, axis, kind, dead, safe, arch,
                                                          seed):
    rng = np.random.default_rng(seed)
    h, scale = kv * group, float(d) ** -0.5
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in
               ((b, h, sq, d), (b, kv, sk, d), (b, kv, sk, d)))
    mask = _mask(rng, (b, 1, 1, sk) if axis == "row" else (b, 1, sq, 1), kind, dead)
    out, prof = _run(_graph(b, h, kv, sq, sk, d, scale, mask.shape, None, safe), [q, k, v, mask], arch)
    assert len(_attention_kernels(prof)) == 1, [kernel.name for kernel in prof.kernels]
    expected = _reference(q, k, v, mask, scale, safe)
    dead_rows = np.isneginf((np.zeros((b, h, sq, sk)) + mask).max(-1))
    if safe:
        assert np.all(out[dead_rows] == 0)
    else:
        assert np.all(np.isnan(out[dead_rows]))
    live = ~dead_rows
    if live.any():
        assert np.abs(out[live] - expected[live]).max() <= BOUND * max(np.abs(expected[live]).max(), 1e-30)


def test_a_mask_row_or_column_is_the_pe_arrays_and_a_tile_is_not():
    for shape, on_pe in (((1, 1, 1, 1, 32), True), ((1, 1, 1, 32, 1), True), ((1, 1, 1, 32, 32), False),
                         ((1, 1, 1, 1, 1), False)):
        spec = AttentionSpec(1, 2, 2, 32, 32, 16, 16, 0.25, shape, safe=True)
        assert mask_on_pe(spec) == on_pe
        assert isinstance(choose_attention_tiling(spec, npu_backend.load_arch("cgra-8x8")), RowTiling)


def test_a_padding_row_costs_the_vector_unit_nothing():
    """Llama's shapes with a padding row instead of a causal tile (4 query heads, 2 K / V heads of
    16 dims, 32 tokens, cgra-8x8): the row's GEMMs of k = 1 run on the PE array, where its ELTWISE
    add took the vector unit 134 cycles an item: 7,728 -> 6,475 cycles, within 4% of the same
    attention without a mask (6,934 -> 6,264: the row sums' GEMMs; the mask's load and the scale
    on Kᵀ instead of in the exp make the rest)."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((1, 4, 32, 16), (1, 2, 32, 16),
                                                                            (1, 2, 32, 16)))
    mask = np.where(rng.random((1, 1, 1, 32)) < 0.3, -np.inf, 0).astype(np.float32)
    arch = npu_backend.load_arch("cgra-8x8")
    _, masked = _run(_graph(1, 4, 2, 32, 32, 16, 0.25, mask.shape, None, True), [q, k, v, mask], arch)
    _, plain = _run(_graph(1, 4, 2, 32, 32, 16, 0.25, None, None, True), [q, k, v], arch)
    assert masked.kernels[0].cycles <= plain.kernels[0].cycles * 1.04
