"""A 16-bit float model's cast of an attention's output, moved onto the attention's result.

Stage: normalise (after attentions.py, which writes the attention's normal form). In: a Relax
IRModule. Out: the same module in which

    astype(reshape(...reshape(r)), h)       r: an attention's P V (a batched matmul of a
                                            softmax), or a permute_dims of it through
                                            reshapes (the attention's head merge)

is `reshape(...reshape(astype(r, h)))`: a conversion commutes with a reshape, exactly (it moves
no element). HF's bfloat16 Llama writes `attn_output.reshape(B, S, H * D).to(h)` before its
output projection (half_casts.py moves the cast past the head merge's transpose, not past the
view to the projection's rows); here the cast reaches the attention's pattern, whose rounded form
(kernels/attention/attention.py) stores the output in h, the float32 O rounded to nearest even by
an EPILOGUE on store (rows.py, flash.py). Before, the attention stored float32 and a cast kernel
read it back to round it (two a layer: 1,640 cycles of Llama's on cgra-8x8 at 32 tokens).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .half_casts import HALF_FLOATS, bound_through, is_op
from .rewrite import as_pass, rewrite_functions


def half_attention_outputs_moved(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with each 16-bit cast of a reshaped attention result on the result (module doc)."""
    return rewrite_functions(mod, _CastMover)


half_attention_outputs_pass = as_pass(half_attention_outputs_moved, "cgra.HalfAttentionOutputs",
                                      ops=("relax.astype",))


@relax.expr_functor.mutator
class _CastMover(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not is_op(call, "astype") or str(call.attrs.dtype) not in HALF_FLOATS \
                or dtype_of(call.args[0]) != "float32":
            return call
        reshapes, value = [], self._bound(call.args[0])
        while is_op(value, "reshape"):
            reshapes.append(value)
            value = self._bound(value.args[0])
        if not reshapes or not self._batched_result(value):
            return call
        moved = self.builder_.emit(relax.op.astype(reshapes[-1].args[0], str(call.attrs.dtype)))
        for reshape in reversed(reshapes[1:]):
            moved = self.builder_.emit(relax.op.reshape(moved, reshape.args[1]))
        return relax.op.reshape(moved, reshapes[0].args[1])

    def _batched_result(self, value) -> bool:
        """Whether `value` is an attention's P V (a batched matmul of a softmax, or of a safe
        softmax's where) or a permute_dims of one through reshapes (its heads merged)."""
        if is_op(value, "permute_dims"):
            value = self._bound(value.args[0])
            while is_op(value, "reshape"):
                value = self._bound(value.args[0])
        if not is_op(value, "matmul") or len(shape_dims(value) or ()) < 3:
            return False
        weights = self._bound(value.args[0])
        return isinstance(weights, relax.Call) and weights.op.name in ("relax.nn.softmax", "relax.where")

    def _bound(self, expr):
        return bound_through(self, expr)
