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
from bench_transformers import UNITS, unit_line  # noqa: E402

UNIT_NAMES = [unit for unit, _ in UNITS]


def _kernel(busy: dict) -> types.SimpleNamespace:
    return types.SimpleNamespace(busy_cycles=busy)


def _parse(line: str) -> dict:
    """{label: value} of a units line."""
    head, floor = line.removeprefix("units busy x ideal: ").split("; floor (busiest unit a launch) ")
    values = {label: float(value) for label, value in (part.rsplit(" ", 1) for part in head.split(", "))}
    return {**values, "floor": float(floor)}


def test_hand_count():
    kernels = [_kernel({"load": 100, "compute": 300, "store": 50, "vector": 200}),
               _kernel({"load": 400, "compute": 0, "store": 100, "vector": 0})]
    got = _parse(unit_line(kernels, 100))
    assert got == {"load": 5.0, "PE": 3.0, "store": 1.5, "vector": 2.0, "floor": 7.0}


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
