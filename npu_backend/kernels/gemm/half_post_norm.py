"""A 16-bit float post-norm in the epilogue of the GEMM before it, with PyTorch's roundings.

Stage: partition (the patterns `cgra.<matmul | linear>_half_post_norm` and the spec they set) and
kernel definition (the program's extra steps, which post_norm.py's stages, tensorizes and prices
as its own). A bfloat16 / float16 post-norm encoder (HF BERT's `LayerNorm(dense(h) + x)` in h)
is, after TVM's importer and normalise/half_casts.py,

    astype(layer_norm(astype(add([reshape](astype(matmul(a_h, W_h, f32) + astype(b_h, f32), h)),
                                 x_h), float32), gamma, beta), h)

PyTorch's arithmetic: the linear's float32 sum rounded to h; the residual add in h (both widened,
added in float32, rounded: PyTorch's CPU kernel; float32 holds 2p + 2 bits of either format, so
that is also the exactly rounded sum); the layer norm in float32 on the sum widened, rounded once.
The kernel (spec: post_norm set with half_out, the form post_norm.py's with_post_norm refuses):

    post_summed = EPILOGUE(acc + b_h) rounded to h               (the GEMM's sum, rounded)
    post_res_added = ELTWISE add in h (post_summed, res_pad)     (res_pad: x_h's tile, DMA)
    post_wide = EPILOGUE widening it to float32                  (a cast: exact)
    ... the layer norm kernel's float32 program (kernels/rows/norms.py) on post_wide ...
    epi = EPILOGUE rounding its last step to h                   (the store's h)

the same commands on the same values as the GEMM kernel rounding its sum, the add kernel and the
16-bit norm kernel (kernels/rows/half_norms.py's steps) apart, so the same bits where the GEMM's
summation order is the same (tests/test_half_post_norms.py: bit for bit numpy's model of that
rounding sequence with ml_dtypes). Before, BERT in bf16 on cgra-8x8 ran each post-norm as three
kernels: the GEMM storing its rounded sum, an add kernel and a norm kernel (66,457 -> 63,137
cycles at 32 tokens, bf16 over float32 1.010 -> 0.960).

A 16-bit Llama's final norm after its last down projection (normalise/half_linears.py: a 16-bit
GEMM storing its float32 sum; HF's residual stream stays float32 in TVM's import) is
`g * astype(rms_norm([reshape](x_h W_h^T) + r, R.ones), h)` (cgra.<root>_half_post_norm_rms): the
EPILOGUE adds the residual as post_norm.py's does, the RMSNorm kernel's float32 program without
a weight, then kernels/rows/half_norms.py's end: rounded to h (an EPILOGUE), times g in h (an
ELTWISE in h: PyTorch's `weight * x.to(h)`). Before, the norm ran as its own kernel (1,501 cycles
on cgra-8x8). Its GEMM may read `astype(x, h)` of a float32 x (the last layer's `act(gate) * up`):
the RMS form follows the rounded operand's roots too (half_rounded_lhs.py: the panel's EPILOGUE
rounding; its rounding runs in order with the norm's program: post_norm_cost.py). Where that fold
is refused, the plain form after the cast (spec.lhs_cast_from) is taken only where the cast kernel
and it are estimated cheaper than the GEMM rounding its panel with the norm apart
(rounded_lhs_cost.py): the cheapest of the three runs (bf16 Llama at 32 tokens, bench_half.py:
cgra-4x4 the cast kernel and the fold, 178,218 cycles; 8x8 the panel's fold, 42,777; 16x16 the
panel's fold, 23,416; always the GEMM and norm apart, 179,001 and 42,934).

Priced against the kernels apart as the float32 form is (post_norm_cost.check_post_norm): the
fold's estimate with its operands' sizes (h operands, output and, with half_out, residual; the
residual's ELTWISE in the program, not the EPILOGUE: BERT's 32 x 64 x 64 on cgra-8x8 5,766 cycles
estimated before, 4,806 now, 4,686 run) against the GEMM rounding its sum and adding the residual
(half_residual.py) plus the 16-bit norm kernel, or for the RMS form the GEMM storing its float32
sum plus the RMSNorm kernel rounding to h; refused where no cheaper, the reason in explain.
"""

from __future__ import annotations

import dataclasses
import functools

from tvm import relax, te
from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of, shape_dims
from ..common.operands import padded
from ..intrinsics import get_intrin
from ..rows.half_norms import HALF_FLOATS
from ..rows.rows import Step, shapes_of
from .half_rounded_lhs import SCALED

F32 = "float32"
#: The pattern-name suffix: "cgra.linear_half_post_norm" (post_norm.is_post_norm_pattern holds too).
SUFFIX = "_half_post_norm"
#: The program's input that is the residual's tile (block res_pad, loaded as the EPILOGUE's residual is).
RES = "res"
#: The name's end of the RMSNorm form (a 16-bit Llama's final norm on its down projection).
RMS = "_rms"
#: The roots a post-norm follows: a 2-D matmul or a linear.
_ROOTS = ("matmul", "linear")
#: The roots of a float32 operand rounded to h on the A panel (half_rounded_lhs.py), which the RMS
#: form follows too: a bf16 Llama's last down projection reads `act(gate) * up` rounded to h.
_ROUNDED_ROOTS = ("matmul_rounded_lhs", "linear_rounded_lhs")


def half_post_norm_graphs(roots) -> list[tuple]:
    """(name, pattern, annotations, root name) of the chain of the module doc, the bias add and
    the residual add either way round."""
    graphs = []
    for root in sorted(roots, key=lambda root: -len(root.roles)):  # a linear before a bare matmul
        if root.name in _ROUNDED_ROOTS:  # a rounded operand (half_rounded_lhs.py): the RMS form only
            graphs += _rms_graphs(root)
        if root.name not in _ROOTS:
            continue
        bias, residual, gamma, beta = (wildcard() for _ in range(4))
        wide_bias = is_op("relax.astype")(bias)
        summed = is_op("relax.add")(root.pattern, wide_bias) | is_op("relax.add")(wide_bias, root.pattern)
        cast = is_op("relax.astype")(summed)
        reshape = is_op("relax.reshape")(cast, wildcard())
        added = functools.reduce(lambda a, b: a | b, [is_op("relax.add")(*pair) for inner in (reshape, cast)
                                                      for pair in ((inner, residual), (residual, inner))])
        wide = is_op("relax.astype")(added)
        norm = is_op("relax.nn.layer_norm")(wide, gamma, beta)
        top = is_op("relax.astype")(norm)
        annotations = {"root": root.pattern, **root.roles, "bias": bias, "bias_wide": wide_bias, "half_cast": cast,
                       "reshape": reshape, "residual": residual, "res_added": added, "norm_wide": wide,
                       "post_norm": norm, "norm_gamma": gamma, "norm_beta": beta, "norm_cast": top}
        graphs.append((f"cgra.{root.name}{SUFFIX}", top, annotations, root.name))
        graphs += _rms_graphs(root)
    return graphs


def _rms_graphs(root) -> list[tuple]:
    """(name, pattern, annotations, root name) of g * astype(rms_norm([reshape](root) + residual,
    R.ones), h), g on either side: a 16-bit Llama's final norm after its down projection (RMS)."""
    graphs = []
    residual, weight = wildcard(), wildcard()
    reshape = is_op("relax.reshape")(root.pattern, wildcard())
    added = functools.reduce(lambda a, b: a | b, [is_op("relax.add")(*pair) for inner in (reshape, root.pattern)
                                                  for pair in ((inner, residual), (residual, inner))])
    norm = is_op("relax.nn.rms_norm")(added, is_op("relax.ones")(wildcard()))
    cast = is_op("relax.astype")(norm)
    for top in (is_op("relax.multiply")(weight, cast), is_op("relax.multiply")(cast, weight)):
        annotations = {"root": root.pattern, **root.roles, "reshape": reshape, "residual": residual,
                       "res_added": added, "post_norm": norm, "norm_cast": cast, "norm_gamma": weight, "half_scaled": top}
        graphs.append((f"cgra.{root.name}{SUFFIX}{RMS}", top, annotations, root.name))
    return graphs


def is_half_post_norm_pattern(name: str) -> bool:
    return SUFFIX in name


def with_half_post_norm(spec, annotated: dict, tail, with_reshape):
    """`spec` (epilogue.epilogue_fields': half_out the rounding cast's h) with the reshape
    (`with_reshape`: epilogue_tail's, which imports post_norm, which imports this) and the
    residual (`tail`: epilogue.with_epilogue_tail) and the norm; refuses what the kernel does not
    compute (the GEMM, the add and the norm then run as their own kernels)."""
    if "half_scaled" in annotated:
        return _with_rms(spec, annotated, tail, with_reshape)
    what = f"a {spec.half_out} layer_norm after the {spec.op}'s rounded residual add"
    norm, h = annotated["post_norm"], spec.half_out
    if spec.op != "matmul" or spec.compute_name != "matmul" or spec.batch > 1 or spec.symbols or \
            h is None or spec.half_via or spec.acc_dtype != F32 or spec.dtype != h or spec.act or \
            spec.fabric_body or spec.row_norm or spec.multiplier_shape:
        raise UnsupportedOperator(f"{what}: fused after a static 16-bit 2-D matmul rounding its biased sum to "
                                  "the norm's format; the ops run as their own kernels")
    spec = with_reshape(spec, annotated)
    inner = {role: expr for role, expr in annotated.items() if role not in _OWN and role != "reshape"}
    spec = tail(spec, inner, f"cgra.{spec.op}_residual")
    n = spec.gemm_extents[1]
    dims = tuple(shape_dims(norm) or ())
    axes = [int(a) % max(len(dims), 1) for a in norm.attrs.axes]
    if dtype_of(annotated["res_added"]) != h or str(annotated["norm_wide"].attrs.dtype) != F32 or \
            str(annotated["norm_cast"].attrs.dtype) != h or dtype_of(norm) != F32 or axes != [len(dims) - 1] or \
            not dims or dims[-1] != n or not (bool(norm.attrs.center) and bool(norm.attrs.scale)):
        raise UnsupportedOperator(f"{what}: the epilogue normalises the last axis of the sum in {h} widened, "
                                  f"centred and scaled, rounded to {h}; the norm runs on its own")
    for role in ("norm_gamma", "norm_beta"):
        if tuple(shape_dims(annotated[role]) or ()) != (n,) or dtype_of(annotated[role]) != F32:
            raise UnsupportedOperator(f"{what}: its {role.removeprefix('norm_')} is not {n} float32 values")
    return dataclasses.replace(spec, post_norm=(float(norm.attrs.epsilon), True, "layer_norm"))


#: The annotations of the norm and the casts around it: not the GEMM's chain.
_OWN = ("bias_wide", "half_cast", "res_added", "norm_wide", "post_norm", "norm_gamma", "norm_beta", "norm_cast",
        "half_scaled")


def _with_rms(spec, annotated: dict, tail, with_reshape):
    """`spec` of the RMS form: a 16-bit GEMM storing its float32 sum (normalise/half_linears.py's),
    plus a float32 residual, the float32 RMSNorm of that without a weight, rounded to the GEMM's
    16-bit dtype h, times the weight g in h (kernels/rows/half_norms.py's program)."""
    norm, h = annotated["post_norm"], spec.dtype
    what = f"rms_norm after the {h} {spec.op}'s residual add, rounded to h and weighted"
    if spec.op != "matmul" or spec.compute_name != "matmul" or spec.batch > 1 or spec.symbols or \
            h not in HALF_FLOATS or spec.half_out or spec.half_via or spec.acc_dtype != F32 or spec.act or \
            spec.bias_shape or spec.fabric_body or spec.row_norm or spec.multiplier_shape:
        raise UnsupportedOperator(f"{what}: fused after a static 16-bit 2-D matmul storing its float32 sum; the "
                                  "norm runs on its own")
    lhs = annotated["lhs"]
    if SCALED not in annotated and isinstance(lhs, relax.Call) and getattr(lhs.op, "name", "") == "relax.astype" \
            and dtype_of(lhs.args[0]) == F32:
        # the rounded operand's fold (tried first) was refused: this fold after a cast kernel is
        # priced against the GEMM rounding its panel with the norm apart (check_post_norm)
        spec = dataclasses.replace(spec, lhs_cast_from=F32)
    spec = tail(with_reshape(spec, annotated), {role: expr for role, expr in annotated.items()
                                                 if role not in _OWN and role != "reshape"}, f"cgra.{spec.op}_residual")
    n = spec.gemm_extents[1]
    dims = tuple(shape_dims(norm) or ())
    axes = [int(a) % max(len(dims), 1) for a in norm.attrs.axes]
    if str(annotated["norm_cast"].attrs.dtype) != h or dtype_of(norm) != F32 or axes != [len(dims) - 1] or \
            not dims or dims[-1] != n or tuple(shape_dims(annotated["norm_gamma"]) or ()) != (n,) or \
            dtype_of(annotated["norm_gamma"]) != h or not spec.residual_shape:
        raise UnsupportedOperator(f"{what}: the epilogue normalises the last axis of float32 rows with the "
                                  f"residual, rounds them to {h} and multiplies {n} {h} weights; the norm runs on "
                                  "its own")
    return dataclasses.replace(spec, post_norm=(float(norm.attrs.epsilon), True, "rms_norm"))


def is_rms_form(spec) -> bool:
    """Whether `spec` is the RMS form's (_with_rms): a 16-bit GEMM's post-norm storing no 16-bit sum."""
    return spec.dtype in HALF_FLOATS and not spec.half_out and spec.post_norm[2] == "rms_norm"


def role_dtype(spec, role: str) -> str:
    """The dtype of the norm's parameter `role`: the RMS form's weight is in h."""
    return spec.dtype if role == "norm_gamma" and is_rms_form(spec) else F32


# ------------------------------------------------------------------ the program

def half_program(steps: tuple, spec) -> tuple:
    """post_norm.py's float32 `steps` (reading "x", the last one "epi") as the 16-bit form's:
    the residual added in h to the rounded sum ("x"), widened, the steps on that, rounded to h
    ("epi"); the RMS form's: the norm without its weight rounded to h, times the weight in h.
    A cast's func names the dtype it reads (the EPILOGUE's accumulator). Else `steps`."""
    if not spec.half_out:
        if not is_rms_form(spec):
            return steps
        unweighted = [i for i in steps[-1].inputs if i != "weight"][0]
        return (*steps[:-1], Step("post_rounded", "cast", F32, (unweighted,), dtype=spec.dtype),
                Step("epi", "eltwise", "multiply", ("post_rounded", "weight"), dtype=spec.dtype))
    h, wide = spec.half_out, "post_wide"
    renamed = tuple(dataclasses.replace(step, name="post_unrounded" if step.name == "epi" else step.name,
                                        inputs=tuple(wide if i == "x" else i for i in step.inputs)) for step in steps)
    return (Step("post_res_added", "eltwise", "add", ("x", RES), dtype=h),
            Step(wide, "cast", h, ("post_res_added",), dtype=F32), *renamed,
            Step("epi", "cast", F32, ("post_unrounded",), dtype=h))


def program_kinds(steps, rows_roles) -> dict:
    """rows.shapes_of, the residual's tile (RES) a whole tile as "x" is."""
    reading = [dataclasses.replace(step, inputs=tuple("x" if i == RES else i for i in step.inputs)) for step in steps]
    return {RES: "full", **shapes_of(reading, rows_roles)}


def residual_tile(spec, summed, operands: dict) -> dict:
    """{RES: the residual's padded tile (block res_pad, staged as the EPILOGUE's residual is)} for
    the 16-bit form, else {}."""
    if not spec.half_out:
        return {}
    residual = operands["residual"]
    shape = list(residual.shape)
    return {RES: te.compute(summed.shape, lambda i, j: padded(residual, shape, (i, j)), name="res_pad")}


def cast_intrin(step, rows: int, width: int) -> str:
    """The EPILOGUE of a cast step: its accumulator the dtype step.func names."""
    return get_intrin("epilogue", rows, width, step.func, bias=False, relu=False, residual=False, clip=None,
                      zero_point=None, out_dtype=step.dtype)


def half_summed_operands(spec, operands: dict) -> dict:
    """The operands of the sum's EPILOGUE: the 16-bit form's rounds the GEMM's sum without the
    residual (the program adds it in h)."""
    return {**operands, "residual": None} if spec.post_norm and spec.half_out else operands
