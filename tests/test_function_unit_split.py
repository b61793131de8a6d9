"""A VFUNC split between the function unit's pipelines and the vector lanes (function_unit.split).

The lanes' ALUs idle while the unit streams a long VFUNC; the vector unit gives them m of its
elements. The split is checked against a search over every m, never busier nor later than the
pipelines alone or the lanes alone (the model before the split), its cycles monotone in the
elements, and the simulator's timeline charging it; the bits are the same wherever an element
runs (functional.py computes VFUNC from special.py alone: test_function_unit.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import cost, load_arch, simulate_detailed, special
from cgra_sim.function_unit import depth, split
from cgra_sim.isa import DType, Op, Unit, VFunc, encode
from sim_records import dma_record


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _searched(pipes: int, vector_lanes: int, n: int, d: int) -> tuple[int, int]:
    """split's (issue, end) by trying every m: the least issue, then the earliest end; the lanes
    alone where they end no later."""
    best = None
    for m in range(n + 1):
        lanes, piped = _ceil(m * d, vector_lanes), _ceil(n - m, pipes)
        issue, end = max(lanes, piped), max(lanes, piped + d - 1 if m < n else 0)
        best = min(best or (issue, end), (issue, end))
    lanes = _ceil(n * d, vector_lanes)
    return (lanes, lanes) if lanes <= best[1] else best


def _unsplit(pipes: int, vector_lanes: int, n: int, d: int) -> tuple[int, int]:
    """(issue, end) before the split: the pipelines alone or the lanes alone, whichever ends first."""
    piped, lanes = _ceil(n, pipes), _ceil(n * d, vector_lanes)
    return (piped, piped + d - 1) if piped + d - 1 < lanes else (lanes, lanes)


_SHAPES = dict(pipes=st.integers(1, 4), vector_lanes=st.sampled_from([4, 8, 16]),
               d=st.sampled_from(sorted(set(special.OPS.values()) | {v + 2 for v in special.OPS.values()})))


@given(n=st.integers(1, 700), **_SHAPES)
def test_the_split_is_the_best_m_of_a_search(n, pipes, vector_lanes, d):
    assert split({"lanes": pipes}, vector_lanes, n, d) == _searched(pipes, vector_lanes, n, d)


@given(n=st.integers(1, 200_000), **_SHAPES)
def test_the_split_is_never_busier_nor_later_than_either_alone(n, pipes, vector_lanes, d):
    issue, end = split({"lanes": pipes}, vector_lanes, n, d)
    before_issue, before_end = _unsplit(pipes, vector_lanes, n, d)
    assert issue <= before_issue and end <= before_end and issue <= end
    # and no faster than both at their full rates
    assert end >= n / (pipes + vector_lanes / d) - 1


@given(n=st.integers(1, 20_000), more=st.integers(1, 300), **_SHAPES)
def test_a_vfunc_keeps_the_vector_unit_no_shorter_with_more_elements(n, more, pipes, vector_lanes, d):
    """Its busy cycles (what a loop of tiles pays) never fall with more elements once the
    pipelines take part (below that, the lanes alone end first and stay busy: as before the
    split); its last result comes within the rounding of a lanes' share (depth cycles) of
    monotone."""
    table = {"lanes": pipes}
    (issue, end), (more_issue, more_end) = split(table, vector_lanes, n, d), split(table, vector_lanes, n + more, d)
    if _unsplit(pipes, vector_lanes, n, d)[0] < _ceil(n * d, vector_lanes):
        assert issue <= more_issue
    assert end <= more_end + d


def test_long_gelus_and_exps_gain_the_lanes_rate():
    """cgra-8x8 (one pipeline, 8 lanes): GELU 1 + 8 / 85 elements a cycle, exp 1 + 8 / 28."""
    arch = load_arch("cgra-8x8")
    for func, rate in (("gelu", 1 + 8 / 85), ("exp", 1 + 8 / 28)):
        cycles = cost.vfunc_cycles(arch, 16384, func) - cost.VECTOR_OVERHEAD_CYCLES
        assert 16384 / rate <= cycles <= 16384 / rate + depth(func)
        issue = cost.vfunc_issue_cycles(arch, 16384, func) - cost.VECTOR_OVERHEAD_CYCLES
        assert 16384 / rate <= issue <= 16384 / rate + 1


@given(rows=st.integers(1, 24), cols=st.integers(1, 64), func=st.sampled_from(["gelu", "exp", "silu", "rsqrt"]))
def test_the_timeline_charges_the_split_and_the_bits_are_special_pys(rows, cols, func):
    """One VFUNC through the simulator: its duration and its vector unit's busy cycles are the
    split's, its output special.py's (bit for bit)."""
    arch = load_arch("cgra-8x8")
    n = rows * cols
    x = (np.random.default_rng(n).standard_normal(n) * 4).astype(np.float32)
    if func == "rsqrt":
        x = np.abs(x) + np.float32(1e-3)
    arrays = [x.copy(), np.zeros(n, np.float32)]
    out_addr = _ceil(n * 4, 64) * 64
    records = [dma_record(Op.DMA_LOAD, 0, 0, [(n, 0, 1, 1)]),
               encode(Op.VFUNC, func=VFunc[func.upper()], dtype=DType.FLOAT32, rows=rows, cols=cols, a_addr=0,
                      a_row_stride=cols, a_col_stride=1, out_addr=out_addr, out_stride=cols),
               dma_record(Op.DMA_STORE, 1, out_addr, [(n, 0, 1, 1)])]
    timeline = simulate_detailed(arch, np.array(records, dtype=np.int64), arrays).timeline
    assert timeline.ends[1] - timeline.starts[1] == cost.vfunc_cycles(arch, n, func)
    assert timeline.busy_cycles(Unit.VECTOR) == cost.vfunc_issue_cycles(arch, n, func)
    assert arrays[1].tobytes() == getattr(special, func)(x).tobytes()


def test_a_chip_without_the_unit_keeps_the_lanes_alone():
    arch = load_arch("cgra-8x8")
    plain = dataclasses.replace(arch, function_unit=None)
    assert cost.vfunc_cycles(plain, 4096, "gelu") == cost.vfunc_issue_cycles(plain, 4096, "gelu") \
        == _ceil(4096 * 85, 8) + cost.VECTOR_OVERHEAD_CYCLES
