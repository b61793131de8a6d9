"""Figures for issue 13 on model-zoo-shaped networks (tests/zoo_models.py): compile time against
the llvm build, peak memory against the model's weights and activations, cycles against the ideal
and roofline bounds, and DRAM traffic.

Each model runs in two fresh processes, so that their peak memory is their own:
- `cgra`: compile with an empty kernel cache and an empty mapping cache (timed: a first compile
  on a fresh machine, though the presets' shipped mappings are read), run one inference under the profile (timed;
  the peak resident memory of compile + run is read here), compile again with the persistent
  cache warm and the in-process cache empty (another process recompiling the model), then the
  `llvm` build of the same model (timed, for the ratio: measured in the same process);
- `llvm`: compile and run with target "llvm" only: the peak memory to report beside ours.

Columns: model; parameters; weights and activations (MB, float32; activations: every tensor the
graph computes); NPU share of MACs; compile s cgra (cold), the VM's creation from it (the
executable made runnable), cgra warm, llvm (in the cgra process, after it) and cgra (cold) / llvm,
llvm cold (its own fresh process: a first compile, like cgra's) and cgra cold / llvm cold; peak RSS above
the interpreter after `import npu_backend` (MB) for cgra and llvm and cgra's against weights +
activations; total cycles, cycles / ideal (model MACs / PEs at peak), cycles / the bound on the
streams as issued (`/issued`: the sum of KernelStats.ideal_cycles, each launch's max(MACs / PEs,
each DMA engine's bytes moved / bandwidth), reloads counted; not the roofline, which counts each
element once: bench_transformers' `x roofline`); DRAM MB moved by
the NPU's DMA; the largest relative difference to onnxruntime.

    python benchmarks/bench_zoo.py [--arch cgra-8x8] [--size N] [--models alexnet vgg19 ...]

--size: every model's input height and width (default: each model's own, 224; the YOLOs' 416).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests")  # the model builders (zoo_models.py) are test-side


def _peak_rss_mb() -> float:
    """The process's peak resident memory since the last reset (VmHWM), in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # Linux: reset VmHWM to the current resident size


def _tensor_bytes(model) -> tuple[int, int]:
    """(weights, activations) in bytes: the initializers, and every value the graph computes."""
    import numpy as np
    import onnx

    weights = sum(int(np.prod(t.dims)) * 4 for t in model.graph.initializer)
    inferred = onnx.shape_inference.infer_shapes(model)
    activations = sum(int(np.prod([d.dim_value for d in v.type.tensor_type.shape.dim])) * 4
                      for v in list(inferred.graph.value_info) + list(inferred.graph.output))
    return weights, activations


def child(name: str, arch_name: str, size: int | None, target: str) -> dict:
    """One model in this (fresh) process, with a kernel cache and a mapping cache of its own that
    it removes; returns its figures."""
    with tempfile.TemporaryDirectory(prefix="bench-zoo-kernels-") as cache, \
            tempfile.TemporaryDirectory(prefix="bench-zoo-mappings-") as mappings:
        os.environ["CGRA_KERNEL_CACHE"], os.environ["CGRA_MAPPING_CACHE"] = cache, mappings
        return _measure(name, arch_name, size, target)


def _build(name: str, size: int | None):
    """The ONNX model `name` of zoo_models.ZOO at `size` (None: its builder's default)."""
    sys.path.insert(0, TESTS)
    from zoo_models import ZOO

    return ZOO[name]() if size is None else ZOO[name](size)


def _measure(name: str, arch_name: str, size: int, target: str) -> dict:
    import numpy as np
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    import npu_backend
    from npu_backend.target.relax_ext import clear_kernel_cache

    model = _build(name, size)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    mod = from_onnx(model)
    _reset_peak_rss()
    base = _peak_rss_mb()
    figures = {}
    started = time.perf_counter()
    executable = npu_backend.compile(mod, arch_name) if target == "cgra" else tvm.compile(mod, target="llvm")
    figures["compile_s"] = time.perf_counter() - started
    started = time.perf_counter()
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
    figures["vm_s"] = time.perf_counter() - started
    with npu_backend.profile() as prof:
        started = time.perf_counter()
        out = vm["main"](tvm.runtime.tensor(x))
        figures["run_s"] = time.perf_counter() - started
    out = (out[0] if not hasattr(out, "numpy") else out).numpy()
    figures["peak_mb"] = _peak_rss_mb() - base
    figures["out"] = out.tolist()
    if target != "cgra":
        return figures
    del executable, vm
    clear_kernel_cache()
    # Each later compile starts with the garbage collector's debts paid, as it would in the other
    # process it stands for: the run before leaves a full collection of every object (0.1 s)
    # due, which would otherwise land in whichever compile comes next.
    gc.collect()
    started = time.perf_counter()
    npu_backend.compile(mod, arch_name)
    figures["warm_s"] = time.perf_counter() - started
    gc.collect()
    started = time.perf_counter()
    tvm.compile(mod, target="llvm")
    figures["llvm_s"] = time.perf_counter() - started
    arch = npu_backend.load_arch(arch_name)
    placements = npu_backend.explain(mod, arch)
    figures.update(
        macs=sum(p.macs for p in placements), npu_share=npu_backend.npu_mac_fraction(placements),
        cycles=prof.total_cycles, bound=sum(k.ideal_cycles for k in prof.kernels),
        ideal=sum(p.macs for p in placements) / (arch.num_pes * arch.macs_per_pe["float32"]),
        dram=sum(k.dma_load_bytes + k.dma_store_bytes for k in prof.kernels), launches=len(prof.kernels))
    return figures


def _run_child(name, arch, size, target) -> dict:
    sized = ["--size", str(size)] if size is not None else []
    done = subprocess.run([sys.executable, __file__, "--child", name, target, "--arch", arch, *sized],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{name} ({target}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _reference(name, size, out) -> float:
    """Largest difference to onnxruntime, relative to the output's largest magnitude."""
    import numpy as np
    import onnxruntime

    model = _build(name, size)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = session.run(None, {model.graph.input[0].name: x})[0]
    return float(np.abs(np.asarray(out) - ref).max() / max(np.abs(ref).max(), 1e-30))


HEADER = (f"{'model':<14} {'params':>7} {'W MB':>6} {'A MB':>6} {'NPU':>5} {'cgra s':>6} {'VM s':>5} {'warm s':>6} "
          f"{'llvm s':>6} {'/llvm':>5} {'cold s':>6} {'/cold':>5} {'RSS cg':>6} {'RSS ll':>6} {'/(W+A)':>6} {'cycles':>11} {'/ideal':>6} "
          f"{'/issued':>7} {'DRAM MB':>8} {'rel err':>8}")


def report(name, arch, size) -> tuple[str, dict]:
    """The model's row, and its compile ratios for the summary."""
    model = _build(name, size)
    weights, activations = _tensor_bytes(model)
    params = weights // 4
    cgra, llvm = _run_child(name, arch, size, "cgra"), _run_child(name, arch, size, "llvm")
    mb = 1 << 20
    return (f"{name:<14} {params / 1e6:>6.1f}M {weights / mb:>6.1f} {activations / mb:>6.1f} {cgra['npu_share']:>5.0%} "
            f"{cgra['compile_s']:>6.2f} {cgra['vm_s']:>5.2f} {cgra['warm_s']:>6.2f} {cgra['llvm_s']:>6.2f} "
            f"{cgra['compile_s'] / cgra['llvm_s']:>5.2f} {llvm['compile_s']:>6.2f} "
            f"{cgra['compile_s'] / llvm['compile_s']:>5.2f} {cgra['peak_mb']:>6.0f} {llvm['peak_mb']:>6.0f} "
            f"{cgra['peak_mb'] * mb / (weights + activations):>6.2f} {cgra['cycles']:>11,} "
            f"{cgra['cycles'] / cgra['ideal']:>6.2f} {cgra['cycles'] / cgra['bound']:>7.2f} "
            f"{cgra['dram'] / mb:>8.1f} {_reference(name, size, cgra['out']):>8.1e}"), {
        "/llvm": cgra["compile_s"] / cgra["llvm_s"], "/cold": cgra["compile_s"] / llvm["compile_s"],
        "warm/llvm": cgra["warm_s"] / cgra["llvm_s"]}


def summary(ratios: dict) -> list[str]:
    """Geometric mean and worst case of each compile ratio over the models (issue 13, goal 1)."""
    lines = []
    for key in ("/llvm", "/cold", "warm/llvm"):
        values = {name: figures[key] for name, figures in ratios.items()}
        worst = max(values, key=values.get)
        geomean = math.exp(sum(math.log(v) for v in values.values()) / len(values))
        lines.append(f"compile {key:<9}: geometric mean {geomean:.2f}, worst {values[worst]:.2f} ({worst})")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cgra-8x8")
    parser.add_argument("--size", type=int, default=None,
                        help="input height and width (default: each model's own, 224; the YOLOs' 416)")
    parser.add_argument("--models", nargs="*", help="default: every model of tests/zoo_models.py (ZOO)")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "TARGET"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child[:1], args.arch, args.size, args.child[1])))
        return
    sys.path.insert(0, TESTS)
    from zoo_models import ZOO

    print(f"{args.arch}, {f'{args.size}x{args.size}' if args.size else 'each model at its own size'} inputs, float32")
    print(HEADER, flush=True)
    ratios = {}
    for name in args.models or list(ZOO):
        line, ratios[name] = report(name, args.arch, args.size)
        print(line, flush=True)
    print("\n".join(summary(ratios)))


if __name__ == "__main__":
    main()
