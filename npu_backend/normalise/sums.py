"""ONNX Sum as adds: `sum(stack([x1, ..., xn], axis=0), axis=0)` becomes `((x1 + x2) + ...) + xn`.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module with each such
sum of a stack (TVM's ONNX importer writes Sum that way, each operand first broadcast to the
output's shape) as a chain of adds, in the order the sum reduces, the broadcasts that change
nothing dropped.

Why: a stack and a reduction are no NPU kernel, so a ResNet-style `Sum` of a block and its
shortcut (then Relu) stayed on the host; as adds they are a residual add the conv2d kernel fuses,
or elementwise adds the vector unit runs.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import static_shape
from .rewrite import as_pass, rewrite_functions

_SUM = tvm.ir.Op.get("relax.sum")
_STACK = tvm.ir.Op.get("relax.stack")
_BROADCAST_TO = tvm.ir.Op.get("relax.broadcast_to")


def sums_as_adds(mod: tvm.IRModule) -> tvm.IRModule:
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _SumRewriter))


sums_as_adds_pass = as_pass(sums_as_adds, "cgra.SumsAsAdds", ops=("relax.stack",))


@relax.expr_functor.mutator
class _SumRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_SUM) and not bool(call.attrs.keepdims)
                and call.attrs.axis is not None and [int(a) for a in call.attrs.axis] == [0]):
            return call
        stacked = self._value(call.args[0])
        if not (isinstance(stacked, relax.Call) and stacked.op.same_as(_STACK) and int(stacked.attrs.axis) == 0):
            return call
        operands = self._value(stacked.args[0])
        if not isinstance(operands, relax.Tuple) or len(operands.fields) < 2:
            return call
        fields = [self._unbroadcast(field) for field in operands.fields]
        total = fields[0]
        for field in fields[1:-1]:
            total = self.builder_.emit(with_span(relax.op.add(total, field), call.span))
        return with_span(relax.op.add(total, fields[-1]), call.span)

    def _value(self, expr):
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            return bound if bound is not None else expr
        return expr

    def _unbroadcast(self, expr):
        """`x` for a broadcast_to(x, shape) that leaves x's shape as it is, else `expr`."""
        value = self._value(expr)
        if isinstance(value, relax.Call) and value.op.same_as(_BROADCAST_TO):
            source = value.args[0]
            if static_shape(source) is not None and static_shape(source) == static_shape(value):
                return source
        return expr
