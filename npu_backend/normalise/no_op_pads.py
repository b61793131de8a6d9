"""A pad of zero widths is its operand.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which every
`nn.pad(x, widths)` whose widths are all 0 is x itself.

Why: HF's Swin pads each stage's feature map to a multiple of its window size, with widths
computed by the model; at a size the window divides they are all 0, and the pad was a copy
kernel of its own between the layer norm and the window partition (1.6 k and 0.9 k cycles of
Swin's 160 k at 64 x 64 px on cgra-8x8).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_info import dtype_of
from .rewrite import as_pass, rewrite_functions

_PAD = tvm.ir.Op.get("relax.nn.pad")


def no_op_pads_removed(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every pad of zero widths replaced by its operand."""
    return rewrite_functions(mod, _PadRewriter)


no_op_pads_pass = as_pass(no_op_pads_removed, "cgra.NoOpPads", ops=("relax.nn.pad",))


@relax.expr_functor.mutator
class _PadRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if isinstance(call, relax.Call) and call.op.same_as(_PAD) and not any(int(w) for w in call.attrs.pad_width) \
                and dtype_of(call.args[0]) == dtype_of(call):
            return call.args[0]
        return call
