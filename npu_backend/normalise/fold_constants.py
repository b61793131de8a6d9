"""The constant calls fold_weights has no numpy rule for (RoPE's cos / sin tables, T5's
position buckets, a full_like of a variable), folded as TVM's FoldConstant folds them, but only
they: copied into a function of their own and evaluated in one unfused llvm build.

Stage: normalise (the pass list's first, after fold_weights). In and out: a Relax IRModule.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, static_shape
from .fold_weights import folded_or
from .rewrite import with_updates


def fold_remaining_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's FoldConstant, for the constant calls fold_weights has no numpy rule for (RoPE's cos
    and sin tables, T5's relative-position buckets), and only on them: FoldConstant visits and
    legalizes the whole model to find them (Llama 2.1 s, T5 5.8 s under load, for 2 and 1 calls;
    DenseNet-121: 0.5 s for nothing), so the calls it can evaluate (every call whose arguments
    are constants or such calls) are copied into a function of their own, folded there, and their
    values put back as FoldConstant would: folded bindings dropped, the constants used in place
    of their variables (dataflow variables bound to constants too)."""
    updates = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            folded = _folded_closure(mod, func)
            if folded:
                updates[gvar] = _ClosureFolder(mod, func, folded).visit_expr(func)
    return with_updates(mod, updates)


def _constant_closure(func) -> dict:
    """The bindings (var -> call, in order) FoldConstant can evaluate: calls (not opaque packed
    ones) of static shape whose arguments hold no variable except constants and such calls."""
    bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    closure = {}

    def variable_free(expr) -> bool:
        if isinstance(expr, relax.Var):
            return isinstance(bound.get(expr), tvm.ir.GenericConst) or expr in closure
        if isinstance(expr, relax.Tuple):
            return all(variable_free(field) for field in expr.fields)
        if isinstance(expr, relax.ShapeExpr):
            return all(isinstance(dim, tvm.tirx.IntImm) for dim in expr.values)
        if isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm, tvm.ir.GenericConst)):
            return True
        if isinstance(expr, tvm.ir.prim.expr.ExprWithOp):  # a symbolic value: no constant
            return False
        return not isinstance(expr, (relax.Call, relax.Function, relax.If, relax.SeqExpr))

    for var, value in bound.items():
        if not isinstance(value, relax.Call) or getattr(value.op, "name", "") == "relax.call_pure_packed" \
                or static_shape(var) is None:
            continue
        args = value.args[1:] if _reads_shape_only(value, 0) else value.args
        if all(variable_free(arg) for arg in args):
            closure[var] = value
    return closure


#: Operators whose first operand only gives the result its shape and dtype: legalized, they read
#: none of its values, and FoldConstant folds them whatever that operand is.
_SHAPE_ONLY = ("relax.full_like", "relax.zeros_like", "relax.ones_like")


def _reads_shape_only(call, index: int) -> bool:
    """Whether `call` reads only the static shape and dtype of its operand `index`."""
    return index == 0 and call.op.name in _SHAPE_ONLY and static_shape(call.args[0]) is not None


def _folded_closure(mod, func) -> dict:
    """var -> the constant TVM's FoldConstant evaluates its binding to, for the bindings of
    `_constant_closure`, folded in a module of their own (with the PrimFuncs they call)."""
    closure = _constant_closure(func)
    if not closure:
        return {}
    bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    copies, called = {}, set()

    def copied(expr):
        if isinstance(expr, relax.Var):
            return copies.get(expr, bound.get(expr))
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([copied(field) for field in expr.fields])
        if isinstance(expr, relax.GlobalVar):
            called.add(expr)
        return expr

    builder = relax.BlockBuilder()
    with builder.function("constants", []):
        with builder.dataflow():
            for var, call in closure.items():
                # relax.const makes an int64 array int32 unless told the dtype.
                args = [relax.const(np.zeros(static_shape(arg), dtype_of(arg)), dtype_of(arg))
                        if _reads_shape_only(call, index)
                        else copied(arg) for index, arg in enumerate(call.args)]
                copies[var] = builder.emit(relax.Call(call.op, args, call.attrs, call.ty_args, call.span))
            out = builder.emit_output(relax.Tuple([copies[var] for var in closure]))
        builder.emit_func_output(out)
    small = builder.get()
    for gvar in called:
        small[gvar] = mod[gvar]
    try:
        values = _evaluated(small)
    except tvm.error.TVMError:  # an op one build cannot take: FoldConstant's own, op by op
        result = relax.transform.FoldConstant()(small)["constants"]
        bindings = {b.var: b.value for block in result.body.blocks for b in block.bindings}
        fields = bindings.get(result.body.body, result.body.body)
        values = fields.fields if isinstance(fields, relax.Tuple) else ()
    return {var: value for var, value in zip(closure, values) if isinstance(value, tvm.ir.GenericConst)}


def _evaluated(small: tvm.IRModule) -> list:
    """The constants `small`'s "constants" function returns, computed as FoldConstant computes
    each (the op legalized and built for llvm, unfused: TVM's default build pipeline has no
    FuseOps), in one build instead of one per op (T5's 23 calls: 5.3 -> 2.7 s under load)."""
    from tvm.relax.pipeline import default_build_pipeline

    executable = tvm.compile(small, target="llvm", relax_pipeline=default_build_pipeline())
    results = relax.VirtualMachine(executable, tvm.cpu())["constants"]()
    return [relax.const(result.numpy(), str(result.dtype)) for result in results]


@relax.expr_functor.mutator
class _ClosureFolder(relax.PyExprMutator):
    """FoldConstant's result from the values `_folded_closure` computed: folded bindings (and
    dataflow variables bound to constants) dropped, their constants used in place."""

    def __init__(self, mod, func, folded):
        super().__init__(mod)
        self.constants = dict(folded)
        for block in func.body.blocks:
            self.constants.update({b.var: b.value for b in block.bindings if isinstance(b.var, relax.DataflowVar)
                                   and isinstance(b.value, tvm.ir.GenericConst)})

    def visit_var_(self, op):
        return folded_or(self.constants, op, super().visit_var_)

    def visit_dataflow_var_(self, op):
        return folded_or(self.constants, op, super().visit_dataflow_var_)

    def visit_var_binding_(self, binding):
        if binding.var in self.constants:
            if not isinstance(binding.var, relax.DataflowVar):  # an output keeps its binding
                self.builder_.emit_normalized(relax.VarBinding(binding.var, self.constants.pop(binding.var)))
            return
        super().visit_var_binding_(binding)
