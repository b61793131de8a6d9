"""An RMSNorm of a bfloat16 / float16 model, as PyTorch writes it, as one norm kernel.

Stage: partition (the norm family's patterns and spec read it; norms.py). Input: HF's
`weight * rms_norm(x.float()).to(h)`, after TVM's importer and normalise: `multiply(g,
astype(nn.rms_norm(x, w), h))` (either operand order) of float32 x and a 16-bit float h and g.
The kernel runs the float32 RMSNorm's row program (times w), then an EPILOGUE rounds the tile to h
(nearest even), then an ELTWISE in h multiplies it by g (widened, in float32, rounded): the same
two roundings the three ops make, in one kernel. Before, the cast and the multiply were two more
kernels (or host ops) a norm.

A layer norm of such a model (normalise/half_casts.py writes PyTorch's as `astype(nn.layer_norm(
x, gamma, beta), h)`, in float32 with the constants widened) likewise: the float32 layer norm's
row program, then an EPILOGUE rounding the tile to h, so the kernel stores h (half the bytes) and
no cast kernel runs after it (ViT: 550 cycles a norm on cgra-8x8); where x is itself a 16-bit
float widened, `astype(x_h, float32)`, the kernel loads x_h (half the bytes) and a first EPILOGUE
widens it exactly, so the cast before it goes too.
"""

from __future__ import annotations

import dataclasses

from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of
from .rows import Step

HALF_FLOATS = ("bfloat16", "float16")


def half_norm_patterns() -> list:
    """(name, pattern, annotations) of g * astype(rms_norm(x, w), h), g on either side (w: HF's
    ones, which normalise/rms_norms.py writes; any float32 row is applied)."""
    patterns = []
    for ones in (True, False):  # HF's ones marked R.ones (normalise/half_casts.py) first: no float32 weight
        for order in ("weight_first", "weight_last"):
            x, norm_weight, weight = wildcard(), is_op("relax.ones")(wildcard()) if ones else wildcard(), wildcard()
            norm = is_op("relax.nn.rms_norm")(x, norm_weight)
            cast = is_op("relax.astype")(norm)
            root = is_op("relax.multiply")(*((weight, cast) if order == "weight_first" else (cast, weight)))
            roles = {"root": root, "norm": norm, "cast": cast, "lhs": x, "weight": weight}
            patterns.append((f"cgra.rms_norm_half_{order}{'_ones' if ones else ''}", root,
                             roles | ({"ones": norm_weight} if ones else {"norm_weight": norm_weight})))
    return patterns


def half_layer_norm_patterns() -> list:
    """(name, pattern, annotations) of astype(layer_norm(astype(x_h, float32), gamma, beta), h), then
    of astype(layer_norm(x, gamma, beta), h)."""
    patterns = []
    for wide in (True, False):
        x, gamma, beta = wildcard(), wildcard(), wildcard()
        source = is_op("relax.astype")(x) if wide else x
        norm = is_op("relax.nn.layer_norm")(source, gamma, beta)
        root = is_op("relax.astype")(norm)
        roles = {"root": root, "norm": norm, "lhs": x, "gamma": gamma, "beta": beta}
        patterns.append((f"cgra.layer_norm_half{'_wide' * wide}", root, roles | ({"wide": source} if wide else {})))
    return patterns


def half_layer_norm_input(annotated: dict) -> str:
    """The dtype the matched layer norm loads x in: a 16-bit float it widens, or float32."""
    if "wide" not in annotated:
        return "float32"
    source = dtype_of(annotated["lhs"])
    if source not in HALF_FLOATS or str(annotated["wide"].attrs.dtype) != "float32":
        raise UnsupportedOperator(f"layer_norm of astype({source}, {annotated['wide'].attrs.dtype}): the norm kernel "
                                  "widens bfloat16 / float16 to float32 (an EPILOGUE)")
    return source


def half_layer_norm_dtype(annotated: dict) -> str:
    """The 16-bit float a matched layer norm's cast writes; raises UnsupportedOperator saying why not."""
    out = str(annotated["root"].attrs.dtype)
    if out not in HALF_FLOATS:
        raise UnsupportedOperator(f"layer_norm cast to {out}: the norm kernel writes float32, or rounds it to "
                                  "bfloat16 / float16")
    return out


def half_norm_dtype(annotated: dict) -> str:
    """The 16-bit float the matched norm writes; raises UnsupportedOperator saying why not."""
    out, weight = str(annotated["cast"].attrs.dtype), dtype_of(annotated["weight"])
    if out not in HALF_FLOATS or weight != out:
        raise UnsupportedOperator(f"rms_norm cast to {out} times a {weight} weight: the norm kernel writes "
                                  "float32, or bfloat16 / float16 times a weight of that dtype")
    return out


def half_steps(steps: tuple, out_dtype: str, ones: bool) -> tuple:
    """The float32 RMSNorm's `steps` times its float32 weight (none if `ones`), rounded to
    `out_dtype`, then times the 16-bit weight in it."""
    if not ones:
        steps = steps + (Step("weighted", "eltwise", "multiply", (steps[-1].name, "norm_weight")),)
    return steps + (Step("rounded", "cast", "", (steps[-1].name,), dtype=out_dtype),
                    Step("rms_norm", "eltwise", "multiply", ("rounded", "weight"), dtype=out_dtype))


def half_layer_steps(steps: tuple, out_dtype: str, in_dtype: str) -> tuple:
    """The float32 layer norm's `steps`, rounded to `out_dtype` (one EPILOGUE); with a 16-bit
    `in_dtype`, x widened first (one EPILOGUE) and the steps reading that."""
    steps += (Step("rounded", "cast", "", (steps[-1].name,), dtype=out_dtype),)
    if in_dtype == "float32":
        return steps
    reading = tuple(dataclasses.replace(step, inputs=tuple("wide" if name == "x" else name for name in step.inputs))
                    for step in steps)
    return (Step("wide", "cast", "", ("x",), dtype="float32"),) + reading
