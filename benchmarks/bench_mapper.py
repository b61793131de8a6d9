"""Figures for the CGRA mapper (issue 14): II against MII over the intrinsic suite on every preset
and on random fabrics, with the heuristic alone and with the CP-SAT fallback (how many MII the
solver proved infeasible, how many it reached where the heuristic missed), mapping time per array
size, II as the array grows, and the cycle-level array simulator against the mapping's own count.

    python benchmarks/bench_mapper.py [--random 20] [--seed 0] [--mapper both|heuristic|auto|solver]
    python benchmarks/bench_mapper.py --bodies [--mapper heuristic] [CHIP ...]

`--bodies` times what a first compile of a model with a smooth activation maps on each chip
(default: the presets and examples/my_chip.json): GELU's four bodies (SiLU's and sigmoid's three
among them) through body.program, every lane count it tries, with a fresh disk cache and the
shipped mappings left unread; CPU seconds, as the machine may be shared.

`--mapper both` (the default when ortools is installed) measures the heuristic alone and then the
heuristic with the solver fallback (CGRA_MAPPER=auto); one mode measures that one. Every mapping
is computed afresh: the in-process cache is cleared before each, and the disk cache is a new
temporary directory per mode (so a second run does not read the first one's mappings).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import statistics
import tempfile
import time

import numpy as np

from cgra_sim import load_arch, preset_names
from cgra_sim.fabric import Fabric
from cgra_sim.mapping import INTRINSICS, MappingError, map_graph, solver
from cgra_sim.mapping import mapper
from cgra_sim.mapping.array_sim import run_array


def _timed(graph, fabric):
    mapper._CACHE.clear()
    started = time.perf_counter()
    mapping = map_graph(graph, fabric)
    return mapping, time.perf_counter() - started


def _random_fabric(rng: random.Random) -> Fabric:
    topology = rng.choice(["mesh", "torus", "hycube"])
    side = rng.choice([2, 3, 4, 4, 6, 8])
    return Fabric(side, rng.choice([side, side // 2 or 1, side * 2]), topology=topology,
                  hops_per_cycle=rng.randint(2, 3) if topology == "hycube" else 1, registers=rng.randint(2, 8),
                  memory_ports=rng.choice(["left", "border", "all"]), multipliers=rng.choice(["all", "checkerboard"]),
                  latency={"alu": rng.randint(1, 2), "mul": rng.randint(1, 3), "mem": rng.randint(1, 2)})


def _suite(fabric: Fabric) -> list[dict]:
    """One record per intrinsic: at MII, MII proved infeasible, found by the solver, seconds."""
    records = []
    for name, build in INTRINSICS.items():
        try:
            mapping, took = _timed(build(), fabric)
        except MappingError:
            records.append({"name": name, "mapped": False, "at": False, "proved": False, "solver": False,
                            "optimal": False})
            continue
        records.append({"name": name, "mapped": True, "at": mapping.ii == mapping.mii, "seconds": took,
                        "proved": mapping.mii in mapping.infeasible, "solver": mapping.mapper == "cp-sat",
                        # no lower II: MII, or every II below it proved infeasible
                        "optimal": set(range(mapping.mii, mapping.ii)) <= set(mapping.infeasible)})
    return records


def _count(records: list[dict]) -> str:
    at, proved = sum(r["at"] for r in records), sum(r["proved"] for r in records)
    solved, failed = sum(r["solver"] for r in records), [r["name"] for r in records if not r["mapped"]]
    return (f"II = MII {at:2}/{len(records)}" + (f", MII proved infeasible {proved:2}" if proved else "")
            + (f", by the solver {solved}" if solved else "") + (f"; not mapped: {failed}" if failed else ""))


def _describe(index: int, fabric: Fabric) -> str:
    return (f"random {index:2} {fabric.rows}x{fabric.cols} {fabric.topology:6} regs {fabric.registers} "
            f"mem {fabric.memory_ports:6} mul {fabric.multipliers:12}")


def _measure(fabrics: list[tuple[str, Fabric]], mode: str) -> dict:
    """Every fabric's suite records with CGRA_MAPPER=mode and a fresh disk cache (the presets'
    shipped mappings unread: the mac cell is one of them)."""
    os.environ["CGRA_MAPPER"] = mode
    cache = tempfile.mkdtemp(prefix="bench-mapper-")
    os.environ["CGRA_MAPPING_CACHE"] = cache
    try:
        with _without_shipped():
            return {label: _suite(fabric) for label, fabric in fabrics}
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _percentiles(values: list[float]) -> str:
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
    return f"{statistics.median(values):.3f} / {p90:.3f} / {values[-1]:.3f}"


def _report(fabrics: list[tuple[str, Fabric]], results: dict) -> None:
    modes = list(results)
    for label, _ in fabrics:
        print(f"  {label:58} " + " | ".join(f"{mode}: {_count(results[mode][label])}" for mode in modes))
    for part, labels in (("presets", [lb for lb, _ in fabrics if not lb.startswith("random")]),
                         ("random fabrics", [lb for lb, _ in fabrics if lb.startswith("random")])):
        for mode in modes if labels else ():  # --random 0: no random fabrics
            records = [r for label in labels for r in results[mode][label]]
            at, proved = sum(r["at"] for r in records), sum(r["proved"] for r in records)
            missed, optimal = len(records) - at - proved, sum(r["optimal"] for r in records)
            print(f"{part} ({mode}): II = MII on {at}/{len(records)} ({at / len(records):.1%}); MII infeasible "
                  f"(proved) {proved}; heuristic missed, not proved {missed}; found by the solver "
                  f"{sum(r['solver'] for r in records)}; II proved the least possible {optimal}/{len(records)}")
    print("mapping time (s) by array size: p50 / p90 / max" + "".join(f"  [{mode}]" for mode in modes))
    sizes = {f"{fabric.rows}x{fabric.cols}": [] for _, fabric in fabrics}
    for label, fabric in fabrics:
        sizes[f"{fabric.rows}x{fabric.cols}"].append(label)
    for size in sorted(sizes, key=lambda s: tuple(int(x) for x in s.split("x"))):
        cells = []
        for mode in modes:
            seconds = [r["seconds"] for label in sizes[size] for r in results[mode][label] if r["mapped"]]
            cells.append(_percentiles(seconds) if seconds else "-")
        print(f"  {size:6} " + "   ".join(cells) + f"  ({len(sizes[size]) * len(INTRINSICS)} mappings)")


def _check_cycles(fabric: Fabric, iterations: int = 32) -> list[str]:
    lines = []
    for name, build in INTRINSICS.items():
        mapping = map_graph(build(), fabric)
        graph = mapping.graph
        rng = np.random.default_rng(0)
        inputs = {s: (rng.standard_normal(iterations) if graph.dtype == "float32"
                      else rng.integers(-1000, 1000, iterations)).astype(graph.dtype) for s in graph.inputs}
        outputs, cycles = run_array(mapping, inputs, iterations)
        exact = all(np.array_equal(outputs[s], v) for s, v in graph.evaluate(inputs).items())
        lines.append(f"  {name:16} II {mapping.ii} latency {mapping.length:3}: array {cycles} cycles, "
                     f"(n-1) x II + latency {mapping.cycles(iterations)}, {'bit-exact' if exact else 'DIFFERS'}")
    return lines


def _without_shipped():
    """Mappings computed, not read from the package (a mapper from before they shipped has none)."""
    try:
        from cgra_sim.mapping.store import without_shipped
    except ImportError:
        return contextlib.nullcontext()
    return without_shipped()


def _time_bodies(chips: list[str], mode: str) -> None:
    """CPU seconds body.program takes for the smooth activations' bodies on each chip, mapped afresh."""
    from cgra_sim.mapping import body, sigmoid

    os.environ["CGRA_MAPPER"] = mode
    print(f"the smooth activations' bodies mapped afresh ({mode}): lanes / II / latency, CPU s")
    total = 0.0
    for chip in chips:
        fabric = Fabric.of(load_arch(chip))
        cells = []
        for nodes in sigmoid.passes("gelu_tanh"):
            with tempfile.TemporaryDirectory(prefix="bench-mapper-") as cache, _without_shipped():
                os.environ["CGRA_MAPPING_CACHE"] = cache
                mapper._CACHE.clear()
                body._program.cache_clear()
                started = time.process_time()
                program = body.program(nodes, "float32", fabric)
                took = time.process_time() - started
            total += took
            cells.append(f"{program.lanes:2}/{program.ii:2}/{program.latency:3} {took:6.2f}")
        print(f"  {os.path.basename(chip):18} " + "   ".join(cells))
    print(f"  total {total:.1f} CPU s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=int, default=20, help="random fabrics (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mapper", choices=["both", *solver.MODES], default=None,
                        help="both (the default with ortools: heuristic, then auto), or one CGRA_MAPPER mode")
    parser.add_argument("--bodies", nargs="*", metavar="CHIP",
                        help="time the smooth activations' bodies on these chips (default: presets, my_chip)")
    args = parser.parse_args()
    if args.bodies is not None:
        here = os.path.dirname(os.path.abspath(__file__))
        _time_bodies(args.bodies or [*preset_names(), os.path.join(here, "..", "examples", "my_chip.json")],
                     args.mapper if args.mapper in solver.MODES else "auto")
        return
    choice = args.mapper or ("both" if solver.version() else "heuristic")
    modes = ["heuristic", "auto"] if choice == "both" else [choice]
    print(f"intrinsic suite: {len(INTRINSICS)} bodies ({', '.join(INTRINSICS)}); mappers: {', '.join(modes)}"
          f" (ortools {solver.version() or 'not installed'})")
    rng = random.Random(args.seed)
    fabrics = [(preset, Fabric.of(load_arch(preset))) for preset in preset_names()]
    randoms = [_random_fabric(rng) for _ in range(args.random)]
    fabrics += [(_describe(index, fabric), fabric) for index, fabric in enumerate(randoms)]
    _report(fabrics, {mode: _measure(fabrics, mode) for mode in modes})
    os.environ["CGRA_MAPPER"], os.environ["CGRA_MAPPING_CACHE"] = modes[-1], "off"
    print(f"II as the array grows (mesh, 2x2 .. 16x16; {modes[-1]}):")
    for name, build in INTRINSICS.items():
        iis = [map_graph(build(), Fabric(side, side)).ii for side in (2, 3, 4, 6, 8, 12, 16)]
        monotone = all(a >= b for a, b in zip(iis, iis[1:]))
        print(f"  {name:16} {iis}  {'never worse' if monotone else 'WORSE ON A BIGGER ARRAY'}")
    print(f"cycle-level array simulator vs the mapping (cgra-8x8, 32 iterations; {modes[-1]}):")
    print("\n".join(_check_cycles(Fabric.of(load_arch("cgra-8x8")))))


if __name__ == "__main__":
    main()
