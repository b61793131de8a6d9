"""`cgra-sim sweep` (npu_backend/tools/sweep.py, pareto.py): grids over chip fields, one row per
(chip, model) equal to what `cgra-sim run` reports for that chip, the same table from one process,
from worker processes, from the point cache and from Ray, and a frontier no chip beats."""

from __future__ import annotations

import csv
import dataclasses
import json
import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_cli.cli import main
from cgra_sim import load_arch
from npu_backend.tools import pareto, sweep

MODEL = str(pathlib.Path(__file__).parent.parent / "examples" / "tiny_cnn.onnx")
GRID = ["--set", "rows=4,8", "--set", "spad_bytes=64K,3000", "--set", "macs_per_pe.int8=1"]
TIMES = ("compile_s", "simulate_s")


def test_settings_parse_and_refuse_what_is_not_a_field():
    assert sweep.parse_setting("spad_bytes=128K,1M,128K") == ("spad_bytes", [131072, 1 << 20])
    assert sweep.parse_setting("clock_mhz=500,1e3") == ("clock_mhz", [500.0, 1000.0])
    assert sweep.parse_setting("macs_per_pe.int8=1,4") == ("macs_per_pe.int8", [1, 4])
    with pytest.raises(sweep.SweepError, match="'name' is not a field a sweep can vary; these are: rows"):
        sweep.parse_setting("name=a,b")
    with pytest.raises(sweep.SweepError, match="values of 'rows' must be integers"):
        sweep.parse_setting("rows=4,eight")
    with pytest.raises(sweep.SweepError, match="expected FIELD=V1,V2"):
        sweep.parse_setting("rows")


def test_the_fabric_is_a_dimension_of_the_sweep(tmp_path, capsys):
    """`--set fabric.latency.alu=1,2 --set fabric.multipliers=...`: each point's chip has that fabric,
    its row carries the fabric's fields, and its cycles are what `cgra-sim run` reports on that chip
    (an adder of latency 2 makes every GEMM longer: the systolic cell's mapping, pe_array.py)."""
    assert sweep.parse_setting("fabric.latency.alu=1,2") == ("fabric.latency.alu", [1, 2])
    assert sweep.parse_setting("fabric.topology=mesh,torus") == ("fabric.topology", ["mesh", "torus"])
    with pytest.raises(sweep.SweepError, match="'fabric.multipliers' is one of all, checkerboard, not some"):
        sweep.parse_setting("fabric.multipliers=all,some")
    slow = sweep.chip(load_arch("cgra-8x8"), {"fabric.latency.alu": 2, "fabric.registers": 6})
    assert slow.fabric["latency"]["alu"] == 2 and slow.fabric["registers"] == 6
    assert load_arch("cgra-8x8").fabric["latency"]["alu"] == 1  # the base is untouched
    folder = tmp_path / "out"
    assert main(["sweep", MODEL, "--set", "fabric.latency.alu=1,2", "--out", str(folder), "--json", "--no-cache",
                 "--jobs", "1"]) == 0
    with open(folder / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["fabric.latency.alu"] for row in rows] == ["1", "2"] and rows[1]["fabric.topology"] == "mesh"
    assert int(rows[1]["cycles"]) > 1.3 * int(rows[0]["cycles"])
    chip_file = tmp_path / "slow.json"
    chip_file.write_text(sweep.chip(load_arch("cgra-8x8"), {"fabric.latency.alu": 2}).to_json())
    capsys.readouterr()
    assert main(["run", MODEL, "--arch", str(chip_file), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_cycles"] == int(rows[1]["cycles"])


def test_grid_is_every_combination_or_a_seeded_sample():
    settings = [("rows", [4, 8, 16]), ("cols", [4, 8])]
    points = sweep.grid(settings)
    assert len(points) == 6 and {"rows": 16, "cols": 4} in points
    assert sweep.grid(settings, sample=3, seed=1) == sweep.grid(settings, sample=3, seed=1)
    assert len(sweep.grid(settings, sample=3, seed=1)) == 3
    with pytest.raises(sweep.SweepError, match="gives a field twice"):
        sweep.grid([("rows", [4]), ("rows", [8])])


def test_a_chip_of_the_grid_prices_its_own_sizes():
    base = load_arch("cgra-8x8")
    small = sweep.chip(base, {"rows": 4, "spad_bytes": 64 << 10})
    assert small.name == "cgra-8x8,rows=4,spad_bytes=65536"
    assert small.energy == dataclasses.replace(small, energy=None).energy  # the published figures, new sizes
    assert small.energy["config_load"] < base.energy["config_load"] and small.area_mm2 < base.area_mm2
    own = dataclasses.replace(base, area={**base.area, "pe_overhead": 5.0})
    assert sweep.chip(own, {"rows": 4}).area["pe_overhead"] == 5.0  # a table the user gave stays


def test_a_sweep_varies_the_function_units_lanes_0_for_none():
    base = load_arch("cgra-8x8")
    assert sweep.parse_setting("function_unit.lanes=0,2") == ("function_unit.lanes", [0, 2])
    none, two = (sweep.chip(base, {"function_unit.lanes": lanes}) for lanes in (0, 2))
    assert none.function_unit is None and two.function_unit == {**base.function_unit, "lanes": 2}
    assert none.area_mm2 < base.area_mm2 < two.area_mm2
    assert sweep.chip(load_arch("cgra-4x4"), {"function_unit.lanes": 1}).function_unit["functions"] == \
        base.function_unit["functions"]  # a base without one: every function


def _sweep(tmp_path, name, *extra):
    out = tmp_path / name
    assert main(["sweep", MODEL, *GRID, "--out", str(out), "--json", "--cache-dir", str(tmp_path / "cache"),
                 *extra]) == 0
    with open(out / "results.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def _without_times(rows):
    return [{key: value for key, value in row.items() if key not in TIMES} for row in rows]


def test_sweep_rows_are_the_run_reports_and_every_way_gives_the_same_table(tmp_path, capsys):
    serial = _sweep(tmp_path, "serial", "--jobs", "1")
    capsys.readouterr()
    assert [row["chip"] for row in serial] == ["cgra-8x8,rows=4,spad_bytes=65536,macs_per_pe.int8=1",
                                               "cgra-8x8,rows=8,spad_bytes=65536,macs_per_pe.int8=1",
                                               "cgra-8x8,rows=4,spad_bytes=3000,macs_per_pe.int8=1",
                                               "cgra-8x8,rows=8,spad_bytes=3000,macs_per_pe.int8=1"]
    assert "must be a multiple of spad_banks * bank_width_bytes" in serial[2]["error"]
    # A row is what `cgra-sim run` says of the model on that chip.
    chip = sweep.chip(load_arch("cgra-8x8"), {"rows": 4, "spad_bytes": 65536, "macs_per_pe.int8": 1})
    chip_file = tmp_path / "chip.json"
    chip_file.write_text(chip.to_json())
    assert main(["run", MODEL, "--arch", str(chip_file), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert int(serial[0]["cycles"]) == report["total_cycles"] and serial[0]["rows"] == "4"
    assert float(serial[0]["energy_pj"]) == pytest.approx(report["total_energy_pj"], rel=1e-12)
    assert float(serial[0]["area_mm2"]) == pytest.approx(chip.area_mm2, rel=1e-12)
    # Worker processes, without the cache: the same table; the cache, the same again.
    parallel = _sweep(tmp_path, "parallel", "--jobs", "2", "--no-cache")
    assert _without_times(parallel) == _without_times(serial)
    assert _sweep(tmp_path, "cached", "--jobs", "2") == serial  # times included: nothing computed again


def test_fuse_chains_is_a_dimension_of_the_sweep(tmp_path, capsys):
    """`--set fuse_chains=off,on`: each chip twice, named after the option, each row what `cgra-sim
    run` (with --fuse-chains for "on") reports; the fused leaky relu saves energy (fewer DRAM
    bytes)."""
    import onnx

    from onnx_models import _Graph

    graph = _Graph(seed=0)
    out = graph.conv_bn(graph.conv_bn("input", 3, 16, act="leaky"), 16, 16, act="leaky")
    model = tmp_path / "leaky.onnx"
    onnx.save(graph.model("leaky", [1, 3, 16, 16], out, [1, 16, 16, 16]), str(model))
    folder = tmp_path / "out"
    assert main(["sweep", str(model), "--set", "rows=8", "--set", "fuse_chains=off,on", "--out", str(folder),
                 "--json", "--no-cache", "--jobs", "1"]) == 0
    with open(folder / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["chip"], row["fuse_chains"]) for row in rows] == [
        ("cgra-8x8,rows=8,fuse_chains=off", "off"), ("cgra-8x8,rows=8,fuse_chains=on", "on")]
    capsys.readouterr()
    for row, flag in zip(rows, ([], ["--fuse-chains"])):
        assert main(["run", str(model), "--json", *flag]) == 0
        report = json.loads(capsys.readouterr().out)
        assert int(row["cycles"]) == report["total_cycles"], flag
        assert float(row["energy_pj"]) == pytest.approx(report["total_energy_pj"], rel=1e-12)
    assert float(rows[1]["energy_pj"]) < float(rows[0]["energy_pj"])
    with pytest.raises(sweep.SweepError, match="'fuse_chains' takes off or on, not maybe"):
        sweep.parse_setting("fuse_chains=on,maybe")


def test_the_ray_table_is_the_local_table(tmp_path):
    pytest.importorskip("ray")  # the ray extra
    local = _sweep(tmp_path, "local", "--jobs", "1", "--no-cache")
    on_ray = _sweep(tmp_path, "ray", "--ray", "local", "--no-cache")
    assert _without_times(on_ray) == _without_times(local)


def test_sweep_writes_the_pareto_picture(tmp_path, capsys):
    pytest.importorskip("matplotlib")  # the plots extra
    _sweep(tmp_path, "plot", "--jobs", "1")
    picture = tmp_path / "plot" / "pareto.png"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(capsys.readouterr().out)["frontier"]


def test_bad_sweeps_are_usage_errors(tmp_path, capsys):
    assert main(["sweep", MODEL, "--out", str(tmp_path)]) == 2
    assert "give at least one --set" in capsys.readouterr().err
    assert main(["sweep", MODEL, "--set", "wings=2", "--out", str(tmp_path)]) == 2
    assert "'wings' is not a field a sweep can vary" in capsys.readouterr().err
    assert main(["sweep", str(tmp_path / "none.onnx"), "--set", "rows=4", "--out", str(tmp_path)]) == 2
    assert "none.onnx: No such file" in capsys.readouterr().err


_OBJECTIVE = st.integers(1, 5)


@given(st.lists(st.tuples(_OBJECTIVE, _OBJECTIVE, _OBJECTIVE), min_size=1, max_size=12))
def test_the_frontier_is_exactly_the_chips_nothing_beats(values):
    chips = [{"chip": f"c{i}", "cycles": c, "energy_pj": e, "area_mm2": a} for i, (c, e, a) in enumerate(values)]
    best = pareto.frontier(chips)

    def beats(a, b):
        return all(a[k] <= b[k] for k in pareto.OBJECTIVES) and a != b and any(
            a[k] < b[k] for k in pareto.OBJECTIVES)

    for chip in chips:
        assert (chip in best) == (not any(beats(other, chip) for other in chips))
    assert best  # a finite set always has an undominated member


def test_a_fabric_that_cannot_map_the_cell_is_refused_before_any_point_compiles(tmp_path, capsys):
    """`--set fabric.registers=1,3` (issue 35): the one-register chip is refused when the grid is
    made (its fabric cannot map the systolic cell every GEMM runs), not after a worker imported
    and began compiling the model; the printed table names it with the reason, as results.csv does."""
    todo, invalid = sweep.tasks("cgra-4x4", [("fabric.registers", [1, 3])], [MODEL])
    assert [dict(task.changes) for task in todo] == [{"fabric.registers": 3}]
    assert [row["chip"] for row in invalid] == ["cgra-4x4,fabric.registers=1"]
    assert "systolic cell" in invalid[0]["error"] and "more registers" in invalid[0]["error"]
    folder = tmp_path / "out"
    assert main(["sweep", MODEL, "--arch", "cgra-4x4", "--set", "fabric.registers=1", "--out", str(folder),
                 "--no-cache", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "fabric.registers=1" in out and "not run: GEMM and DEPTHWISE need the systolic cell" in out, out
    with open(folder / "results.csv", newline="") as handle:
        assert "systolic cell" in list(csv.DictReader(handle))[0]["error"]


def test_the_printed_table_names_each_failed_point_and_its_error():
    from cgra_cli.sweep_arguments import _table

    failed = [{"chip": "cgra-8x8,rows=4", "model": "m.onnx", "error": "ScratchpadTooSmall: no tile fits"}]
    invalid = [{"chip": "cgra-8x8,spad_bytes=3000", "error": "cgra-8x8,spad_bytes=3000: spad_bytes (3000) must be"}]
    lines = _table([], set(), failed, invalid).splitlines()
    assert lines[1].split() == ["rows=4", "failed", "on", "m.onnx:", "ScratchpadTooSmall:", "no", "tile", "fits"]
    assert lines[2].split() == ["spad_bytes=3000", "not", "run:", "spad_bytes", "(3000)", "must", "be"]
