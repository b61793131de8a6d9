"""PyTorch's safe softmax becomes `R.nn.softmax`.

Stage: normalise (before partition, after the folds: a mask built from constants arrives as one
constant). In: a Relax IRModule. Out: the same module in which each safe softmax that
torch.export writes for scaled_dot_product_attention (every layer, with or without a mask),

    s = softmax(x, axis=-1)
    where(logical_not(astype(max(astype(logical_not(equal(x, -inf)), int8), -1, keepdims), bool)),
          full_like(s, 0), s)

(a row of x that is all -inf gives zeros, where softmax would give NaN) is

- `softmax(x, axis=-1)` when no row of x can be all -inf: x is computed from matmuls by constants
  and reshapes ("finite" below), alone or plus a constant mask whose every row along the last
  axis holds a finite entry (a causal mask, ALiBi, a relative position bias). The results are
  identical: the where picks softmax's in every row.
- for x = finite + where(b, c, -inf), a boolean mask b known only at run time (Hugging Face's
  padding mask from the model's inputs) made additive: `where(kept, softmax(x, -1), 0)` with
  kept = greater(max(astype(b, float32), -1, keepdims), 0), b's rows "some entry kept", computed
  once for every layer that adds the same mask: one select per layer beside the softmax.
- `softmax(x, -1)` too for that form when b is computed from a symbolic length alone (Hugging
  Face's causal mask of a model given `input_ids`, built at run time) and proven to keep the
  diagonal entry of every row at every length (length_masks.py): no row is all -inf.
- otherwise the same with kept computed from x itself,

      where(greater(max(astype(not_equal(x, -inf), float32), -1, keepdims), 0), softmax(x, -1), 0)

  five operators beside the softmax instead of eight.

Each form gives PyTorch's result in every row, an all -inf row's zeros included; all float32 but
the comparisons. It is the form the NPU's softmax family is to take as a softmax that gives 0
for a fully masked row. (A row test on max(x) alone cannot tell: TVM's max starts from the
lowest finite float32, not -inf, so an all -inf row's maximum is finite on the host; and
Hugging Face masks with that lowest float too.)

A matmul's result is taken to be never -inf: only an overflow of float32 can make it so, and then
a whole row of it would have to overflow for the two forms to differ.

Why: the safe-softmax plumbing (equal, two logical_nots, two astypes, max, full_like, where) was
eight host operators per attention layer around the softmax.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import shape_dims
from .chain_match import Chain, last_axis_only
from .length_masks import keeps_diagonal
from .rewrite import as_pass, rewrite_functions

_WHERE = tvm.ir.Op.get("relax.where")
_VIEWS = ("relax.reshape", "relax.permute_dims", "relax.broadcast_to", "relax.expand_dims", "relax.squeeze")
_ARITHMETIC = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")
_DEPTH = 16


def safe_softmaxes_as_softmax(mod: tvm.IRModule) -> tvm.IRModule:
    """Every safe softmax of `mod` as a softmax (or a guarded one: module docstring)."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _SafeSoftmaxRewriter))


safe_softmaxes_pass = as_pass(safe_softmaxes_as_softmax, "cgra.SafeSoftmaxes", ops=("relax.nn.softmax",))


@relax.expr_functor.mutator
class _SafeSoftmaxRewriter(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.guards = {}  # a mask's bool condition -> its rows' "some entry kept", in this block

    def visit_dataflow_block_(self, block):
        self.guards = {}  # a guard emitted in one dataflow block is not visible in the next
        return super().visit_dataflow_block_(block)

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_WHERE)):
            return call
        chain = Chain(self)
        softmax = _safe_softmax(chain, call)
        if softmax is None:
            return call
        x = softmax.args[0]
        if _never_all_masked(chain, x):
            return with_span(softmax, call.span)
        kept = kept_condition(chain, x)
        if kept is not None:  # one guard for every layer that adds this mask
            if kept not in self.guards:
                self.guards[kept] = self._some_entry(kept, lambda c: relax.op.astype(c, "float32"))
            some_entry = self.guards[kept]
        else:
            some_entry = self._some_entry(x, lambda v: relax.op.astype(
                self.builder_.emit(relax.op.not_equal(v, relax.const(-np.inf, "float32"))), "float32"))
        probabilities = self.builder_.emit(with_span(softmax, call.span))
        return with_span(relax.op.where(some_entry, probabilities, relax.const(0.0, "float32")), call.span)

    def _some_entry(self, value, as_ones):
        """greater(max(as_ones(value), -1, keepdims), 0): per row, whether any entry counts."""
        ones = self.builder_.emit(as_ones(value))
        row_max = self.builder_.emit(relax.op.max(ones, axis=[-1], keepdims=True))
        return self.builder_.emit(relax.op.greater(row_max, relax.const(0.0, "float32")))


def kept_condition(chain: Chain, x):
    """b when x = finite + where(b, c, -inf) with a finite scalar c (a boolean mask made additive:
    Hugging Face's padding mask), either operand order; else None. A row of x is all -inf exactly
    when b's row is all false."""
    add = chain.call(x, "relax.add")
    if add is None:
        return None
    for value, mask_expr in (add.args, reversed(add.args)):
        where = chain.call(mask_expr, "relax.where")
        if where is None or str(where.args[0].ty.dtype) != "bool" or not _finite(chain, value, _DEPTH):
            continue
        kept, masked = chain.scalar(where.args[1]), chain.scalar(where.args[2])
        if kept is not None and np.isfinite(kept) and masked == -np.inf:
            return where.args[0]
    return None


def _safe_softmax(chain: Chain, where):
    """The softmax(x, -1) call of a safe softmax ending at `where`, else None."""
    cond, first, second = where.args
    for zeros, softmax_expr, picks_zeros_when in ((first, second, True), (second, first, False)):
        softmax = chain.call(softmax_expr, "relax.nn.softmax")
        rank = len(shape_dims(softmax) or ()) if softmax is not None else 0
        if softmax is None or not rank or str(softmax.ty.dtype) != "float32" or \
                int(softmax.attrs.axis) % rank != rank - 1:
            continue
        if _is_zeros(chain, zeros) and _all_masked_test(chain, cond, softmax.args[0], picks_zeros_when):
            return relax.op.nn.softmax(softmax.args[0], axis=-1)
    return None


def _is_zeros(chain: Chain, expr) -> bool:
    """full_like(_, 0), zeros_like(_) or a constant of zeros."""
    array = chain.array(expr)
    if array is not None:
        return array.size > 0 and not np.any(array)
    fill = chain.call(expr, "relax.full_like")
    if fill is not None:
        return chain.scalar(fill.args[1]) == 0.0
    return chain.call(expr, "relax.zeros_like") is not None


def _all_masked_test(chain: Chain, cond, x, all_masked: bool) -> bool:
    """Whether `cond` is, per row, "every entry of x is -inf" (all_masked) or its negation:
    [not] any(not(x == -inf)) along the last axis, through casts between bool and integers."""
    expr = _uncast(chain, cond)
    negation = chain.call(expr, "relax.logical_not")
    if negation is not None:
        expr, all_masked = _uncast(chain, negation.args[0]), not all_masked
    if all_masked:  # cond must be "some entry is not -inf", i.e. max(not(x == -inf))
        return False
    row_max = chain.call(expr, "relax.max")
    if row_max is None or not last_axis_only(row_max.attrs.axis, len(shape_dims(row_max) or ()),
                                             bool(row_max.attrs.keepdims)):
        return False
    unmasked = chain.call(_uncast(chain, row_max.args[0]), "relax.logical_not")
    equal = chain.call(unmasked.args[0], "relax.equal") if unmasked is not None else None
    if equal is None:
        return False
    for value, bound in (equal.args, reversed(equal.args)):
        if chain.same_value(value, x) and chain.scalar(bound) == -np.inf:
            return True
    return False


def _uncast(chain: Chain, expr):
    """Through casts between bool and integer types (they keep a value's truth)."""
    for _ in range(4):
        cast = chain.call(expr, "relax.astype")
        if cast is None or str(cast.ty.dtype) not in _TRUTHFUL or str(cast.args[0].ty.dtype) not in _TRUTHFUL:
            return expr
        expr = cast.args[0]
    return expr


_TRUTHFUL = ("bool", "int8", "int16", "int32", "int64", "uint8")


def _never_all_masked(chain: Chain, x) -> bool:
    """Whether no row of `x` (along the last axis) can be all -inf: x finite, or finite plus a
    constant with a finite entry in every row, or plus where(b, c, -inf) with b computed from a
    symbolic length alone and proven to keep every row's diagonal entry (length_masks.py)."""
    if _finite(chain, x, _DEPTH):
        return True
    kept = kept_condition(chain, x)
    if kept is not None and keeps_diagonal(chain, kept):
        return True
    add = chain.call(x, "relax.add")
    if add is None:
        return False
    for value, mask_expr in (add.args, reversed(add.args)):
        mask = chain.array(mask_expr)
        if mask is not None and mask.dtype.kind == "f" and mask.ndim >= 1 and _finite(chain, value, _DEPTH) \
                and np.isfinite(mask).any(axis=-1).all():
            return True
    return False


def _finite(chain: Chain, expr, depth: int) -> bool:
    """Whether `expr` is computed from matmuls by finite constants, views and one another."""
    array = chain.array(expr)
    if array is not None:
        return array.dtype.kind == "f" and bool(np.isfinite(array).all())
    value = chain.value(expr)
    if depth == 0 or not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
        return False
    name = value.op.name
    if name == "relax.matmul":
        return True
    if name in _VIEWS:
        return _finite(chain, value.args[0], depth - 1)
    if name == "relax.divide":
        divisor = chain.array(value.args[1])
        return divisor is not None and bool(np.all(divisor != 0)) and _finite(chain, value.args[0], depth - 1) \
            and _finite(chain, value.args[1], depth - 1)
    if name in _ARITHMETIC:
        return all(_finite(chain, arg, depth - 1) for arg in value.args)
    return False
