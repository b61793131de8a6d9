"""Concatenations, splits and transposes left on the host become calls to the runtime's own.

Stage: codegen (after the kernels' weights move to the runtime). In: a module whose `main` keeps
`R.concat((a, b, ...), axis=k)`, `R.split(x, ..., axis=k)` or `R.permute_dims(x, axes)` on the
host (no NPU kernel copies tensors). Out: the same module calling the runtime's
`cgra.host.concat` (k, a, b, ...), `cgra.host.split` (k, x; one output per part) and
`cgra.host.permute_dims` (x, axes...) with `R.call_dps_packed` instead, where the operands and
results are tensors of a known rank (anything else stays TVM's: a concat of a tuple variable,
with no axis).

Why: TVM compiles every one of them into the executable's host code. DenseNet-121's 58
concatenations were 0.45 s of its (warm) compile and 0.6 s of LLVM's JIT when the VM first
loads the executable, 40% of the time to its first inference; ShuffleNetV2's channel shuffles
(13 splits, 16 transposes) likewise. The runtime's (runtime/src/host_ops.cc) are compiled once,
with the runtime: concat and split copy one contiguous run of bytes per part and index of the
axes before `k` (memcpy), transposes one element at a time; any dtype, any shape, also symbolic.

`with_host_anchor` gives every executable host code of its own, so that it is an LLVM module.
"""

from __future__ import annotations

import tvm
from tvm import relax

#: The runtime's host operators (runtime/src/host_ops.cc), in destination-passing style.
HOST_CONCAT = "cgra.host.concat"  # (axis, inputs..., output)
HOST_SPLIT = "cgra.host.split"  # (axis, input, outputs...)
HOST_PERMUTE_DIMS = "cgra.host.permute_dims"  # (input, axes..., output)
_CONCAT = tvm.ir.Op.get("relax.concat")
_SPLIT = tvm.ir.Op.get("relax.split")
_PERMUTE_DIMS = tvm.ir.Op.get("relax.permute_dims")
_RESHAPE = tvm.ir.Op.get("relax.reshape")


def host_ops_to_runtime(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with its host concatenations, splits and transposes calling the runtime's (see the
    module's docstring)."""
    rewriter = _HostOps()
    functions = {gvar: rewriter.visit_expr(func) if isinstance(func, relax.Function) else func
                 for gvar, func in mod.functions.items()}
    return tvm.IRModule(functions, attrs=mod.attrs) if rewriter.count else mod


@relax.expr_functor.mutator
class _HostOps(relax.PyExprMutator):
    def __init__(self):
        super().__init__()
        self.count = 0

    def visit_var_binding_(self, binding):
        """A reshape the function returns: a view (RewriteDataflowReshape makes a dataflow
        variable's reshape one), not a reshape PrimFunc TVM compiles for the host (6 ms of
        SqueezeNet's recompile: its flatten). The function returns the view itself: its source, a
        value of the function's dataflow block, then flows to the output, so the VM's memory
        planning gives it a storage of its own, never reused by a later call (SqueezeNet: 867
        host cycles of a copy fewer). A parameter's reshape is copied by the runtime (a concat of
        one): the result must not alias the caller's input."""
        value = binding.value
        if isinstance(binding.var, relax.DataflowVar) or not self.builder_.current_block_is_dataflow() \
                or not (isinstance(value, relax.Call) and value.op.same_as(_RESHAPE)) \
                or not _known(value.ty) or value.ty.ndim < 1 or not _known(value.args[0].ty):
            return super().visit_var_binding_(binding)
        view = self.builder_.emit(relax.op.reshape(self.visit_expr(value.args[0]), self.visit_expr(value.args[1])))
        if not isinstance(value.args[0], relax.DataflowVar):
            view = self.builder_.normalize(relax.op.call_dps_packed(HOST_CONCAT, relax.Tuple([_int(0), view]),
                                                                    value.ty))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, view))
        self.count += 1

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        rewrite = next((fn for op, fn in _REWRITES if call.op.same_as(op)), None)
        runtime_call = rewrite(call) if rewrite is not None else None
        if runtime_call is None:
            return call
        self.count += 1
        return runtime_call


def _known(ty, rank: int | None = None) -> bool:
    """A tensor type with a shape (symbolic extents are fine), of `rank` if given."""
    return isinstance(ty, relax.TensorType) and ty.shape is not None and ty.ndim >= 0 and \
        (rank is None or ty.ndim == rank)


def _int(value: int):
    return tvm.tirx.IntImm("int64", value)


def _concat(call):
    out = call.ty
    if call.attrs.axis is None or not isinstance(call.args[0], relax.Tuple) or not _known(out) or out.ndim < 1:
        return None
    fields = list(call.args[0].fields)
    if not fields or not all(_known(field.ty, out.ndim) for field in fields):
        return None
    axis = int(call.attrs.axis) % out.ndim
    return relax.op.call_dps_packed(HOST_CONCAT, relax.Tuple([_int(axis), *fields]), out)


def _split(call):
    data, parts = call.args[0], call.ty
    if not _known(data.ty) or data.ty.ndim < 1 or not isinstance(parts, relax.TupleType) or \
            not all(_known(part, data.ty.ndim) for part in parts.fields):
        return None
    axis = int(call.attrs.axis) % data.ty.ndim
    return relax.op.call_dps_packed(HOST_SPLIT, relax.Tuple([_int(axis), data]), list(parts.fields))


def _permute_dims(call):
    data, out = call.args[0], call.ty
    if not _known(data.ty) or not _known(out, data.ty.ndim):
        return None
    rank = data.ty.ndim
    axes = list(range(rank))[::-1] if call.attrs.axes is None else [int(a) % max(rank, 1) for a in call.attrs.axes]
    return relax.op.call_dps_packed(HOST_PERMUTE_DIMS, relax.Tuple([data, *map(_int, axes)]), out)


_REWRITES = [(_CONCAT, _concat), (_SPLIT, _split), (_PERMUTE_DIMS, _permute_dims)]


#: The no-op host function every NPU executable holds (`with_host_anchor`).
HOST_ANCHOR = "__cgra_host_anchor"


def with_host_anchor(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with a no-op host PrimFunc. TVM links an executable without host code (every
    operator on the NPU) to an empty C source module, which is not runnable: the VM would then
    export and reload the whole executable, every weight included, before its first call (and
    two threads doing that at once crash in TVM's LLVM module export). With it, TVM's host code
    is always an LLVM module, runnable as it is, like the kernels' (target/relax_ext.py)."""
    anchor = tvm.tirx.PrimFunc([], tvm.tirx.Evaluate(tvm.tirx.const(0, "int32")))
    mod = mod.clone()
    mod[HOST_ANCHOR] = anchor.with_attr("global_symbol", HOST_ANCHOR)
    return mod
