"""Figures on transformer architectures nobody here wrote (tests/transformer_models.py: Hugging
Face's own decoders, encoders, ViTs, a Whisper encoder and ConvNeXt; small configs, random
weights) through torch.export -> from_exported_program -> the NPU.

Columns: architecture; host ops that compute (what `explain` leaves on the host, less views,
reshapes, layout copies and the embedding lookup), then the layout copies and lookups left on
the host (the views, reshapes the VM runs without a copy or a call, not counted); NPU cycles over
ideal (the model's MACs as imported, before any rewrite adds or drops one, / PEs; with host time
modelled by the hardware description's host entry when the profile has it, "+host" marks that
total); the same cycles over the roofline ("x roofline": the physical bound, per launch the larger
of its MACs / (PEs x MACs a PE a cycle) and its compulsory DRAM bytes / the DMA's bytes a cycle +
the DMA latency once, summed over the launches; compulsory bytes: every host element a launch
reads loaded once and every one it writes stored once, whatever its tiling reloads; on a chip
with weight prefetch a launch's constant bytes may load during the launch before it, the load
engine serial; cgra_sim/roofline.py, docs/transformer-ops.md, "x ideal and x roofline"); the
NPU's share of the modelled run time (or of the MACs, "mac", on a profile without host time);
DRAM bytes moved by the NPU's DMA; energy (uJ); compile seconds for cgra (kernel cache off) and
llvm, and their ratio; the largest difference to PyTorch relative to PyTorch's largest output.
`--units` adds a line per model of each unit's busy cycles over ideal (DMA load, PE array, DMA
store, vector unit: the stats' busy_cycles summed over the launches) and the floor: each launch's
busiest unit summed, the cycles were every kernel's units perfectly overlapped. A model whose
vector unit alone is above the goal (Swin on cgra-8x8: its GELUs and exps through the one-lane
function unit, its norms) cannot reach it by scheduling; a model near 1.0x roofline but far above
ideal is bound by its bytes (ConvNeXt's last stage: float32 weights for 4 tokens), not by its
schedule; docs/transformer-ops.md, "Where Swin's and ConvNeXt's cycles go".

    python benchmarks/bench_transformers.py [--arch cgra-8x8 ...] [--models llama vit ...] [--tokens 32] [--why] [--kernels 10] [--units]
    python benchmarks/bench_transformers.py --published --arch cgra-8x8 [--units]   # Swin-T, ConvNeXt-T widths at 224 px

Needs torch and transformers (`pip install -e ".[hf]"`).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the builders (transformer_models.py) are test-side

def figures(name: str, arch_name: str, tokens: int, units: bool = False) -> tuple[str, list[str], list[str], str]:
    """One row of the table, the names of the compute ops left on the host, a line per NPU
    kernel (the same fused function's launches summed), most cycles first, and the units line."""
    import numpy as np
    import torch
    import tvm
    from tvm.relax.frontend.torch import from_exported_program

    import npu_backend
    from transformer_models import build, first_output, host_op_counts

    model, inputs = build(name, tokens=tokens)
    with torch.no_grad():
        expected = first_output(model(*inputs)).numpy()
        mod = from_exported_program(torch.export.export(model, inputs))
    arch = npu_backend.load_arch(arch_name)
    placements = npu_backend.explain(mod, arch)
    host_compute, host_layout, names = host_op_counts(placements)
    ideal = npu_backend.model_macs(mod) / arch.num_pes
    started = time.perf_counter()
    executable = npu_backend.compile(mod, arch)
    cgra_s = time.perf_counter() - started
    args = [tvm.runtime.tensor(x.numpy()) for x in inputs]
    with npu_backend.profile() as prof:
        out = first_output(tvm.relax.VirtualMachine(executable, tvm.cpu())["main"](*args)).numpy()
    error = float(np.abs(out.astype(np.float64) - expected).max() / np.abs(expected).max())
    host_cycles = getattr(prof, "host_cycles", None)
    cycles = prof.total_cycles + (host_cycles or 0)
    share = (f"{prof.npu_share:>6.1%}" if host_cycles is not None
             else f"{npu_backend.npu_mac_fraction(placements):>5.1%}m")
    dram = sum(k.dma_load_bytes + k.dma_store_bytes for k in prof.kernels)
    started = time.perf_counter()
    tvm.compile(mod, target="llvm")
    llvm_s = time.perf_counter() - started
    mark = "+h" if host_cycles is not None else "  "
    roofline = max(prof.roofline_cycles, 1)
    row = (f"{name:<10} {host_compute:>5} {host_layout:>6} {cycles / ideal:>7.2f}{mark} {cycles / roofline:>8.2f}{mark}"
           f" {share:>7} {dram / 1e6:>8.2f} {prof.total_energy_pj / 1e6:>8.2f} {cgra_s:>6.2f} {llvm_s:>6.2f}"
           f" {cgra_s / llvm_s:>5.2f} {error:>8.1e}")
    return row, names, kernel_lines(prof, arch.num_pes if units else 0), unit_line(prof.kernels, ideal)


#: The two figures against bounds, for --help.
FIGURES_HELP = """x ideal: cycles / (the model's MACs / PEs).
x roofline: cycles / the roofline, the physical bound (cgra_sim/roofline.py): per launch
  max(MACs / (PEs x MACs a PE a cycle), compulsory load bytes / DMA bytes a cycle + DMA latency,
  compulsory store bytes / DMA bytes a cycle + DMA latency), summed over the launches;
  compulsory bytes: each host element the launch reads loaded once, each it writes stored once
  (a tiling's reloads and the halo not counted); with dma_prefetch a launch's constant bytes may
  load during the launch before it (the load engine serial across launches). 1.0 is the best any
  schedule can do; x ideal / x roofline above 1 means bytes, not MACs, bound the model."""

#: The stats' units (cgra_sim/stats.py busy_cycles), as the units line names them.
UNITS = (("load", "load"), ("compute", "PE"), ("store", "store"), ("vector", "vector"))


def unit_line(kernels, ideal: float) -> str:
    """Each unit's busy cycles over all launches as x ideal, the floor (each launch's busiest
    unit summed) as x ideal: what perfect overlap inside every kernel would leave, and the
    roofline as x ideal (with the launches' bounds summed alone beside it: without prefetch)."""
    from cgra_sim.roofline import run_roofline
    busy = {unit: sum(k.busy_cycles.get(unit, 0) for k in kernels) for unit, _ in UNITS}
    floor = sum(max(k.busy_cycles.values(), default=0) for k in kernels)
    ideal = max(ideal, 1)
    return ("units busy x ideal: " + ", ".join(f"{label} {busy[unit] / ideal:.2f}" for unit, label in UNITS)
            + f"; floor (busiest unit a launch) {floor / ideal:.2f}"
            + f"; roofline {run_roofline(kernels) / ideal:.2f} (each launch alone"
            f" {sum(k.roofline_cycles for k in kernels) / ideal:.2f})")


def kernel_lines(prof, pes: int = 0) -> list[str]:
    """`prof`'s NPU cycles by kernel (launches of one fused function summed), most first, with its
    roofline (KernelStats.roofline_cycles: each launch alone on an idle chip, so a launch whose
    weights were prefetched may run below it) and the cycles over it; given
    the chip's `pes` (--units), each kernel's ideal cycles (its MACs / PEs) and its units' busy cycles, so
    that a kernel far from its ideal shows which unit holds it (the busiest) and how much of its
    time no unit is the limit (cycles over the busiest unit: start-up, tail, dependences)."""
    cycles, launches, macs = collections.Counter(), collections.Counter(), collections.Counter()
    roofline = collections.Counter()
    busy = collections.defaultdict(collections.Counter)
    for kernel in prof.kernels:
        cycles[kernel.name] += kernel.cycles
        launches[kernel.name] += 1
        macs[kernel.name] += kernel.macs
        roofline[kernel.name] += kernel.roofline_cycles
        busy[kernel.name].update(kernel.busy_cycles)
    total = max(prof.total_cycles, 1)
    lines = []
    for kernel, count in cycles.most_common():
        bound = max(roofline[kernel], 1)
        line = (f"{count:>10,} {count / total:>6.1%} x{launches[kernel]:<3} roofline {roofline[kernel]:>9,}"
                f" x{count / bound:<5.2f} {kernel}")
        if pes:
            line += ("\n" + " " * 22 + f"ideal {macs[kernel] / pes:,.0f}, busy: " +
                     ", ".join(f"{label} {busy[kernel].get(unit, 0):,}" for unit, label in UNITS))
        lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=FIGURES_HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", action="append", help="presets or chip files (default: every preset)")
    parser.add_argument("--models", nargs="*", help="default: every architecture of tests/transformer_models.py")
    parser.add_argument("--published", action="store_true",
                        help="measure Swin-T and ConvNeXt-T at their published widths, heads and window, one block "
                             "a stage, 224 x 224 px (transformer_models.PUBLISHED; ~4 min each on cgra-8x8) instead "
                             "of the small configs")
    parser.add_argument("--tokens", type=int, default=32, help="tokens of text per prompt (default 32)")
    parser.add_argument("--why", action="store_true", help="also list the compute ops left on the host")
    parser.add_argument("--units", action="store_true",
                        help="also print each unit's busy cycles and the overlap floor, x ideal")
    parser.add_argument("--kernels", type=int, default=0, metavar="N",
                        help="also list each model's N costliest NPU kernels (cycles, share, launches, roofline "
                             "and cycles over it)")
    args = parser.parse_args()
    os.environ.setdefault("CGRA_KERNEL_CACHE", "off")
    import npu_backend
    from transformer_models import ARCHITECTURES, PUBLISHED

    for arch in args.arch or npu_backend.preset_names():
        print(f"\n{arch}, random weights, float32, {args.tokens} tokens of text")
        print(f"{'model':<10} {'host':>5} {'layout':>6} {'x ideal':>9} {'x roofline':>10} {'NPU':>7} {'DRAM MB':>8} {'uJ':>8} "
              f"{'cgra s':>6} {'llvm s':>6} {'ratio':>5} {'error':>8}")
        for name in args.models or list(PUBLISHED if args.published else ARCHITECTURES):
            try:
                row, names, kernels, units = figures(name, arch, args.tokens, args.units)
            except Exception as err:  # noqa: BLE001  (a model that fails is a row, not the end of the table)
                print(f"{name:<10} fails: {type(err).__name__}: {str(err).splitlines()[0][:120]}", flush=True)
                continue
            print(row, flush=True)
            if args.why and names:
                counts = {op: names.count(op) for op in sorted(set(names))}
                print("           host: " + ", ".join(f"{op} x{n}" for op, n in counts.items()), flush=True)
            if args.units:
                print("           " + units, flush=True)
            for line in kernels[:args.kernels]:
                print("          " + line, flush=True)


if __name__ == "__main__":
    main()
