"""The whole-row attention kernel's pipelining and its cheaper forms (kernels/attention/rows.py):
each form gives the bits of the plain one, and the items overlap.

The plain form scales every Q tile and adds the mask by an ELTWISE; the kernel instead scales
by a power of two inside the exp (no mask) or once per K / V head (a mask and a group of query
heads), and accumulates Q Kᵀ onto a copy of a mask of whole tiles. Each of these rounds as the
plain form does, so the outputs are compared bit for bit, not within a bound.
"""

from __future__ import annotations

import numpy as np
import pytest

import npu_backend
from npu_backend.kernels import registry
from npu_backend.kernels.attention import attention_tiles, rows
from npu_backend.target import relax_ext
from npu_backend.kernels.attention.flash_tiles import FlashTiling
from npu_backend.kernels.attention.spec import AttentionSpec
from test_attention import BOUND, _graph, _reference, _run


def _inputs(b, h, hk, s, d, mask_shape, seed):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((b, h, s, d)).astype(np.float32),
              *(rng.standard_normal((b, hk, s, d)).astype(np.float32) for _ in range(2))]
    if mask_shape:
        mask = np.where(rng.random(mask_shape) < 0.4, -np.inf, rng.standard_normal(mask_shape)).astype(np.float32)
        mask[..., 0] = 0.5
        arrays.append(mask)
    return arrays


def _plain(monkeypatch):
    """The plain form: every Q tile scaled, the mask added by an ELTWISE (held whole: the tiling
    searched again, a mask of the fast form's loaded into S, scores_mask.py, is not added so)."""
    monkeypatch.setattr(rows, "scale_at", lambda spec: None if spec.scale is None else "q")
    monkeypatch.setattr(rows, "mask_in_gemm", lambda spec: False)
    monkeypatch.setattr(attention_tiles, "mask_in_gemm", lambda spec: False)
    monkeypatch.setattr(registry, "_TILINGS", {})


@pytest.mark.parametrize("h, hk, mask, safe, d", [(4, 2, "tile", True, 16), (4, 4, "none", False, 16),
                                                  (2, 1, "tile", False, 64), (3, 3, "heads", True, 8)])
def test_the_cheaper_forms_give_the_plain_forms_bits(monkeypatch, h, hk, mask, safe, d):
    """A power-of-two scale (d 16, 64) in the exp or on Kᵀ, a mask in the GEMM: the same bits; a
    scale that is no power of two (d 8) stays on Q."""
    monkeypatch.setenv("CGRA_KERNEL_CACHE", "off")
    relax_ext.clear_kernel_cache()
    s, arch = 24, npu_backend.load_arch("cgra-8x8")
    mask_shape = {"tile": (1, 1, s, s), "heads": (1, h, s, s), "none": None}[mask]
    arrays = _inputs(2, h, hk, s, d, mask_shape, seed=h + d)
    mod = _graph(2, h, hk, s, s, d, d ** -0.5, mask_shape, None, safe)
    fast, prof = _run(mod, arrays, arch)
    relax_ext.clear_kernel_cache()
    _plain(monkeypatch)
    plain, plain_prof = _run(mod, arrays, arch)
    relax_ext.clear_kernel_cache()  # the plain kernels are no one else's
    np.testing.assert_array_equal(fast.view(np.uint32), plain.view(np.uint32))
    assert prof.total_cycles < plain_prof.total_cycles


def test_the_items_overlap_and_the_vector_unit_hardly_waits():
    """Llama's attention at 32 tokens (4 query heads, 2 K / V heads of 16 dims, a causal mask
    input) on cgra-8x8: 10,606 cycles with the items one after the other, 7,720 pipelined, 7,203
    with the row sums on the PE array (the last item's on the vector unit, beside its P V GEMM),
    6,032 with the lanes taking a share of the exps beside the function unit (function_unit.split).
    The vector unit waits 531 cycles, all for the first item's loads and GEMM: a fixed start-up,
    so it is bounded in cycles, not as a share of a kernel that keeps getting shorter."""
    arrays = _inputs(1, 4, 2, 32, 16, (1, 1, 32, 32), seed=0)
    _, prof = _run(_graph(1, 4, 2, 32, 32, 16, 0.25, (1, 1, 32, 32), None, True), arrays,
                   npu_backend.load_arch("cgra-8x8"))
    (kernel,) = prof.kernels
    assert kernel.cycles <= 6_200
    assert kernel.stall_cycles["vector"] < 600
    assert kernel.dma_load_bytes + kernel.dma_store_bytes == sum(x.nbytes for x in arrays) + arrays[0].nbytes


def test_one_copy_of_k_and_v_loads_the_next_head_after_the_last_item_of_this_one():
    """300 tokens of 32 dims, two K / V heads on cgra-8x8: two copies of K and V do not fit, so
    the next head's load must wait for this head's last P V GEMM (it once came before it in the
    stream, and the last query tile of head 0 read head 1's V: off by 0.57)."""
    spec = AttentionSpec(1, 2, 1, 300, 300, 32, 32, 32 ** -0.5)
    tiling = attention_tiles.choose_attention_tiling(spec, npu_backend.load_arch("cgra-8x8"))
    assert isinstance(tiling, attention_tiles.RowTiling) and tiling.kv_copies == 1
    arrays = _inputs(1, 2, 2, 300, 32, None, seed=2)
    out, _ = _run(_graph(1, 2, 2, 300, 300, 32, 32 ** -0.5), arrays, npu_backend.load_arch("cgra-8x8"))
    expected = _reference(*arrays, None, 32 ** -0.5, safe=False)
    assert np.abs(out - expected).max() <= BOUND * np.abs(expected).max()


def test_the_key_tiles_overlap():
    """150 queries over 301 keys of 64 dims on cgra-4x4 run over key tiles (flash.py): the next
    tile's Q Kᵀ on the PE array under this tile's softmax on the vector unit (1,641,923 cycles
    with the tiles one after the other, about the two units' busy cycles added up)."""
    arch = npu_backend.load_arch("cgra-4x4")
    spec = AttentionSpec(1, 2, 1, 150, 301, 64, 64, 0.125, (1, 1, 1, 1, 301), safe=True)
    tiling = attention_tiles.choose_attention_tiling(spec, arch)
    assert isinstance(tiling, FlashTiling) and spec.sk // tiling.tk >= 2
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, s, 64)).astype(np.float32) for s in (150, 301, 301))
    mask = np.where(rng.random((1, 1, 1, 301)) < 0.3, -np.inf, 0).astype(np.float32)
    out, prof = _run(_graph(1, 2, 2, 150, 301, 64, 0.125, mask.shape, None, True), [q, k, v, mask], arch)
    (kernel,) = prof.kernels
    assert kernel.cycles < 0.8 * (kernel.busy_cycles["compute"] + kernel.busy_cycles["vector"])
    expected = _reference(q, k, v, mask, 0.125, safe=True)
    assert np.abs(out - expected).max() <= BOUND * np.abs(expected).max()
