"""Embedding lookups whose indices are computed from a symbolic length alone, as the rows they read.

Stage: normalise (before the lookups' index casts and the layout rewrites). In: a Relax IRModule.
Out: the same module in which an add of `take(T, ids, axis=0)` (maybe viewed as (1, s, C)), T a
constant table and its 1-D ids proven one value c for every length from the length alone
(length_masks.Elements, TVM's prover: ALBERT's token types `token_type_ids[:, :s]` gathered at the
position ids, all zeros), adds T[c]: a constant row the add broadcasts (lookup_tables.py then
adds it to the word embedding's table). (The position embeddings, float32 from the length alone,
are the first s rows of a table at the bound already: frontend/position_tables.tabulate_prefix.)

Exact: the add adds the row the lookup read at every position.

Why: with a symbolic length the token types' gather ran on the host (ALBERT at 16 tokens on
cgra-8x8: 1,380 host cycles) before a lookup kernel; a static compile folds it into a constant.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, sym, tirx

from ..relax_info import dtype_of, shape_dims
from .chain_match import Chain
from .length_masks import Elements, prove
from .rewrite import as_pass, rewrite_functions


def length_lookups_as_rows(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with the lookups of the module doc as the table's rows."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _LookupRewriter))


length_lookups_pass = as_pass(length_lookups_as_rows, "cgra.LengthLookups", ops=("relax.take",))


def lookup_row(chain: Chain, call) -> int | None:
    """c when the take `call` reads row c of its constant table at every position, for every
    length; else None."""
    table, ids = chain.array(call.args[0]), call.args[1]
    dims = shape_dims(ids)
    if table is None or table.ndim != 2 or dims is None or len(dims) != 1 or isinstance(dims[0], int) or \
            call.attrs.axis is None or int(call.attrs.axis) != 0 or dtype_of(ids) not in ("int32", "int64"):
        return None
    i = tirx.Var("i0", "int64")
    value = Elements(chain).element(ids, [i])
    if value is None or str(value.ty) != "int64":
        return None
    first = sym.Analyzer().simplify(tirx.Let(i, tirx.IntImm("int64", 0), value))
    if not isinstance(first, tirx.IntImm) or not 0 <= int(first.value) < table.shape[0]:
        return None
    return int(first.value) if prove(tirx.EQ(value, first), [i], dims) else None


@relax.expr_functor.mutator
class _LookupRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
            return call
        chain = Chain(self)
        if call.op.name == "relax.add" and dtype_of(call) == "float32":
            return self._row_add(chain, call)
        return call

    def _row_add(self, chain: Chain, call):
        """x + take(T, ids) with ids one row c as x + T[c], where the sum has x's shape."""
        for x, other in ((call.args[0], call.args[1]), (call.args[1], call.args[0])):
            view = chain.call(other, "relax.reshape", "relax.expand_dims")  # (s, C) -> (1, s, C)
            take = chain.call(view.args[0] if view is not None else other, "relax.take")
            if take is None or str(shape_dims(x)) != str(shape_dims(call)) or \
                    (view is not None and str(shape_dims(view)[-2:]) != str(shape_dims(take))):
                continue
            found = lookup_row(chain, take)
            if found is not None:
                row = np.ascontiguousarray(chain.array(take.args[0])[found])
                return relax.op.add(x, relax.const(row, str(row.dtype)))
        return call
