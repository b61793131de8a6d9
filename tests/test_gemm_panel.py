"""A matmul whose reduction is one step holds A's row panel across its column tiles
(kernels/gemm/gemm.py: holds_a_panel), and the GEMM tile search prices what the kernel runs.

End to end on the simulator: every A tile is loaded once (the column tiles of a row tile all
read the one copy), results match numpy; the tile search counts B's loads per column tile and
A's per row tile, and a smooth activation's FABRIC bodies as PE-array work.
"""

from __future__ import annotations

import collections
import types

import numpy as np
import pytest

import npu_backend
from cgra_sim.isa import Op
from cgra_sim.trace import command_args
from models import matmul_model, run
from npu_backend.kernels.common.spec import Tiling
from npu_backend.kernels.gemm.epilogue_tail import tail_tile_cycles
from npu_backend.kernels import registry
from npu_backend.kernels.gemm import gemm
from npu_backend.target import relax_ext
from npu_backend.kernels.gemm.gemm import estimate_cycles


@pytest.fixture
def whole_tiles(monkeypatch):
    """The tile search as it was before output tiles were finished in pieces (gemm.py's
    `finishes_in_pieces`): on these shapes it holds A's panel, which is what is tested here (with
    pieces the search streams shallow reduction steps instead: test_gemm_pieces.py)."""
    monkeypatch.setattr(gemm, "finishes_in_pieces", lambda spec, arch: False)
    monkeypatch.setattr(gemm, "_TILINGS", {})
    monkeypatch.setattr(registry, "_TILINGS", {})
    monkeypatch.setenv("CGRA_KERNEL_CACHE", "off")
    monkeypatch.setattr(relax_ext, "_KERNEL_CACHE", collections.OrderedDict())  # nor the process's


@pytest.mark.parametrize("arch", ["cgra-4x4", "cgra-8x8"])
@pytest.mark.parametrize("m, n, k, dtype", [(32, 64, 64, "float32"), (64, 64, 64, "float32"), (40, 96, 72, "int8")])
def test_each_a_tile_is_loaded_once_for_all_its_column_tiles(arch, m, n, k, dtype, whole_tiles):
    mod, inputs, ref = matmul_model(m, n, k, dtype, bias=False, relu=False, transposed=True)
    with npu_backend.profile(keep_timelines=True) as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
    launch, = prof.timelines
    loads = {}  # slot -> the boxes it loaded, in order
    for record in launch.commands:
        if int(record[0]) == Op.DMA_LOAD:
            args = command_args(record)
            loads.setdefault(args["slot"], []).append(tuple(args["origin"]))
    assert len(loads) == 2
    # (the weight is the first parameter of the kernel: rhs, lhs, out)
    a_boxes, b_boxes = loads[1], loads[0]
    assert len(a_boxes) == len(set(a_boxes))  # no A tile twice
    assert len(b_boxes) > len(a_boxes)  # more than one column tile per row tile


def test_the_estimate_loads_a_once_per_row_tile_and_b_per_column_tile():
    arch = npu_backend.load_arch("cgra-8x8")
    tiling = Tiling(32, 8, 64, 64, 64, 64)  # 2 row tiles x 8 column tiles
    held = estimate_cycles(tiling, "float32", 4, 4, arch, init_folded=True, a_panel=True)
    reloaded = estimate_cycles(tiling, "float32", 4, 4, arch, init_folded=True)
    assert held < reloaded
    whole_depth_in_steps = Tiling(32, 8, 32, 64, 64, 64)  # two reduction steps: nothing to hold
    assert estimate_cycles(whole_depth_in_steps, "float32", 4, 4, arch, a_panel=True) == \
        estimate_cycles(whole_depth_in_steps, "float32", 4, 4, arch)


def test_a_smooth_activation_is_pe_array_work_and_gelu_vector_work():
    """Without a function unit (cgra-4x4) SiLU is the fabric's bodies on the PE array, then x times
    the sigmoid on the vector unit; through cgra-8x8's unit it is one VFUNC, as GELU is."""
    def tail(arch_name, act):
        spec = types.SimpleNamespace(act=act, multiplier_shape=None, gated=False, half_via=None, half_out=None)
        return tail_tile_cycles(spec, npu_backend.load_arch(arch_name))(512)

    silu, gelu = tail("cgra-4x4", "silu"), tail("cgra-8x8", "gelu")
    assert silu[0] > 0 and silu[1] > 0  # the FABRIC bodies, then x times the sigmoid on the vector unit
    assert tail("cgra-8x8", "silu")[0] == 0 and tail("cgra-8x8", "silu")[1] > 0
    assert gelu[0] == 0 and gelu[1] > 0  # one VFUNC
