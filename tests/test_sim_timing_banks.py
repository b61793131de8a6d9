"""The simulator's scratchpad banks: a command whose operands share a bank slows by the conflict
degree (docs/simulator.md, "Scratchpad banks"), counted here by enumeration; more banks never slow
a command or a tiled GEMM (five can be slower than four).

The rule: byte a in bank (a // W) % N; a bank serves one W-byte word a cycle. Expected cycles
below are derived by enumerating the words, not from cgra_sim.banks' closed form.
"""

import dataclasses
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import load_arch, simulate, simulate_detailed, streams
from cgra_sim.isa import EPILOGUE_RELU, DType, Op, encode
from timing_cases import PRESETS, ceil_div, check_unit_cycles, durations, gemm_cycles, gemm_streams, load, run


def period(arch):
    """Bytes after which the banks repeat: rows this far apart all start in one bank."""
    return arch.spad_banks * arch.bank_width_bytes


def gemm_with_a_stride(arch, dtype, m, n, k, a_stride):
    """Records loading A (rows `a_stride` elements apart) and compact B, then one GEMM; tensors."""
    size = np.dtype(dtype).itemsize
    b_addr = -(-m * a_stride * size // 64) * 64
    acc = -(-(b_addr + k * n * size) // 64) * 64
    records = [load(0, 0, m, k) if a_stride == k else streams.matrix_dma(Op.DMA_LOAD, 0, 0, 0, 0, m, k, a_stride),
               load(1, b_addr, k, n),
               encode(Op.GEMM, dtype=DType.from_name(dtype), m=m, n=n, k=k, a_addr=0, a_stride=a_stride,
                      b_addr=b_addr, b_stride=n, acc_addr=acc, acc_stride=n)]
    return records, [np.ones((m, k), dtype), np.ones((k, n), dtype)]


@pytest.mark.parametrize("arch", PRESETS, ids=lambda a: a.name)
@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_a_gemm_whose_rows_share_one_bank_slows_by_the_conflict_degree(arch, dtype):
    # Compact A with one bank period per row (the compiler's layout when tk * itemsize is a
    # multiple of N * W): all `rows` rows start in bank 0, and a word feeds a row W / itemsize
    # cycles, so the PE array waits max(1, rows * itemsize / W) times longer. Padding each row
    # by one bank word puts the rows in consecutive banks: the folds' cycles exactly.
    size, width = np.dtype(dtype).itemsize, arch.bank_width_bytes
    m, n, k = arch.rows, arch.cols, period(arch) // size
    fill = m + n - 2
    for a_stride, degree in ((k, arch.rows), (k + width // size, 1)):
        records, tensors = gemm_with_a_stride(arch, dtype, m, n, k, a_stride)
        _, timeline = run(arch, records, tensors)
        steady = ceil_div(k * max(Fraction(1), Fraction(degree * size, width)), 1)
        assert durations(timeline)[2] == arch.config_load_cycles + fill + steady, a_stride
        assert durations(timeline)[2] == gemm_cycles(arch, m, n, k, dtype, a_stride=a_stride * size)
    # int8: one word feeds a row 8 cycles, so up to 8 rows per bank cost nothing.
    if dtype == "int8" and arch.rows <= width:
        assert durations(timeline)[2] == gemm_cycles(arch, m, n, k, dtype, a_stride=period(arch) + width)


@pytest.mark.parametrize("arch", PRESETS, ids=lambda a: a.name)
def test_a_dma_scattering_one_element_per_bank_period_serialises_its_beats(arch):
    # An int32 column written `period` bytes apart: each beat's dma_bytes_per_cycle / 4 elements
    # fall in one bank and take a cycle each. One word apart they use consecutive banks.
    extent, beat = 64, arch.dma_bytes_per_cycle
    for sstride, degree in ((period(arch) // 4, beat // 4), (arch.bank_width_bytes // 4, 1)):
        records = [streams.dma(Op.DMA_LOAD, 0, 0, [(extent, 0, 1, sstride)])]
        stats, timeline = run(arch, records, [np.ones(extent, np.int32)])
        transfer = ceil_div(extent * 4, beat) * degree
        assert durations(timeline) == [arch.dma_latency + transfer]
        assert stats.busy_cycles["load"] == transfer


@pytest.mark.parametrize("arch", PRESETS, ids=lambda a: a.name)
def test_a_vector_command_on_a_column_waits_for_its_bank(arch):
    # A FILL of an int32 column whose elements are one bank period apart: vector_lanes elements a
    # cycle, all in one bank: min(rows, lanes) cycles per beat.
    rows = 3 * arch.vector_lanes + 1
    fill = encode(Op.FILL, dtype=DType.INT32, rows=rows, cols=1, stride=period(arch) // 4, value_bits=7)
    _, timeline = run(arch, [fill], [])
    assert durations(timeline) == [ceil_div(rows, arch.vector_lanes) * arch.vector_lanes + 2]


@given(lanes=st.integers(1, 64), words=st.integers(0, 200), addr=st.integers(0, 4096),
       banks=st.integers(1, 16), width=st.sampled_from([2, 4, 8, 16]), run_bytes=st.integers(1, 40))
def test_the_conflict_degree_matches_counting_the_words(lanes, words, addr, banks, width, run_bytes):
    from cgra_sim.banks import degree
    stride = words * width if words % 3 else words * width + words % 7  # word multiples and others
    touched = {word for i in range(lanes) for word in range((addr + i * stride) // width,
                                                            (addr + i * stride + run_bytes - 1) // width + 1)}
    busiest = max(sum(1 for w in touched if w % banks == bank) for bank in range(banks))
    expected = 1 if lanes == 1 or stride == 0 else busiest
    assert degree(lanes, stride, addr, banks, width, run_bytes) == expected


@st.composite
def strided_kernels(draw):
    """(arch, records, tensors) of one GEMM with any A row stride, or a DMA with any scratchpad
    stride, on a preset."""
    arch = draw(st.sampled_from(PRESETS))
    dtype = draw(st.sampled_from(["int8", "float32"]))
    m, n, k = draw(st.integers(1, 40)), draw(st.integers(1, 40)), draw(st.integers(1, 40))
    if draw(st.booleans()):
        records, tensors = gemm_with_a_stride(arch, dtype, m, n, k, k + draw(st.integers(0, 80)))
        return arch, records, tensors
    sstride = draw(st.integers(1, 10))  # the box stays inside the smallest scratchpad
    return arch, [streams.dma(Op.DMA_LOAD, 0, 0, [(m, 0, 1, sstride * k), (k, 1, 1, sstride)])], \
        [np.ones((m, k), dtype)]


@given(strided_kernels(), st.sampled_from([2, 4]))
def test_more_banks_never_slow_a_command(case, factor):
    """Multiplying the banks splits every bank's words among its new banks. (Merely adding banks
    can alias a stride: see the next test.)"""
    arch, records, tensors = case
    more = dataclasses.replace(arch, spad_banks=arch.spad_banks * factor)
    assert run(more, records, tensors)[0].cycles <= run(arch, records, tensors)[0].cycles


@given(gemm_streams(), st.sampled_from([2, 4]))
def test_more_banks_never_slow_a_tiled_gemm(case, factor):
    arch, records, tensors = case
    more = dataclasses.replace(arch, spad_banks=arch.spad_banks * factor)
    assert simulate(more, records, tensors()).cycles <= simulate(arch, records, tensors()).cycles


def test_five_banks_can_be_slower_than_four():
    # Rows 5 words apart: 4 banks see banks 0, 1, 2, 3; 5 banks see bank 0 four times. A float32
    # row needs a word every 2 cycles, so four rows on one bank halve the pace.
    four = dataclasses.replace(load_arch("cgra-4x4"), spad_bytes=40960)
    five = dataclasses.replace(four, spad_banks=5)
    records, tensors = gemm_with_a_stride(four, "float32", 4, 4, 10, 10)
    assert durations(run(four, records, tensors)[1])[2] == gemm_cycles(four, 4, 4, 10, "float32")
    assert durations(run(five, records, tensors)[1])[2] == gemm_cycles(four, 4, 4, 20, "float32")


@pytest.mark.parametrize("arch", PRESETS, ids=lambda a: a.name)
def test_busy_stall_and_idle_add_up_when_banks_conflict(arch):
    tk = period(arch) // 4  # float32 A tiles of one bank period per row: every row in bank 0
    m, n, k = 2 * arch.rows, 2 * arch.cols, 2 * tk
    records = streams.tiled_gemm(arch, m, n, k, "float32", tile=(arch.rows, arch.cols, tk),
                                 epilogue_flags=EPILOGUE_RELU)
    tensors = [np.ones((m, k), np.float32), np.ones((k, n), np.float32), np.zeros((m, n), np.float32)]
    result = simulate_detailed(arch, records, tensors)
    check_unit_cycles(result.stats, result.timeline, arch.config_load_cycles)
    spread = dataclasses.replace(arch, spad_banks=arch.spad_banks * 8)  # the rows' banks differ
    assert simulate(spread, records, tensors).cycles < result.stats.cycles
