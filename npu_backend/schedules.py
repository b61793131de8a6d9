"""Your own schedules for the NPU's kernels (docs/own-kernels.md).

Register a function for a cgra pattern (or for every kernel of an op); it gets the whole fused
kernel (compute, epilogue, copies) as one s_tir PrimFunc in an `s_tir.Schedule`, and what
comes after it (DMA pass, code generation, runtime, simulator, profile) is the built-in path:

    @npu_backend.schedules.register_schedule("cgra.conv2d_bias_residual_relu")
    def channels_outer(sch, spec, tiling, arch):
        ...

What a schedule gets: `spec` (KernelSpec: op, shapes, dtypes, epilogue), `tiling` (Tiling: the
built-in tile search's tm x tn x tk, which it may ignore) and `arch` (HardwareDescription).
Blocks of a GEMM-shaped kernel (matmul, conv2d): "a_pad" and "b_pad" (the operands), "acc" (the
reduction), "bias_pad" / "scale_pad" / "res_pad" (epilogue operands), "epi" (the epilogue),
"out" (the store). Every block must end up tensorized (`intrinsic(...)` names the intrinsic for
a tile) or a copy between a tensor and the scratchpad (scope `SPAD`); the compiler checks.
"""

from __future__ import annotations

from .kernels.gemm.gemm_schedule import loops_after, stage_output_tile, tensorize_tile
from .kernels.intrinsics import INTRINSICS, SPAD
from .kernels.intrinsics import get_intrin as intrinsic
from .kernels.registry import builtin_schedule as builtin
from .kernels.registry import register_kernel, register_schedule
from .kernels.common.spec import KernelSpec, Tiling

__all__ = ["INTRINSICS", "SPAD", "KernelSpec", "Tiling", "builtin", "intrinsic", "loops_after", "register_kernel",
           "register_schedule", "stage_output_tile", "tensorize_tile"]


def intrinsics_table() -> str:
    """The intrinsics a schedule may tensorize to, as the markdown table in docs/own-kernels.md
    (`python -m npu_backend.schedules` prints it; a test keeps the page equal to it)."""
    import inspect

    lines = ["| kind | ISA command | `intrinsic(kind, ...)` parameters (after `*`: by keyword) | computes |",
             "|---|---|---|---|"]
    for kind, entry in INTRINSICS.items():
        params, keywords = [], False
        for name, param in inspect.signature(entry.factory).parameters.items():
            if param.kind is inspect.Parameter.KEYWORD_ONLY and not keywords and name != "scope":
                params.append("*")
                keywords = True
            if name != "scope":
                params.append(name)
        summary = (inspect.getdoc(entry.factory) or "").split("\n\n")[0].replace("\n", " ")
        lines.append(f"| `{kind}` | {entry.op.name} | {', '.join(params)} | {summary} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(intrinsics_table())
