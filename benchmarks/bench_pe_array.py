"""Figures for issue 14, item 3: GEMM and DEPTHWISE costs from the systolic cell's mapping.

For each model (tests/zoo_models.py, random weights) and each chip (a preset, then the preset with
one fabric field changed), compile, run one inference under the profile and print the total
cycles, the cycles the PE array was busy (its GEMM, DEPTHWISE and FABRIC commands), the ratio
to the preset's cycles, and the cell's mapping that explains it: a MAC every
`step` cycles a cell (the `mac` body's II x the cells sharing a multiplier). On the preset the
figures are the systolic closed forms the model had before (the snapshot is identical); each
change moves them for the reason its `step` names. The compiler re-tiles for each chip (its tile
searches call the same cost model), so a step of 2 costs a little under 2x where DMA hid under
compute before.

    python benchmarks/bench_pe_array.py [--arch cgra-8x8] [--size 224] [--models resnet18 mobilenet_v2]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the model builders (zoo_models.py) are test-side

#: name -> the fabric fields it changes (the preset's own first).
CHANGES = {
    "preset": {},
    "alu latency 2": {"latency": {"alu": 2, "mul": 2, "mem": 1}},
    "mul latency 4": {"latency": {"alu": 1, "mul": 4, "mem": 1}},
    "2 registers": {"registers": 2},
    "checkerboard": {"multipliers": "checkerboard"},
    "torus": {"topology": "torus"},
}


def chips(preset: str):
    from cgra_sim import load_arch

    base = load_arch(preset)
    for label, change in CHANGES.items():
        yield label, base if not change else dataclasses.replace(
            base, name=f"{preset}-{label.replace(' ', '-')}", fabric={**base.fabric, **change})


def run(model, arch) -> tuple[int, int, float]:
    """(total cycles, cycles the PE array was busy, compile seconds) of one inference."""
    import numpy as np
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    import npu_backend

    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    started = time.perf_counter()
    executable = npu_backend.compile(from_onnx(model), arch)
    seconds = time.perf_counter() - started
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
    with npu_backend.profile() as prof:
        vm["main"](tvm.runtime.tensor(x))
    busy = sum(k.busy_cycles.get("compute", 0) for k in prof.kernels)
    return prof.total_cycles, busy, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="cgra-8x8", help="the preset whose fabric is varied (default cgra-8x8)")
    parser.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    parser.add_argument("--models", nargs="*", default=["resnet18", "mobilenet_v2"])
    args = parser.parse_args()
    from cgra_sim.mapping import pe_array
    from zoo_models import ZOO

    print(f"{'model':<14}{'chip':<16}{'step':>5}{'cell II':>8}{'share':>6}{'cycles':>14}{'array busy':>14}"
          f"{'/ preset':>9}{'compile s':>10}")
    for name in args.models:
        model = ZOO[name](args.size)
        baseline = None
        for label, arch in chips(args.arch):
            program = pe_array.program(arch, "float32")
            cycles, on_array, seconds = run(model, arch)
            baseline = baseline or cycles
            print(f"{name:<14}{label:<16}{program.step:>5}{program.cell.ii:>8}{program.share:>6}{cycles:>14,}"
                  f"{on_array:>14,}{cycles / baseline:>9.2f}{seconds:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
