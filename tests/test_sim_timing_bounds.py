"""The simulator's timing on random tiled-GEMM streams: cycles >= the bound on the stream as
issued, double buffering hides loads, more bandwidth / PEs / MACs a PE never slower (and where a
larger array can be), the stats' JSON."""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import load_arch, simulate, streams
from cgra_sim.isa import Op
from timing_cases import durations, gemm, gemm_operands, gemm_streams, run


@given(gemm_streams())
def test_cycles_never_beat_the_roofline_bound(case):
    arch, records, tensors = case
    stats = simulate(arch, records, tensors())
    assert stats.cycles >= stats.ideal_cycles > 0
    assert 0 < stats.utilisation <= 1
    assert all(busy <= stats.cycles for busy in stats.busy_cycles.values())


def test_double_buffering_overlaps_loads_with_compute():
    arch = load_arch("cgra-8x8")
    m, n, k = 64, 64, 256
    records = streams.tiled_gemm(arch, m, n, k, "int8", tile=(16, 16, 64))
    stats, timeline = run(arch, records, [np.ones((m, k), np.int8), np.ones((k, n), np.int8),
                                          np.zeros((m, n), np.int32)])
    assert stats.cycles < sum(durations(timeline))
    gemm_at = np.flatnonzero(timeline.ops == Op.GEMM)
    load_at = np.flatnonzero(timeline.ops == Op.DMA_LOAD)
    # Some load of a later tile runs while an earlier GEMM computes.
    assert any(timeline.starts[l] < timeline.ends[g] for g in gemm_at for l in load_at if l > g)


@given(gemm_streams(), st.integers(2, 4), st.booleans())
def test_more_dma_bandwidth_or_less_latency_is_never_slower(case, factor, latency):
    arch, records, tensors = case
    faster = dataclasses.replace(arch, dma_bytes_per_cycle=arch.dma_bytes_per_cycle * factor,
                                 dma_latency=arch.dma_latency // 2 if latency else arch.dma_latency)
    assert simulate(faster, records, tensors()).cycles <= simulate(arch, records, tensors()).cycles


@given(gemm_streams(compute_bound=True), st.sampled_from([(2, 1), (1, 2), (2, 2), (4, 4)]))
def test_more_pes_are_never_slower_on_compute_bound_gemms(case, scale):
    arch, records, tensors = case
    bigger = dataclasses.replace(arch, rows=arch.rows * scale[0], cols=arch.cols * scale[1])
    assert simulate(bigger, records, tensors()).cycles <= simulate(arch, records, tensors()).cycles


@given(gemm_streams(), st.integers(2, 4))
def test_more_macs_per_pe_are_never_slower(case, factor):
    arch, records, tensors = case
    faster = dataclasses.replace(arch, macs_per_pe={d: v * factor for d, v in arch.macs_per_pe.items()})
    assert simulate(faster, records, tensors()).cycles <= simulate(arch, records, tensors()).cycles


def test_a_larger_array_can_be_slower_on_latency_bound_gemms():
    # Documented limit of the model (docs/simulator.md): with k = 1 a 16-row GEMM costs
    # 2 folds + 8 + 8 - 2 cycles on 8x8 but 1 fold + 16 + 8 - 2 on 16x16.
    arch = load_arch("cgra-8x8")
    records, tensors, a, b, acc, _ = gemm_operands("int8", 16, 8, 1)
    records.append(gemm("int8", 16, 8, 1, a, b, acc))
    small = run(arch, records, tensors)[1]
    big = run(dataclasses.replace(arch, rows=16), records, tensors)[1]
    assert durations(big)[2] - durations(small)[2] == (16 + 8 - 2) + 1 - (8 + 8 - 2) - 2


def test_stats_serialise_to_json():
    arch = load_arch("cgra-4x4")
    records = streams.tiled_gemm(arch, 8, 8, 8, "int8")
    stats = simulate(arch, records, [np.ones((8, 8), np.int8)] * 2 + [np.zeros((8, 8), np.int32)],
                     name="matmul", source_ops="matmul,relu")
    data = json.loads(stats.to_json())
    assert data == stats.to_dict()
    assert data["source_ops"] == ["matmul", "relu"] and data["arch"] == "cgra-4x4"
    assert data["op_counts"]["GEMM"] == 4 and data["num_commands"] == len(records)
    assert data["macs"] == 512 and data["dma_store_bytes"] == 256
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.cycles = 0
