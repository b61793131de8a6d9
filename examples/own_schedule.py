"""Your own schedule for a fused kernel (docs/own-kernels.md, seed 000: "both conv2d and its fused
operators scheduled together").

A ResNet-style conv2d + bias + residual add + relu is one kernel (pattern
cgra.conv2d_bias_residual_relu). The built-in schedule walks the output in its tile search's
tiles, pixel tiles outer and channel tiles inner. This one walks the same tiles channel tiles
outer, pixel tiles inner: it splits and orders the epilogue's loops itself, then uses the
built-in helpers to stage the tile in the scratchpad and tensorize it. Both run on the
simulator; the result is checked against numpy and the cycles are printed side by side.

    python examples/own_schedule.py [--arch cgra-8x8]
"""

from __future__ import annotations

import argparse

import numpy as np

import npu_backend
from npu_backend import schedules
from npu_backend.tools.workloads import conv2d_model, run

PATTERN = "cgra.conv2d_bias_residual_relu"
SCHEDULED = []  # the kernels channels_outer scheduled (so that a caller can see it ran)


def channels_outer(sch, spec, tiling, arch):
    """The built-in search's output tiles, channel tile outer, pixel tile inner; the rest built
    in. (Tiles of your own: dataclasses.replace(tiling, tn=...); a tile must divide the padded
    extents tiling.mp, np, kp and still fit the scratchpad.)"""
    SCHEDULED.append(spec)
    *_, row, col = sch.get_loops(sch.get_sblock("epi"))  # (output pixels, output channels)
    row_outer, row_inner = sch.split(row, [None, tiling.tm])
    col_outer, col_inner = sch.split(col, [None, tiling.tn])
    sch.reorder(col_outer, row_outer, row_inner, col_inner)
    acc = schedules.stage_output_tile(sch, spec, row_outer)
    schedules.tensorize_tile(sch, spec, tiling, arch, acc, row_inner, row_outer)


def cycles(arch: str) -> int:
    mod, inputs, reference = conv2d_model(1, 32, 28, 28, 64, 3, 3, (1, 1), (1, 1, 1, 1), residual=True, seed=0)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    np.testing.assert_allclose(out, reference, rtol=1e-4, atol=1e-4)
    (kernel,) = prof.kernels
    return kernel.cycles


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="cgra-8x8", help="preset name or JSON file (default cgra-8x8)")
    arch = parser.parse_args(argv).arch
    built_in = cycles(arch)
    schedules.register_schedule(PATTERN, channels_outer)
    try:
        own = cycles(arch)
    finally:
        schedules.register_schedule(PATTERN, None)  # back to the built-in schedule
    print(f"conv2d 3x3 32->64 on 28x28 + bias + residual + relu, {arch}: matches numpy with both schedules")
    print(f"  built-in schedule (pixels outer):  {built_in:>9,} cycles")
    print(f"  your schedule (channels outer):    {own:>9,} cycles ({own / built_in:.3f}x)")
    return {"built_in": built_in, "own": own, "scheduled": len(SCHEDULED)}


if __name__ == "__main__":
    main()
