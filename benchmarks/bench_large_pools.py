"""Figures for large pooling windows (normalise/large_pools.py): a global average over an
H x W map, compiled whole (one POOL window of H*W taps) and split into a row pass and a column
pass, on cgra-8x8: compile seconds, simulated cycles of what ran on the NPU, and where each
pass ran (a pass whose image does not fit the scratchpad stays on the host). Whole windows past
32 x 32 are not compiled: at 64 x 64 that took minutes, at 80 x 80 it crashed (issue 12).

    python benchmarks/bench_large_pools.py
"""

from __future__ import annotations

import time

import numpy as np
import tvm
from tvm import relax

import npu_backend
from npu_backend.normalise import large_pools


def global_mean(size: int):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 64, size, size), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.mean(x, axis=[2, 3], keepdims=True))
        bb.emit_func_output(out)
    return bb.get()


def measure(size: int, split: bool) -> tuple[float, int, str]:
    saved = large_pools.MAX_TAPS
    large_pools.MAX_TAPS = 256 if split else 1 << 30
    try:
        started = time.perf_counter()
        executable = npu_backend.compile(global_mean(size), "cgra-8x8")
        seconds = time.perf_counter() - started
    finally:
        large_pools.MAX_TAPS = saved
    data = tvm.runtime.tensor(np.random.default_rng(0).standard_normal((1, 64, size, size)).astype("float32"))
    with npu_backend.profile() as prof:
        relax.VirtualMachine(executable, tvm.cpu())["main"](data)
    placements = npu_backend.explain(global_mean(size) if not split else large_pools.split_large_pools(global_mean(size)),
                                     "cgra-8x8")
    return seconds, prof.total_cycles, "+".join(p.where for p in placements if p.op != "reshape")


def main():
    print(f"{'map':>9} {'whole: s':>9} {'cycles':>9} {'split: s':>9} {'cycles':>9} {'split/whole':>12}  split runs on")
    for size in (17, 24, 32, 64, 80, 160):
        whole = measure(size, split=False) if size <= 32 else None
        split = measure(size, split=True)
        ratio = f"{split[1] / whole[1]:.3f}" if whole else "-"
        shown = f"{whole[0]:9.2f} {whole[1]:9}" if whole else f"{'-':>9} {'-':>9}"
        print(f"{size:>4}x{size:<4} {shown} {split[0]:9.2f} {split[1]:9} {ratio:>12}  {split[2]}")


if __name__ == "__main__":
    main()
