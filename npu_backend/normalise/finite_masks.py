"""A causal & padding mask written with float32's minimum (Bloom's) as the kernel's causal
triangle and padding row of -inf, with the rows it masks wholly put back.

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
rows, where the -inf form has no key. So the softmax becomes the safe one (such a row gives 0,
kernels/attention/) and the row is put back after the head merge: o' = o + D V, D (B, Sq, Sk)
= (1 - min(R cᵀ, 1)) * fl(1 / Sk) with R the padding row's {0, 1} twin (the count of keys a row
sees, integer sums in float32: exact), so D's rows are fl(1 / Sk) (HF's P there, the same
products) where a row sees no key and +0 elsewhere: o + +0 = o, 0 + D V = D V.

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


def unseen_rows(rewriter, constant: np.ndarray, twin) -> relax.Expr | None:
    """D (Br, Sq, Sk): fl(1 / Sk) in the rows of padding item b that see no key, else +0.0, from
    U = 1 - min(R cᵀ, 1) of the padding row's {0, 1} twin R (Br, Sk) and the constant c."""
    shape = static_shape(twin)
    sq, sk = constant.shape[-2:]
    if shape is None or len(shape) < 2 or shape[-1] != sk or any(d != 1 for d in shape[1:-1]):
        return None  # a row per item only (HF's (B, 1, 1, Sk))
    emit = rewriter.emit
    rows = emit(relax.op.reshape(twin, (shape[0], sk)))
    counts = emit(relax.op.matmul(rows, relax.const(constant.reshape(sq, sk).T.astype(np.float32)),
                                  out_dtype="float32"))
    seen = emit(relax.op.reshape(emit(relax.op.minimum(counts, relax.const(np.float32(1)))), (shape[0], sq, 1)))
    unseen = emit(relax.op.subtract(relax.const(np.float32(1)), seen))
    return emit(relax.op.multiply(unseen, relax.const(np.full((1, 1, sk), np.float32(1) / np.float32(sk)))))


def safe_softmax(rewriter, chain, call):
    """where(kept, softmax(s), 0) (the attention form's safe softmax, normalise/attentions.py) for
    `call` = softmax(s), s = add(add(x, C), R) of a finite split; else None."""
    scores = chain.call(call.args[0], "relax.add")
    unseen = getattr(rewriter, "unseen", {})
    if scores is None or not any(scores.args[0].same_as(m) for m in unseen):
        return None
    emit, s = rewriter.emit, call.args[0]
    finite = emit(relax.op.astype(emit(relax.op.not_equal(s, relax.const(-np.inf, "float32"))), "float32"))
    kept = emit(relax.op.greater(emit(relax.op.max(finite, axis=[-1], keepdims=True)), relax.const(0.0, "float32")))
    return relax.op.where(kept, emit(call), relax.const(0.0, "float32"))


def put_back_unseen_rows(rewriter, chain, call):
    """o + D V in (B, Sq, H * Dv) for the attention output's head merge `call` =
    permute_dims(reshape(o), [0, 2, 1, 3]) (the form the kernel writes sequence-major,
    kernels/attention/head_layouts.py), o = matmul(where(kept, softmax(add(add(x, C), R)), 0),
    v5) of a finite split, v5 a head split of V (B, Sk, H, Dv) or of a slice of a larger tensor
    (read again from that tensor: the attention's own slice stays its own); else None."""
    out_shape = static_shape(call)
    attention = _attention_of(chain, call)
    if attention is None or out_shape is None or len(out_shape) != 4:
        return None
    masked, v5 = attention
    v = _value_source(chain, v5)
    b, sq, h, dv = out_shape
    if v is None or tuple(static_shape(v) or ()) != (b, static_shape(v5)[3], h, dv):
        return None
    emit = rewriter.emit
    sk = static_shape(v)[1]
    values = emit(relax.op.reshape(v, (b, sk, h * dv)))
    out = emit(relax.op.reshape(emit(call), (b, sq, h * dv)))
    rewriter.unseen.pop(masked)
    put_back = emit(relax.op.add(emit(relax.op.matmul(rewriter.seen_of[masked], values, out_dtype="float32")), out))
    return relax.op.reshape(put_back, out_shape)


def _attention_of(chain, call):
    """(add(x, C), v5) for call = permute_dims(reshape([reshape](o)), [0, 2, 1, 3]), o the P V
    matmul of a safe attention whose scores' causal add is in `unseen`, else None."""
    axes = call.attrs.axes if chain.call(call, "relax.permute_dims") is not None else None
    if axes is None or [int(a) for a in axes] != [0, 2, 1, 3]:
        return None
    node = call.args[0]
    for _ in range(2):
        reshape = chain.call(node, "relax.reshape")
        if reshape is None:
            break
        node = reshape.args[0]
    matmul = chain.call(node, "relax.matmul")
    where = chain.call(matmul.args[0], "relax.where") if matmul is not None else None
    softmax = chain.call(where.args[1], "relax.nn.softmax") if where is not None else None
    scores = chain.call(softmax.args[0], "relax.add") if softmax is not None else None
    unseen = getattr(chain.mutator, "unseen", {})
    if scores is None or not any(scores.args[0].same_as(m) for m in unseen):
        return None
    shape = static_shape(matmul)
    if shape is None or len(shape) != 5 or shape[2] != 1:  # one query head per K / V head
        return None
    return next(m for m in unseen if scores.args[0].same_as(m)), matmul.args[1]


def _value_source(chain, v5):
    """V (B, Sk, H, Dv) for v5 = reshape(permute_dims(x, [0, 2, 1, 3])): x, or a new slice of the
    tensor x slices; else None."""
    reshape = chain.call(v5, "relax.reshape")
    permute = chain.call(reshape.args[0], "relax.permute_dims") if reshape is not None else None
    if permute is None or permute.attrs.axes is None or [int(a) for a in permute.attrs.axes] != [0, 2, 1, 3]:
        return None
    x = permute.args[0]
    part = chain.call(x, "relax.strided_slice")
    if part is None:
        return x
    return chain.mutator.emit(relax.Call(part.op, list(part.args), part.attrs))
