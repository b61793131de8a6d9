"""Whole-network simulation speed: ResNet-18 at 224x224, compiled once, one inference timed.

Stage: tooling (not part of any pipeline). In: nothing (the model is built with onnx.helper by
tests/onnx_models.py: 7x7/2 stem, max pool, 64-128-256-512 channels with two basic blocks per
stage, stride-2 projections, batch norm, global average pool, FC; float32). Out, per preset: the
compile time, then for the inference (run in a fresh process that only loads the compiled
library, so its peak RSS is the simulation's, not the compiler's; the peak is reset after
loading where Linux allows it): simulated cycles and MACs,
NPU commands, host seconds, simulated cycles / MACs / commands per host second, peak RSS, and
the host seconds split over the simulator's steps (validate / time / execute / stats), the
device glue around them and everything else (host operators on the CPU, runtime, VM).

    python benchmarks/bench_network.py [--arch cgra-8x8 cgra-16x16] [--repeat 2] [--keep DIR]

`--keep DIR` keeps the compiled libraries there and reuses them on the next run (compile skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = ("validate", "time", "execute", "stats", "device")


def compile_library(arch: str, path: str) -> float:
    """Compiles ResNet-18 for `arch` into the shared library `path`; returns the seconds taken."""
    import npu_backend
    from tvm.relax.frontend.onnx import from_onnx

    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from onnx_models import resnet18  # test-only model builder

    mod = from_onnx(resnet18())
    started = time.perf_counter()
    executable = npu_backend.compile(mod, arch)
    seconds = time.perf_counter() - started
    executable.export_library(path)
    return seconds


def _memory_mib(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process in MiB (Linux); the peak from getrusage
    elsewhere."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _reset_peak_memory() -> None:
    """Restart VmHWM from the current RSS (Linux >= 4.0), so the peak is the inference's own."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
            clear.write("5")
    except OSError:
        pass


def run_library(path: str, repeat: int) -> dict:
    """Loads the compiled library and runs `repeat` inferences; figures of the fastest one."""
    import numpy as np
    import tvm

    import npu_backend

    vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(path), tvm.cpu())
    x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype("float32"))
    rss_loaded = _memory_mib("VmRSS")
    _reset_peak_memory()
    runs = []
    for _ in range(repeat):
        with npu_backend.profile() as prof:
            started, cpu_started = time.perf_counter(), time.process_time()
            vm["main"](x).numpy()
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        runs.append({"seconds": seconds, "cpu_seconds": cpu, "cycles": prof.total_cycles, "macs": prof.total_macs,
                     "commands": sum(k.num_commands for k in prof.kernels),
                     "launches": len(prof.kernels), "steps": dict(getattr(prof, "host_seconds", {}))})
    best = min(runs, key=lambda run: run["seconds"])
    best["all_seconds"] = [run["seconds"] for run in runs]
    best["rss_loaded_mib"] = rss_loaded
    best["rss_peak_mib"] = _memory_mib("VmHWM")
    return best


def report(arch: str, compile_s: float | None, run: dict) -> None:
    seconds = run["seconds"]
    steps = run["steps"]
    other = seconds - sum(steps.get(step, 0.0) for step in STEPS)
    split = ", ".join(f"{step} {steps.get(step, 0.0):.2f}" for step in STEPS)
    compiled = "reused" if compile_s is None else f"{compile_s:.1f} s"
    print(f"ResNet-18 224x224 float32 on {arch} (compile: {compiled})\n"
          f"  {run['cycles']:,} simulated cycles, {run['macs']:,} MACs, {run['commands']:,} commands "
          f"in {run['launches']} launches\n"
          f"  one inference: {seconds:.2f} s host, {run['cpu_seconds']:.2f} s CPU "
          f"(runs: {', '.join(f'{s:.2f}' for s in run['all_seconds'])})"
          f"; {run['cycles'] / seconds:,.0f} cycles/s, {run['macs'] / seconds:,.0f} MACs/s, "
          f"{run['commands'] / seconds:,.0f} commands/s\n"
          f"  host seconds: {split}, other (host ops, runtime, VM) {other:.2f}\n"
          f"  peak RSS while running {run['rss_peak_mib']:.0f} MiB ({run['rss_loaded_mib']:.0f} MiB after "
          f"importing tvm and loading the library)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="*", default=["cgra-8x8", "cgra-16x16"])
    parser.add_argument("--repeat", type=int, default=2, help="inferences per preset (default 2)")
    parser.add_argument("--keep", metavar="DIR", help="keep (and reuse) the compiled libraries here")
    parser.add_argument("--run-library", metavar="SO", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.run_library:
        print(json.dumps(run_library(args.run_library, args.repeat)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or scratch
        os.makedirs(folder, exist_ok=True)
        for arch in args.arch:
            path = os.path.join(folder, f"resnet18_{arch}.so")
            compile_s = None if args.keep and os.path.exists(path) else compile_library(arch, path)
            child = subprocess.run([sys.executable, __file__, "--run-library", path, "--repeat",
                                    str(args.repeat)], check=True, capture_output=True, text=True)
            report(arch, compile_s, json.loads(child.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    main()
