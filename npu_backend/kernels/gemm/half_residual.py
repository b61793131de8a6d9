"""A 16-bit linear's rounded output plus its residual, rounded again: one GEMM kernel.

Stage: partition (the patterns and the spec fields they set). HF's bfloat16 / float16 GPT-2 and
ViT add each block's output projection and fc2 to the residual stream in h: TVM's importer and
normalise/half_casts.py leave

    add([reshape](astype(add(matmul(x_h, W_h, out_dtype="float32"), astype(b_h, float32)), h)), r_h)

(the add either way round). PyTorch rounds the biased float32 sum to h, then adds the two h
tensors in float32 and rounds again. cgra.<matmul | linear>_bias_rounded_residual is one kernel:
its epilogue rounds the biased sum to h (the rounding store half_bias.py's chains use) and an
ELTWISE add in h of that tile and the residual tile rounds the sum
(kernels/intrinsics/rounded_residual.py): the GEMM's and the add kernel's commands on the same
values, bit for bit, without the add's launch, its loads of both tensors and the GEMM's store
and reload of the rounded output. KernelSpec: half_out = half_via = h with a residual.
"""

from __future__ import annotations

import dataclasses

from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from .epilogue_tail import with_reshape

#: The patterns' suffix: "cgra.linear_bias_rounded_residual".
SUFFIX = "_bias_rounded_residual"


def rounded_residual_graphs(root, annotations: dict, cast) -> list[tuple]:
    """(ops, name, pattern, annotations, root name) of add([reshape](cast), residual), the add
    either way round (module doc); `cast` half_bias.py's rounding of the biased sum."""
    graphs = []
    reshape = is_op("relax.reshape")(cast, wildcard())
    for shaped in (reshape, cast):
        for first in (False, True):
            residual = wildcard()
            summed = is_op("relax.add")(*((shaped, residual) if first else (residual, shaped)))
            graphs.append((5 + (shaped is reshape), f"cgra.{root.name}{SUFFIX}", summed,
                           {**annotations, "residual": residual, "half_residual": summed,
                            **({"reshape": shaped} if shaped is reshape else {})}, root.name))
    return graphs


def with_rounded_residual(spec, annotated: dict):
    """`spec` rounding its biased sum before the residual add, rounding that too (module doc): a
    2-D linear storing the residual's 16-bit dtype; the residual itself is the caller's
    (epilogue._with_residual)."""
    half = spec.half_out
    if spec.op != "matmul" or spec.batch > 1 or half is None or spec.half_via is not None or spec.act \
            or spec.relu or spec.clip is not None:
        raise UnsupportedOperator(f"a rounded {spec.op}'s residual add is fused after a 2-D linear storing a 16-bit "
                                  "float, with its bias only: this one runs as its parts")
    return dataclasses.replace(with_reshape(spec, annotated), half_via=half)
