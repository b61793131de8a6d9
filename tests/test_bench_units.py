"""bench_transformers --units (issue 34): each unit's busy cycles over ideal and the overlap
floor, summed over a profile's launches, checked against a hand count and, on a real profile,
against the cycles (a launch takes at least its busiest unit's)."""

from __future__ import annotations

import pathlib
import sys
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_transformers import UNITS, kernel_lines, unit_line  # noqa: E402

UNIT_NAMES = [unit for unit, _ in UNITS]


def _kernel(busy: dict, name: str = "k", cycles: int = 0, macs: int = 0, roofline: int = 0,
            load: int = 0) -> types.SimpleNamespace:
    """A launch's statistics; `roofline` its bound alone, `load` its load engine's share of it
    (KernelStats.roofline_cycles / roofline_load_cycles; no prefetched constants)."""
    return types.SimpleNamespace(busy_cycles=busy, name=name, cycles=cycles, macs=macs, roofline_cycles=roofline,
                                 roofline_own_cycles=roofline, roofline_load_cycles=load)


def _kernel_units(line: str) -> tuple[int, dict]:
    """(cycles, {"ideal": .., label: busy, ..}) of a --units kernel line (two lines)."""
    first, second = line.split("\n")
    ideal, busy = second.strip().removeprefix("ideal ").split(", busy: ")
    values = {label: int(value.replace(",", "")) for label, value in (part.rsplit(" ", 1) for part in busy.split(", "))}
    return int(first.split()[0].replace(",", "")), {"ideal": float(ideal.replace(",", "")), **values}


def _parse(line: str) -> dict:
    """{label: value} of a units line."""
    head, rest = line.removeprefix("units busy x ideal: ").split("; floor (busiest unit a launch) ")
    floor, roofline = rest.split("; roofline ")
    chained, alone = roofline.removesuffix(")").split(" (each launch alone ")
    values = {label: float(value) for label, value in (part.rsplit(" ", 1) for part in head.split(", "))}
    return {**values, "floor": float(floor), "roofline": float(chained), "roofline alone": float(alone)}


def test_hand_count():
    kernels = [_kernel({"load": 100, "compute": 300, "store": 50, "vector": 200}, roofline=250, load=80),
               _kernel({"load": 400, "compute": 0, "store": 100, "vector": 0}, roofline=300, load=300)]
    got = _parse(unit_line(kernels, 100))
    assert got == {"load": 5.0, "PE": 3.0, "store": 1.5, "vector": 2.0, "floor": 7.0,
                   "roofline": 5.5, "roofline alone": 5.5}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.fixed_dictionaries({unit: st.integers(0, 10**6) for unit in UNIT_NAMES}), max_size=6),
       st.integers(1, 10**6))
def test_floor_bounds_each_unit(busy, ideal):
    """The floor is at least every unit's total and at most their sum (rounded as printed)."""
    got = _parse(unit_line([_kernel(b) for b in busy], ideal))
    totals = {label: sum(b[unit] for b in busy) / ideal for unit, label in UNITS}
    for label, total in totals.items():
        assert got[label] == pytest.approx(total, abs=0.006)
        assert got["floor"] >= total - 0.01
    assert got["floor"] <= sum(totals.values()) + 0.02


def test_real_profile_floor_below_cycles():
    """On a simulated GEMM + GELU kernel: no launch ends before its busiest unit does."""
    tvm = pytest.importorskip("tvm")
    from tvm.script import relax as R

    import npu_backend

    @tvm.script.ir_module
    class Model:
        @R.function
        def main(x: R.Tensor((32, 64), "float32"), w: R.Tensor((64, 64), "float32")):
            with R.dataflow():
                y = R.nn.gelu(R.matmul(x, w))
                R.output(y)
            return y

    vm = tvm.relax.VirtualMachine(npu_backend.compile(Model, "cgra-8x8"), tvm.cpu())
    rng = np.random.default_rng(0)
    with npu_backend.profile() as prof:
        vm["main"](tvm.runtime.tensor(rng.standard_normal((32, 64), dtype="float32")),
                   tvm.runtime.tensor(rng.standard_normal((64, 64), dtype="float32")))
    got = _parse(unit_line(prof.kernels, prof.total_cycles))
    assert 0 < got["floor"] <= 1.0
    assert got["vector"] > 0  # the GELU's VFUNC issue


def test_kernel_lines_hand_count():
    """--units: a kernel's launches summed, its ideal (MACs / PEs) and each unit's busy cycles."""
    kernels = [_kernel({"load": 100, "compute": 300, "store": 50, "vector": 200}, "fc1", 400, 6400),
               _kernel({"load": 400, "compute": 0, "store": 100}, "norm", 500),
               _kernel({"load": 10, "compute": 30, "store": 5, "vector": 20}, "fc1", 40, 640)]
    prof = types.SimpleNamespace(kernels=kernels, total_cycles=940)
    lines = kernel_lines(prof, 64)
    assert _kernel_units(lines[0]) == (500, {"ideal": 0.0, "load": 400, "PE": 0, "store": 100, "vector": 0})
    assert _kernel_units(lines[1]) == (440, {"ideal": 110.0, "load": 110, "PE": 330, "store": 55, "vector": 220})
    assert all("\n" not in line for line in kernel_lines(prof))  # without --units: one line a kernel


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 10**6), st.integers(0, 10**8),
                          st.fixed_dictionaries({unit: st.integers(0, 10**6) for unit in UNIT_NAMES})),
                min_size=1, max_size=8))
def test_kernel_lines_sum_launches(launches):
    """Every kernel's line sums its launches' cycles, MACs and busy cycles, most cycles first."""
    kernels = [_kernel(busy, name, cycles, macs) for name, cycles, macs, busy in launches]
    lines = kernel_lines(types.SimpleNamespace(kernels=kernels, total_cycles=1), 64)
    got = {line.split("\n")[0].split()[-1]: _kernel_units(line) for line in lines}
    assert len(got) == len({name for name, *_ in launches})
    for name, (cycles, values) in got.items():
        mine = [k for k in kernels if k.name == name]
        assert cycles == sum(k.cycles for k in mine)
        assert values["ideal"] == pytest.approx(sum(k.macs for k in mine) / 64, abs=0.51)
        for unit, label in UNITS:
            assert values[label] == sum(k.busy_cycles[unit] for k in mine)
    order = [cycles for cycles, _ in got.values()]
    assert order == sorted(order, reverse=True)
