"""Figures for whole networks: the ResNet- and MobileNetV2-style ONNX models of tests/onnx_models.py.

Prints, per model and preset: the share of the model's MACs on the NPU, total simulated cycles,
the model's MACs against the ideal MACs / PEs bound (the ratio counts padding and every
conv/matmul at its true size, so depthwise layers show what they cost), the mean utilisation the
profile reports for the conv/matmul kernels (from the model's MACs), compile times in the same
process (the normalise stage alone; `cgra` with an empty kernel cache, the same with the host code
optimised at LLVM -O2 instead of the default -O0, `cgra` again from the kernel cache, and `llvm`)
and the ratio of the first to llvm's, and the host time to run and simulate one inference.

    python benchmarks/bench_models.py [--arch cgra-8x8 ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import tvm
from tvm.relax.frontend.onnx import from_onnx

import npu_backend
from npu_backend.target.relax_ext import clear_kernel_cache

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from onnx_models import mobilenet_v2, resnet, resnet18  # noqa: E402  (test-only model builders)


def _timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def bench(name, model, arch_name):
    arch = npu_backend.load_arch(arch_name)
    mod = from_onnx(model)
    placements = npu_backend.explain(mod, arch)
    model_macs = sum(p.macs for p in placements)
    normalise = dict(npu_backend.STAGES)["normalise"]
    _, normalise_s = _timed(lambda: normalise(mod, arch, npu_backend.CompileOptions()))
    clear_kernel_cache()  # the first compile pays for every kernel
    executable, cgra_s = _timed(lambda: npu_backend.compile(mod, arch))
    _, cached_s = _timed(lambda: npu_backend.compile(mod, arch))
    clear_kernel_cache()
    _, o2_s = _timed(lambda: npu_backend.compile(mod, arch, host_opt_level=2))
    _, llvm_s = _timed(lambda: tvm.compile(mod, target="llvm"))
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal(shape).astype("float32"))
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
    with npu_backend.profile() as prof:
        _, run_s = _timed(lambda: vm["main"](x))
    ideal = model_macs / (arch.rows * arch.cols * arch.macs_per_pe["float32"])
    utilisation = np.mean([k.utilisation for k in prof.kernels])
    print(f"{name:<13} {arch.name:<11} {npu_backend.npu_mac_fraction(placements):>7.2%} "
          f"{model_macs:>10} {prof.total_cycles:>9} {prof.total_cycles / ideal:>6.2f} "
          f"{utilisation:>6.1%} {normalise_s:>6.2f} {cgra_s:>7.2f} {o2_s:>7.2f} {cached_s:>7.2f} {llvm_s:>7.2f} "
          f"{cgra_s / llvm_s:>6.2f} {run_s:>7.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="*", default=npu_backend.preset_names())
    args = parser.parse_args()
    print(f"{'model':<13} {'arch':<11} {'NPU MAC':>7} {'MACs':>10} {'cycles':>9} {'/ideal':>6} "
          f"{'util':>6} {'norm s':>6} {'cgra s':>7} {'-O2 s':>7} {'again s':>7} {'llvm s':>7} {'/llvm':>6} {'run s':>7}")
    for name, build in (("resnet", resnet), ("mobilenet_v2", mobilenet_v2), ("resnet18_224", resnet18)):
        for arch in args.arch:
            bench(name, build(), arch)


if __name__ == "__main__":
    main()
