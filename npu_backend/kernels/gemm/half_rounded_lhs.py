"""A 16-bit GEMM whose left operand is float32 rounded to h: the rounding run on its A panel.

Stage: partition (the roots `cgra.<matmul | linear>_rounded_lhs...` and the spec field they set)
and kernel definition (the panel program row_norm.py runs for them: one EPILOGUE). In:

    matmul(astype(x, h), W_h)        x float32 (M, K), h bfloat16 / float16, a 2-D h GEMM

which normalise/half_linears.py writes for HF Llama's down projection (`act(gate) * up` stays
float32 in TVM's import; PyTorch's F.linear rounds it to h first). The kernel loads x's float32
panel, rounds it to h into the panel the GEMMs read with one EPILOGUE (nearest even, as the cast
kernel's EPILOGUE does: the same command on the same values, so the same bits), without the cast
kernel's launch, its store of the h rows and the GEMM's load of them. The panel program is
row_norm.py's with `row_norm = ("round", 0.0, h, "float32")`, so its tiling (whole-depth tiles,
the float32 panel's bytes counted), placement and lowering (lower/norm_rows.py: the program in
pieces of rows as they arrive) are the pre-norms'.

Why: on cgra-16x16 the bf16 Llama's cast kernel cost 880 cycles a layer (load 512, store 256,
vector 264 busy: mostly the launch and the DMA round trip), more than the whole rounding is worth
inside the GEMM whose PE array waits on its A panel anyway.
"""

from __future__ import annotations

import dataclasses

from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of
from ..common.spec import KernelSpec
from ..rows.rows import Step
from .roots import Root

F32 = "float32"
HALF_FLOATS = ("bfloat16", "float16")
#: `KernelSpec.row_norm[0]` of a rounded left operand.
ROUND = "round"
#: The role of the rounded operand: what the GEMM multiplies (half_row_norm.SCALED's name).
SCALED = "norm_scaled"


def rounded_lhs_roots() -> list[Root]:
    """A matmul and a linear (permute_dims + matmul) of astype(x, h)."""
    roots = []
    for name, permuted in (("matmul", False), ("linear", True)):
        x, rhs = wildcard(), wildcard()
        cast = is_op("relax.astype")(x)
        operand = is_op("relax.permute_dims")(rhs) if permuted else rhs
        # the cast in one role only (a call under two reads as computed twice: composite.py)
        roles = {"lhs": x, "rhs": rhs, SCALED: cast, **({"permute": operand} if permuted else {})}
        roots.append(Root(f"{name}_rounded_lhs", is_op("relax.matmul")(cast, operand), roles))
    return roots


def is_rounded_lhs(annotated: dict) -> bool:
    """Whether a match's left operand is a cast (this module's roots): a rounded operand, no norm."""
    return SCALED in annotated and "row_norm" not in annotated


def with_rounded_lhs(spec: KernelSpec, annotated: dict) -> KernelSpec:
    """`spec` rounding its float32 left operand into an h panel; raises UnsupportedOperator when
    the kernel cannot (the cast then runs as its own kernel, or in the kernel before)."""
    half = dtype_of(annotated[SCALED])
    rows_only = all(role in ("lhs", "out") and axis == 0 for role, axis, _ in spec.symbols)
    if dtype_of(annotated["lhs"]) != F32 or half not in HALF_FLOATS or spec.dtype != half or \
            spec.op != "matmul" or spec.compute_name != "matmul" or not rows_only or spec.batch > 1:
        raise UnsupportedOperator(f"a float32 operand rounded to {half} for a matmul: a 2-D {spec.dtype} GEMM of "
                                  "static columns rounds its A panel; the cast runs on its own")
    return dataclasses.replace(spec, row_norm=(ROUND, 0.0, half, F32))


def round_steps(half: str) -> tuple:
    """The panel program: one EPILOGUE rounding the float32 panel x to `half`."""
    return (Step("rounded", "cast", "", ("x",), dtype=half),)
