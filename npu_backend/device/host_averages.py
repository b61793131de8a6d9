"""An integer average left on the host returns the dtype the graph gives it.

Stage: codegen (after the kernels are compiled, before TVM builds the host). In: a module whose
functions keep an average of an integer tensor on the host: `avg_pool1d/2d/3d`,
`adaptive_avg_pool1d/2d/3d` or `mean`. Out: the same module computing each of them as TVM
legalizes it (a `call_tir`), followed by a cast to the dtype Relax types the average with, where
the two differ.

Why: Relax types an int8 average int8, but TVM's legalization (TOPI) computes it as int64 (the
pools with a divisor, `mean`) or int32 (the adaptive pools), and TVM types everything after it
from there. An NPU kernel reading the average was compiled, during partitioning, for the int8 the
graph declares and at run time received int64 ("argument 0 ('data'): expected dtype int8, got
int64", an int8 NHWC avg_pool2d -> minimum -> max_pool2d). The average of integers of one dtype
fits that dtype, so the cast changes no value; the graph's output has its declared dtype
(`target="llvm"` returns the int64 it computed).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_info import dtype_of

#: The averages whose legalization widens an integer result.
_AVERAGES = tuple(tvm.ir.Op.get(name) for name in (
    "relax.nn.avg_pool1d", "relax.nn.avg_pool2d", "relax.nn.avg_pool3d", "relax.nn.adaptive_avg_pool1d",
    "relax.nn.adaptive_avg_pool2d", "relax.nn.adaptive_avg_pool3d", "relax.mean"))


def host_averages_as_typed(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with each integer average on the host cast back to its declared dtype (see the
    module's docstring); `mod` itself when it holds none."""
    if not any(_is_integer_average(call) for call in _calls(mod)):
        return mod
    rewriter = _TypedAverages(mod)
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
    return rewriter.builder_.get()


def _calls(mod: tvm.IRModule):
    """The calls bound in `mod`'s Relax functions."""
    for func in mod.functions.values():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            for block in func.body.blocks:
                yield from (b.value for b in block.bindings if isinstance(b.value, relax.Call))


def _is_integer_average(call) -> bool:
    return any(call.op.same_as(op) for op in _AVERAGES) and dtype_of(call).startswith(("int", "uint"))


@relax.expr_functor.mutator
class _TypedAverages(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and _is_integer_average(call)):
            return call
        declared = dtype_of(call)
        legalized = self.builder_.normalize(tvm.ir.Op.get(call.op.name).get_attr("FLegalize")(self.builder_, call))
        if dtype_of(legalized) == declared:
            return legalized
        return relax.op.astype(self.builder_.emit(legalized), declared)
