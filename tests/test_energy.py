"""Energy: each kernel's picojoules from its commands and the chip's energy table (cgra_sim/energy.py).

A one-tile GEMM against the closed form; every component linear in its own price and in nothing
else (Hypothesis over tiled GEMMs and prices); descriptions without a table get the published
figures, bad tables are refused naming the entry; a compiled model reports energy per kernel,
in total (per layer: test_cli's CSV test), and an int8 model costs less than its float32 twin.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import load_arch, simulate, streams
from cgra_sim.arch import ArchError, HardwareDescription
from cgra_sim.energy import COMPONENTS, default_energy

ARCH = load_arch("cgra-8x8")


def _inputs(m, n, k, dtype, rng):
    acc = "int32" if dtype == "int8" else "float32"
    if dtype == "int8":
        a, b = rng.integers(-100, 100, (m, k)).astype(np.int8), rng.integers(-100, 100, (k, n)).astype(np.int8)
    else:
        a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    return [a, b, np.zeros((m, n), acc)]


def test_a_one_tile_gemm_costs_the_closed_form():
    """12 x 20 x 30 float32 in one tile on the 8x8 array: 2 row folds, 3 column folds."""
    m, n, k = 12, 20, 30
    stream = streams.tiled_gemm(ARCH, m, n, k, "float32", tile=(m, n, k))
    stats = simulate(ARCH, stream, _inputs(m, n, k, "float32", np.random.default_rng(0)))
    e = ARCH.energy
    a, b, c = 4 * m * k, 4 * k * n, 4 * m * n  # bytes
    expected = {
        "mac": m * n * k * e["mac"]["float32"],
        "vector": 0.0,
        # loads write A and B, the GEMM reads A per column fold and B per row fold and writes C,
        # the store reads C
        "spad": (a * 3 + b * 2 + c) * e["spad_read_byte"] + (a + b + c) * e["spad_write_byte"],
        "dram": (a + b + c) * e["dram_byte"],
        "config": stats.config_loads * e["config_load"],
        "leakage": stats.cycles * e["leakage_per_cycle"],
    }
    assert stats.energy_breakdown == pytest.approx(expected)
    assert stats.energy_pj == pytest.approx(sum(expected.values()))
    assert stats.config_loads >= 1


def test_a_configuration_costs_its_slots_and_its_word_size():
    """A 128-bit configuration word loads two 64-bit words a PE; a systolic cell mapped at II 2
    (an adder of latency 2) takes two slots: four times the preset's configuration energy."""
    m, n, k = 12, 20, 30
    stream = streams.tiled_gemm(ARCH, m, n, k, "float32", tile=(m, n, k))
    inputs = _inputs(m, n, k, "float32", np.random.default_rng(0))
    base = simulate(ARCH, stream, [a.copy() for a in inputs])
    wide = dataclasses.replace(ARCH, name="wide-slow", fabric={**ARCH.fabric, "config_word_bits": 128,
                                                                "latency": {"alu": 2, "mul": 2, "mem": 1}})
    changed = simulate(wide, stream, [a.copy() for a in inputs])
    assert changed.config_loads == base.config_loads
    assert changed.energy_breakdown["config"] == pytest.approx(4 * base.energy_breakdown["config"])


#: The energy-table entry each component is priced by (the MAC's per dtype, the spad's by reads).
PRICES = {"spad": ("spad_read_byte",), "dram": ("dram_byte",), "config": ("config_load",),
          "leakage": ("leakage_per_cycle",)}


@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 40), dtype=st.sampled_from(["int8", "float32"]),
       tile=st.tuples(st.integers(1, 16), st.integers(1, 16), st.integers(1, 16)), factor=st.integers(2, 5),
       component=st.sampled_from(["mac", "spad", "dram", "config", "leakage"]), seed=st.integers(0, 2**16))
def test_each_component_scales_with_its_own_price_only(m, n, k, dtype, tile, factor, component, seed):
    """Raise one price `factor`-fold: that component grows `factor`-fold (the spad's by its read
    part), the cycles, results and every other component stay the same."""
    stream = streams.tiled_gemm(ARCH, m, n, k, dtype, tile=tile)
    energy = json.loads(json.dumps(ARCH.energy))
    key = ("mac", dtype) if component == "mac" else PRICES[component]
    if len(key) == 2:
        energy[key[0]][key[1]] *= factor
    else:
        energy[key[0]] *= factor
    pricier = dataclasses.replace(ARCH, energy=energy)
    rng = np.random.default_rng(seed)
    tensors = _inputs(m, n, k, dtype, rng)
    copies = [t.copy() for t in tensors]
    base, raised = simulate(ARCH, stream, tensors), simulate(pricier, stream, copies)
    assert raised.cycles == base.cycles and np.array_equal(tensors[2], copies[2])
    for part in COMPONENTS:
        if part != component:
            assert raised.energy_breakdown[part] == pytest.approx(base.energy_breakdown[part])
    if component != "spad":
        assert raised.energy_breakdown[component] == pytest.approx(factor * base.energy_breakdown[component])
    else:
        assert raised.energy_breakdown["spad"] > base.energy_breakdown["spad"]


def test_a_description_without_a_table_gets_the_published_figures_and_a_bad_one_is_refused():
    data = json.loads(ARCH.to_json())
    del data["energy"]
    assert HardwareDescription.from_dict(data).energy == ARCH.energy  # the preset states the same figures
    for preset in ("cgra-4x4", "cgra-16x16"):
        arch = load_arch(preset)
        assert arch.energy == default_energy(arch.rows, arch.cols, arch.spad_bytes, arch.spad_banks, arch.dtypes)
    for change, message in [
        (lambda e: e.__setitem__("dram_byte", -1.0), "energy['dram_byte'] must be a non-negative number"),
        (lambda e: e["mac"].pop("int8"), "energy['mac'] must give pJ for each of ['bfloat16', 'float16', 'float32', 'int16', 'int8']"),
        (lambda e: e.pop("leakage_per_cycle"), "missing ['leakage_per_cycle']"),
        (lambda e: e.__setitem__("spad_byte", 1.0), "unknown ['spad_byte']"),
    ]:
        bad = json.loads(ARCH.to_json())
        change(bad["energy"])
        with pytest.raises(ArchError, match=message.replace("[", r"\[").replace("]", r"\]")):
            HardwareDescription.from_dict(bad)


def test_a_model_reports_energy_per_kernel_and_in_total_and_int8_costs_less():
    import npu_backend
    from npu_backend.tools.workloads import conv2d_model, run

    energy = {}
    for dtype in ("float32", "int8"):
        mod, inputs, _ = conv2d_model(1, 16, 20, 20, 32, 3, 3, (1, 1), (1, 1, 1, 1), dtype)
        with npu_backend.profile() as prof:
            run(npu_backend.compile(mod, "cgra-8x8"), inputs)
        (kernel,) = prof.kernels
        assert kernel.energy_pj > 0 and kernel.energy_pj == pytest.approx(sum(kernel.energy_breakdown.values()))
        assert prof.to_dict()["total_energy_pj"] == pytest.approx(kernel.energy_pj)
        assert kernel.energy_breakdown["mac"] == pytest.approx(kernel.padded_macs * {"float32": 4.6, "int8": 0.3}[dtype])
        energy[dtype] = kernel.energy_pj
    assert energy["int8"] < energy["float32"] / 2
