"""`cgra-sim map`: map an intrinsic's body onto a chip's fabric, check it cycle by cycle, show it.

Stage: entry (the mapper's command line; no tvm). In: an intrinsic name (intrinsics.py) or
`all`, and a chip. Out: II against MII (ResMII, RecMII), latency, PE utilisation, configuration
size, mapping time and which mapper found it (the heuristic, or the CP-SAT solver where the
heuristic missed MII; `--mapper` chooses, as $CGRA_MAPPER does), with the IIs the solver proved
infeasible; for one intrinsic the mapping as a grid per time slot (the operation each PE issues,
the values that move); the cycle-level array simulator's check (bit-exact, and its cycles equal
to (n - 1) x II + latency); `--json`; `--png` draws the grids (matplotlib).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from ..arch import load_arch
from ..fabric import Fabric
from .array_sim import run_array
from . import pe_array
from .intrinsics import INTRINSICS
from .mapper import map_graph
from .solver import MODES, SolverMissing, mode

HELP = "map an intrinsic's loop body onto the chip's PE fabric (modulo schedule): II vs MII, the grid"
DESCRIPTION = (
    "Map the dataflow graph of an intrinsic's loop body (GEMM's multiply-accumulate, depthwise taps, "
    "elementwise ops, the max pool's compare tree, requantisation, fixed-point activations) onto the "
    "chip's fabric (its 'fabric' table: topology, registers, memory ports, latencies) as a modulo "
    "schedule, run the mapping on the cycle-level array simulator against numpy, and print II against "
    "MII = max(ResMII, RecMII), the schedule's latency, PE utilisation, the configuration size, the "
    "mapping time and which mapper found the mapping (the heuristic, or the CP-SAT solver where the "
    "heuristic missed MII), with the grid of each time slot for one intrinsic. Intrinsics: "
    + ", ".join(sorted(INTRINSICS)) + ", or all.")


def add_map_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--intrinsic", required=True, choices=sorted(INTRINSICS) + ["all"], metavar="NAME",
                        help=f"one of {', '.join(sorted(INTRINSICS))}, or all")
    parser.add_argument("--arch", default="cgra-8x8", help="preset name or JSON file (default cgra-8x8)")
    parser.add_argument("--iterations", type=int, default=16,
                        help="iterations the cycle-level check runs on random inputs (default 16)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (a list with --intrinsic all)")
    parser.add_argument("--png", metavar="FILE.png", help="draw the mapping's time slots (the plots extra: matplotlib)")
    parser.add_argument("--mapper", choices=list(MODES),
                        help="which mapper (default: $CGRA_MAPPER, else auto): "
                             + "; ".join(f"{mode}: {what}" for mode, what in MODES.items())
                             + ' (the solver is the solver extra: pip install -e ".[solver]")')


def run_map(args) -> int:
    if args.iterations < 1:
        raise ValueError("--iterations must be at least 1")
    if args.mapper is None:
        return _run_map(args)
    before = os.environ.get("CGRA_MAPPER")
    os.environ["CGRA_MAPPER"] = args.mapper  # for this run only
    try:
        return _run_map(args)
    finally:
        if before is None:
            del os.environ["CGRA_MAPPER"]
        else:
            os.environ["CGRA_MAPPER"] = before


def _run_map(args) -> int:
    try:
        mode()  # a bad $CGRA_MAPPER, or the solver asked for without ortools: a usage error, not a traceback
    except SolverMissing as error:
        raise ValueError(str(error)) from None
    arch = load_arch(args.arch)
    fabric = Fabric.of(arch)
    names = sorted(INTRINSICS) if args.intrinsic == "all" else [args.intrinsic]
    reports = [_report(name, arch.name, fabric, args.iterations) for name in names]
    for report in reports:
        if report["intrinsic"] == "mac":  # the systolic cell: what every GEMM and DEPTHWISE costs
            program = pe_array.program(arch, "int8")
            report["pe_array"] = {"mac_every_cycles": program.step, "cells_per_multiplier": program.share,
                                  "context_slots": program.slots, "depthwise_fill": program.depthwise_fill}
    if args.png:
        if len(names) != 1:
            raise ValueError("--png draws one intrinsic's mapping: name one with --intrinsic")
        from .picture import draw_mapping

        draw_mapping(map_graph(INTRINSICS[names[0]](), fabric), args.png)
    if args.json:
        print(json.dumps(reports if args.intrinsic == "all" else reports[0]))
        return 0
    for report in reports:
        print(_summary(report))
        if "pe_array" in report:
            p = report["pe_array"]
            print(f"  as the PE array's systolic cell (GEMM, DEPTHWISE; mapping/pe_array.py): a MAC every "
                  f"{p['mac_every_cycles']} cycle(s) a cell (II {report['II']} x {p['cells_per_multiplier']} "
                  f"cell(s) a multiplier), {p['context_slots']} context slot(s), DEPTHWISE fill {p['depthwise_fill']}")
    if len(names) == 1:
        print(grids(map_graph(INTRINSICS[names[0]](), fabric)))
    else:
        at_mii = sum(r["II"] == r["MII"] for r in reports)
        proved = sum(r["MII"] in r["proved_infeasible"] for r in reports)
        solved = sum(r["mapper"] == "cp-sat" for r in reports)
        print(f"{at_mii} of {len(reports)} at II = MII" + (f"; MII proved infeasible for {proved}" if proved else "")
              + (f"; {solved} mapped by the CP-SAT solver" if solved else ""))
    return 0 if all(r["check"]["bit_exact"] for r in reports) else 1


def _report(name: str, arch_name: str, fabric: Fabric, iterations: int) -> dict:
    mapping = map_graph(INTRINSICS[name](), fabric)
    graph = mapping.graph
    rng = np.random.default_rng(0)
    inputs = {s: (rng.standard_normal(iterations) if graph.dtype == "float32"
                  else rng.integers(-1000, 1000, iterations)).astype(graph.dtype) for s in graph.inputs}
    outputs, cycles = run_array(mapping, inputs, iterations)
    expected = graph.evaluate(inputs)
    exact = all(np.array_equal(outputs[s], expected[s]) for s in expected)
    where = mapping.fabric
    return {"intrinsic": name, "arch": arch_name, "fabric": {"rows": fabric.rows, "cols": fabric.cols, **fabric.table()},
            "region": [where.rows, where.cols], "operations": len(graph.nodes), "II": mapping.ii, "MII": mapping.mii,
            "ResMII": mapping.res_mii, "RecMII": mapping.rec_mii, "latency": mapping.length,
            "utilisation": len(graph.nodes) / (fabric.num_pes * mapping.ii),
            "config_bytes": mapping.config_bytes, "seconds": mapping.seconds, "mapper": mapping.mapper,
            "proved_infeasible": list(mapping.infeasible),
            "placement": {n: {"pe": list(where.position(pe)), "cycle": t} for n, (pe, t) in mapping.placement.items()},
            "routes": [{"reader": reader, "operand": index,
                        "path": [[*where.position(pe), t] for pe, t in chain]}
                       for (reader, index), chain in mapping.routes.items()],
            "check": {"iterations": iterations, "cycles": cycles, "expected_cycles": mapping.cycles(iterations),
                      "bit_exact": bool(exact)}}


def _summary(r: dict) -> str:
    f = r["fabric"]
    check = r["check"]
    verdict = "bit-exact" if check["bit_exact"] else "DIFFERS from numpy"
    return (f"{r['intrinsic']} on {r['arch']} ({f['rows']}x{f['cols']} {f['topology']}, {f['registers']} registers "
            f"per PE, memory ports: {f['memory_ports']}): II {r['II']}, MII {r['MII']} (ResMII {r['ResMII']}, "
            f"RecMII {r['RecMII']}); {r['operations']} operations, latency {r['latency']} cycles, PE utilisation "
            f"{r['utilisation']:.1%}, configuration {r['config_bytes']} bytes, mapped in {r['seconds']:.3f} s by "
            f"{_found_by(r)}; array check: {check['iterations']} iterations {verdict} in {check['cycles']} cycles "
            f"(expected {check['expected_cycles']})")


def _found_by(r: dict) -> str:
    who = "the CP-SAT solver (the heuristic missed this II)" if r["mapper"] == "cp-sat" else "the heuristic"
    proved = r["proved_infeasible"]
    return who + (f"; II {', '.join(map(str, proved))} proved infeasible by the solver" if proved else "")


def grids(mapping) -> str:
    """The mapping as text: per time slot, each PE's operation (cycle within the iteration), and
    the values sent over links in that slot."""
    fabric, lines = mapping.fabric, []
    width = max(8, max(len(n) for n in mapping.placement) + 4)
    for slot in range(mapping.ii):
        lines.append(f"slot {slot} (cycles = {slot} mod {mapping.ii}):")
        cells = {pe: f"{name}@{t}" for name, (pe, t) in mapping.placement.items() if t % mapping.ii == slot}
        for row in range(fabric.rows):
            lines.append("  " + " ".join(f"{cells.get(row * fabric.cols + col, '.'):<{width}}"
                                         for col in range(fabric.cols)))
        moves = sorted({f"{_value(mapping, reader, index)} {fabric.position(a)}->{fabric.position(b)}@{t}"
                        for (reader, index), chain in mapping.routes.items()
                        for (a, t), (b, _) in zip(chain, chain[1:]) if a != b and t % mapping.ii == slot})
        lines.append("  moves: " + (", ".join(moves) if moves else "none"))
    return "\n".join(lines)


def _value(mapping, reader: str, index: int) -> str:
    return mapping.graph.by_name[reader].operands[index].source
