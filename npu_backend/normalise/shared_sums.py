"""Sums every layer repeats, computed once.

Stage: normalise (after masks.py). In: a Relax IRModule. Out: the same module in which a dataflow
binding of a reshape or an add whose operands are the same variables (or equal constants and shapes), with
the same attributes, as an earlier binding of its block reads that earlier binding instead.

Bloom's attention form adds the ALiBi rows to the padding mask in every layer: reshape(alibi) and
mask + rows, the same (1, H, s, s) sum each time, one add kernel a layer; it is now one for the
model. Only reshapes and adds, and only of the same operands: a general common-subexpression
elimination (Relax's EliminateCommonSubexpr, tried first) also merged the arange / less_equal /
where that each layer's attention computes its causal mask from at a symbolic length, and the
broadcast position of every cache write in a decode step, so no attention or cache write pattern
matched (their inner values became shared with other layers) and both went to the host.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

from .rewrite import as_pass, op_name, replace_functions

SHARED_OPS = ("relax.add", "relax.reshape")


def _same_operand(a, b) -> bool:
    """The same variable, or equal constants / shapes."""
    if isinstance(a, relax.Var) or isinstance(b, relax.Var):
        return a.same_as(b)
    return tvm_ffi.structural_equal(a, b)


def _repeats(func: relax.Function) -> dict:
    """{a binding's variable: the earlier variable of its block bound to the same sum}."""
    repeated = {}
    for block in getattr(func.body, "blocks", ()):
        if not isinstance(block, relax.DataflowBlock):
            continue
        seen = []
        for binding in block.bindings:
            value = binding.value
            if not isinstance(binding, relax.VarBinding) or not isinstance(binding.var, relax.DataflowVar) or \
                    op_name(value) not in SHARED_OPS:
                continue
            args = [repeated.get(a, a) if isinstance(a, relax.Var) else a for a in value.args]
            same = next((var for op, attrs, seen_args, var in seen
                         if op == op_name(value) and tvm_ffi.structural_equal(attrs, value.attrs)
                         and len(seen_args) == len(args)
                         and all(_same_operand(x, y) for x, y in zip(seen_args, args))), None)
            if same is not None:
                repeated[binding.var] = same
            else:
                seen.append((op_name(value), value.attrs, args, binding.var))
    return repeated


@relax.expr_functor.mutator
class _ReadOnce(relax.PyExprMutator):
    """Each repeated binding dropped, its uses reading the first."""

    def __init__(self, repeated: dict):
        super().__init__()
        self.repeated = repeated

    def visit_var_binding_(self, binding):
        first = self.repeated.get(binding.var)
        if first is None:
            return super().visit_var_binding_(binding)
        self.set_var_remap(binding.var, self.visit_expr(first))


def _rewrite_function(func: relax.Function):
    """`func` with its repeated sums read once, or None when it has none."""
    repeated = _repeats(func)
    return _ReadOnce(repeated).visit_expr(func) if repeated else None


def shared_sums(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every repeated reshape / add of the same operands computed once."""
    return replace_functions(mod, _rewrite_function)


shared_sums_pass = as_pass(shared_sums, "cgra.SharedSums", ops=SHARED_OPS)
