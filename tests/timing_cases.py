"""Helpers of the simulator's timing tests (tests/test_sim_timing*.py): the closed forms of
docs/simulator.md (DMA, GEMM, bank slowdown), record builders, a runner returning stats and
timeline, random tiled-GEMM streams and the busy + stall + idle check per unit."""

from fractions import Fraction

import numpy as np
from hypothesis import strategies as st

from cgra_sim import load_arch, preset_names, simulate_detailed, streams
from cgra_sim.isa import EPILOGUE_RELU, GEMM_ACCUMULATE, DType, Op, Unit, encode

PRESETS = [load_arch(name) for name in preset_names()]


ACC = {"int8": "int32", "float32": "float32"}


def ceil_div(a, b):
    return -(-a // b)


def dma_cycles(arch, nbytes):
    return arch.dma_latency + transfer_cycles(arch, nbytes)


def transfer_cycles(arch, nbytes):
    """How long a DMA keeps its engine busy: the latency overlaps the next transfer."""
    return ceil_div(nbytes, arch.dma_bytes_per_cycle)


def gemm_cycles(arch, m, n, k, dtype, config=True, fill=True, a_stride=None):
    """config + fill + folds x k, the folds stretched when the banks cannot feed A's column
    (`a_stride` bytes between rows, default compact: k elements) or A and B together."""
    steady = ceil_div(m, arch.rows) * ceil_div(n, arch.cols) * ceil_div(k, arch.macs_per_pe[dtype])
    steady = ceil_div(steady * bank_slowdown_of_a(arch, m, n, dtype, a_stride or k * np.dtype(dtype).itemsize,
                                                  per_lane=Fraction(k, ceil_div(k, arch.macs_per_pe[dtype]))), 1)
    return (arch.config_load_cycles if config else 0) + \
        (min(m, arch.rows) + min(n, arch.cols) - 2 if fill else 0) + steady


def bank_slowdown_of_a(arch, m, n, dtype, a_stride, addr=0, per_lane=1):
    """The bank rule of docs/simulator.md by enumeration: the busiest bank's distinct words among
    the first words of A's min(m, rows) rows, over the W / itemsize cycles a word feeds a row;
    or A's and B's elements a cycle (`per_lane` of each row and column a step: k over its steps of MACs a PE) over
    the scratchpad's width."""
    size, width, banks = np.dtype(dtype).itemsize, arch.bank_width_bytes, arch.spad_banks
    lanes = min(m, arch.rows)
    words = {(addr + i * a_stride) // width for i in range(lanes)}
    busiest = max(sum(1 for w in words if w % banks == bank) for bank in range(banks))
    return max(Fraction(1), Fraction(busiest * size, width),
               Fraction((lanes + min(n, arch.cols)) * size * per_lane, banks * width))


def load(slot, addr, rows, cols):
    return streams.matrix_dma(Op.DMA_LOAD, slot, addr, 0, 0, rows, cols, cols)


def store(slot, addr, rows, cols):
    return streams.matrix_dma(Op.DMA_STORE, slot, addr, 0, 0, rows, cols, cols)


def gemm(dtype, m, n, k, a, b, acc, accumulate=False, b_stride=None):
    return encode(Op.GEMM, flags=GEMM_ACCUMULATE if accumulate else 0, dtype=DType.from_name(dtype),
                  m=m, n=n, k=k, a_addr=a, a_stride=k, b_addr=b, b_stride=b_stride or n,
                  acc_addr=acc, acc_stride=n)


def run(arch, records, tensors):
    result = simulate_detailed(arch, np.array(records, dtype=np.int64), tensors)
    return result.stats, result.timeline


def durations(timeline):
    return list(timeline.ends - timeline.starts)


def gemm_operands(dtype, m, n, k):
    """Records loading A and B, their tensors, and the addresses of A, B and two accumulators."""
    size = np.dtype(dtype).itemsize
    a_addr, b_addr = 0, m * k * size
    acc1 = (m * k + k * n) * size
    acc2 = acc1 + m * n * 4
    return ([load(0, a_addr, m, k), load(1, b_addr, k, n)],
            [np.ones((m, k), dtype), np.ones((k, n), dtype)], a_addr, b_addr, acc1, acc2)


@st.composite
def gemm_streams(draw, compute_bound=False):
    """(arch, records, tensor factory) of a random tiled GEMM.

    compute_bound: every GEMM has ceil(k / macs_per_pe) >= max(m, n), the regime where a larger
    PE array can only help (with little k a deeper array pipeline costs more than its folds save).
    """
    arch = draw(st.sampled_from(PRESETS))
    dtype = draw(st.sampled_from(["int8", "float32"]))
    m, n = draw(st.integers(1, 100)), draw(st.integers(1, 100))
    tm, tn = draw(st.integers(ceil_div(m, 5), 32)), draw(st.integers(ceil_div(n, 5), 32))
    if compute_bound:
        tk = draw(st.integers(max(tm, tn), 64))
        k = tk * draw(st.integers(1, 3))
    else:
        k = draw(st.integers(1, 100))
        tk = draw(st.integers(ceil_div(k, 5), 64))
    flags = draw(st.sampled_from([None, EPILOGUE_RELU]))
    records = streams.tiled_gemm(arch, m, n, k, dtype, tile=(tm, tn, tk), epilogue_flags=flags)

    def tensors():
        return [np.ones((m, k), dtype), np.ones((k, n), dtype), np.zeros((m, n), ACC[dtype])]
    return arch, records, tensors


UNITS = ("load", "compute", "vector", "store")


def check_unit_cycles(stats, timeline, config: int = 0):
    """busy + stall + idle == cycles per unit, none negative, and every stall is a wait for a
    dependency: it ends exactly when an earlier command it depends on ends, or, for a PE-array
    command loading its configuration while it waits, `config` cycles (that load) before."""
    for unit in UNITS:
        parts = (stats.busy_cycles[unit], stats.stall_cycles[unit], stats.idle_cycles[unit])
        assert min(parts) >= 0 and sum(parts) == stats.cycles, unit
    stalls = timeline.stalls()
    assert (stalls >= 0).all()
    for index in np.flatnonzero(stalls > 0):
        blocker = timeline.waits_for[index]
        early = timeline.ends[blocker] - timeline.starts[index]
        assert 0 <= blocker < index and early in ((0, config) if timeline.units[index] == Unit.COMPUTE else (0,))
    assert (timeline.waits_for[stalls == 0] == -1).all()
