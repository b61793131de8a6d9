"""What weight prefetch across kernel launches is worth (cgra_sim/prefetch.py, `dma_prefetch`).

Each model is compiled once and run twice under a profile: with the chip's prefetch (the
presets have `dma_prefetch`) and with it switched off in the device. Columns, in cycles summed
over the launches of the run without prefetch: `wait`, each launch's first-load wait of constant
operands (the last end of its constant DMA_LOADs before its first non-DMA command: what its
first computation waits for weights); `idle`, the load engine's idle tail of the launch before
(its cycles less the end of its last load transfer: the time a prefetch may use); `stake`, the
sum of min(wait, idle) per launch, about what can be won; then the NPU cycles off and on, the
cycles saved, x ideal off -> on, and whether every output is bit for bit the same.

    python benchmarks/bench_prefetch.py [--arch cgra-8x8] [--models convnext swin vit llama resnet50]

Transformers come from tests/transformer_models.py (needs torch and transformers), ResNet-50
from tests/zoo_models.py (ONNX, `--resnet-size`, default 64 pixels to keep the run short).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the model builders are test-side


class LaunchLog:
    """Wraps the device's `simulate_detailed` to keep, per launch, what the stake columns need."""

    def __init__(self):
        self.launches = []  # (wait, idle of this launch's load engine, cycles)

    def __call__(self, simulate):
        def logged(arch, stream, tensors, *args, constant_slots=(), **kwargs):
            result = simulate(arch, stream, tensors, *args, constant_slots=constant_slots, **kwargs)
            self.launches.append((first_load_wait(stream, result.timeline, constant_slots),
                                  result.tail.cycles - result.tail.load_free if result.tail else 0,
                                  result.timeline.cycles))
            return result
        return logged

    def stake(self) -> tuple[int, int, int]:
        """(sum of waits, sum of the previous launches' idle tails, sum of their minimum per launch)."""
        waits = [w for w, _, _ in self.launches[1:]]
        idles = [idle for _, idle, _ in self.launches[:-1]]
        return sum(waits), sum(idles), sum(min(w, i) for w, i in zip(waits, idles))


def first_load_wait(stream, timeline, constant_slots) -> int:
    """The last end of the constant DMA_LOADs before the launch's first non-DMA command."""
    from cgra_sim.isa import Op
    constants, wait = set(constant_slots), 0
    for index, op in enumerate(timeline.ops):
        if op not in (Op.DMA_LOAD, Op.DMA_STORE):
            break
        if op == Op.DMA_LOAD and int(stream[index][2]) in constants:
            wait = max(wait, int(timeline.ends[index]))
    return wait


@contextlib.contextmanager
def device_prefetch(enabled: bool):
    """The device with its prefetch on (the chip's) or off (no load moves), logging each launch."""
    from npu_backend.device import simulator_backend
    # the module: the package's attribute `simulate` is the function
    simulate_module = importlib.import_module("cgra_sim.simulate")
    log = LaunchLog()
    saved_simulate, saved_plan = simulator_backend.simulate_detailed, simulate_module.plan_prefetch
    simulator_backend.simulate_detailed = log(saved_simulate)
    if not enabled:
        simulate_module.plan_prefetch = lambda *args: simulate_module.NO_PREFETCH
    try:
        yield log
    finally:
        simulator_backend.simulate_detailed, simulate_module.plan_prefetch = saved_simulate, saved_plan


def build(name: str, resnet_size: int):
    """(relax module, input tensors) of a model."""
    import tvm
    if name == "resnet50":
        import zoo_models
        from npu_backend import from_onnx
        model = zoo_models.resnet50(size=resnet_size, classes=100)
        x = np.random.default_rng(0).standard_normal((1, 3, resnet_size, resnet_size)).astype("float32")
        return from_onnx(model), [tvm.runtime.tensor(x)]
    import torch
    from tvm.relax.frontend.torch import from_exported_program
    from transformer_models import build as build_transformer
    model, inputs = build_transformer(name, tokens=32)
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(model, inputs))
    return mod, [tvm.runtime.tensor(x.numpy()) for x in inputs]


def row(name: str, arch_name: str, resnet_size: int) -> str:
    import tvm
    import npu_backend
    mod, args = build(name, resnet_size)
    arch = npu_backend.load_arch(arch_name)
    ideal = npu_backend.model_macs(mod) / arch.num_pes
    vm = tvm.relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    runs = {}
    for enabled in (False, True):
        with device_prefetch(enabled) as log, npu_backend.profile() as prof:
            out = vm["main"](*args)
        outs = out if isinstance(out, (list, tuple, tvm.ir.Array)) else [out]
        runs[enabled] = (prof.total_cycles, log, [np.array(o.numpy()) for o in outs if hasattr(o, "numpy")])
    (off, log, out_off), (on, _, out_on) = runs[False], runs[True]
    wait, idle, stake = log.stake()
    same = all(a.tobytes() == b.tobytes() for a, b in zip(out_off, out_on))
    return (f"{name:<9} {len(log.launches):>8} {wait:>10} {idle:>10} {stake:>10} {off:>11} {on:>11} "
            f"{off - on:>9} {off / ideal:>6.2f} -> {on / ideal:<5.2f} {'yes' if same else 'NO'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cgra-8x8")
    parser.add_argument("--models", nargs="*", default=["convnext", "swin", "vit", "llama", "resnet50"])
    parser.add_argument("--resnet-size", type=int, default=64)
    args = parser.parse_args()
    print(f"{'model':<9} {'launches':>8} {'wait':>10} {'idle':>10} {'stake':>10} {'cycles off':>11} "
          f"{'cycles on':>11} {'saved':>9} {'x ideal off -> on':>16} same")
    for name in args.models:
        print(row(name, args.arch, args.resnet_size), flush=True)


if __name__ == "__main__":
    main()
