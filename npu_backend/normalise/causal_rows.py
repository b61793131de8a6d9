"""An attention's causal triangle and padding row added to its scores one at a time, not as one
s x s mask.

Stage: normalise (masks.py calls it, after attentions.py wrote the attention's normal form; the
stage passes kernels/attention/attention_tiles.causal_row_fits, whether the chip's attention
kernel takes the triangle and the row). In:
`add(x, view(M))` of x's shape where M = add(C, R) is masks.py's split select: C a constant
causal triangle (0 where key j <= query i + k, -inf elsewhere: attentions.causal_offset) and R
a padding row of +0 and -inf broadcast along the queries. Out:

    add(add(x, C'), R')      C' and R' the views of C and R the view of M had made

(for add(x, view(add(view(M), A))), A a row per head along the keys: Bloom's ALiBi added to
its mask, R' is the view of R + A: a row per head) which the attention family reads as its
causal pattern with a mask row (kernels/attention/:
the kernel builds the triangle, skips the keys above each query tile's diagonal, and adds the
row on the PE array). Exact: every value of C and R is +0 or -inf, and x + +0 + +0 = x + +0,
x + -inf = -inf in either order.

Why: HF's decoders build their mask as causal & padding; masks.py made it one add kernel of
s x s (572 cycles in Llama at 32 tokens) which every layer's attention read whole and added
(a copy of s x s per item on the vector unit), where the kernel needs neither.
"""

from __future__ import annotations

from tvm import relax

from ..relax_info import static_shape
from .attentions import causal_offset
from .chain_match import Chain

_DEPTH = 4


def causal_row_add(rewriter, chain: Chain, call):
    """add(add(x, C'), R') for add(x, view(add(C, R))) (module docstring), x an attention's scores, the
    rewriter's `splits` holding (C, R) of the inner add; else None."""
    x, mask = call.args
    shape, wanted = static_shape(call), static_shape(mask)
    if shape is None or wanted is None or static_shape(x) != shape or len(shape) < 2:
        return None
    source, extra = _split_source(rewriter, chain, mask), None
    if source is None:
        found = _split_plus_row(rewriter, chain, mask)
        if found is None:
            return None
        source, extra = found
    constant, row = rewriter.splits[source]
    target = static_shape(source)
    if extra is not None:  # ALiBi's rows added to the split (Bloom): the row is their sum
        target = static_shape(extra[0])
        row = rewriter.emit(relax.op.add(rewriter.emit(relax.op.reshape(row, _carried(
            static_shape(row), static_shape(source), static_shape(extra[1])))), extra[2]))
    if [t for t in target if t != 1] != [w for w in wanted if w != 1]:
        return None
    row_shape = _carried(static_shape(row), target, wanted)
    causal_shape = _carried(constant.shape, target, wanted)
    sq, sk = shape[-2:]
    offset = causal_offset(constant, sq, sk)
    if row_shape[-2] != 1 or offset is None:  # a row the kernel reads, a triangle it builds
        return None
    q_shape = _query_shape(chain, x)
    fits = rewriter.causal_fits  # kernels/attention/attention_tiles.causal_row_fits for the chip
    if q_shape is None or (fits is not None and not fits(q_shape, shape, offset, row_shape)):
        return None
    causal = relax.const(constant.reshape(causal_shape))
    masked = rewriter.emit(relax.op.add(x, causal))
    if source in rewriter.seen:  # a finite split: its rows that see no key are put back (finite_masks.py)
        rewriter.unseen[masked] = True
        rewriter.seen_of[masked] = rewriter.seen[source]
    return relax.op.add(masked, rewriter.emit(relax.op.reshape(row, row_shape)))


def _query_shape(chain: Chain, x):
    """Q's (B, Hk, G, Sq, D) for the scores x = matmul(q, kᵀ) [* scale] of the attention form
    (normalise/attentions.py), else None (no attention's scores: nothing to split for)."""
    scores = chain.call(x, "relax.matmul")
    scaled = chain.call(x, "relax.multiply") if scores is None else None
    scores = chain.call(scaled.args[0], "relax.matmul") if scaled is not None else scores
    q_shape = static_shape(scores.args[0]) if scores is not None else None
    return q_shape if q_shape is not None and len(q_shape) == 5 and len(static_shape(x)) == 5 else None


def _split_source(rewriter, chain: Chain, mask):
    """The split select's variable `mask` is a view of (through reshapes and variables bound to
    variables), else None."""
    expr = mask
    for _ in range(4 * _DEPTH):
        if isinstance(expr, relax.Var):
            if any(expr.same_as(split) for split in rewriter.splits):
                return next(split for split in rewriter.splits if expr.same_as(split))
            bound = rewriter.lookup_binding(expr)
            if bound is None:
                return None
            expr = bound
            continue
        reshape = chain.call(expr, "relax.reshape")
        if reshape is None:
            return None
        expr = reshape.args[0]
    return None


def _split_plus_row(rewriter, chain: Chain, mask):
    """(split, (the add, the split's view, the other row)) for `mask` a view of add(view(split),
    row), the row broadcast along the queries (Bloom's mask plus ALiBi), else None."""
    expr = mask
    for _ in range(_DEPTH):
        reshape = chain.call(expr, "relax.reshape")
        if reshape is None:
            break
        expr = reshape.args[0]
    add = chain.call(expr, "relax.add")
    if add is None:
        return None
    for view, row in (add.args, reversed(add.args)):
        source = _split_source(rewriter, chain, view)
        row_shape, add_shape = static_shape(row), static_shape(add)
        if source is None or row_shape is None or add_shape is None or len(row_shape) < 2 or \
                row_shape[-2] != 1 or len(row_shape) > len(add_shape) or static_shape(view) is None:
            continue
        if [t for t in static_shape(source) if t != 1] != [t for t in static_shape(view) if t != 1]:
            continue
        return source, (add, view, row)
    return None


def _carried(shape, target, wanted) -> list:
    """`shape` (broadcasting to `target`) carried through the view from `target` to `wanted`,
    which keep the same dimensions other than 1 in the same order."""
    shape = [1] * (len(target) - len(shape)) + list(shape)
    kept = iter(s for s, t in zip(shape, target) if t != 1)
    return [1 if w == 1 else next(kept) for w in wanted]

