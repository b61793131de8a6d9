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

A bfloat16 GPT-2's up projection (and ViT's fc1) goes on to its activation in float32 and rounds
that (normalise/gelus.py, half_casts.py: astype(act([reshape](astype(astype(linear(x) + b, h),
float32))), h)): cgra.<root>_bias_rounded_act is one kernel storing h, its epilogue rounding the
biased sum to h, widening it back over the accumulator tile, the activation as one VFUNC there
in place, and the rounding store (epilogue_tail.rounded_act_intrin): where the function unit has
the activation (gemm.py refuses it elsewhere: those chips keep the GEMM, an activation kernel and
a cast), instead of the three. The same values the three kernels compute, bit for bit. The
same over a half-normed root (half_row_norm.py: GPT-2's ln_2 and ViT's pre-MLP norm in fc1's
prologue: norm, fc1 and GELU one kernel) and for tanh (ViT's pooler). A rounded linear's residual
add, rounded again, is half_residual.py's.
"""

from __future__ import annotations

import dataclasses

from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from .epilogue_tail import with_reshape
from .half_residual import rounded_residual_graphs

#: The patterns' suffix: "cgra.linear_bias_rounded".
SUFFIX = "_bias_rounded"
#: The suffix of the chain widened back to float32 after its rounding.
WIDE_SUFFIX = "_bias_rounded_wide"
#: The suffix of that chain's activation, rounded to h.
ACT_SUFFIX = "_bias_rounded_act"
#: Relax op -> the activation (kernels/intrinsics/epilogue_tail.py's) a rounded linear's epilogue runs:
#: GELU's two forms (GPT-2's tanh, ViT's erf), and tanh (ViT's pooler).
ROUNDED_ACTS = {"relax.nn.gelu_tanh": "gelu_tanh", "relax.nn.gelu": "gelu", "relax.tanh": "tanh"}


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
            if root.name in ("matmul", "linear") or "_norm_half" in root.name:  # (with_rounded_act: a 2-D linear's)
                graphs += _rounded_act_graphs(root, annotations, back)
            if root.name in ("matmul", "linear"):  # its residual add, rounded (half_residual.py)
                graphs += rounded_residual_graphs(root, annotations, cast)
    return graphs


def _rounded_act_graphs(root, annotations: dict, back) -> list[tuple]:
    """(ops, name, pattern, annotations, root name) of astype(act([reshape](back)), h), one per
    activation (module doc)."""
    graphs = []
    reshape = is_op("relax.reshape")(back, wildcard())
    for op in ROUNDED_ACTS:
        for shaped in (reshape, back):
            act = is_op(op)(shaped)
            top = is_op("relax.astype")(act)
            graphs.append((7, f"cgra.{root.name}{ACT_SUFFIX}", top,
                           {**annotations, "half_back": back, "act": act, "half_act_cast": top,
                            **({"reshape": shaped} if shaped is reshape else {})}, root.name))
    return graphs


def with_rounded_act(spec, annotated: dict):
    """`spec` with the activation of a rounded linear's float32 value and its rounding (module
    doc): the stored dtype must be the one rounded to; a matmul only (its reshape a view)."""
    act = ROUNDED_ACTS[str(annotated["act"].op.name)]
    if spec.op != "matmul" or spec.half_out != spec.half_via or spec.batch > 1:
        raise UnsupportedOperator(f"a rounded {spec.op}'s {act} is fused after a 2-D linear rounding to the dtype it "
                                  "stores: this one runs as its parts")
    spec = with_reshape(spec, annotated) if "reshape" in annotated else spec
    return dataclasses.replace(spec, act=act)


def stored_dtype(annotated: dict, root_dtype: str) -> str:
    """The dtype a matched chain stores: the rounding cast's where it ends in one (the float32 it
    widens back to where it ends in that too)."""
    cast = annotated.get("half_act_cast", annotated.get("half_back", annotated.get("half_cast")))
    return root_dtype if cast is None else str(cast.attrs.dtype)


def rounded_via(annotated: dict) -> str | None:
    """The 16-bit float a chain widened back after its rounding is rounded to, else None."""
    if "half_back" not in annotated:
        return None
    return str(annotated["half_cast"].attrs.dtype)
