"""A broadcast to the shape its operand already has is that operand.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which every
`broadcast_to(x, shape)` with x of exactly that static shape is x itself.

Why: torch.export writes each batched matmul's `expand` as a broadcast_to, usually to the shape
the operand has (2-layer GPT-2: all 8; Llama: 8 of 12, grouped-query attention's 4 real ones
left); each stayed a host operator that copies its input, between NPU kernels.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_info import static_shape
from .rewrite import as_pass, rewrite_functions

_BROADCAST_TO = tvm.ir.Op.get("relax.broadcast_to")


def no_op_broadcasts_removed(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every broadcast_to that changes nothing replaced by its operand."""
    return rewrite_functions(mod, _BroadcastRewriter)


no_op_broadcasts_pass = as_pass(no_op_broadcasts_removed, "cgra.NoOpBroadcasts", ops=("relax.broadcast_to",))


@relax.expr_functor.mutator
class _BroadcastRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if isinstance(call, relax.Call) and call.op.same_as(_BROADCAST_TO):
            shape = static_shape(call.args[0])
            if shape is not None and shape == static_shape(call) and str(call.args[0].ty.dtype) == str(call.ty.dtype):
                return call.args[0]
        return call
