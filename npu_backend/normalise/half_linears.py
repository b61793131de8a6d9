"""A 16-bit float linear whose weight TVM's importer widened, as the 16-bit GEMM PyTorch computes.

Stage: normalise (before fold_weights, which would fold the widening into a float32 weight and
hide it). In: a Relax IRModule. Out: the same module in which

    matmul(x, astype(layout(W_h), float32), out_dtype="float32")      x float32, W_h a constant

(layout: permute_dims / reshape, none or more) is

    matmul(astype(x, h), layout(W_h), out_dtype="float32")

Why it is PyTorch's arithmetic: `F.linear` takes a bfloat16 / float16 weight only with an input
of that dtype, so in the model x was a 16-bit float; TVM's importer keeps every 16-bit linear's
result in float32 (matmul(out_dtype="float32")) and an elementwise op of two such results (HF
Llama's `act(gate) * up`) stays float32, so the next linear's importer casts its weight up to x's
float32 instead of x down. PyTorch rounds x to h (the elementwise op stores h) and multiplies h
by h, the products accumulated in float32, rounded once: that is the GEMM this writes (its float32
sum stored, as every other 16-bit linear of the import is; a cast after it still rounds it). The
rounding of x is a cast in the graph; where x is a gated unit's product the gate / up GEMM stores
it rounded (kernels/gemm/gated.py), else a cast kernel rounds it.

Before: HF's bfloat16 Llama's down projection ran as a float32 GEMM (its weight widened:
twice the weight bytes, a float32 PE array's MACs), the one linear of the model that did.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_info import dtype_of
from .half_casts import HALF_FLOATS, bound_through, is_op
from .rewrite import rewrite_functions


def half_widened_linears(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with each linear of a widened 16-bit constant weight a 16-bit GEMM (module doc)."""
    return rewrite_functions(mod, _LinearRewriter)


@relax.expr_functor.mutator
class _LinearRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not is_op(call, "matmul") or str(call.attrs.out_dtype) != "float32" or len(call.args) != 2:
            return call
        x, widened = call.args
        weight = self._widened_constant(widened)
        if weight is None or dtype_of(x) != "float32":
            return call
        narrow = self.builder_.emit(relax.op.astype(x, dtype_of(weight)))
        return relax.op.matmul(narrow, weight, out_dtype="float32")

    def _widened_constant(self, expr):
        """W_h's layout ops, where `expr` is astype(layout(W_h), float32) of a 16-bit constant
        W_h (through bindings), else None."""
        cast = self._bound(expr)
        if not is_op(cast, "astype") or str(cast.attrs.dtype) != "float32":
            return None
        source = cast.args[0]
        value = self._bound(source)
        while is_op(value, "permute_dims") or is_op(value, "reshape"):
            value = self._bound(value.args[0])
        if not isinstance(value, tvm.ir.GenericConst) or dtype_of(value) not in HALF_FLOATS:
            return None
        return source

    def _bound(self, expr):
        return bound_through(self, expr)
