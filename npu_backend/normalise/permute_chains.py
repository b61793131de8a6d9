"""A transpose of a transpose is one transpose, and a transpose that moves nothing is its operand.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which every
`permute_dims(permute_dims(x, a), b)` is `permute_dims(x, c)` with c[i] = a[b[i]], and every
`permute_dims(x, identity)` is x (the inner transpose stays where something else reads it).

Exact: a transpose only moves elements, and the composed index map is the composition of the
two. Why: the attention normal form's output comes back to (1, S, H, D) through three
transposes in a row in a Llama-style decoder ([2, 0, 1, 3], [1, 2, 0, 3], [0, 2, 1, 3]: the
first two cancel), each a layout copy kernel (or host copy) of its own; composed, one is left.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .rewrite import as_pass, rewrite_functions

_PERMUTE = tvm.ir.Op.get("relax.permute_dims")


def permute_chains_composed(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with chains of transposes composed and identity transposes removed."""
    return rewrite_functions(mod, _PermuteRewriter)


permute_chains_pass = as_pass(permute_chains_composed, "cgra.PermuteChains", ops=("relax.permute_dims",))


def axes_of(call) -> list[int] | None:
    """The axis order of a permute_dims call (None: its rank is unknown)."""
    rank = getattr(call.ty, "ndim", -1)
    if rank is None or int(rank) < 0:
        return None
    rank = int(rank)
    given = call.attrs.axes
    return list(reversed(range(rank))) if given is None else [int(a) % rank for a in given]


@relax.expr_functor.mutator
class _PermuteRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_PERMUTE)):
            return call
        outer = axes_of(call)
        if outer is None:
            return call
        operand = call.args[0]
        inner_call = self.lookup_binding(operand) if isinstance(operand, relax.Var) else None
        if isinstance(inner_call, relax.Call) and inner_call.op.same_as(_PERMUTE):
            inner = axes_of(inner_call)
            if inner is not None and len(inner) == len(outer):
                operand, outer = inner_call.args[0], [inner[b] for b in outer]
        if outer == list(range(len(outer))):
            return operand
        if operand.same_as(call.args[0]):
            return call
        return relax.op.permute_dims(operand, outer)
