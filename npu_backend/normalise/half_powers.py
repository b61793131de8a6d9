"""A bfloat16 power as PyTorch's CPU computes it: widened to float32, raised, rounded back.

Stage: normalise (before half_casts.py, which then treats the casts as any other). In: a Relax
IRModule. Out: the same module in which every `power(a, b)` of bfloat16 operands is

    astype(power(astype(a, float32), astype(b, float32)), bfloat16)

TVM's legalisation refuses a bfloat16 power (tirx's pow: "power only applies to float", its
IsFloatType leaving bfloat16 out), so a bfloat16 GPT-2 (HF's NewGELU, 0.044715 * pow(x, 3.0))
did not compile. PyTorch's CPU kernel for a bfloat16 pow computes in float32 and rounds the
result once, which this is, bit for bit, but for two exponents it special-cases: x ** 3 is
x * x rounded, times x, rounded, and x ** -2 is 1 / (x * x rounded), rounded; both are written
that way here (checked against torch 2.13 on every finite bfloat16: 4,762 and 9,514 values differ
from a single rounding). float16 powers build as they are.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import dtype_of
from .rewrite import rewrite_functions

_POWER = tvm.ir.Op.get("relax.power")


def half_powers_in_float32(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with each bfloat16 power computed in float32 and rounded once (module doc)."""
    return rewrite_functions(mod, _PowerRewriter)


@relax.expr_functor.mutator
class _PowerRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_POWER) and dtype_of(call) == "bfloat16"):
            return call
        if any(dtype_of(arg) != "bfloat16" for arg in call.args):
            return call
        wide = [self.builder_.emit(relax.op.astype(arg, "float32")) for arg in call.args]
        exponent = _scalar(call.args[1])
        if exponent in (3.0, -2.0):
            square = self._rounded(relax.op.multiply(wide[0], wide[0]), call.span)
            raised = relax.op.multiply(square, wide[0]) if exponent == 3.0 else \
                relax.op.divide(relax.const(1.0, "float32"), square)
        else:
            raised = relax.op.power(*wide)
        raised = self.builder_.emit(with_span(raised, call.span))
        return with_span(relax.op.astype(raised, "bfloat16"), call.span)

    def _rounded(self, value, span):
        """`value` (float32) rounded to bfloat16 and widened again, as PyTorch's intermediate."""
        value = self.builder_.emit(with_span(value, span))
        narrow = self.builder_.emit(relax.op.astype(value, "bfloat16"))
        return self.builder_.emit(relax.op.astype(narrow, "float32"))


def _scalar(expr) -> float | None:
    """The value of a one-element constant, else None."""
    if isinstance(expr, tvm.ir.GenericConst) and expr.value.numpy().size == 1:
        return float(expr.value.numpy().astype("float32").reshape(()))
    return None
