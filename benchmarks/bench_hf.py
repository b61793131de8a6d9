"""Figures on Hugging Face transformers' own architectures (tests/hf_models.py; small configs,
random weights): NPU share of the multiply-accumulates, kernel launches, compile time against the
llvm build, NPU cycles and the largest difference to PyTorch.

Columns: architecture; parameters; NPU share of MACs; kernel launches; compile s cgra (cold,
kernel cache off), llvm, and their ratio; NPU cycles on the chip; relative error against PyTorch
(float32, max |difference| / max |PyTorch|) of cgra, and of llvm ("fails": TVM's own llvm build
raises on that graph).

    python benchmarks/bench_hf.py [--arch cgra-8x8] [--models resnet vit ...]

Needs torch and transformers (`pip install -e ".[hf]"`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the builders (hf_models.py) are test-side


def figures(name: str, arch: str) -> str:
    import numpy as np
    import torch
    import tvm
    from tvm.relax.frontend.torch import from_exported_program

    import npu_backend
    from hf_models import build, first_output

    model, inputs = build(name)
    with torch.no_grad():
        expected = first_output(model(*inputs)).numpy()
        mod = from_exported_program(torch.export.export(model, inputs))
    scale = np.abs(expected).max()
    params = sum(p.numel() for p in model.parameters())
    share = npu_backend.npu_mac_fraction(npu_backend.explain(mod, arch))
    started = time.perf_counter()
    executable = npu_backend.compile(mod, arch)
    cgra_s = time.perf_counter() - started
    args = [tvm.runtime.tensor(x.numpy()) for x in inputs]
    with npu_backend.profile() as prof:
        out = first_output(tvm.relax.VirtualMachine(executable, tvm.cpu())["main"](*args)).numpy()
    cgra_err = float(np.abs(out.astype(np.float64) - expected).max() / scale)
    started = time.perf_counter()
    try:
        llvm = tvm.compile(mod, target="llvm")
        llvm_s = time.perf_counter() - started
        reference = first_output(tvm.relax.VirtualMachine(llvm, tvm.cpu())["main"](*args)).numpy()
        llvm_err = f"{float(np.abs(reference.astype(np.float64) - expected).max() / scale):.1e}"
    except Exception:  # noqa: BLE001  (TVM's own build: reported, not ours to fix)
        llvm_s, llvm_err = time.perf_counter() - started, "fails"
    return (f"{name:<18} {params / 1e6:>6.2f}M {share:>6.1%} {len(prof.kernels):>7} {cgra_s:>6.2f} {llvm_s:>6.2f} "
            f"{cgra_s / llvm_s:>5.2f} {prof.total_cycles:>11,} {cgra_err:>8.1e} {llvm_err:>8}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cgra-8x8")
    parser.add_argument("--models", nargs="*", help="default: every architecture of tests/hf_models.py")
    args = parser.parse_args()
    os.environ.setdefault("CGRA_KERNEL_CACHE", "off")
    from hf_models import ARCHITECTURES

    print(f"{args.arch}, random weights, float32")
    print(f"{'architecture':<18} {'params':>7} {'NPU':>6} {'kernels':>7} {'cgra s':>6} {'llvm s':>6} {'ratio':>5} "
          f"{'cycles':>11} {'cgra err':>8} {'llvm err':>8}")
    for name in args.models or list(ARCHITECTURES):
        print(figures(name, args.arch), flush=True)


if __name__ == "__main__":
    main()
