"""Figures for `cgra-sim sweep` (issue 15): a grid of chips x three models, run serially, in worker
processes and (with the ray extra) on a local Ray instance; the tables must agree, and the wall
times and the Pareto frontier are printed.

    python benchmarks/bench_sweep.py [--size 64] [--ray] [--out DIR]

The models: the bundled examples/tiny_cnn.onnx and two model-zoo-shaped networks at --size
(tests/zoo_models.py: SqueezeNet 1.1 and MobileNet v1, random weights). The grid: rows 4/8/16 x
cols 4/8 x scratchpad 128/256 KiB x DMA 8/16 bytes per cycle = 24 chips from cgra-8x8. No point
cache (every way computes every point); each way gets its own empty kernel cache.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the model builders are test-side
GRID = [("rows", [4, 8, 16]), ("cols", [4, 8]), ("spad_bytes", [128 << 10, 256 << 10]),
        ("dma_bytes_per_cycle", [8, 16])]
TIMES = ("compile_s", "simulate_s")


def _models(folder: str, size: int) -> list[str]:
    import onnx

    from zoo_models import ZOO

    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(HERE, "..", "examples", "tiny_cnn.onnx")]
    for name in ("squeezenet1.1", "mobilenet_v1"):
        paths.append(os.path.join(folder, f"{name}-{size}.onnx"))
        onnx.save(ZOO[name](size), paths[-1])
    return paths


def _timed(todo, **how) -> tuple[list[dict], float]:
    from npu_backend.tools import sweep

    with tempfile.TemporaryDirectory(prefix="bench-sweep-kernels-") as cache:
        os.environ["CGRA_KERNEL_CACHE"] = cache
        started = time.perf_counter()
        rows = sweep.run_sweep(todo, **how)
        return rows, time.perf_counter() - started


def _without_times(rows):
    return [{key: value for key, value in row.items() if key not in TIMES} for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64, help="input size of the zoo models (default 64)")
    parser.add_argument("--ray", action="store_true", help="also run on a local Ray instance (the ray extra)")
    parser.add_argument("--out", default=tempfile.mkdtemp(prefix="bench-sweep-"), help="folder for the table")
    args = parser.parse_args()
    from npu_backend.tools import pareto, sweep

    todo, invalid = sweep.tasks("cgra-8x8", GRID, _models(args.out, args.size))
    assert not invalid, invalid
    print(f"{len(todo)} points: {len(todo) // 3} chips x 3 models, {os.cpu_count()} cores")
    serial, serial_s = _timed(todo, jobs=1)
    print(f"serial (1 process):     {serial_s:7.1f} s")
    parallel, parallel_s = _timed(todo, jobs=os.cpu_count())
    print(f"{os.cpu_count()} worker processes:     {parallel_s:7.1f} s  ({serial_s / parallel_s:.2f}x)  "
          f"same table: {_without_times(parallel) == _without_times(serial)}")
    if args.ray:
        on_ray, ray_s = _timed(todo, ray_address="local")
        print(f"local Ray:              {ray_s:7.1f} s  ({serial_s / ray_s:.2f}x)  "
              f"same table: {_without_times(on_ray) == _without_times(serial)}")
    failed = [row for row in serial if row["error"]]
    print(f"failed points: {len(failed)}" + "".join(f"\n  {r['chip']} {r['model']}: {r['error']}" for r in failed))
    summaries = pareto.chip_summaries(serial)
    best = pareto.frontier(summaries)
    print(f"Pareto frontier over (cycles, energy, area): {len(best)} of {len(summaries)} chips")
    for s in sorted(best, key=lambda s: s["cycles"]):
        print(f"  {pareto.short_name(s['chip']):60} {s['area_mm2']:6.2f} mm2 {s['cycles']:>11,} cycles "
              f"{s['energy_pj'] / 1e6:8.1f} uJ")
    files = sweep.write_table(serial, args.out)
    try:
        files.append(pareto.plot_pareto(summaries, os.path.join(args.out, "pareto.png")))
    except ImportError as err:
        print(err)
    print("wrote", ", ".join(files))


if __name__ == "__main__":
    main()
