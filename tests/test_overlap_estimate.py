"""The one overlap estimate (cgra_sim.cost.double_buffered_cycles) against the simulator.

Every tile search prices its tiled loop with cost.double_buffered_cycles. Here, per family, a
kernel is compiled for a few shapes, and the search's estimate of the tiling it chose (read
back from the tiling cache, kernels.registry) is compared with the simulated cycles of that
kernel's launch. Each family states its bound: how far its first-order estimate may be from the
simulator's timeline, and why where it is deliberately coarse.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import numpy as np
import pytest
from tvm import relax

import npu_backend
from cgra_sim import cost, load_arch
from models import conv2d_model, matmul_model, pool_model, relax_module, run
from npu_backend.kernels import registry
from npu_backend.kernels.elementwise.activation import ActivationSpec, activation_tile_cycles
from npu_backend.kernels.gemm.depthwise import estimate_depthwise_cycles
from npu_backend.kernels.elementwise.eltwise import EltwiseSpec, estimate_eltwise_cycles
from npu_backend.kernels.elementwise.fabric import FabricSpec, fabric_tile_cycles
from npu_backend.kernels.gemm.gemm import estimate_cycles as gemm_estimate_cycles, may_hold_a_panel
from npu_backend.kernels.pool.global_pool import estimate_global_cycles
from npu_backend.kernels.fused.inverted_residual import InvertedResidualSpec
from npu_backend.kernels.fused import inverted_residual_tiles, separable_tiles
from npu_backend.kernels.pool.pool_tiles import estimate_pool_cycles
from npu_backend.kernels.fused.separable import SeparableSpec
from npu_backend.kernels.elementwise.sigmoid import SmoothSpec, smooth_tile_cycles
from npu_backend.kernels.rows import norms, row_reduce, softmax
from npu_backend.kernels.rows.rows import RowSpec, estimate_row_cycles
from npu_backend.kernels.elementwise.special import SpecialSpec, special_tile_cycles
from npu_backend.kernels.common.spec import KernelSpec
from npu_backend.kernels.common.unary import estimate_unary_cycles
from npu_backend.tools.workloads import eltwise_model
from test_separable import _always_fused, separable_model

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_dynamic  # noqa: E402

ARCHS = ("cgra-4x4", "cgra-8x8")
RNG = np.random.default_rng(0)


def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def _one_op(op, shape, dtype="float32"):
    return relax_module([("x", shape, dtype)], lambda bb, x: op(x)), [RNG.standard_normal(shape).astype(dtype)]


def _symbolic(build, size):
    mod, inputs = build()
    return mod, inputs(size)


#: family -> (model builder, the spec type the family's kernels carry) per case.
CASES = {
    "gemm": [lambda: matmul_model(64, 64, 64)[:2], lambda: matmul_model(100, 48, 200, "int8")[:2],
             lambda: conv2d_model(1, 16, 14, 14, 32, 3, 3, pad=(1, 1, 1, 1))[:2],
             lambda: conv2d_model(1, 32, 8, 8, 64, 1, 1)[:2]],
    "depthwise": [lambda: conv2d_model(1, 32, 16, 16, 32, 3, 3, pad=(1, 1, 1, 1), groups=32)[:2],
                  lambda: conv2d_model(1, 64, 8, 8, 64, 3, 3, stride=(2, 2), pad=(1, 1, 1, 1), groups=64)[:2]],
    "pool": [lambda: pool_model("max", 1, 32, 16, 16, (3, 3), (2, 2), (1, 1, 1, 1))[:2],
             lambda: pool_model("avg", 1, 64, 8, 8, (2, 2), (2, 2))[:2],
             lambda: _one_op(lambda x: relax.op.mean(x, axis=[2, 3]), (1, 96, 7, 7))],
    "global_pool": [lambda: _symbolic(lambda: bench_dynamic.global_square(64), 12),
                    lambda: _symbolic(lambda: bench_dynamic.global_square(32), 9)],
    "eltwise": [lambda: eltwise_model("add", (1, 32, 16, 16), (1, 32, 16, 16))[:2],
                lambda: eltwise_model("multiply", (64, 100), (1, 100))[:2]],
    "unary": [lambda: _one_op(relax.op.nn.relu, (1, 16, 32, 32)),
              lambda: _one_op(lambda x: relax.op.nn.leakyrelu(x, 0.1), (1, 16, 32, 32)),
              lambda: _one_op(relax.op.sigmoid, (64, 96)),
              lambda: _one_op(relax.op.exp, (64, 96))],
    "rows": [lambda: _one_op(relax.op.nn.softmax, (64, 96)),
             lambda: _one_op(lambda x: relax.op.nn.rms_norm(x, relax.const(np.ones(128, "float32")), axes=[-1]),
                             (32, 128)),
             lambda: _one_op(lambda x: relax.op.nn.layer_norm(x, relax.const(np.ones(768, "float32")),
                                                              relax.const(np.zeros(768, "float32")), axes=[-1]),
                             (16, 768)),
             lambda: _one_op(lambda x: relax.op.sum(x, axis=[-1]), (48, 200)),
             lambda: _one_op(relax.op.nn.softmax, (4, 3000))],
    "separable": [lambda: separable_model(1, 32, 16, 16, 64)[:2], lambda: separable_model(1, 16, 32, 32, 16)[:2]],
    "inverted_residual": [lambda: separable_model(1, 16, 8, 8, 16, residual="shortcut", expansion=96)[:2],
                          lambda: separable_model(1, 24, 8, 8, 32, stride=2, expansion=144)[:2]],
}


#: The registered families (kernels.registry) each test family covers.
_FAMILY_NAMES = {"gemm": ("matmul", "conv2d"), "depthwise": ("depthwise",), "pool": ("pool",), "global_pool": ("pool",),
                 "eltwise": ("eltwise",), "unary": ("activation", "fabric", "smooth", "special"),
                 "rows": ("softmax", "norms", "row_reduce"), "separable": ("separable",),
                 "inverted_residual": ("inverted_residual",)}


def _estimate(spec, tiling, arch, inputs) -> int:
    """The family's tile search's estimate of `spec` on `tiling`."""
    if isinstance(spec, KernelSpec) and spec.op in ("matmul", "conv2d"):
        taps = spec.rhs_shape[2] * spec.rhs_shape[3] if spec.op == "conv2d" else 1
        return gemm_estimate_cycles(tiling, spec.dtype, _itemsize(spec.dtype), _itemsize(spec.acc_dtype), arch,
                                    bool(spec.residual_shape), taps=taps, init_folded=True,
                                    a_panel=may_hold_a_panel(spec), piece_rows=tiling.epilogue_rows, as_lowered=True)
    if isinstance(spec, KernelSpec) and spec.op == "depthwise":
        return estimate_depthwise_cycles(spec, tiling, arch)
    if isinstance(spec, KernelSpec) and spec.pool is not None and spec.symbolic_image:
        return estimate_global_cycles(spec, tiling, arch, inputs[0].shape[2])
    if isinstance(spec, KernelSpec) and spec.op == "pool":
        return estimate_pool_cycles(spec, tiling, arch)
    if isinstance(spec, EltwiseSpec):
        return estimate_eltwise_cycles(spec, tiling, arch)
    tile_cycles = {ActivationSpec: activation_tile_cycles, FabricSpec: fabric_tile_cycles,
                   SmoothSpec: smooth_tile_cycles, SpecialSpec: special_tile_cycles}.get(type(spec))
    if tile_cycles is not None:
        return estimate_unary_cycles(spec, arch, tile_cycles(spec, arch), tiling.tm, tiling.tn, spec.rows, spec.cols)
    if isinstance(spec, RowSpec):
        steps = softmax.STEPS if spec.op == "softmax" else row_reduce.steps_of(spec) if spec.op == "row_reduce" \
            else norms.steps_of(spec)
        return estimate_row_cycles(spec, arch, steps, tiling.tm, tiling.tn)
    if isinstance(spec, SeparableSpec):
        return separable_tiles.estimate_cycles(spec, tiling, arch)
    if isinstance(spec, InvertedResidualSpec):
        return inverted_residual_tiles.estimate_cycles(spec, tiling, arch)
    raise AssertionError(f"no estimate for {type(spec).__name__}")


def estimate_and_cycles(family: str, case: int, arch_name: str) -> tuple[int, int]:
    """(the search's estimate of the tiling chosen for the case's one kernel, its simulated cycles)."""
    return measured(family, *CASES[family][case](), arch_name)


def measured(family: str, mod, inputs, arch_name: str) -> tuple[int, int]:
    """(the search's estimate of the tiling chosen for `mod`'s one kernel of `family`, its
    simulated cycles)."""
    arch = load_arch(arch_name)
    # A pair or block is fused wherever it fits (whatever its unfused kernels' estimates): its
    # estimate is what is measured here.
    fused = _always_fused(inverted_residual_tiles, "_unfused_cycles") if family == "inverted_residual" else \
        _always_fused()
    with fused:
        registry._TILINGS.clear()  # what the compile searches, read back below
        with npu_backend.profile() as prof:
            run(npu_backend.compile(mod, arch_name), inputs)
        chosen = [(spec, tiling) for (spec, fingerprint), tiling in registry._TILINGS.items()
                  if fingerprint == arch.fingerprint and registry.family_of(spec).name in _FAMILY_NAMES[family]]
    assert len(prof.kernels) == 1, [k.name for k in prof.kernels]
    # the partitioner also asks about smaller fusions of the same call: the kernel is the largest
    spec, tiling = max(chosen, key=lambda st: len(st[0].source_ops))
    return _estimate(spec, tiling, arch, inputs), prof.kernels[0].cycles


#: How far each family's estimate may be from the simulated cycles of the kernel it chose
#: (relative to the cycles), measured on cgra-4x4 and cgra-8x8 over CASES.
BOUNDS = {
    # A load-bound tiling's buffer round trip (latency, load and GEMM every two steps) is priced
    # for every step, the first included, whose load the prologue already counts: 1.4% over
    # (the 1x1 conv2d on cgra-8x8, once its PE array configuration loads under its first loads).
    "gemm": 0.015,
    # The static search leaves the output buffer's round trip out and prices the last tile as a
    # whole step and its work past it (kernels/gemm/depthwise.py): within 3% (the stride-2 3 x 3
    # on cgra-8x8: 1,602 against 1,556). The halo lower/held_halos.py loads only with a buffer
    # copy's first tile is priced (cost.BufferedLoop.held_load); unpriced, the estimate was 20%
    # over (that case on cgra-4x4: 3,220 against 2,693 cycles; now 2,710).
    "depthwise": 0.04,
    # The last tile is priced as a whole step (its POOL not again): over by up to a step, most
    # with few tiles (a 7 x 7 global mean of 96 channels on cgra-8x8: 5.8%; the symbolic global
    # pool's 9 x 9 image on cgra-8x8: 7.5%). The form the searches were tuned with: the plain
    # tail picks slower tiles for SqueezeNet's pools (kernels/pool/pool_tiles.py). Held halos
    # are priced (unpriced, the padded 3 x 3 max on cgra-8x8 was 6.1% over: 3,153 against 2,971).
    "pool": 0.06,
    "global_pool": 0.08,
    "eltwise": 0.01,
    # The FABRIC bodies' configuration loads (once per kernel, the same for every tiling) are not
    # in the estimate: a sigmoid's three bodies on cgra-8x8 are exactly those 576 cycles (5%) under.
    "unary": 0.06,
    # Coarse: per block the PE array's DEPTHWISE, GEMMs and the bubble between them are summed as
    # one unit's work, with no round trip between the tiles' buffers: a small map is up to 21%
    # under (16 channels at 32 x 32 on cgra-8x8). The round trips would bring that case to 2%, but
    # pick a slower tile for MobileNetV2's first block (kernels/fused/separable_tiles.py).
    "separable": 0.22,
    "inverted_residual": 0.05,
    # Row kernels (softmax, norms, reductions; a softmax row in passes over column tiles): the
    # gamma / beta loads and the column steps' commands are priced as the loop's, not beside it:
    # within 2.4% (a 16 x 768 layer norm on cgra-8x8).
    "rows": 0.03,
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("family, case", [(family, case) for family in CASES for case in range(len(CASES[family]))])
def test_the_estimate_of_the_chosen_tiling_is_within_the_familys_bound(family, case, arch):
    estimate, cycles = estimate_and_cycles(family, case, arch)
    assert abs(estimate - cycles) <= BOUNDS[family] * cycles, (estimate, cycles)


@pytest.mark.parametrize("case, arch", [(1, "cgra-4x4"), (1, "cgra-8x8"), (2, "cgra-4x4")])
def test_the_gemm_estimate_charges_the_fill_the_simulator_charges(case, arch):
    """gemm.py once priced the PE array's fill as rows + cols; the simulator charges
    cost.gemm_fill_cycles (the sub-array's rows + cols - 2). On these compute-bound kernels (an
    int8 matmul, a 3x3 conv2d) the estimate is the simulated cycles exactly, but for a cycle: the
    int8 matmul on cgra-8x8 takes a third copy of its operand tiles (gemm_copies.py), 15,898
    estimated against 15,899."""
    estimate, cycles = estimate_and_cycles("gemm", case, arch)
    assert abs(estimate - cycles) <= 1


def test_a_compute_bound_loop_is_its_first_load_its_steps_and_its_last_work_and_store():
    arch = load_arch("cgra-8x8")
    latency = arch.dma_latency
    loop = cost.double_buffered_cycles(arch, cost.BufferedLoop(10, 5, (300,), 7))
    assert loop == cost.LoopCycles(latency + 5, 300, 300 + latency + 7, latency + 5 + 9 * 300 + 300 + latency + 7)


def test_a_short_step_waits_for_its_buffers_round_trip():
    """Two buffers: the load two steps later reuses a buffer once this step's work has read it
    ("load"); the work two steps later, once this step's store has read its output ("store")."""
    arch = load_arch("cgra-8x8")
    latency = arch.dma_latency
    step = cost.buffered_step_cycles
    assert step(arch, cost.BufferedLoop(4, 3, (2,), 1)) == -(-(latency + 3 + 2) // 2)
    assert step(arch, cost.BufferedLoop(4, 1, (2,), 3, round_trips=("store",))) == -(-(2 + latency + 3) // 2)
    assert step(arch, cost.BufferedLoop(4, 3, (2,), 1, round_trips=())) == 3
    # two work stages (a DEPTHWISE, then its EPILOGUEs): the input buffer is free after the first
    assert step(arch, cost.BufferedLoop(4, 30, (2, 40), 1, round_trips=("load",))) == \
        max(40, -(-(latency + 30 + 2) // 2))
    assert step(arch, cost.BufferedLoop(4, 1, (2, 40), 30, round_trips=("store",))) == \
        max(40, -(-(2 + 40 + latency + 30) // 2))


def test_the_coarser_forms_and_work_outside_the_steps():
    arch = load_arch("cgra-8x8")
    latency = arch.dma_latency
    whole = cost.double_buffered_cycles(arch, cost.BufferedLoop(10, 5, (300,), 7, last_work=0, whole_last_step=True))
    assert whole.total == latency + 5 + 10 * 300 + latency + 7
    busy = cost.double_buffered_cycles(arch, cost.BufferedLoop(10, 5, (300,), 7, others=5000, stalls=11))
    assert busy.total == latency + 5 + 5000 + 11 + 300 + latency + 7
    assert cost.double_buffered_cycles(arch, cost.BufferedLoop(3, 5, (300,), 7, steady=123)).total == \
        latency + 5 + 123 + 300 + latency + 7


def test_an_unknown_round_trip_is_refused():
    with pytest.raises(ValueError, match="round trips among"):
        cost.BufferedLoop(1, 1, (1,), 1, round_trips=("reload",))


def test_held_loads_price_the_steps_after_the_copies():
    """cost.BufferedLoop.held_load (lower/held_halos.py: a window's halo loaded by each buffer
    copy's first step only): the first `copies` steps load the whole box, the others (and a whole
    last step, the last one's) the inside."""
    arch = load_arch("cgra-8x8")
    latency = arch.dma_latency
    plain = cost.double_buffered_cycles(arch, cost.BufferedLoop(6, 500, (300,), 7, round_trips=()))
    held = cost.double_buffered_cycles(arch, cost.BufferedLoop(6, 500, (300,), 7, round_trips=(), held_load=100))
    assert plain.total == latency + 500 + 5 * 500 + 300 + latency + 7
    assert held.total == latency + 500 + 500 + 4 * 300 + 300 + latency + 7
    whole = cost.double_buffered_cycles(arch, cost.BufferedLoop(6, 500, (300,), 7, round_trips=(), held_load=100,
                                                                last_work=0, whole_last_step=True))
    assert whole.total == latency + 500 + 500 + 5 * 300 + latency + 7
    few = cost.BufferedLoop(2, 500, (300,), 7, round_trips=())  # no step past the copies
    assert cost.double_buffered_cycles(arch, dataclasses.replace(few, held_load=100)) == \
        cost.double_buffered_cycles(arch, few)
