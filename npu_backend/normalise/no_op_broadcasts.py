"""A broadcast to the shape its operand already has is that operand.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which every
`broadcast_to(x, shape)` with x of exactly that static shape is x itself.

A broadcast_to of a symbolic shape that only repeats unit axes a static number of times
(grouped-query attention's repeat_kv at a symbolic length: (1, Hk, 1, s, d) to (1, Hk, G, s, d))
becomes `repeat` along each such axis, and one to the shape its operand has (symbolic axes the
same variables) is its operand too.

Why: torch.export writes each batched matmul's `expand` as a broadcast_to, usually to the shape
the operand has (2-layer GPT-2: all 8; Llama: 8 of 12, grouped-query attention's 4 real ones
left); each stayed a host operator that copies its input, between NPU kernels. A repeat's result
shape follows from its operand, where an offloaded broadcast_to of a symbolic shape would take
the shape as a parameter and return a tensor of no shape, which TVM 0.27 cannot allocate; so the
layout family copies a repeat of a symbolic length on the NPU (kernels/layout/).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims, static_shape
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
            repeated = self._repeats(call)
            return call if repeated is None else repeated
        return call

    def _repeats(self, call):
        """The operand, or repeats of it, for a broadcast_to of a symbolic shape that keeps every
        axis but unit ones repeated a static number of times; else None."""
        source, out = shape_dims(call.args[0]), shape_dims(call)
        if source is None or out is None or len(source) != len(out) or static_shape(call) is not None \
                or dtype_of(call.args[0]) != dtype_of(call):
            return None
        repeats = []
        for axis, (have, want) in enumerate(zip(source, out)):
            if str(have) == str(want):
                continue
            if not (isinstance(have, int) and have == 1 and isinstance(want, int)):
                return None
            repeats.append((axis, want))
        value = call.args[0]
        for axis, count in repeats:
            value = relax.op.repeat(value, count, axis)
            if (axis, count) != repeats[-1]:
                value = self.builder_.emit(value)
        return value
