"""A concatenation's empty operands are dropped; a concatenation of one operand is that operand.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which every
`concat` leaves out its operands of static extent 0 along the joined axis, and a `concat` left
with one operand of its own shape and dtype is that operand.

Why: HF's partial rotary (Phi-3, GPT-NeoX) writes `concat(rotated, x[..., rotary_dim:])`; where
the rotary dimensions are the whole head the slice is empty, and the NPU's DMA moves no empty
tensor, so the slice and the concat stayed host copies (Phi-3 at 32 tokens: 10 host calls, a
fifth of the run). Dropping the operand leaves the slice unused, and dead code goes with it.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

from ..relax_info import shape_dims
from .rewrite import as_pass, rewrite_functions

_CONCAT = tvm.ir.Op.get("relax.concat")


def empty_operands_dropped(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every concat's empty operands left out (see the module doc)."""
    return rewrite_functions(mod, _ConcatRewriter)


empty_operands_pass = as_pass(empty_operands_dropped, "cgra.EmptyConcatOperands", ops=("relax.concat",))


def _is_empty(expr, axis: int) -> bool:
    shape = shape_dims(expr)  # (the other axes may be symbolic: a prefill's length)
    return shape is not None and len(shape) > axis and isinstance(shape[axis], int) and shape[axis] == 0


@relax.expr_functor.mutator
class _ConcatRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_CONCAT) and isinstance(call.args[0], relax.Tuple)):
            return call
        shape = shape_dims(call)
        if not shape or call.attrs.axis is None:
            return call
        axis = int(call.attrs.axis) % len(shape)
        kept = [field for field in call.args[0].fields if not _is_empty(field, axis)]
        if len(kept) == len(call.args[0].fields) or not kept:
            return call
        if len(kept) == 1:
            only = kept[0]
            same = tvm_ffi.structural_equal(only.ty.shape, call.ty.shape) and str(only.ty.dtype) == str(call.ty.dtype)
            return only if same else call
        return relax.op.concat(relax.Tuple(kept), axis=axis)
