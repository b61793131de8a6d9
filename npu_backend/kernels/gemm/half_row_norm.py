"""A bfloat16 / float16 model's RMSNorm folded into the linear that reads it, with its roundings.

Stage: partition (the roots `cgra.<matmul | linear>_rms_norm_half...` and the spec field they
set) and kernel definition (what row_norm.py's panel program adds for them). HF's bfloat16 /
float16 RMSNorm is `weight * rms_norm(x.float()).to(h)`: normalised in float32, rounded to h,
times gamma in h (PyTorch's CPU kernel widens both factors, multiplies in float32 and rounds),
which normalise/rms_norms.py and half_casts.py write as `multiply(g, astype(rms_norm(x, ones),
h))` and normalise/half_normed_linears.py copies into each linear reading it:

    matmul(multiply(g, astype(rms_norm(x, R.ones), h)), W)      x float32 (M, K), g and W h

The rounded gamma multiply cannot go into W (g * W rounds differently), so, unlike the float32
norm (gamma folded away, row_norm.py), the kernel reads g: per tile of rows its A panel x, in
float32, runs the norm kernel's own half program (kernels/rows/half_norms.py: REDUCE, VFUNC,
ELTWISE, an EPILOGUE rounding to h, an ELTWISE in h by g's row), and the GEMMs read the h panel:
the same commands on the same values as the norm kernel, so the product is the norm kernel's
followed by the GEMM, without the norm's launch, its store of the normed rows and the GEMM's
load of them.
"""

from __future__ import annotations

import dataclasses

from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of, shape_dims
from ..common.spec import KernelSpec, aligned
from .roots import Root

F32 = "float32"
HALF_FLOATS = ("bfloat16", "float16")
#: The role of the norm's 16-bit gamma, which the kernel reads (a row of the panel program).
GAMMA = "norm_gamma"
#: The role of the norm's rounded, scaled rows: what the GEMM multiplies (its dtype the GEMM's).
SCALED = "norm_scaled"


def half_normed_roots() -> list[Root]:
    """A matmul and a linear (permute_dims + matmul) of multiply(g, astype(rms_norm(x, R.ones), h))
    (the order normalise/half_normed_linears.py writes)."""
    roots = []
    for name, permuted in (("matmul", False), ("linear", True)):
        x, rhs, gamma = wildcard(), wildcard(), wildcard()
        ones = is_op("relax.ones")(wildcard())
        norm = is_op("relax.nn.rms_norm")(x, ones)
        cast = is_op("relax.astype")(norm)
        scaled = is_op("relax.multiply")(gamma, cast)
        operand = is_op("relax.permute_dims")(rhs) if permuted else rhs
        roles = {"lhs": x, "rhs": rhs, "row_norm": norm, "ones": ones, "norm_cast": cast, SCALED: scaled,
                 GAMMA: gamma, **({"permute": operand} if permuted else {})}
        roots.append(Root(f"{name}_rms_norm_half", is_op("relax.matmul")(scaled, operand), roles))
    return roots


def gemm_operands(annotated: dict) -> dict:
    """The roles the GEMM's own checks read: a half root's left operand is the rounded, scaled
    norm (the dtype the PE array multiplies), not x; other matches as they are."""
    return dict(annotated, lhs=annotated[SCALED]) if SCALED in annotated else annotated


def with_half_row_norm(spec: KernelSpec, annotated: dict) -> KernelSpec:
    """`spec` normalising its float32 left operand's rows into an h panel (module doc); raises
    UnsupportedOperator when the kernel cannot (the norm then runs as its own kernel)."""
    norm, half = annotated["row_norm"], str(annotated["norm_cast"].attrs.dtype)
    x, gamma = annotated["lhs"], annotated[GAMMA]
    depth = spec.gemm_extents[2]
    rows_only = all(role in ("lhs", "out", "cos", "sin") and axis == 0 for role, axis, _ in spec.symbols)
    if spec.op != "matmul" or spec.compute_name != "matmul" or spec.dtype != half or half not in HALF_FLOATS \
            or not rows_only or spec.batch > 1:
        raise UnsupportedOperator(f"a {half} rms_norm folded into a matmul: a 2-D {half} GEMM with static columns "
                                  "and reduction only; the norm runs on its own")
    if dtype_of(x) != F32 or dtype_of(norm) != F32 or dtype_of(gamma) != half or \
            tuple(shape_dims(gamma) or ()) != (depth,):
        raise UnsupportedOperator(f"a {half} rms_norm folded into a matmul normalises float32 rows and multiplies "
                                  f"a {half} gamma of one value a column; the norm runs on its own")
    axes = [int(a) for a in norm.attrs.axes]
    if axes not in ([-1], [len(spec.lhs_shape) - 1]):
        raise UnsupportedOperator("a rms_norm folded into a matmul normalises the last axis")
    return dataclasses.replace(spec, row_norm=("rms_norm", float(norm.attrs.epsilon), half))


def half_row_roles(spec: KernelSpec) -> dict:
    """The RowSpec fields of the norm kernel the panel program repeats: a 16-bit model's writes h
    and multiplies its gamma ("weight", a row); none for float32's."""
    if len(spec.row_norm) == 2:
        return {}
    return dict(row_roles=("weight",), out_dtype=spec.row_norm[2], role_dtypes=(("weight", spec.row_norm[2]),))


def lhs_dtype(spec: KernelSpec) -> str:
    """The dtype the kernel loads its left operand in: float32 rows it normalises into an h panel,
    else the GEMM's."""
    return F32 if spec.row_norm is not None and len(spec.row_norm) > 2 else spec.dtype


def panel_input_bytes(spec: KernelSpec, tm: int) -> int:
    """Scratchpad bytes beyond what the tile search counts for A: the float32 panel loaded (the
    search prices A in the GEMM's 16-bit dtype) and gamma's row."""
    if len(spec.row_norm) == 2:
        return 0
    depth = spec.gemm_extents[2]
    return aligned(tm * depth * 2) + aligned(depth * 2)
