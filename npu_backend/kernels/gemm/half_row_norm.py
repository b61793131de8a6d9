"""A bfloat16 / float16 model's RMSNorm or layer norm folded into the linear that reads it, rounded.

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

A 16-bit layer norm (PyTorch's CPU kernel: in float32, gamma and beta applied, rounded once;
half_casts.py writes `astype(layer_norm(astype(x_h, float32), gamma, beta), h)`) likewise: the
panel x_h (or float32 x), widened by an EPILOGUE, the float32 layer norm kernel's program with
gamma's and beta's rows (read: they cannot go into W either), an EPILOGUE rounding to h
(kernels/rows/half_norms.py's steps): ViT's pre-MLP norms, GPT-2's ln_1 / ln_2.

The panel's layer norm centres its rows once (`centred_once`): the mean (REDUCE, VFUNC), x - mean
(ELTWISE), then the RMSNorm program of those rows, which is the layer norm of a row whose mean is
0: normalise/centred_streams.py's shortcut for float32 streams, taken inside the panel. What it
skips is the same: the correction of the mean's own rounding (a REDUCE of the centred rows, a VFUNC,
an ELTWISE: two of the program's ten passes over the panel; GPT-2 bfloat16 on cgra-16x16: c_attn
and c_fc about 280 cycles a layer each). The error it adds is of the same kind: the mean off by
its float32 sum's rounding (at most n u mean|x|, typically sqrt(n) u |mean|, u = 2^-24), the
float32 values before the one rounding to h off by that over the row's standard deviation: under
1e-5 up to a mean of about 20 standard deviations at n = 64 (GPT-2's stream: under one), far below
h's unit (2^-9, 2^-12), so at most one unit of h in an element whose float32 value lies that
close to a rounding boundary. The roundings to h are PyTorch's (one, of the float32 result). Only
the fold takes it: the norm's own kernel (kernels/rows/half_norms.py, which post_norm.py's
programs share) keeps the correction. tests/test_half_normed_linears.py
holds the panel bit for bit to numpy's centring and the float32 RMSNorm kernel (plus beta) on it,
rounded by ml_dtypes, and within h's unit plus 1e-5 of float64's layer norm.
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
#: The role of a layer norm's float32 beta, which the kernel reads.
BETA = "norm_beta"
#: The role of the norm's rounded rows: what the GEMM multiplies (its dtype the GEMM's).
SCALED = "norm_scaled"
#: Per norm: (the row's name in the norm kernel's steps, its role here) of the rows it reads.
_ROWS = {"rms_norm": (("weight", GAMMA),), "layer_norm": (("gamma", GAMMA), ("beta", BETA))}


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
        for wide in (False, True):  # float32 x, or x_h widened (ViT's): tried first, being listed last
            x, rhs, gamma, beta = wildcard(), wildcard(), wildcard(), wildcard()
            source = is_op("relax.astype")(x) if wide else x
            norm = is_op("relax.nn.layer_norm")(source, gamma, beta)
            rounded = is_op("relax.astype")(norm)
            operand = is_op("relax.permute_dims")(rhs) if permuted else rhs
            roles = {"lhs": x, "rhs": rhs, "row_norm": norm, SCALED: rounded, GAMMA: gamma, BETA: beta,
                     **({"norm_wide": source} if wide else {}), **({"permute": operand} if permuted else {})}
            roots.append(Root(f"{name}_layer_norm_half{'_wide' * wide}", is_op("relax.matmul")(rounded, operand), roles))
    return roots


def gemm_operands(annotated: dict) -> dict:
    """The roles the GEMM's own checks read: a half root's left operand is the rounded, scaled
    norm (the dtype the PE array multiplies), not x; other matches as they are."""
    return dict(annotated, lhs=annotated[SCALED]) if SCALED in annotated else annotated


def with_half_row_norm(spec: KernelSpec, annotated: dict) -> KernelSpec:
    """`spec` normalising its left operand's rows into an h panel (module doc); raises
    UnsupportedOperator when the kernel cannot (the norm then runs as its own kernel)."""
    norm, half = annotated["row_norm"], dtype_of(annotated[SCALED])
    kind = str(norm.op.name).removeprefix("relax.nn.")
    x, depth = annotated["lhs"], spec.gemm_extents[2]
    rows_only = all(role in ("lhs", "out", "cos", "sin") and axis == 0 for role, axis, _ in spec.symbols)
    if spec.op != "matmul" or spec.compute_name != "matmul" or spec.dtype != half or half not in HALF_FLOATS \
            or not rows_only or spec.batch > 1:
        raise UnsupportedOperator(f"a {half} {kind} folded into a matmul: a 2-D {half} GEMM with static columns "
                                  "and reduction only; the norm runs on its own")
    in_dtype = dtype_of(x) if "norm_wide" in annotated else F32
    row_dtype = {"rms_norm": half, "layer_norm": F32}[kind]
    if dtype_of(x) != in_dtype or in_dtype not in (F32, half) or dtype_of(norm) != F32 or any(
            dtype_of(annotated[role]) != row_dtype or tuple(shape_dims(annotated[role]) or ()) != (depth,)
            for _, role in _ROWS[kind]):
        raise UnsupportedOperator(f"a {half} {kind} folded into a matmul normalises float32 rows ({half} ones "
                                  f"widened) and reads {row_dtype} rows of one value a column; the norm runs on its own")
    if kind == "layer_norm" and not (bool(norm.attrs.center) and bool(norm.attrs.scale)):
        raise UnsupportedOperator("layer_norm without its center or scale runs on its own")
    axes = [int(a) for a in norm.attrs.axes]
    if axes not in ([-1], [len(spec.lhs_shape) - 1]):
        raise UnsupportedOperator(f"a {kind} folded into a matmul normalises the last axis")
    return dataclasses.replace(spec, row_norm=(kind, float(norm.attrs.epsilon), half, in_dtype))


#: The steps of the layer norm program correcting its mean's rounding, which `centred_once` drops.
_CORRECTION = ("drift", "shift", "centred")


def centred_once(spec: KernelSpec, steps: tuple) -> tuple:
    """The panel program of `steps` (the norm kernel's, norms.steps_of): a 16-bit layer norm's
    without the correction of its mean's rounding, its variance and scale read from the rows
    centred once (module doc); any other program as it is."""
    if spec.row_norm is None or len(spec.row_norm) == 2 or spec.row_norm[0] != "layer_norm":
        return steps
    return tuple(dataclasses.replace(step, inputs=tuple("centred0" if name == "centred" else name
                                                         for name in step.inputs))
                 for step in steps if step.name not in _CORRECTION)


def panel_rows(spec: KernelSpec) -> tuple:
    """(name in the steps, kernel role, dtype) of each (depth,) row the panel program reads."""
    if len(spec.row_norm) == 2:
        return ()
    kind, half = spec.row_norm[0], spec.row_norm[2]
    return tuple((name, role, half if kind == "rms_norm" else F32) for name, role in _ROWS.get(kind, ()))


def half_row_roles(spec: KernelSpec) -> dict:
    """The RowSpec fields of the norm kernel the panel program repeats: a 16-bit model's writes h,
    reads x in its dtype and applies its rows (gamma, beta); none for float32's."""
    if len(spec.row_norm) == 2:
        return {}
    kind, _, half, in_dtype = spec.row_norm
    rows = panel_rows(spec)
    return dict(row_roles=tuple(name for name, _, _ in rows), out_dtype=half, in_dtype=in_dtype,
                role_dtypes=tuple((name, dtype) for name, _, dtype in rows if dtype != F32))


def lhs_dtype(spec: KernelSpec) -> str:
    """The dtype the kernel loads its left operand in: the rows a 16-bit norm's panel program
    reads (float32, or h widened), else the GEMM's."""
    return spec.row_norm[3] if spec.row_norm is not None and len(spec.row_norm) > 2 else spec.dtype


def panel_input_bytes(spec: KernelSpec, tm: int) -> int:
    """Scratchpad bytes beyond what the tile search counts for A: a float32 panel loaded (the
    search prices A in the GEMM's 16-bit dtype) and the norm's rows."""
    if len(spec.row_norm) == 2:
        return 0
    depth = spec.gemm_extents[2]
    wider = aligned(tm * depth * 2) if lhs_dtype(spec) == F32 else 0
    return wider + sum(aligned(depth * 4) for _ in panel_rows(spec))
