"""The mapper's CP-SAT fallback (cgra_sim/mapping/solver.py): every mapping it finds, on random
graphs and fabrics (two registers per PE included), runs on the cycle-level array simulator to the
numpy meaning bit for bit in (n - 1) x II + latency cycles, within every modulo capacity; an II it
proves infeasible is one the heuristic cannot map either; it reaches MII where the heuristic
misses it; it is deterministic, across processes too; CGRA_MAPPER chooses it and keys the caches.
The rest of the suite runs with CGRA_MAPPER=heuristic (conftest.py); these tests set it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

pytest.importorskip("ortools.sat.python.cp_model")

import cgra_sim  # noqa: E402
from cgra_sim import load_arch  # noqa: E402
from cgra_sim.fabric import Fabric  # noqa: E402
from cgra_sim.mapping import INTRINSICS, Mapping, map_graph, mapper, rec_mii, res_mii, solver, store  # noqa: E402
from cgra_sim.mapping.dfg import OPS  # noqa: E402
from cgra_sim.mapping.mrrg import segments  # noqa: E402
from test_mapping import _runs_right, fabrics, graphs  # noqa: E402

# bench_mapper.py's random fabric 18: the heuristic maps gemm at II 4, MII is 2
TWO_REGISTERS = Fabric(4, 4, topology="torus", registers=2, memory_ports="all", multipliers="checkerboard",
                       latency={"alu": 1, "mul": 3, "mem": 1})


def _within_capacities(mapping) -> None:
    """Counted from the placement and routes alone: one operation per PE slot, `registers`
    values per PE slot, one value per unit link per slot; each chain starts where its value lands
    (or on another route of it), steps one cycle at a time to itself or a neighbour and ends where
    its reader reads it."""
    graph, fabric, ii = mapping.graph, mapping.fabric, mapping.ii
    uses, states, steps = Counter(), defaultdict(set), defaultdict(set)
    for name, (pe, t) in mapping.placement.items():
        kind = OPS[graph.by_name[name].op][0]
        assert fabric.can_run(pe, kind) and t >= 0
        uses[("fu", pe, t % ii)] += 1
        if graph.by_name[name].op != "store":
            states[name].add((pe, t + fabric.latency[kind]))
    for (reader, index), chain in mapping.routes.items():
        operand = graph.by_name[reader].operands[index]
        pe, t = mapping.placement[reader]
        assert chain[-1] == (pe, t + operand.distance * ii)
        assert chain[0] in states[operand.source] or any(
            chain[0] in other for (r, i), other in mapping.routes.items()
            if graph.by_name[r].operands[i].source == operand.source and other is not chain)
        for (a, c), (b, d) in zip(chain, chain[1:]):
            assert d == c + 1 and (b == a or b in fabric.neighbours(a))
        states[operand.source].update(chain)
        steps[operand.source].update((a, b) for a, b in zip(chain, chain[1:]) if a[0] != b[0])
    for held in states.values():
        uses.update(("reg", pe, c % ii) for pe, c in held)
    for pairs in steps.values():
        uses.update(("link", link, c % ii) for (a, c), (b, _) in pairs for link in segments(fabric, a, b))
    for (kind, where, slot), count in uses.items():
        assert count <= (fabric.registers if kind == "reg" else 1), (kind, where, slot, count)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), fabrics(max_side=4), st.sampled_from([2, 2, 3, 4]), st.integers(0, 1), st.integers(1, 6))
def test_solver_mappings_run_as_their_meaning_within_capacities(graph, fabric, registers, above, iterations):
    fabric = dataclasses.replace(fabric, registers=registers)
    res, rec = res_mii(graph, fabric), rec_mii(graph, fabric)
    ii = max(res, rec) + above
    outcome = solver.attempt(graph, fabric, ii, budget=2.0)
    event(outcome.status)
    if outcome.status == "mapped":
        mapping = Mapping(graph, outcome.fabric, ii, res, rec, outcome.placement, outcome.routes, 0.0, "cp-sat")
        _within_capacities(mapping)
        _runs_right(mapping, iterations)
    elif outcome.status == "infeasible":  # a proof: the heuristic cannot map it at this II either
        assert mapper._search(graph, fabric, ii, ii) is None


def test_the_fallback_reaches_mii_where_the_heuristic_misses(tmp_path, monkeypatch):
    monkeypatch.setenv("CGRA_MAPPING_CACHE", str(tmp_path))
    monkeypatch.setattr(mapper, "_CACHE", {})
    gemm, mac = INTRINSICS["gemm"](), INTRINSICS["mac"]()
    monkeypatch.setenv("CGRA_MAPPER", "heuristic")
    alone = map_graph(gemm, TWO_REGISTERS)
    assert (alone.ii, alone.mii, alone.mapper) == (4, 2, "heuristic")
    monkeypatch.setenv("CGRA_MAPPER", "auto")
    helped = map_graph(gemm, TWO_REGISTERS)
    assert (helped.ii, helped.mapper, helped.infeasible) == (2, "cp-sat", ())
    _within_capacities(helped)
    for iterations in (1, 3, 10):
        _runs_right(helped, iterations, seed=iterations)
    # mac at II 1 would need three registers on its multiplier's PE (two operands, its result): proved
    proved = map_graph(mac, TWO_REGISTERS)
    assert (proved.mii, proved.ii, proved.mapper, proved.infeasible) == (1, 2, "heuristic", (1,))
    # both read back from disk as they were
    monkeypatch.setattr(mapper, "_CACHE", {})
    monkeypatch.setattr(mapper, "_map", lambda *args: pytest.fail("mapped again instead of reading the file"))
    again = map_graph(gemm, TWO_REGISTERS)
    assert (again.ii, again.mapper, again.placement, again.routes) == (2, "cp-sat", helped.placement, helped.routes)
    assert map_graph(mac, TWO_REGISTERS).infeasible == (1,)


def test_a_fabric_body_maps_at_mii_on_cgra_16x16_by_tiling_its_lanes(tmp_path, monkeypatch):
    """Hard-swish over 16 lanes: the heuristic's II is 3; the solver maps one lane on a row with
    its memory port and copies it to the 15 others. The body's program cache keys by mapper too."""
    from cgra_sim.mapping import body

    monkeypatch.setenv("CGRA_MAPPING_CACHE", str(tmp_path))
    hard_swish = (("add", "a", 3.0), ("max", "n0", 0.0), ("min", "n1", 6.0), ("mul", "n2", 1 / 6), ("mul", "a", "n3"))
    fabric = Fabric.of(load_arch("cgra-16x16"))
    monkeypatch.setenv("CGRA_MAPPER", "heuristic")
    alone = body.program(hard_swish, "float32", fabric)
    assert (alone.lanes, alone.ii, alone.mapping.mii, alone.mapping.mapper) == (16, 3, 2, "heuristic")
    monkeypatch.setenv("CGRA_MAPPER", "auto")
    helped = body.program(hard_swish, "float32", fabric)
    assert (helped.lanes, helped.ii, helped.mapping.mapper) == (16, 2, "cp-sat")
    _within_capacities(helped.mapping)
    _runs_right(helped.mapping, 5)


def test_the_solver_is_deterministic_across_processes():
    gemm = INTRINSICS["gemm"]()
    first = solver.solve(gemm, TWO_REGISTERS, 2)
    assert first is not None and solver.solve(gemm, TWO_REGISTERS, 2) == first
    script = ("import json; from cgra_sim.fabric import Fabric; from cgra_sim.mapping import INTRINSICS, solver; "
              f"fabric = Fabric(**{json.dumps(dataclasses.asdict(TWO_REGISTERS))}); "
              "placement, routes = solver.solve(INTRINSICS['gemm'](), fabric, 2); "
              "print(json.dumps([placement, [[r, i, c] for (r, i), c in routes.items()]]))")
    source = str(Path(cgra_sim.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": os.pathsep.join([source, *sys.path])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True).stdout
    placement, routes = json.loads(out)
    assert {name: tuple(at) for name, at in placement.items()} == first[0]
    assert {(r, i): [tuple(step) for step in chain] for r, i, chain in routes} == first[1]


def test_cgra_mapper_chooses_and_says_what_is_missing(monkeypatch, capsys):
    from cgra_cli.cli import main

    gemm = INTRINSICS["gemm"]()
    monkeypatch.setattr(mapper, "_CACHE", {})
    monkeypatch.setenv("CGRA_MAPPER", "simplex")
    with pytest.raises(ValueError, match="CGRA_MAPPER='simplex': use one of auto, heuristic, solver"):
        map_graph(gemm, TWO_REGISTERS)
    monkeypatch.setitem(sys.modules, "ortools", None)  # as if it were not installed
    assert solver.version() is None
    monkeypatch.setenv("CGRA_MAPPER", "solver")
    with pytest.raises(solver.SolverMissing, match=r'needs OR-Tools: pip install -e "\.\[solver\]"'):
        map_graph(gemm, TWO_REGISTERS)
    assert main(["map", "--intrinsic", "mac", "--arch", "cgra-4x4", "--mapper", "solver"]) == 2
    assert 'pip install -e ".[solver]"' in capsys.readouterr().err
    assert os.environ["CGRA_MAPPER"] == "solver"  # --mapper set it for its run only
    monkeypatch.setenv("CGRA_MAPPER", "auto")  # without ortools: the heuristic alone
    assert (map_graph(gemm, TWO_REGISTERS).ii, map_graph(gemm, TWO_REGISTERS).mapper) == (4, "heuristic")


def test_cache_keys_differ_by_mapper_and_ortools_version(tmp_path, monkeypatch):
    monkeypatch.setenv("CGRA_MAPPING_CACHE", str(tmp_path))
    version = solver.version()
    tags = {mode: solver.cache_tag(mode) for mode in solver.MODES}
    assert tags == {"auto": f"auto-ortools{version}", "heuristic": "heuristic", "solver": f"solver-ortools{version}"}
    gemm = INTRINSICS["gemm"]()
    files = [store.cache_file(gemm.fingerprint, TWO_REGISTERS.fingerprint, tag) for tag in tags.values()]
    assert len(set(files)) == 3 and all(f"-{tag}-" in file.name for tag, file in zip(tags.values(), files))
    # in the process too: a heuristic mapping is not served to a solver run
    monkeypatch.setattr(mapper, "_CACHE", {})
    monkeypatch.setenv("CGRA_MAPPER", "heuristic")
    assert map_graph(INTRINSICS["gemm"](), TWO_REGISTERS).mapper == "heuristic"
    monkeypatch.setenv("CGRA_MAPPER", "solver")
    assert map_graph(INTRINSICS["gemm"](), TWO_REGISTERS).mapper == "cp-sat"
    assert len(mapper._CACHE) == 2


def test_cgra_sim_map_says_which_mapper_found_the_mapping(tmp_path, capsys):
    from cgra_cli.cli import main

    chip = load_arch("cgra-4x4").to_dict()
    chip["name"] = "two-registers"
    chip["fabric"] = {**TWO_REGISTERS.table(), "latency": dict(TWO_REGISTERS.latency)}
    path = tmp_path / "two-registers.json"
    path.write_text(json.dumps(chip))
    assert main(["map", "--intrinsic", "gemm", "--arch", str(path), "--mapper", "solver", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["II"], report["MII"], report["mapper"], report["check"]["bit_exact"]) == (2, 2, "cp-sat", True)
    assert main(["map", "--intrinsic", "mac", "--arch", str(path), "--mapper", "auto"]) == 0
    assert "II 1 proved infeasible by the solver" in capsys.readouterr().out
    assert main(["map", "--intrinsic", "gemm", "--arch", str(path), "--mapper", "heuristic", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mapper"] == "heuristic"
