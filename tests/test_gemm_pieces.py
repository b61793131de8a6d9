"""A prefill-shaped matmul (a few dozen rows) finishes its output tiles in pieces of the PE
array's rows, and may stream shallow reduction steps (kernels/gemm/gemm.py: epilogue_rows,
_in_pieces; lower/hoist_allocs.py gives each piece its own buffer).

End to end on the simulator: results match numpy within float32's rounding (a shallower step
sums the reduction in another order), the chosen tiling beats the one without pieces, and the
last tile's pieces are a pipeline: its GEMMs run in the same pieces of rows (lower/gemm_rows.py),
each EPILOGUE starts when its rows' GEMM and the EPILOGUE before it are done, not after the
store before it; the tile search's estimate is the simulator's cycles.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import npu_backend
from cgra_sim.isa import Op
from cgra_sim.trace import command_args
from models import matmul_model, run
from npu_backend.kernels import registry
from npu_backend.kernels.gemm import gemm
from npu_backend.kernels.gemm.gemm import estimate_cycles
from npu_backend.target import relax_ext


def _profiled(mod, inputs, arch):
    with npu_backend.profile(keep_timelines=True) as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    return out, prof


def _tiling(m, n, k, residual, arch):
    """The tiling the search picks for the model's matmul (its spec as the kernel builds it)."""
    return gemm.choose_tiling(m, n, k, "float32", "float32", False, npu_backend.load_arch(arch),
                              has_residual=residual, a_panel=True, pieces=True)


@pytest.mark.parametrize("arch", ["cgra-4x4", "cgra-8x8"])
def test_a_prefill_matmul_finishes_its_tiles_in_pipelined_pieces(arch, monkeypatch):
    mod, inputs, ref = matmul_model(32, 64, 128, bias=False, relu=False, residual=True)
    out, prof = _profiled(mod, inputs, arch)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
    tiling = _tiling(32, 64, 128, True, arch)
    assert 0 < tiling.epilogue_rows < tiling.tm
    launch, = prof.timelines
    ops = [Op(int(record[0])) for record in launch.commands]
    epilogues = [i for i, op in enumerate(ops) if op == Op.EPILOGUE]
    last = epilogues[-tiling.tm // tiling.epilogue_rows:]  # the last tile's pieces
    starts, ends = launch.timeline.starts, launch.timeline.ends
    gemms = [i for i, op in enumerate(ops) if op == Op.GEMM]
    # its GEMMs in the same pieces (lower/gemm_rows.py): each EPILOGUE starts when its rows' GEMM
    # and the EPILOGUE before it are done, all but the last before the kernel's last GEMM ends
    last_gemms = gemms[-len(last):]
    assert all(starts[e] == max(ends[g], ends[p]) for e, g, p in zip(last[1:], last_gemms[1:], last))
    assert all(starts[e] < ends[gemms[-1]] for e in last[:-1])
    assert sum(op == Op.DMA_STORE for op in ops) == len(epilogues)  # a store per piece

    monkeypatch.setattr(gemm, "finishes_in_pieces", lambda spec, arch: False)
    monkeypatch.setattr(gemm, "_TILINGS", {})
    monkeypatch.setattr(registry, "_TILINGS", {})
    monkeypatch.setenv("CGRA_KERNEL_CACHE", "off")
    monkeypatch.setattr(relax_ext, "_KERNEL_CACHE", collections.OrderedDict())
    whole_out, whole = _profiled(mod, inputs, arch)
    np.testing.assert_allclose(whole_out, ref, rtol=1e-5, atol=1e-4)
    assert prof.total_cycles < whole.total_cycles


@pytest.mark.parametrize("m, n, k, residual", [(32, 64, 128, True), (32, 64, 64, False), (48, 96, 128, False), (64, 64, 256, False)])
def test_the_estimate_in_pieces_is_the_simulators_cycles(m, n, k, residual):
    mod, inputs, _ = matmul_model(m, n, k, bias=False, relu=False, residual=residual)
    _, prof = _profiled(mod, inputs, "cgra-8x8")
    tiling = _tiling(m, n, k, residual, "cgra-8x8")
    estimate = estimate_cycles(tiling, "float32", 4, 4, npu_backend.load_arch("cgra-8x8"), residual,
                               init_folded=True, a_panel=True, piece_rows=tiling.epilogue_rows, as_lowered=True)
    assert abs(estimate - prof.total_cycles) <= 0.015 * prof.total_cycles, (tiling, estimate, prof.total_cycles)


@settings(max_examples=6, deadline=None)
@given(m=st.integers(9, 72), n=st.sampled_from([16, 40, 64, 96]), k=st.sampled_from([16, 48, 64, 128]),
       residual=st.booleans(), relu=st.booleans())
def test_matmuls_in_pieces_match_numpy(m, n, k, residual, relu):
    mod, inputs, ref = matmul_model(m, n, k, bias=True, relu=relu, residual=residual, seed=m * 1000 + n + k)
    out = run(npu_backend.compile(mod, "cgra-8x8"), inputs)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


def test_a_streamed_panel_loads_each_a_step_once_in_the_first_column_tile():
    """32 x 64 x 64 float32 on cgra-8x8 (a transformer's q / o projection at 32 tokens): A's panel
    comes a 16-deep step at a time with the first column tile's B steps (lower/stream_panel.py),
    so the first GEMM waits for one step's B and its first rows of A, and the second column tile
    loads only B."""
    mod, inputs, ref = matmul_model(32, 64, 64, bias=False, relu=False, transposed=True)
    out, prof = _profiled(mod, inputs, "cgra-8x8")
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
    tiling = _tiling(32, 64, 64, False, "cgra-8x8")
    assert tiling.stream_panel and tiling.tk < 64 and tiling.tn < 64
    launch, = prof.timelines
    loads = {}  # slot -> the boxes it loaded, in order (the weight is slot 0: rhs, lhs, out)
    for record in launch.commands:
        if int(record[0]) == Op.DMA_LOAD:
            args = command_args(record)
            loads.setdefault(args["slot"], []).append(tuple(args["origin"]))
    a_boxes, b_boxes = loads[1], loads[0]
    # each step of A once, in pieces of the epilogue's rows (lower/gemm_rows.py)
    assert len(a_boxes) == len(set(a_boxes)) == 64 // tiling.tk * (tiling.tm // tiling.epilogue_rows)
    assert len(b_boxes) == (64 // tiling.tn) * (64 // tiling.tk)
    first_gemm = [i for i, record in enumerate(launch.commands) if int(record[0]) == Op.GEMM][0]
    # one step's B, then its A a piece of rows at a time (lower/gemm_rows.py)
    first = [command_args(record) for record in launch.commands[:first_gemm] if int(record[0]) == Op.DMA_LOAD]
    assert [args["slot"] for args in first] == [0] + [1] * (tiling.tm // tiling.epilogue_rows)
    assert [args["origin"][0] for args in first[1:]] == list(range(0, tiling.tm, tiling.epilogue_rows))
