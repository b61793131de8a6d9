"""Constant negative indices count from the end, as in PyTorch and numpy.

Stage: normalise (after fold_weights: indices computed from constants arrive as constants; before
FoldConstant, which would evaluate the reads below at compile time; outside the pass list). In: a Relax IRModule. Out:
the same module in which every constant index array of

    take(x, indices, axis, mode="fast")    gather_elements(x, indices, axis)
    index_tensor(x, (i0, i1, ...))         gather_nd(x, indices)

with a negative entry has that entry plus the size of the axis it indexes. A constant entry
outside [-size, size) is refused (UnsupportedOperator naming the op, the index and the axis).

Why: TVM's lowering of these reads the index as written, so a negative one reads before the
tensor: torch.export's `qkv[..., [-2], :]` (Falcon's multi-query attention) became
`take(x, [-2], axis=2, mode="fast")`, output off by up to 4.5 or NaN, varying run to run, on
llvm as well as the NPU. strided_slice counts a negative begin or end from the end already, and
take's "wrap" and "clip" modes say what they do with one.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..errors import UnsupportedOperator
from ..frontend.provenance import with_span
from ..relax_info import shape_dims
from .chain_match import Chain
from .rewrite import called_ops, rewrite_functions

_OPS = ("relax.take", "relax.gather_elements", "relax.index_tensor", "relax.gather_nd")


def wrap_negative_indices(mod: tvm.IRModule) -> tvm.IRModule:
    """Every constant negative index of `mod`'s index-taking ops wrapped (module docstring); an
    out-of-range one raises UnsupportedOperator (call it outside a TVM pass, which would hand
    the error on as a RuntimeError)."""
    called = called_ops(mod)
    if called is not None and called.isdisjoint(_OPS):
        return mod
    refused = []
    rewritten = rewrite_functions(mod, lambda m: _IndexRewriter(m, refused))
    if refused:  # raised here: raised inside the mutator, TVM's FFI would make it a RuntimeError
        raise refused[0]
    return rewritten


@relax.expr_functor.mutator
class _IndexRewriter(relax.PyExprMutator):
    def __init__(self, mod, refused: list):
        super().__init__(mod)
        self.refused = refused

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name in _OPS):
            return call
        shape = shape_dims(call.args[0])  # an axis a constant index reads must be static
        if shape is None:
            return call
        try:
            args = _WRAPS[call.op.name](Chain(self), call, shape)
        except UnsupportedOperator as err:
            self.refused.append(err)
            return call
        if args is None:
            return call
        return with_span(relax.Call(call.op, args, call.attrs, call.ty_args), call.span)


def _wrapped(chain: Chain, call, expr, extents, where: str):
    """The constant `expr` with negative entries wrapped (its last axis indexing `extents` in
    turn when `extents` is a list, else every entry indexing one axis of that size); None when
    it is not a constant or has no negative entry. A constant entry out of range is refused."""
    indices = chain.array(expr)
    if indices is None or indices.dtype.kind not in "iu" or not indices.size:
        return None
    sizes = np.asarray(extents, dtype=np.int64)
    if sizes.ndim and (indices.ndim == 0 or indices.shape[-1] != len(sizes)):
        return None
    bad = (indices < -sizes) | (indices >= sizes)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise UnsupportedOperator(
            f"{call.op.name.replace('relax.', '')}: constant index {int(indices[index])} at {list(index)} is outside "
            f"{where} (sizes {np.atleast_1d(sizes).tolist()}): the model reads out of bounds; "
            "fix the index in the model before exporting it")
    if indices.min() >= 0:
        return None
    return relax.const(np.where(indices < 0, indices + sizes, indices).astype(indices.dtype))


def _take(chain, call, shape):
    if call.attrs.axis is None or str(call.attrs.mode) != "fast":
        return None
    axis = int(call.attrs.axis) % len(shape)
    if not isinstance(shape[axis], int):
        return None
    indices = _wrapped(chain, call, call.args[1], shape[axis], f"axis {axis}")
    return None if indices is None else [call.args[0], indices]


def _gather_elements(chain, call, shape):
    axis = int(call.attrs.axis) % len(shape)
    if not isinstance(shape[axis], int):
        return None
    indices = _wrapped(chain, call, call.args[1], shape[axis], f"axis {axis}")
    return None if indices is None else [call.args[0], indices]


def _index_tensor(chain, call, shape):
    fields = chain.value(call.args[1])
    if not isinstance(fields, relax.Tuple):
        return None
    wrapped = [_wrapped(chain, call, field, shape[axis], f"axis {axis}")
               if axis < len(shape) and isinstance(shape[axis], int) else None
               for axis, field in enumerate(fields.fields)]
    if all(w is None for w in wrapped):
        return None
    return [call.args[0], relax.Tuple([w if w is not None else f for w, f in zip(wrapped, fields.fields)])]


def _gather_nd(chain, call, shape):
    batch = int(call.attrs.batch_dims)
    indices = chain.array(call.args[1])
    if indices is None or indices.ndim == 0:
        return None
    depth = indices.shape[-1]
    if not all(isinstance(extent, int) for extent in shape[batch:batch + depth]):
        return None
    wrapped = _wrapped(chain, call, call.args[1], list(shape[batch:batch + depth]),
                       f"axes {batch}..{batch + depth - 1}")
    return None if wrapped is None else [call.args[0], wrapped]


_WRAPS = {"relax.take": _take, "relax.gather_elements": _gather_elements, "relax.index_tensor": _index_tensor,
          "relax.gather_nd": _gather_nd}
