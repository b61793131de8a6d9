"""Loop bodies on the PE fabric (FABRIC): how the chip maps them, what a kernel of one costs
against its bound, and what they change in whole models.

    python benchmarks/bench_fabric.py [--models] [--arch cgra-8x8 ...]

Prints, per preset: each activation body's program (lanes per iteration, II against MII, elements
a cycle against the DMA engines' rate, configuration bytes and load cycles, mapping time); a
leaky relu kernel over a 16 x 64 x 64 map (cycles against the body's own bound and the DMA
bound); with --models, MobileNetV3-Small (224) and Tiny YOLOv3 (416) on the first arch given,
with their chains as kernels of their own and inside the convolutions (fuse_chains): kernels,
cycles, DMA bytes, energy. Mapping times are measured with the mapping cache off and the presets'
shipped mappings unread.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ["CGRA_MAPPING_CACHE"] = "off"
os.environ.setdefault("CGRA_KERNEL_CACHE", "off")

BODIES = {  # as the compiler writes them (kernels/common/chains.py, kernels/elementwise/eltwise.py's PRELU_BODY)
    "leaky relu 0.1": (("mul", "a", 0.1), ("max", "a", "n0")),
    "hard-swish": (("add", "a", 3.0), ("max", "n0", 0.0), ("min", "n1", 6.0), ("mul", "n2", 1 / 6),
                   ("mul", "a", "n3")),
    "hard-sigmoid": (("mul", "a", 0.2), ("add", "n0", 0.5), ("max", "n1", 0.0), ("min", "n2", 1.0)),
    "prelu (slope as B)": (("max", "a", 0.0), ("min", "a", 0.0), ("mul", "n1", "b"), ("add", "n0", "n2")),
}


def programs(arch) -> None:
    from cgra_sim import cost
    from cgra_sim.fabric import Fabric
    from cgra_sim.mapping import body as bodies
    from cgra_sim.mapping.store import without_shipped

    fabric = Fabric.of(arch)
    for name, body in BODIES.items():
        started = time.perf_counter()
        with without_shipped():
            program = bodies.program(body, "float32", fabric)
        seconds = time.perf_counter() - started
        print(f"  {name:19} {program.lanes:2} lanes, II {program.ii} (MII {program.mapping.mii}), latency "
              f"{program.latency:2}: {program.lanes / program.ii:4.1f} elements/cycle (DMA engine "
              f"{arch.dma_bytes_per_cycle / 4:.0f}); configuration {program.config_bytes} B = "
              f"{cost.fabric_config_cycles(arch, program.config_bytes)} cycles; mapped in {seconds:.2f} s")


def leaky_kernel(arch) -> None:
    import tvm
    from tvm import relax

    import npu_backend

    shape = (1, 16, 64, 64)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.leakyrelu(x, 0.1)))
        bb.emit_func_output(out)
    ex = npu_backend.compile(bb.get(), arch)
    with npu_backend.profile() as prof:
        tvm.relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(np.ones(shape, np.float32)))
    kernel = prof.kernels[0]
    dma = kernel.busy_cycles["load"]
    print(f"  leaky relu kernel on {shape}: {kernel.cycles:,} cycles, {kernel.op_counts['FABRIC']} FABRIC tiles; "
          f"the body's bound {kernel.busy_cycles['compute']:,} ({kernel.cycles / kernel.busy_cycles['compute']:.2f}x), "
          f"the DMA bound {dma:,}")


def models(arch) -> None:
    import tvm

    import npu_backend

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from zoo_models import ZOO

    for name, size in (("mobilenet_v3_small", 224), ("tiny_yolo_v3", 416)):
        model = ZOO[name](size)
        x = np.random.default_rng(0).standard_normal((1, 3, size, size)).astype("float32")
        for fuse in (False, True):
            ex = npu_backend.compile(npu_backend.from_onnx(model), arch, fuse_chains=fuse)
            with npu_backend.profile() as prof:
                tvm.relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
            dram = sum(k.dma_load_bytes + k.dma_store_bytes for k in prof.kernels)
            fabric = sum(k.op_counts.get("FABRIC", 0) > 0 for k in prof.kernels)
            print(f"  {name}@{size}{' fuse_chains' if fuse else '':12}: {len(prof.kernels):3} kernels "
                  f"({fabric} with FABRIC), {prof.total_cycles:,} cycles, DMA {dram / 1e6:.1f} MB, "
                  f"energy {sum(k.energy_pj for k in prof.kernels) / 1e6:,.0f} uJ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", nargs="*", default=["cgra-4x4", "cgra-8x8", "cgra-16x16"])
    parser.add_argument("--models", action="store_true", help="also the two model-zoo networks with activation chains")
    args = parser.parse_args()
    from cgra_sim import load_arch

    for name in args.arch:
        arch = load_arch(name)
        print(f"{arch.name}:")
        programs(arch)
        leaky_kernel(arch)
    if args.models:
        print(f"models on {args.arch[0]}:")
        models(load_arch(args.arch[0]))


if __name__ == "__main__":
    main()
