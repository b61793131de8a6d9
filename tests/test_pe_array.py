"""GEMM and DEPTHWISE costs from the systolic cell's mapping (cgra_sim/mapping/pe_array.py):
the presets keep their closed forms, a fabric change moves the cycles for the reason the mapping
gives, and the mapped cell computes acc += a * b cycle by cycle on the array simulator."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import cost, load_arch, preset_names
from cgra_sim.mapping import pe_array
from cgra_sim.mapping.array_sim import run_array

PRESETS = [load_arch(name) for name in preset_names()]


def _with_fabric(arch, **changes):
    return dataclasses.replace(arch, name=f"{arch.name}-changed", fabric={**arch.fabric, **changes})


@pytest.mark.parametrize("arch", PRESETS + [load_arch("examples/my_chip.json")], ids=lambda a: a.name)
@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_every_preset_runs_a_mac_a_cycle_on_every_pe(arch, dtype):
    """Which is what keeps the systolic closed forms (and the SCALE-Sim comparisons) exact."""
    program = pe_array.program(arch, dtype)
    assert (program.cell.ii, program.share, program.step, program.slots) == (1, 1, 1, 1)
    assert cost.depthwise_fill_cycles(arch, dtype) == 2
    assert cost.pe_array_config_cycles(arch, dtype) == arch.config_load_cycles
    assert cost.gemm_steady_cycles(arch, 64, 64, 64, dtype) == \
        -(-64 // arch.rows) * -(-64 // arch.cols) * -(-64 // arch.macs_per_pe[dtype])


@pytest.mark.parametrize("changes, step, why", [
    ({"latency": {"alu": 2, "mul": 2, "mem": 1}}, 2, "the accumulator's adder takes 2 cycles: a MAC every other cycle"),
    ({"multipliers": "checkerboard"}, 2, "half the PEs multiply: two cells a multiplier"),
    ({"latency": {"alu": 1, "mul": 4, "mem": 2}}, 1, "a longer multiplier only lengthens the pipeline"),
])
def test_a_fabric_change_moves_gemm_and_depthwise_cycles_for_its_reason(changes, step, why):
    base = load_arch("cgra-8x8")
    changed = _with_fabric(base, **changes)
    program = pe_array.program(changed, "int8")
    assert program.step == step, why
    m, n, k = 32, 48, 96  # int8 on 8x8: the banks keep up, so the steady stream is the MAC steps
    assert cost.gemm_steady_cycles(changed, m, n, k, "int8") == step * cost.gemm_steady_cycles(base, m, n, k, "int8")
    assert cost.depthwise_compute_cycles(changed, m, n, 9, "int8") == \
        step * cost.depthwise_compute_cycles(base, m, n, 9, "int8")
    assert cost.pe_array_config_cycles(changed, "int8") == step * base.config_load_cycles
    assert cost.depthwise_fill_cycles(changed, "int8") == changed.fabric["latency"]["mem"] + \
        changed.fabric["latency"]["alu"]


def test_a_two_register_pe_cannot_keep_a_b_and_the_product_at_one_mac_a_cycle():
    changed = _with_fabric(load_arch("cgra-4x4"), registers=2)
    program = pe_array.program(changed, "float32")
    assert program.cell.ii > program.cell.mii == 1
    assert cost.gemm_steady_cycles(changed, 4, 4, 8, "float32") == 8 * program.cell.ii


def test_a_fabric_that_cannot_run_the_cell_is_refused_by_name():
    changed = _with_fabric(load_arch("cgra-4x4"), registers=1)
    with pytest.raises(pe_array.PeArrayError, match=r"GEMM and DEPTHWISE need the systolic cell.*registers"):
        cost.gemm_steady_cycles(changed, 4, 4, 8, "int8")


@given(rows=st.integers(2, 5), cols=st.integers(2, 5), registers=st.integers(3, 5),
       topology=st.sampled_from(["mesh", "torus", "hycube"]), memory_ports=st.sampled_from(["left", "border", "all"]),
       multipliers=st.sampled_from(["all", "checkerboard"]), alu=st.integers(1, 2), mul=st.integers(1, 3),
       mem=st.integers(1, 2), dtype=st.sampled_from(["int8", "float32"]), k=st.integers(1, 40))
def test_the_cell_runs_cycle_by_cycle_as_the_fast_model_charges(rows, cols, registers, topology, memory_ports,
                                                               multipliers, alu, mul, mem, dtype, k):
    """On random fabrics: the cell's mapping, run PE by PE on the array simulator over k MACs,
    computes every partial sum of acc += a * b bit for bit, issues a MAC every II cycles (its
    cycle count is k x II plus one iteration's latency less an II: the fill and drain the fast
    model charges as the GEMM's skew), and the fast model charges k x II x the multiplier share."""
    arch = dataclasses.replace(
        load_arch("cgra-4x4"), name="random", rows=rows, cols=cols, macs_per_pe={"int8": 1, "float32": 1},
        fabric={**load_arch("cgra-4x4").fabric, "topology": topology, "registers": registers,
                "hops_per_cycle": 2 if topology == "hycube" else 1, "memory_ports": memory_ports,
                "multipliers": multipliers, "latency": {"alu": alu, "mul": mul, "mem": mem}})
    program = pe_array.program(arch, dtype)
    cell = program.cell
    rng = np.random.default_rng(k)
    kind = pe_array.cell_dtype(dtype)
    a, b = (rng.integers(-100, 100, k).astype(kind) for _ in range(2))
    outputs, cycles = run_array(cell, {"a": a, "b": b}, k)
    np.testing.assert_array_equal(outputs["out"], np.cumsum(a * b, dtype=kind))
    assert cycles == k * cell.ii + cell.length - cell.ii
    multiplying = sum(multipliers == "all" or (r + c) % 2 == 0 for r in range(rows) for c in range(cols))
    assert program.share == -(-rows * cols // multiplying)
    assert cost.gemm_steady_cycles(arch, 1, 1, k, dtype) == k * cell.ii * program.share


def _chip_file(tmp_path, name, **changes):
    import json

    arch = load_arch("cgra-8x8").to_dict()
    arch.update(name=name, fabric={**arch["fabric"], **changes})
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(arch))
    return str(path)


def test_a_model_on_a_chip_with_a_slow_adder_takes_longer_and_stays_right(tmp_path, capsys):
    """The whole flow: the tile searches and the simulator both price GEMMs by the cell's II."""
    import json
    import os

    from npu_backend.tools.cli import main

    example = os.path.join(os.path.dirname(__file__), "..", "examples", "tiny_cnn.onnx")
    cycles = {}
    for chip in ("cgra-8x8", _chip_file(tmp_path, "slow-adder", latency={"alu": 2, "mul": 2, "mem": 1})):
        assert main(["run", example, "--arch", chip, "--check", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        cycles[chip] = {",".join(layer["nodes"]): layer["cycles"] for layer in report["layers"]
                        if layer["where"] == "npu"}
    preset, slow = cycles.values()
    conv = "conv2,relu2"
    assert 1.5 * preset[conv] < slow[conv] <= 2 * preset[conv] + 2_000  # compute-bound: about twice


def test_a_chip_that_cannot_run_the_cell_is_refused_before_compiling(tmp_path, capsys):
    import os

    from npu_backend.tools.cli import main

    example = os.path.join(os.path.dirname(__file__), "..", "examples", "tiny_cnn.onnx")
    assert main(["run", example, "--arch", _chip_file(tmp_path, "one-register", registers=1)]) != 0
    error = capsys.readouterr().err
    assert "chip 'one-register'" in error and "systolic cell" in error and "more registers" in error
