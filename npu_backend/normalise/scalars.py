"""A scalar constant operand of an elementwise op becomes a constant of the other operand's rank.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which each
add / subtract / multiply / maximum / minimum of a tensor of rank 1..4 and a scalar constant
(shape (), e.g. ONNX's `Mul(x, 0.5)`, `Div` turned multiply, a `/ 255` preprocessing step) has
that constant reshaped to (1, ..., 1) of the tensor's rank: the same value by broadcasting.

Why: the NPU's DMA moves tensors of rank 1..4, so a rank-0 operand kept the op on the host; a
(1, ..., 1) operand is an ELTWISE broadcast, loaded once per tile and read with stride 0.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import static_shape
from .rewrite import as_pass, rewrite_functions

_ELTWISE = {tvm.ir.Op.get(f"relax.{name}") for name in ("add", "subtract", "multiply", "maximum", "minimum")}


def scalar_operands_as_tensors(mod: tvm.IRModule) -> tvm.IRModule:
    return rewrite_functions(mod, _ScalarRewriter)


scalar_operands_pass = as_pass(scalar_operands_as_tensors, "cgra.ScalarOperandsAsTensors")


@relax.expr_functor.mutator
class _ScalarRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and any(call.op.same_as(op) for op in _ELTWISE)):
            return call
        args = list(call.args)
        for index in (0, 1):
            other = static_shape(args[1 - index])
            if isinstance(args[index], tvm.ir.GenericConst) and static_shape(args[index]) == () \
                    and other is not None and 1 <= len(other) <= 4:
                value = args[index].value.numpy().reshape((1,) * len(other))
                args[index] = relax.const(value, str(value.dtype))
                return with_span(relax.Call(call.op, args, call.attrs, call.ty_args), call.span)
        return call
