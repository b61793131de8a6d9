"""A cumulative sum over booleans counts them, as PyTorch does.

Stage: normalise. In: a Relax IRModule. Out: the same module in which every `cumsum` of a bool
tensor whose result is bool (TVM's PyTorch importer keeps the input's dtype where PyTorch gives
int64) is a cumsum of the tensor as int64, typed int64; what reads it is typed again from there.

Why: Hugging Face's causal-mask code (GPT-2, Llama and the other decoders) numbers packed
sequences with `(position_ids.diff() != 1).cumsum(-1)`. As a bool cumsum, TVM's LLVM code
generator refuses the add of two booleans (`CreateAdd: Check failed: t.MatchesCode(kDLFloat)`)
and no target builds the model, `target="llvm"` included; and a bool sum would not count
past one. As int64 it is PyTorch's result, and the host builds it.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import dtype_of
from .rewrite import as_pass, rewrite_functions

_CUMSUM = tvm.ir.Op.get("relax.cumsum")


def bool_scans_as_counts(mod: tvm.IRModule) -> tvm.IRModule:
    return rewrite_functions(mod, _BoolScanRewriter)


bool_scans_as_counts_pass = as_pass(bool_scans_as_counts, "cgra.BoolScansAsCounts", ops=("relax.cumsum",))


@relax.expr_functor.mutator
class _BoolScanRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_CUMSUM) and dtype_of(call.args[0]) == "bool"
                and dtype_of(call) == "bool"):
            return call
        counts = self.builder_.emit(relax.op.astype(call.args[0], "int64"))
        axis = None if call.attrs.axis is None else int(call.attrs.axis)
        return with_span(relax.op.cumsum(counts, axis=axis, dtype="int64", exclusive=bool(call.attrs.exclusive)),
                         call.span)
