"""lower/late_residual.py: a prefill matmul finished in pieces loads an output tile's residual,
and runs its epilogue, halfway through the next tile's reduction steps, not in front of that
tile's first operand tiles. End to end on the simulator: the same bits as without the pass, in
fewer cycles, the first tile's residual loaded after the second tile's first B tile, and the
search's estimate of the kernel as lowered (gemm_estimate.py, as_lowered) its cycles."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import npu_backend
from cgra_sim.isa import Op
from cgra_sim.trace import command_args
from models import matmul_model, run
from npu_backend.kernels import registry
from npu_backend.kernels.gemm import gemm
from npu_backend.kernels.gemm.gemm_estimate import estimate_cycles
from npu_backend.lower import late_residual
from npu_backend.target import relax_ext

RHS, RESIDUAL = 0, 2  # DMA slots: the kernel's parameters (rhs, lhs, residual, out)


def _compiled(arch, monkeypatch):
    monkeypatch.setenv("CGRA_KERNEL_CACHE", "off")
    monkeypatch.setattr(relax_ext, "_KERNEL_CACHE", collections.OrderedDict())
    mod, inputs, _ = matmul_model(32, 64, 128, bias=False, relu=False, residual=True, transposed=True, seed=0)
    with npu_backend.profile(keep_timelines=True) as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    return out, prof


@pytest.mark.parametrize("arch, fewer", [("cgra-4x4", False), ("cgra-8x8", True)])
def test_the_residual_loads_in_the_next_tile_same_bits_fewer_cycles(arch, fewer, monkeypatch):
    """On cgra-8x8 the first column tile's steps (A's step and B's) keep the load engine busy: loaded
    in front of the second tile's, the residual held its first GEMM back (4,662 cycles, 4,566 with
    the pass). On cgra-4x4 the steps are long enough that it never did (16,744 either way)."""
    out, prof = _compiled(arch, monkeypatch)
    launch, = prof.timelines
    loads = [command_args(r)["slot"] for r in launch.commands if int(r[0]) == Op.DMA_LOAD]
    first_residual = loads.index(RESIDUAL)
    tiling = gemm.choose_tiling(32, 64, 128, "float32", "float32", False, npu_backend.load_arch(arch),
                                has_residual=True, a_panel=True, pieces=True)
    # the first column tile's steps load A (in pieces) and B; the residual comes after the next B
    steps = tiling.kp // tiling.tk
    assert loads[:first_residual].count(RHS) > steps
    estimate = estimate_cycles(tiling, "float32", 4, 4, npu_backend.load_arch(arch), True, init_folded=True,
                               a_panel=True, piece_rows=tiling.epilogue_rows, as_lowered=True)
    assert abs(estimate - prof.total_cycles) <= 0.015 * prof.total_cycles

    monkeypatch.setattr(late_residual, "_deferred", lambda tiles: tiles)
    monkeypatch.setattr(registry, "_TILINGS", {})
    before, whole = _compiled(arch, monkeypatch)
    np.testing.assert_array_equal(out.view(np.uint32), before.view(np.uint32))
    assert prof.total_cycles < whole.total_cycles if fewer else prof.total_cycles == whole.total_cycles
