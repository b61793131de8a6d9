"""Concatenations left on the host become calls to the runtime's `cgra.host.concat`.

Stage: codegen (after the kernels' weights move to the runtime). In: a module whose `main` keeps
`R.concat((a, b, ...), axis=k)` on the host (no NPU kernel copies tensors). Out: the same module
calling `R.call_dps_packed("cgra.host.concat", (k, a, b, ...))` instead, where the operands are
tensors of a known rank (a concat of a tuple variable, or with no axis, stays TVM's).

Why: TVM compiles every concatenation into the executable's host code. DenseNet-121's 58
concatenations were 0.45 s of its (warm) compile and 0.6 s of LLVM's JIT when the VM first
loads the executable, 40% of the time to its first inference. The runtime's concat
(runtime/src/host_ops.cc) is compiled once, with the runtime, and copies one contiguous run of
bytes per input and index of the axes before `k` (memcpy): any dtype, any shape, also symbolic.
"""

from __future__ import annotations

import tvm
from tvm import relax

#: The runtime's concatenation (runtime/src/host_ops.cc): (axis, inputs..., output).
HOST_CONCAT = "cgra.host.concat"
_CONCAT = tvm.ir.Op.get("relax.concat")


def concats_to_runtime(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with its host concatenations calling the runtime's (see the module's docstring)."""
    rewriter = _Concats()
    functions = {gvar: rewriter.visit_expr(func) if isinstance(func, relax.Function) else func
                 for gvar, func in mod.functions.items()}
    return tvm.IRModule(functions, attrs=mod.attrs) if rewriter.count else mod


@relax.expr_functor.mutator
class _Concats(relax.PyExprMutator):
    def __init__(self):
        super().__init__()
        self.count = 0

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not call.op.same_as(_CONCAT) or call.attrs.axis is None or not isinstance(call.args[0], relax.Tuple):
            return call
        out = call.ty
        fields = list(call.args[0].fields)
        if not isinstance(out, relax.TensorType) or out.shape is None or out.ndim < 1 or not fields or \
                any(not isinstance(f.ty, relax.TensorType) or f.ty.ndim != out.ndim for f in fields):
            return call
        self.count += 1
        axis = int(call.attrs.axis) % out.ndim
        return relax.op.call_dps_packed(HOST_CONCAT, relax.Tuple([tvm.tirx.IntImm("int64", axis), *fields]), out)
