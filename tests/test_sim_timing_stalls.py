"""The simulator's busy, stall and idle cycles per unit: they add up to the kernel's cycles, and
every stall is a wait for a dependency (docs/simulator.md)."""

import json

import numpy as np
import pytest
from hypothesis import given

from cgra_sim import load_arch, simulate, simulate_detailed, streams
from cgra_sim.isa import Op
from timing_cases import (PRESETS, UNITS, check_unit_cycles, dma_cycles, gemm, gemm_cycles, gemm_operands,
    gemm_streams, load, run, store, transfer_cycles)


@pytest.mark.parametrize("arch", PRESETS, ids=lambda a: a.name)
def test_gemm_stalls_for_its_operands_and_the_store_for_the_gemm(arch):
    m, n, k = arch.rows, arch.cols, 24
    operands = m * k + k * n  # A then B, int8, in one load
    records = [streams.dma(Op.DMA_LOAD, 0, 0, [(operands, 0, 1, 1)]),
               gemm("int8", m, n, k, 0, m * k, operands),
               store(1, operands, m, n)]
    out = np.zeros((m, n), np.int32)
    stats, timeline = run(arch, records, [np.ones(operands, np.int8), out])

    load_end = dma_cycles(arch, operands)  # the GEMM's operands are all in
    # The configuration loads while they arrive (the PE array is free): the GEMM starts that
    # much before load_end and its operands enter at load_end.
    config = arch.config_load_cycles
    gemm_end = max(load_end, config) + gemm_cycles(arch, m, n, k, "int8", config=False)
    total = gemm_end + dma_cycles(arch, out.nbytes)
    assert stats.cycles == total
    assert stats.busy_cycles == {"load": transfer_cycles(arch, operands), "vector": 0,
                                 "compute": gemm_cycles(arch, m, n, k, "int8"),
                                 "store": transfer_cycles(arch, out.nbytes)}
    # The PE array waits for the load's transfer and its latency; the store for the GEMM.
    assert stats.stall_cycles == {"load": 0, "compute": max(0, load_end - config), "vector": 0, "store": gemm_end}
    # After its last command: the load engine is free once it has streamed (its latency is idle
    # time), the PE array once the GEMM ends, the store engine during its own latency.
    assert stats.idle_cycles == {"load": total - transfer_cycles(arch, operands),
                                 "compute": total - gemm_end, "vector": total,
                                 "store": arch.dma_latency}
    assert list(timeline.waits_for) == [-1, 0 if load_end > config else -1, 1]
    np.testing.assert_array_equal(out, k)


def test_refilling_a_buffer_stalls_the_load_engine_for_the_previous_fills_latency():
    # Pipelined DMA: the engine frees after the first transfer, but the second load writes the
    # same bytes (write after write), so it waits for the first one's completion: dma_latency.
    arch = load_arch("cgra-8x8")
    rows, cols = 4, 64
    out = np.zeros((rows, cols), np.int8)
    records = [load(0, 0, rows, cols), load(1, 0, rows, cols), store(2, 0, rows, cols)]
    first, second = np.zeros((rows, cols), np.int8), np.ones((rows, cols), np.int8)
    stats, timeline = run(arch, records, [first, second, out])

    latency, transfer = arch.dma_latency, transfer_cycles(arch, rows * cols)
    second_end = 2 * (transfer + latency)  # the second load starts at the first one's end
    total = second_end + latency + transfer
    assert list(timeline.starts) == [0, transfer + latency, second_end]
    assert stats.busy_cycles["load"] == 2 * transfer and stats.stall_cycles["load"] == latency
    assert stats.idle_cycles["load"] == total - 2 * transfer - latency == 2 * latency + transfer
    assert stats.busy_cycles["store"] == transfer and stats.stall_cycles["store"] == second_end
    assert stats.idle_cycles["store"] == latency
    assert list(timeline.waits_for) == [-1, 0, 1]
    np.testing.assert_array_equal(out, 1)


def test_a_stall_free_queue_reports_no_stall():
    # Back-to-back accumulating GEMMs whose operands are all loaded first: the PE array stalls
    # only for those loads, then runs without a gap (partial sums stay in the array).
    arch = load_arch("cgra-8x8")
    m, n, k = 8, 8, 16
    records, tensors, a, b, acc, _ = gemm_operands("int8", m, n, k)
    records += [gemm("int8", m, n, k, a, b, acc), gemm("int8", m, n, k, a, b, acc, accumulate=True)]
    stats, timeline = run(arch, records, tensors)
    loads_end = dma_cycles(arch, m * k) + transfer_cycles(arch, k * n)
    configured = loads_end - arch.config_load_cycles  # the configuration loads while they arrive
    assert stats.stall_cycles["compute"] == configured == timeline.starts[2]
    assert list(timeline.stalls()) == [0, 0, configured, 0]
    assert stats.idle_cycles["compute"] == 0 and stats.idle_cycles["vector"] == stats.cycles


@given(gemm_streams())
def test_busy_stall_and_idle_add_up_to_the_kernels_cycles(case):
    arch, records, tensors = case
    result = simulate_detailed(arch, records, tensors())
    check_unit_cycles(result.stats, result.timeline, arch.config_load_cycles)


@pytest.mark.parametrize("arch", PRESETS, ids=lambda a: a.name)
def test_busy_stall_and_idle_add_up_on_a_conv_with_halo_loads(arch):
    height, width, channels, filters = 6, 5, 3, 4
    records = streams.conv2d_3x3(arch, height, width, channels, filters, "int8")
    result = simulate_detailed(arch, records, [np.ones((height, width, channels), np.int8),
                                               np.ones((3, 3, channels, filters), np.int8),
                                               np.zeros((height, width, filters), np.int32)])
    check_unit_cycles(result.stats, result.timeline, arch.config_load_cycles)
    assert result.stats.stall_cycles["compute"] > 0  # the first GEMM waits for its loads


def test_stall_and_idle_cycles_serialise_to_json():
    arch = load_arch("cgra-4x4")
    records = streams.tiled_gemm(arch, 8, 8, 8, "int8")
    stats = simulate(arch, records, [np.ones((8, 8), np.int8)] * 2 + [np.zeros((8, 8), np.int32)])
    data = json.loads(stats.to_json())
    parts = [data["busy_cycles"], data["stall_cycles"], data["idle_cycles"]]
    assert all(set(part) == set(UNITS) for part in parts)
    assert all(sum(part[unit] for part in parts) == data["cycles"] for unit in UNITS)
