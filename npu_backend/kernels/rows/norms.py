"""The norm family: layer norm and RMSNorm over the last axis on the vector unit.

Stage: partition (its patterns and spec), kernel definition, tiling and schedule. Input: a Relax
`nn.layer_norm(x, gamma, beta)` or `nn.rms_norm(x, weight)` of a float32 tensor of rank 1..4
(static, or one symbolic leading axis as the rows), normalised over its last axis (the normalise rewrites turn HF / torch RMSNorm
chains into `nn.rms_norm`). Per tile of whole rows (rows.py):
    layer norm  REDUCE sum, VFUNC mean = sum / n, ELTWISE d = x - mean, then the mean's own
                rounding corrected: REDUCE sum of d, VFUNC / n, ELTWISE d - that; REDUCE sum
                of squares, VFUNC rsqrt(ss / n + eps), ELTWISE multiply, multiply by gamma,
                add beta
    RMSNorm     REDUCE sum of squares, VFUNC rsqrt(ss / n + eps), ELTWISE multiply, multiply
                by the weight [, add a beta: `add(rms_norm(x, w), beta)`, a centred stream's
                final layer norm (normalise/centred_streams.py), one kernel]
the variance two-pass (centred, the centring corrected once), so no cancellation even at a mean
of 50 standard deviations. Within 3e-6 of float64 relative to the output's scale
(tests/test_row_kernels.py). A row that does not fit the scratchpad stays on the
host with the reason.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm.relax.dpl import is_const, is_op, wildcard

from ...errors import UnsupportedOperator
from ..family import OpFamily
from .half_norms import (half_layer_norm_dtype, half_layer_norm_input, half_layer_norm_patterns, half_layer_steps,
                         half_norm_dtype, half_norm_patterns, half_steps)
from .rows import RowSpec, Step, choose_row_tiling, last_axis, read_rows, row_compute, schedule_rows


def steps_of(spec: RowSpec) -> tuple:
    """The row program of a layer norm or RMSNorm of `spec.cols` columns and epsilon `spec.eps`."""
    inverse_n = 1.0 / spec.cols
    if spec.kind == "rms_norm":
        steps = (Step("squares", "reduce", "sum_squares", ("x",)),
                 Step("scale", "vfunc", "rsqrt", ("squares",), inverse_n, spec.eps),
                 Step("normed", "eltwise", "multiply", ("x", "scale")))
        if spec.out_dtype != "float32":  # a 16-bit float model's norm (half_norms.py)
            return half_steps(steps, spec.out_dtype, "norm_weight" not in spec.row_roles)
        steps += (Step("rms_norm", "eltwise", "multiply", ("normed", "weight")),) if spec.row_roles else ()
        # a centred stream's final layer norm: its beta added in the same program (centred_streams.py)
        return steps + ((Step("rms_norm_bias", "eltwise", "add", ("rms_norm", "beta")),)
                        if "beta" in spec.row_roles else ())
    steps = (Step("total", "reduce", "sum", ("x",)),
            Step("mean", "vfunc", "identity", ("total",), inverse_n),
            Step("centred0", "eltwise", "subtract", ("x", "mean")),
            Step("drift", "reduce", "sum", ("centred0",)),
            Step("shift", "vfunc", "identity", ("drift",), inverse_n),
            Step("centred", "eltwise", "subtract", ("centred0", "shift")),
            Step("squares", "reduce", "sum_squares", ("centred",)),
            Step("scale", "vfunc", "rsqrt", ("squares",), inverse_n, spec.eps),
            Step("normed", "eltwise", "multiply", ("centred", "scale")))
    steps += ((Step("scaled", "eltwise", "multiply", ("normed", "gamma")),
               Step("layer_norm", "eltwise", "add", ("scaled", "beta"))) if spec.row_roles else ())
    return half_layer_steps(steps, spec.out_dtype, spec.in_dtype) if spec.out_dtype != "float32" else steps


def _patterns() -> list:
    """The plain norms (constant gamma of ones, beta of zeros: norm_folds.py leaves them) first."""
    x, gamma, beta, weight = wildcard(), wildcard(), wildcard(), wildcard()
    layer = is_op("relax.nn.layer_norm")(x, gamma, beta)
    rms = is_op("relax.nn.rms_norm")(x, weight)
    x1, gamma1, beta1, weight1 = wildcard(), is_const(), is_const(), is_const()
    layer1 = is_op("relax.nn.layer_norm")(x1, gamma1, beta1)
    rms1 = is_op("relax.nn.rms_norm")(x1, weight1)
    x2, weight2, beta2 = wildcard(), wildcard(), wildcard()
    rms2 = is_op("relax.nn.rms_norm")(x2, weight2)
    biased = {"root": rms2, "lhs": x2, "weight": weight2, "beta": beta2}
    return half_norm_patterns() + half_layer_norm_patterns() + [
            ("cgra.rms_norm_bias", is_op("relax.add")(rms2, beta2), biased),
            ("cgra.rms_norm_bias", is_op("relax.add")(beta2, rms2), biased),
            ("cgra.layer_norm_plain", layer1, {"root": layer1, "lhs": x1, "gamma": gamma1, "beta": beta1}),
            ("cgra.rms_norm_plain", rms1, {"root": rms1, "lhs": x1, "weight": weight1}),
            ("cgra.layer_norm", layer, {"root": layer, "lhs": x, "gamma": gamma, "beta": beta}),
            ("cgra.rms_norm", rms, {"root": rms, "lhs": x, "weight": weight})]


def _plain(kind: str, annotated: dict, roles: tuple) -> None:
    """Refuse a plain pattern's match whose gamma is not ones or beta not zeros. (In the
    offloaded function the constants are parameters: the pattern's name vouches for them.)"""
    for role in roles:
        expr = annotated[role]
        if isinstance(expr, tvm.ir.GenericConst) and not np.all(expr.value.numpy() == (0 if role == "beta" else 1)):
            raise UnsupportedOperator(f"{kind}: its {role} is not all {0 if role == 'beta' else 1} "
                                      "(the plain kernel applies none)")


def norm_spec(name: str, annotated: dict) -> RowSpec:
    """The RowSpec of a layer norm or RMSNorm over the last axis, its row operands one value a column."""
    half = half_norm_dtype(annotated) if name.startswith("cgra.rms_norm_half") else \
        half_layer_norm_dtype(annotated) if name.startswith("cgra.layer_norm_half") else "float32"
    in_dtype = half_layer_norm_input(annotated) if name.startswith("cgra.layer_norm_half") else "float32"
    if half != "float32":
        annotated = dict(annotated, root=annotated["norm"])
        name = name.partition("_half")[0]
    biased = name == "cgra.rms_norm_bias"
    kind = name.removeprefix("cgra.").removesuffix("_plain").removesuffix("_bias")
    x, root = annotated["lhs"], annotated["root"]
    shape, rows, cols, symbols = read_rows(x, kind, dtype=in_dtype)
    last_axis(list(root.attrs.axes), len(shape), kind)
    roles = ("gamma", "beta") if kind == "layer_norm" else ("weight", "beta") if biased else \
        ("weight",) if half == "float32" else ("weight",) if "ones" in annotated else ("norm_weight", "weight")
    for role in roles:
        vector_shape, *_ = read_rows(annotated[role], f"{kind}'s {role}", dtype=half if role == "weight" else "float32")
        if vector_shape != (cols,):
            raise UnsupportedOperator(f"{kind}: its {role} of shape {vector_shape} is not one value per column "
                                      f"({cols},)")
    if kind == "layer_norm" and not (bool(root.attrs.center) and bool(root.attrs.scale)):
        raise UnsupportedOperator("layer_norm without its center or scale: the NPU kernel applies both")
    if name.endswith("_plain"):
        _plain(kind, annotated, roles)
    row_roles = () if name.endswith("_plain") else roles
    spec = RowSpec(kind, kind, shape, shape, rows, cols, float(root.attrs.epsilon), row_roles,
                   param_roles=("lhs", *roles), source_ops=(f"nn.{kind}",) + (("add",) if biased else ()),
                   symbols=symbols, out_dtype=half,
                   role_dtypes=(("weight", half),) if half != "float32" and kind == "rms_norm" else (),
                   in_dtype=in_dtype)
    return dataclasses.replace(spec)


def norm_compute(spec: RowSpec, tiling):
    """rows.row_compute of the norm's steps."""
    return row_compute(spec, tiling, steps_of(spec), spec.out_shape)


NORMS = OpFamily(
    name="norms", ops=("layer_norm", "rms_norm"), patterns=_patterns, spec_from_match=norm_spec,
    choose_tiling=lambda spec, arch: choose_row_tiling(spec, arch, steps_of(spec)), compute=norm_compute,
    schedule=lambda sch, spec, tiling, arch: schedule_rows(sch, spec, tiling, steps_of(spec)),
    host_ops={"relax.nn.layer_norm": "cgra.layer_norm", "relax.nn.rms_norm": "cgra.rms_norm"},
    checks_pe_dtype=False)
