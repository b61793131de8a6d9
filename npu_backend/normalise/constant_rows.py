"""A constant causal mask plus constant rows per head (a static Bloom's ALiBi) added to an
attention's scores as the kernel's triangle and a mask row, not as one (1, H, s, s) mask.

Stage: normalise (after masks.py; the stage passes kernels/attention/attention_tiles.
causal_row_fits, whether the chip's attention kernel takes the triangle and the row). In:

    add(x, view(add(view(C), view(A))))

x an attention's scores (the attention form's matmul(q, kᵀ) [* scale], normalise/attentions.py),
C a constant causal triangle of 0 where key j <= query i + k and y elsewhere, y -inf or float32's
minimum (HF's), A a constant row per head along the keys (broadcast along the queries). Out:

    add(add(x, C'), A')     C' the triangle with -inf for y, A' A's view as a mask row

which the attention family reads as its causal pattern with a mask row (the kernel builds the
triangle, skips the keys above each query tile's diagonal and adds the row on the PE array).

Exact: a kept key scores fl(fl(x + 0) + a) = fl(x + a) = fl(x + fl(0 + a)), as before. Under
a causal triangle every row sees key 0, so each row's max is a kept key's score. A masked key
scored x + fl(y + a): for y = -inf that is -inf, as now; for y = float32's minimum (ulp 2^104)
with |a| < 2^100 and |x| < 2^102 it rounds to y, and exp(y - max) is +0 in float32, exactly the
exp(-inf - max) = +0 of the -inf form (normalise/finite_masks.py's argument).

Why: bench_prefill's Bloom exported with `input_ids` alone and compiled for one length folds its
mask and ALiBi to two constants whose sum, the whole (1, H, s, s) mask, was an add kernel
(17,059 cycles at 128 tokens on cgra-8x8), and every layer's attention read it whole and
computed every key (95,756 cycles a layer against the symbolic compile's 51,254).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, static_shape
from .attentions import causal_offset
from .causal_rows import _carried, _query_shape
from .chain_match import Chain
from .rewrite import as_pass, rewrite_functions

FLT_MIN = np.float32(np.finfo(np.float32).min)
#: Rows whose values stay this far inside float32 leave float32's minimum where it was added.
ROW_LIMIT = 2.0 ** 100
_DEPTH = 4


def constant_rows(mod: tvm.IRModule, causal_fits=None) -> tvm.IRModule:
    """`mod` with every attention's constant causal mask plus constant rows split as the module
    doc says (`causal_fits(q_shape, scores_shape, offset, row_shape)`: the chip's kernel takes
    them; None: always)."""
    rewritten = rewrite_functions(mod, lambda module: _RowRewriter(module, causal_fits))
    return relax.transform.DeadCodeElimination()(rewritten)


def constant_rows_pass(causal_fits=None) -> tvm.transform.Pass:
    """constant_rows as a normalise pass."""
    return as_pass(lambda mod: constant_rows(mod, causal_fits), "cgra.ConstantRows", ops=("relax.nn.softmax",))


def _through_views(chain: Chain, expr):
    """The expression `expr` is a view of, through reshapes (and variables)."""
    for _ in range(_DEPTH):
        reshape = chain.call(expr, "relax.reshape")
        if reshape is None:
            break
        expr = reshape.args[0]
    return expr


def triangle(array: np.ndarray) -> np.ndarray | None:
    """`array` (a constant mask's values) with float32's minimum as -inf when its only values
    are 0 and one of -inf / float32's minimum, else None."""
    if array.dtype != np.float32 or not array.size:
        return None
    masked = array[array != 0]
    if masked.size and not (np.all(masked == -np.inf) or np.all(masked == FLT_MIN)):
        return None
    return np.where(array == 0, np.float32(0), np.float32(-np.inf)).astype(np.float32)


def unfold(mask: np.ndarray) -> tuple | None:
    """(C, A) for a constant mask of C + A folded into one: C of 0 and y shared by the heads, A
    the rows its last query sees (every key), equal to the mask wherever C is 0; else None, and
    None where there is nothing to split (C of -inf and A of zeros: the triangle alone, which
    the attention reads as it is)."""
    if mask.dtype != np.float32 or mask.ndim < 2 or not mask.size:
        return None
    sq, sk = mask.shape[-2:]
    masked = (mask == -np.inf) | (mask == FLT_MIN)
    flat = masked.reshape(-1, sq, sk)
    if masked[..., -1, :].any() or not np.all(flat == flat[:1]):
        return None
    rows = mask[..., -1:, :]
    if not np.array_equal(np.where(masked, rows, mask), np.broadcast_to(rows, mask.shape)):
        return None
    causal = np.where(flat[0], mask.reshape(-1, sq, sk)[0], np.float32(0)).astype(np.float32)
    if np.all(rows == 0) and (not masked.any() or np.all(mask[masked] == -np.inf)):
        return None
    return causal.reshape((1,) * (mask.ndim - 2) + (sq, sk)), rows


@relax.expr_functor.mutator
class _RowRewriter(relax.PyExprMutator):
    def __init__(self, mod=None, causal_fits=None):
        super().__init__(mod)
        self.causal_fits = causal_fits

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.add" \
                or dtype_of(call) != "float32":
            return call
        split = self.split(Chain(self), call)
        return split if split is not None else call

    def split(self, chain: Chain, call):
        """add(add(x, C'), A') for `call` = add(x, view(add(view(C), view(A)))), else None."""
        x, mask = call.args
        shape, wanted = static_shape(call), static_shape(mask)
        if shape is None or wanted is None or static_shape(x) != shape or len(shape) != 5:
            return None
        base = _through_views(chain, mask)
        folded = chain.array(base)
        if folded is not None and static_shape(base) is not None and [t for t in static_shape(base) if t != 1] == \
                [w for w in wanted if w != 1]:  # C + A folded to one constant (small sizes)
            parts = unfold(folded.reshape(static_shape(base)))
            return None if parts is None else self.parts(x, shape, wanted, static_shape(base), parts)
        inner = chain.call(base, "relax.add")
        if inner is None or static_shape(inner) is None:
            return None
        target = static_shape(inner)
        if [t for t in target if t != 1] != [w for w in wanted if w != 1]:
            return None
        for c_expr, a_expr in (inner.args, reversed(inner.args)):
            c, a = chain.array(_through_views(chain, c_expr)), chain.array(_through_views(chain, a_expr))
            if c is None or a is None or static_shape(c_expr) is None or static_shape(a_expr) is None:
                continue
            made = self.parts(x, shape, wanted, target, (c.reshape(static_shape(c_expr)), a.reshape(
                static_shape(a_expr))))
            if made is not None:
                return made
        return None

    def parts(self, x, shape, wanted, target, constants):
        """The two adds for triangle constant C and row constant A (their views' shapes), or None."""
        c, a = constants
        sq, sk = shape[-2:]
        tri = triangle(c) if c.shape[-2:] == (sq, sk) and c.size == sq * sk else None
        offset = causal_offset(tri, sq, sk) if tri is not None else None
        if offset is None or a.dtype != np.float32 or a.ndim < 2 or a.shape[-2] != 1 or a.shape[-1] != sk \
                or not np.all(np.abs(a) < ROW_LIMIT):
            return None
        row_shape = _carried(a.shape, target, wanted)
        q_shape = _query_shape(Chain(self), x)
        fits = self.causal_fits
        if q_shape is None or row_shape[-2] != 1 or (fits is not None and not fits(q_shape, shape, offset, row_shape)):
            return None
        causal = relax.const(tri.reshape(_carried(c.shape, target, wanted)))
        if not np.any(a):  # a triangle of float32's minimum alone: no row to add
            return relax.op.add(x, causal)
        masked = self.builder_.emit(relax.op.add(x, causal))
        return relax.op.add(masked, relax.const(np.ascontiguousarray(a.reshape(row_shape))))
