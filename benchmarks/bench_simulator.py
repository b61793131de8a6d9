"""Host-speed benchmark of the cgra_sim simulator on hand-written command streams.

Stage: tooling (not part of any pipeline). In: nothing (the streams are built here with
cgra_sim.streams). Out: one line per stream on stdout: commands, wall time (best of --repeat),
commands per host second, simulated cycles and MACs per host second, peak Python memory
(tracemalloc, measured in a separate run) and the time split over the simulator's steps
(simulate.STEPS: validate / time / execute / stats, each the best of --repeat), with the part of
stats the roofline's compulsory bytes take (roofline.launch_roofline on the same commands).

    python benchmarks/bench_simulator.py [--arch cgra-16x16] [--repeat 5]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from fractions import Fraction

import numpy as np

from cgra_sim import load_arch, simulate, streams
from cgra_sim.isa import EPILOGUE_RELU
from cgra_sim.roofline import launch_roofline
from cgra_sim.simulate import simulate_detailed
from cgra_sim.validate import validate_stream


def gemm_case(arch, m, n, k, tile):
    records = streams.tiled_gemm(arch, m, n, k, "int8", tile=tile, epilogue_flags=EPILOGUE_RELU)
    rng = np.random.default_rng(0)

    def tensors():
        return [rng.integers(-128, 128, (m, k), dtype=np.int8),
                rng.integers(-128, 128, (k, n), dtype=np.int8), np.zeros((m, n), np.int32)]
    return f"tiled gemm {m}x{n}x{k} int8, tiles {tile[0]}x{tile[1]}x{tile[2]}", records, tensors


def conv_case(arch, height, width, channels, filters):
    records = streams.conv2d_3x3(arch, height, width, channels, filters, "int8")
    rng = np.random.default_rng(0)

    def tensors():
        return [rng.integers(-128, 128, (height, width, channels), dtype=np.int8),
                rng.integers(-128, 128, (3, 3, channels, filters), dtype=np.int8),
                np.zeros((height, width, filters), np.int32)]
    return f"conv2d 3x3 {height}x{width}x{channels}->{filters} int8, halo loads", records, tensors


def roofline_seconds(arch, records, tensors, repeat: int) -> float:
    """Seconds (best of `repeat`) the roofline takes inside the stats step: its cost is the
    compulsory bytes (a mask over every DMA box), the same whatever the MACs, so none are given."""
    decoded = validate_stream(arch, records, tensors)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        launch_roofline(arch, decoded, Fraction(0))
        best = min(best, time.perf_counter() - start)
    return best


def measure(arch, label, records, make_tensors, repeat: int) -> None:
    best, stats, steps = float("inf"), None, {}
    for _ in range(repeat):
        tensors = make_tensors()
        start = time.perf_counter()
        result = simulate_detailed(arch, records, tensors)
        best = min(best, time.perf_counter() - start)
        stats = result.stats
        for step, seconds in result.host_seconds.items():
            steps[step] = min(steps.get(step, float("inf")), seconds)
    tensors = make_tensors()
    tracemalloc.start()
    simulate(arch, records, tensors)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    roofline_s = roofline_seconds(arch, records, make_tensors(), repeat)
    split = ", ".join(f"{step} {seconds * 1e3:.0f} ms" for step, seconds in steps.items())
    print(f"{label}\n  {len(records)} commands in {best * 1e3:.1f} ms: "
          f"{len(records) / best:,.0f} commands/s, {stats.cycles / best:,.0f} simulated cycles/s, "
          f"{stats.macs / best:,.0f} simulated MACs/s\n"
          f"  kernel: {stats.cycles:,} cycles, {stats.macs:,} MACs, utilisation {stats.utilisation:.2f}; "
          f"peak traced memory {peak / 2**20:.1f} MiB\n"
          f"  split: {split} (roofline {roofline_s * 1e3:.1f} ms, {roofline_s / best:.1%} of the run)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cgra-16x16")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    arch = load_arch(args.arch)
    cases = [gemm_case(arch, 256, 256, 256, (arch.rows, arch.cols, 256)),
             gemm_case(arch, 512, 512, 256, (arch.rows, arch.cols, 256)),
             gemm_case(arch, 256, 256, 256, (arch.rows, arch.cols, 32)),
             conv_case(arch, 56, 56, 64, 128)]
    print(f"cgra_sim benchmark on {arch.name} (best of {args.repeat})")
    for label, records, make_tensors in cases:
        measure(arch, label, records, make_tensors, args.repeat)


if __name__ == "__main__":
    main()
