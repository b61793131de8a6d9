"""A static matmul's per-step operand tiles take a third copy where the scratchpad has room
(kernels/gemm/gemm_copies.py, lower/double_buffer.py's BUFFER_COPIES): a load whose round trip
(latency, transfer) is longer than two steps' GEMMs no longer waits for the GEMM two steps back.

End to end on the simulator: results match numpy on every preset; a prefill GEMM on cgra-16x16
(32 tokens, B's tiles as slow to load as to multiply) gets faster; the tile search's estimate of the
kernel it chose stays the simulator's cycles within its error bound.
"""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings, strategies as st

import npu_backend
from npu_backend.kernels import registry
from npu_backend.kernels.gemm import gemm, gemm_copies
from npu_backend.kernels.gemm.gemm_estimate import estimate_cycles
from npu_backend.target import relax_ext
from npu_backend.tools.workloads import matmul_model, mismatch, run


def _cycles(m, n, k, residual, arch):
    mod, inputs, ref = matmul_model(m, n, k, bias=False, relu=False, residual=residual)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    assert mismatch(out, ref, "float32") is None
    return prof.total_cycles


def _fresh(monkeypatch):
    monkeypatch.setattr(gemm, "_TILINGS", {})
    monkeypatch.setattr(registry, "_TILINGS", {})
    monkeypatch.setenv("CGRA_KERNEL_CACHE", "off")
    monkeypatch.setattr(relax_ext, "_KERNEL_CACHE", collections.OrderedDict())


@pytest.mark.parametrize("m, n, k, residual", [(32, 128, 64, False), (32, 256, 64, False)])
def test_a_prefill_gemm_on_cgra_16x16_is_faster_with_a_third_copy(m, n, k, residual, monkeypatch):
    _fresh(monkeypatch)
    three = _cycles(m, n, k, residual, "cgra-16x16")
    tiling = gemm.choose_tiling(m, n, k, "float32", "float32", False, npu_backend.load_arch("cgra-16x16"),
                                has_residual=residual, a_panel=True, pieces=True, more_copies=True)
    assert tiling.operand_copies == 3
    estimate = estimate_cycles(tiling, "float32", 4, 4, npu_backend.load_arch("cgra-16x16"), residual,
                               init_folded=True, a_panel=True, piece_rows=tiling.epilogue_rows)
    assert abs(estimate - three) <= 0.05 * three, (tiling, estimate, three)
    _fresh(monkeypatch)
    monkeypatch.setattr(gemm_copies, "MORE_COPIES", 2)
    two = _cycles(m, n, k, residual, "cgra-16x16")
    assert three < 0.9 * two, (three, two)


@settings(max_examples=8, deadline=None)
@given(m=st.integers(1, 80), n=st.integers(1, 160), k=st.integers(1, 160), residual=st.booleans(),
       arch=st.sampled_from(["cgra-4x4", "cgra-8x8", "cgra-16x16"]))
def test_matmuls_with_more_operand_copies_match_numpy(m, n, k, residual, arch):
    mod, inputs, ref = matmul_model(m, n, k, bias=True, relu=False, residual=residual, seed=m * 1000 + n + k)
    out = run(npu_backend.compile(mod, arch), inputs)
    assert mismatch(out, ref, "float32") is None
