"""Figures for the CGRA mapper (issue 14): II against MII over the intrinsic suite on every preset
and on random fabrics, mapping time per array size, II as the array grows, and the cycle-level
array simulator against the mapping's own cycle count.

    python benchmarks/bench_mapper.py [--random 20] [--seed 0]

Every mapping is computed afresh (the mapper's cache is cleared before each), one process.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np

from cgra_sim import load_arch, preset_names
from cgra_sim.fabric import Fabric
from cgra_sim.mapping import INTRINSICS, MappingError, map_graph
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


def _suite(fabric: Fabric):
    """(at MII, mapped, failures, seconds per intrinsic)."""
    at, mapped, failed, seconds = 0, 0, [], []
    for name, build in INTRINSICS.items():
        try:
            mapping, took = _timed(build(), fabric)
        except MappingError:
            failed.append(name)
            continue
        mapped += 1
        at += mapping.ii == mapping.mii
        seconds.append(took)
    return at, mapped, failed, seconds


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=int, default=20, help="random fabrics (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"intrinsic suite: {len(INTRINSICS)} bodies ({', '.join(INTRINSICS)})")
    times: dict[str, list[float]] = {}
    for preset in preset_names():
        fabric = Fabric.of(load_arch(preset))
        at, mapped, failed, seconds = _suite(fabric)
        times.setdefault(f"{fabric.rows}x{fabric.cols}", []).extend(seconds)
        print(f"{preset:12} II = MII on {at}/{len(INTRINSICS)}; not mapped: {failed or 'none'}; "
              f"slowest {max(seconds):.3f} s")
    rng = random.Random(args.seed)
    total_at = total = 0
    for _ in range(args.random):
        fabric = _random_fabric(rng)
        at, mapped, failed, seconds = _suite(fabric)
        total_at, total = total_at + at, total + len(INTRINSICS)
        times.setdefault(f"{fabric.rows}x{fabric.cols}", []).extend(seconds)
        print(f"  random {fabric.rows}x{fabric.cols} {fabric.topology:6} regs {fabric.registers} "
              f"mem {fabric.memory_ports:6} mul {fabric.multipliers:12}: II = MII on {at}/{len(INTRINSICS)}"
              + (f"; not mapped: {failed}" if failed else ""))
    print(f"random fabrics: II = MII on {total_at}/{total} ({total_at / total:.1%})")
    print("mapping time (s) by array size: p50 / p90 / max")
    for size in sorted(times, key=lambda s: tuple(int(x) for x in s.split("x"))):
        values = sorted(times[size])
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        print(f"  {size:6} {statistics.median(values):.3f} / {p90:.3f} / {values[-1]:.3f}  ({len(values)} mappings)")
    print("II as the array grows (mesh, 2x2 .. 16x16):")
    for name, build in INTRINSICS.items():
        iis = [map_graph(build(), Fabric(side, side)).ii for side in (2, 3, 4, 6, 8, 12, 16)]
        monotone = all(a >= b for a, b in zip(iis, iis[1:]))
        print(f"  {name:16} {iis}  {'never worse' if monotone else 'WORSE ON A BIGGER ARRAY'}")
    print("cycle-level array simulator vs the mapping (cgra-8x8, 32 iterations):")
    print("\n".join(_check_cycles(Fabric.of(load_arch("cgra-8x8")))))


if __name__ == "__main__":
    main()
