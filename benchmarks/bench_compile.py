"""Figures for the end-to-end flow: simulated cycles against the ideal bound, and compile time.

Prints, for matmul 256x256x256 int8 and ResNet-18's conv2_x layer on every preset, the simulated
cycles, the ideal MACs / PEs bound, their ratio and the host time to run and simulate (the
anchors, SCALE-Sim 3.0.0 output-stationary: GEMM 1.055 on 8x8, 1.117 on 16x16; conv2_x 1.024
and 1.052, in 500-660 s and 120-220 s); then the compile time of the two end-to-end test models
for `cgra` against `llvm`, measured in the same process (best of 3).

    python benchmarks/bench_compile.py
"""

from __future__ import annotations

import time

import tvm

import npu_backend
from npu_backend.tools.workloads import conv2d_model, matmul_model, run


WORKLOADS = {
    # name: (model builder, MACs); SCALE-Sim 3.0.0 figures for the same workloads in anchors.md
    "matmul 256x256x256 int8": (lambda: matmul_model(256, 256, 256, "int8", bias=False, relu=False), 256 ** 3),
    "ResNet-18 conv2_x int8": (lambda: conv2d_model(1, 64, 56, 56, 64, 3, 3, (1, 1), (1, 1, 1, 1), "int8",
                                                    bias=False, relu=False), 56 * 56 * 64 * 64 * 9),
}


def cycles_against_ideal():
    for workload, (build, macs) in WORKLOADS.items():
        print(f"{workload} (no epilogue)")
        print(f"{'arch':<12} {'cycles':>10} {'ideal':>10} {'ratio':>7} {'util':>6} {'host s':>7}")
        for name in npu_backend.preset_names():
            arch = npu_backend.load_arch(name)
            mod, inputs, ref = build()
            ex = npu_backend.compile(mod, arch)
            started = time.perf_counter()
            with npu_backend.profile() as prof:
                out = run(ex, inputs)
            host = time.perf_counter() - started
            assert (out == ref).all(), "wrong result"
            ideal = macs // arch.peak_macs_per_cycle("int8")
            kernel = prof.kernels[0]
            print(f"{name:<12} {kernel.cycles:>10} {ideal:>10} {kernel.cycles / ideal:>7.3f} "
                  f"{kernel.utilisation:>6.1%} {host:>7.2f}")
        print()


def _best_compile_time(mod, target, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        tvm.compile(mod, target=target)
        best = min(best, time.perf_counter() - started)
    return best


def compile_times():
    models = {
        "matmul+bias+relu 100x50x70 f32": matmul_model(100, 50, 70)[0],
        "conv2d+bias+relu 3x30x30->8 f32": conv2d_model(1, 3, 30, 30, 8, 3, 3, (2, 2), (1, 1, 1, 1))[0],
    }
    print("compile time, best of 3 (same process)")
    print(f"{'model':<34} {'cgra s':>7} {'llvm s':>7} {'ratio':>6}")
    for name, mod in models.items():
        cgra, llvm = _best_compile_time(mod, "cgra"), _best_compile_time(mod, "llvm")
        print(f"{name:<34} {cgra:>7.2f} {llvm:>7.2f} {cgra / llvm:>6.2f}")


if __name__ == "__main__":
    cycles_against_ideal()
    compile_times()
