"""An index_tensor with constant indices as the reshape or the row gather it is.

Stage: normalise (after negative_indices.py has counted negative entries from the end). In: a
Relax IRModule. Out: the same module in which every

    index_tensor(x, (i0, ..., ik-1))        x of static shape, every i a constant

is `reshape(x, out_shape)` when the indices read x's first k axes in order, each element once
(the flat index numpy's ravel_multi_index gives is 0, 1, 2, ...), and otherwise
`reshape(take(reshape(x, (n, rest...)), flat, axis=0), out_shape)`: a gather of whole rows.

Also `gather_elements(c, indices)` from a constant c whose entries are all one value (RoBERTa's
buffered token type ids, zeros, gathered at the position ids) is that value in the indices' shape.

Exact: both read the elements the indices name, in the order they name them; an index out of
range is left to the op (negative_indices.py refuses a constant one before this runs).

Why: Hugging Face's padding mask reads `mask[batch_arange[:, None, None, None], kv_arange[None,
None, None, :]]` (Llama, GPT-2, Bloom, Falcon and every decoder since transformers 4.53): with one
sequence and the whole key range that is a reshape of the (1, s) mask to (1, 1, 1, s), which
stayed on the host as an index_tensor, a compute op with no NPU kernel.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import static_shape
from .chain_match import Chain
from .rewrite import as_pass, rewrite_functions

_INDEX_TENSOR = tvm.ir.Op.get("relax.index_tensor")
_GATHER_ELEMENTS = tvm.ir.Op.get("relax.gather_elements")


def constant_indices_as_views(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every index_tensor of constant indices as a reshape or a row gather."""
    return rewrite_functions(mod, _IndexTensorRewriter)


constant_indices_pass = as_pass(constant_indices_as_views, "cgra.ConstantIndicesAsViews",
                                ops=("relax.index_tensor", "relax.gather_elements"))


@relax.expr_functor.mutator
class _IndexTensorRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if isinstance(call, relax.Call) and call.op.same_as(_GATHER_ELEMENTS):
            return _uniform_gather(Chain(self), call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_INDEX_TENSOR)):
            return call
        view = _as_view(self, Chain(self), call)
        return with_span(view, call.span) if view is not None else call


def flat_rows(indices: list, shape: tuple) -> np.ndarray | None:
    """The index of each read row of x viewed as (prod(shape[:k]), rest...), over the indices'
    broadcast shape; None if they do not broadcast or one is out of range."""
    k = len(indices)
    if k == 0 or k > len(shape) or any(a.dtype.kind not in "iu" for a in indices):
        return None
    try:
        broadcast = np.broadcast_arrays(*indices)
    except ValueError:
        return None
    if any(((a < 0) | (a >= size)).any() for a, size in zip(broadcast, shape[:k])):
        return None
    return np.ravel_multi_index(tuple(a.astype(np.int64) for a in broadcast), shape[:k])


def _as_view(mutator, chain: Chain, call):
    """The reshape or gather `call` is, else None."""
    x, fields = call.args[0], call.args[1]
    shape, out_shape = static_shape(x), static_shape(call)
    if shape is None or out_shape is None or not isinstance(fields, relax.Tuple):
        return None
    indices = [chain.array(field) for field in fields.fields]
    if any(index is None for index in indices):
        return None
    rows = flat_rows(indices, shape)
    if rows is None:
        return None
    k, rest = len(indices), tuple(shape[len(indices):])
    if rows.size == int(np.prod(shape[:k])) and (rows.ravel() == np.arange(rows.size)).all():
        return relax.op.reshape(x, out_shape)
    flat = mutator.builder_.emit(relax.op.reshape(x, (int(np.prod(shape[:k])), *rest)))
    gathered = mutator.builder_.emit(relax.op.take(flat, relax.const(rows.ravel().astype(np.int32)), axis=0))
    return relax.op.reshape(gathered, out_shape)


def _uniform_gather(chain: Chain, call):
    """gather_elements from a constant whose entries are all one value: that value in the
    indices' shape (for every index in range; one out of range is an error in PyTorch's gather)."""
    source, shape = chain.array(call.args[0]), static_shape(call)
    if source is None or shape is None or source.size == 0 or not (source == source.flat[0]).all():
        return call
    return relax.const(np.full(shape, source.flat[0], source.dtype), str(source.dtype))
