"""A 16-bit float linear's bias added to its float32 sum, the sum rounded once on store.

Stage: partition (the patterns and the field they fix). TVM's importer writes a bfloat16 /
float16 linear or conv with a bias (frontend/torch_import.py) as

    astype(add(matmul(x_h, W_h, out_dtype="float32"), b), h)          b float32, its values h's

and normalise/half_casts.py writes the widened bias constant b as `astype(b_h, float32)` (exact:
b holds h values). That is the EPILOGUE's rounding store with its bias in h, widened exactly into
the float32 sum, rounded once (kernels/gemm/epilogue.py's half_out): one GEMM kernel storing h
(ViT's q / k / v, output and MLP projections). Before, the GEMM stored the float32 sum and a cast
kernel rounded it: the same single rounding, a kernel and a float32 round trip through DRAM more.
Rounding the sum in the graph first and adding the bias in h would round twice.

HF's bf16 ViT widens that rounded output straight back (q / k / v, fc1:
astype(astype(linear(x) + b, h), float32)): cgra.<root>_bias_rounded_wide is the same EPILOGUE
rounding into the upper half of each output row, and a second EPILOGUE widening it back in place
(KernelSpec.half_via; epilogue_tail.epilogue_intrin's round_via): one kernel storing float32,
instead of the GEMM and a cast kernel.
"""

from __future__ import annotations

from tvm.relax.dpl import is_op, wildcard

#: The patterns' suffix: "cgra.linear_bias_rounded".
SUFFIX = "_bias_rounded"
#: The suffix of the chain widened back to float32 after its rounding.
WIDE_SUFFIX = "_bias_rounded_wide"


def half_bias_graphs(roots) -> list[tuple]:
    """(ops, name, pattern, annotations, root name) of astype(add(root, astype(b)), h), the add
    either way round (epilogue.chain_pattern_graphs ranks them by their ops)."""
    graphs = []
    for root in roots:
        for first in (True, False):
            bias = wildcard()
            wide = is_op("relax.astype")(bias)
            summed = is_op("relax.add")(*((root.pattern, wide) if first else (wide, root.pattern)))
            cast = is_op("relax.astype")(summed)
            annotations = {"root": root.pattern, **root.roles, "bias": bias, "bias_wide": wide, "half_cast": cast}
            graphs.append((4, f"cgra.{root.name}{SUFFIX}", cast, annotations, root.name))
            back = is_op("relax.astype")(cast)
            graphs.append((5, f"cgra.{root.name}{WIDE_SUFFIX}", back, {**annotations, "half_back": back},
                           root.name))
    return graphs


def stored_dtype(annotated: dict, root_dtype: str) -> str:
    """The dtype a matched chain stores: the rounding cast's where it ends in one (the float32 it
    widens back to where it ends in that too)."""
    cast = annotated.get("half_back", annotated.get("half_cast"))
    return root_dtype if cast is None else str(cast.attrs.dtype)


def rounded_via(annotated: dict) -> str | None:
    """The 16-bit float a chain widened back after its rounding is rounded to, else None."""
    if "half_back" not in annotated:
        return None
    return str(annotated["half_cast"].attrs.dtype)
