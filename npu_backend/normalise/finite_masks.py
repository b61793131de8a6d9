"""A causal & padding mask written with float32's minimum (Bloom's) as the kernel's causal
triangle and padding row of -inf, the rows it masks wholly given HF's uniform weights.

Stage: normalise (masks.py calls it for `where(c & r, 0, y)`, y = finfo(float32).min, c a
constant causal triangle, r a run-time padding row; causal_rows.py then hands the attention
kernel the triangle, which it builds and whose keys it skips). In and out: Relax expressions.

The rewrite: softmax(x + where(c & r, 0, y)) = softmax(x + where(c, 0, -inf) + where(r, 0, -inf))
in every row that sees a key (c & r true somewhere in it). Exact there: let u be such a key and
x the scores plus ALiBi, |x| < 2^103 (ulp(y) = 2^104, so x + y rounds to y; a model's scores
are far inside this). In HF's row each masked key scores x_j + y = y, the row max M >= x_u > y
(a masked key is never the max), y - M <= y + 2^103 < -104, so exp(y - M) is +0 in float32:
exactly the exp(-inf - M) = +0 of the -inf form; the kept keys, M, every sum and product agree.

A row that sees no key (left padding: every key up to the diagonal padded) is not exact: HF's
finite form scores every key y, a uniform softmax over all Sk keys, its output the mean of V's
rows, where the -inf form has no key. So the softmax becomes a safe one whose rows that see no
key take c = fl(1 / Sk) (HF's P there: exp(0) / Sk) for every key: where(kept, softmax(s), c),
and P V there is HF's, the same products fl(c v_j). The attention kernel computes it as c 1ᵀ V
per K / V head, given to the rows whose sum is 0 (kernels/attention/rows.py); a host or other
kernel computes the where as written. (It was a GEMM o + D V after the head merge, D from the
padding row: 4,960 cycles at 32 tokens, and V sliced again out of the fused QKV.)

Why: the kernel skips the keys above each query tile's diagonal only under a -inf triangle;
Bloom's attention read a whole (1, H, s, s) mask and computed every key (16,374 cycles of its
88,832 at 32 tokens against GPT-2's 10,052).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..relax_info import static_shape
from .attentions import causal_offset

FLT_MIN = float(np.finfo(np.float32).min)


def splits_finite(constant: np.ndarray, y: float) -> bool:
    """Whether where(constant & r, 0, y) is split by this module: y float32's minimum (HF's) and
    the constant a causal triangle (every row sees a key under it)."""
    if y != FLT_MIN or constant.dtype != np.bool_ or constant.ndim < 2 or constant.all():
        return False
    sq, sk = constant.shape[-2:]
    if constant.size != sq * sk:
        return False
    additive = np.where(constant, 0, -np.inf).astype(np.float32)
    return causal_offset(additive, sq, sk) is not None


def unseen_rows(rewriter, constant: np.ndarray, twin) -> float | None:
    """c = fl(1 / Sk), each key's weight in HF's rows that see no key, for a padding row per item
    (HF's (B, 1, 1, Sk)) whose {0, 1} twin is `twin`; else None."""
    shape = static_shape(twin)
    sk = constant.shape[-1]
    if shape is None or len(shape) < 2 or shape[-1] != sk or any(d != 1 for d in shape[1:-1]):
        return None
    return float(np.float32(1) / np.float32(sk))


def safe_softmax(rewriter, chain, call):
    """where(kept, softmax(s), c) for `call` = softmax(s), s = add(add(x, C), R) of a finite
    split, c its fl(1 / Sk): HF's P in the rows that see no key, its softmax elsewhere (the
    attention form's safe softmax, normalise/attentions.py, with c in place of 0); else None."""
    scores = chain.call(call.args[0], "relax.add")
    unseen = getattr(rewriter, "unseen", {})
    masked = next((m for m in unseen if scores is not None and scores.args[0].same_as(m)), None)
    if masked is None:
        return None
    emit, s = rewriter.emit, call.args[0]
    finite = emit(relax.op.astype(emit(relax.op.not_equal(s, relax.const(-np.inf, "float32"))), "float32"))
    kept = emit(relax.op.greater(emit(relax.op.max(finite, axis=[-1], keepdims=True)), relax.const(0.0, "float32")))
    unseen.pop(masked)  # its rows are HF's: nothing left to redo (masks.py)
    return relax.op.where(kept, emit(call), relax.const(np.float32(rewriter.seen_of[masked])))
