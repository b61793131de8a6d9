"""A decode step's cycles and DRAM bytes per token against the KV cache's length, per preset, with
the memory roofline.

The model is examples/generate.py's (a random-weight Hugging Face LlamaForCausalLM: hidden 64, 2
layers, 4 heads, 2 KV heads of 16, vocabulary 256), its decode step compiled once per preset with
caches preallocated for `--bound` positions and written in place. Per cache length L (the step
at position L - 1, so attention reads L rows): the NPU's cycles, the DRAM bytes the DMA moved, and
the roofline: decode reads every weight once (the embedding table's one row) and the caches' L
rows once, and writes the new row, so no step can take fewer than those bytes / the DMA's bytes
per cycle; "x roofline" is the step's cycles over that. Host cycles and host/NPU crossings are
printed too (0: every op on the NPU, the caches on the device).

    python benchmarks/bench_decode.py [--arch cgra-4x4 cgra-8x8 cgra-16x16] [--lengths 1 16 128 1024 2048]
                                      [--static]

With `--static`, each length also compiles the step for exactly that length (caches of L - 1 rows
in, grown by concat: no preallocated cache, no symbolic length) and prints the preallocated step's
cycles (NPU + host) over that compile's: one compile per length, slow.

Needs torch and transformers (`pip install -e ".[hf]"`).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))  # the model and its step are the example's


def roofline_bytes(model, length: int) -> int:
    """The bytes a decode step at cache length `length` must move: every weight once (one row of
    the embedding table), the caches' rows read once, the new rows written."""
    config = model.config
    weights = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name)
    weights += config.hidden_size  # the token's embedding row
    row = config.num_key_value_heads * config.head_dim
    caches = 2 * config.num_hidden_layers * row * (length + 1)  # L rows read, one written
    return 4 * (weights + caches)


def measure(vm, model, bound: int, length: int) -> dict:
    """The step at position length - 1 over caches of random rows: its profile's figures."""
    import tvm

    from generate import run_step, step_figures

    config = model.config
    shape = (1, config.num_key_value_heads, bound, config.head_dim)
    rng = np.random.default_rng(length)
    caches = [tvm.runtime.tensor(rng.standard_normal(shape).astype("float32")) for _ in
              range(2 * config.num_hidden_layers)]
    _, prof = run_step(vm, 1, length - 1, caches)
    return step_figures(prof)


def static_cycles(model, arch: str, length: int) -> int:
    """NPU + host cycles of the step compiled for exactly cache length `length` (L - 1 rows in)."""
    import torch
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    import npu_backend
    from generate import decode_step

    config = model.config
    caches = [torch.randn(1, config.num_key_value_heads, length - 1, config.head_dim)
              for _ in range(2 * config.num_hidden_layers)]
    args = (torch.tensor([[1]]), torch.tensor([length - 1]), *caches)
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(decode_step(model), args))
    vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    with npu_backend.profile() as prof:
        vm["main"](*[tvm.runtime.tensor(a.numpy()) for a in args])
    return prof.total_cycles + prof.host_cycles


def main(argv=None) -> None:
    """One table per preset: a row per cache length."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", nargs="+", default=["cgra-4x4", "cgra-8x8", "cgra-16x16"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1, 16, 128, 1024, 2048])
    parser.add_argument("--bound", type=int, default=2048, help="cache positions preallocated (default: 2048)")
    parser.add_argument("--static", action="store_true", help="also compile for each length and compare (slow)")
    args = parser.parse_args(argv)
    if max(args.lengths) > args.bound:
        parser.error(f"a cache length of {max(args.lengths)} is past --bound {args.bound}")
    from cgra_sim.arch import load_arch
    from generate import build_model, compile_step

    model = build_model(0, args.bound)
    for arch_name in args.arch:
        arch = load_arch(arch_name)
        vm, seconds = compile_step(model, args.bound, arch_name)
        print(f"\n{arch_name}: {arch.dma_bytes_per_cycle} DMA bytes/cycle, {arch.clock_mhz:.0f} MHz; compiled once "
              f"for lengths 1..{args.bound} in {seconds:.1f} s")
        print(f"{'length':>7} {'cycles':>9} {'tokens/s':>9} {'DRAM B':>9} {'roofline B':>10} {'roofline cyc':>12} "
              f"{'x roofline':>10} {'host cyc':>8} {'crossings':>9}" + (f" {'/ static':>8}" if args.static else ""))
        for length in args.lengths:
            f = measure(vm, model, args.bound, length)
            need = roofline_bytes(model, length)
            bound_cycles = -(-need // arch.dma_bytes_per_cycle)
            print(f"{length:>7} {f['cycles']:>9} {arch.clock_mhz * 1e6 / f['cycles']:>9.0f} {f['dram_bytes']:>9} "
                  f"{need:>10} {bound_cycles:>12} {f['cycles'] / bound_cycles:>10.2f} {f['host_cycles']:>8} "
                  f"{f['crossings']:>9}" + (f" {(f['cycles'] + f['host_cycles']) / static_cycles(model, arch_name, length):>8.3f}"
                                            if args.static else ""), flush=True)


if __name__ == "__main__":
    main()
