"""An RMSNorm of a bfloat16 / float16 model, as PyTorch writes it, as one norm kernel.

Stage: partition (the norm family's patterns and spec read it; norms.py). Input: HF's
`weight * rms_norm(x.float()).to(h)`, after TVM's importer and normalise: `multiply(g,
astype(nn.rms_norm(x, w), h))` (either operand order) of float32 x and a 16-bit float h and g.
The kernel runs the float32 RMSNorm's row program (times w), then an EPILOGUE rounds the tile to h
(nearest even), then an ELTWISE in h multiplies it by g (widened, in float32, rounded): the same
two roundings the three ops make, in one kernel. Before, the cast and the multiply were two more
kernels (or host ops) a norm.
"""

from __future__ import annotations

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
