"""A mask of whole tiles loaded by the DMA into each item's S instead of held whole and copied
(kernels/attention/scores_mask.py, rows.py): the same values reach S, so the outputs are bit for
bit those of the copy, and within test_attention's bound of float64; ragged last query tiles
(zero rows), a mask per head or per batch and head, any share of the exps on the fabric; a mask
shared by the heads stays loaded once (test_attention.test_the_scores_never_reach_dram).
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

import npu_backend
from npu_backend.kernels.attention import attention_tiles, scores_mask
from npu_backend.kernels.attention.attention_tiles import choose_attention_tiling, estimate_attention_cycles
from npu_backend.kernels.attention.spec import AttentionSpec
from attention_tilings import compiled_afresh
from test_attention import BOUND, _graph, _reference, _run


@contextlib.contextmanager
def _forced(in_scores: bool, tq: int, fabric_rows: int):
    """The search's tiling with tq query rows, the mask loaded into S or held whole, and
    `fabric_rows` rows on the fabric, compiled afresh (the caches' keys are the spec's)."""
    found = attention_tiles.whole_row_tiling

    def rows(spec, arch):
        t = found(spec, arch)
        return dataclasses.replace(t, tq=min(tq, spec.sq), mp=-(-spec.sq // min(tq, spec.sq)) * min(tq, spec.sq))

    def mask(spec, arch, t):
        return dataclasses.replace(t, mask=scores_mask.MODE) if in_scores and scores_mask.applies(spec, t, True) else t

    with compiled_afresh(whole_row_tiling=rows, scores_mask_tiling=mask,
                         fabric_tiling=lambda spec, arch, t: dataclasses.replace(t, fabric_rows=min(fabric_rows, t.rows))):
        yield


@settings(max_examples=5, deadline=None)
@given(b=st.integers(1, 3), h=st.sampled_from([2, 3]), sq=st.integers(2, 20), sk=st.integers(2, 20),
       tq=st.sampled_from([2, 4, 8, 16]), per=st.sampled_from(["head", "batch and head"]),
       fabric_rows=st.integers(0, 4), seed=st.integers(0, 2 ** 16))
@example(b=2, h=2, sq=16, sk=16, tq=16, per="head", fabric_rows=6, seed=0)  # Swin's windows
@example(b=2, h=2, sq=11, sk=7, tq=4, per="batch and head", fabric_rows=0, seed=1)  # ragged: zero rows past sq
def test_the_mask_loaded_into_s_gives_the_copys_bits(b, h, sq, sk, tq, per, fabric_rows, seed):
    rng = np.random.default_rng(seed)
    d = 16
    q = rng.standard_normal((b, h, sq, d)).astype(np.float32)
    k, v = (rng.standard_normal((b, h, sk, d)).astype(np.float32) for _ in range(2))
    shape = (1, h, sq, sk) if per == "head" else (b, h, sq, sk)
    mask = rng.standard_normal(shape).astype(np.float32)
    mask[..., 1:][rng.random(shape[:-1] + (sk - 1,)) < 0.2] = -np.inf  # key 0 kept in every row
    mod = _graph(b, h, h, sq, sk, d, 0.25, mask_shape=shape)
    outs = {}
    for in_scores in (True, False):
        with _forced(in_scores, tq, fabric_rows):
            outs[in_scores], prof = _run(mod, [q, k, v, mask], "cgra-8x8")
        vfuncs = sum(kernel.op_counts["VFUNC"] for kernel in prof.kernels)
        outs[(in_scores, "vfuncs")] = vfuncs
    assert outs[(True, "vfuncs")] < outs[(False, "vfuncs")]  # the copies gone
    np.testing.assert_array_equal(outs[True], outs[False])
    expected = _reference(q, k, v, mask, 0.25, safe=False)
    assert np.abs(outs[True] - expected).max() <= BOUND * np.abs(expected).max()


def test_swin_windows_load_their_bias_into_s():
    """Swin's first stage on cgra-8x8 (the vector unit the busier unit): the bias is loaded into
    S per item, priced cheaper than held whole and copied."""
    arch = npu_backend.load_arch("cgra-8x8")
    swin = AttentionSpec(16, 2, 1, 16, 16, 8, 8, mask_shape=(1, 2, 1, 16, 16))
    t = choose_attention_tiling(swin, arch)
    assert t.mask == scores_mask.MODE, t
    assert estimate_attention_cycles(swin, arch, t) < estimate_attention_cycles(
        swin, arch, dataclasses.replace(t, mask="whole"))
    shared = dataclasses.replace(swin, mask_shape=(1, 1, 1, 16, 16))
    assert choose_attention_tiling(shared, arch).mask == "whole"
