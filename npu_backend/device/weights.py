"""The NPU kernels' weights move from the VM executable to the runtime's `cgra_weights` module.

Stage: codegen (right after RunCodegen). In: a module whose `main` calls the compiled kernels
(`R.call_dps_packed("<kernel>", (x, <constant>, ...))`) and whose `external_mods` attribute holds
the kernels' module (target/relax_ext.py). Out: the same module in which each such call passes only its
non-constant arguments, to a binding named `<kernel>__w<k>`, and `external_mods` holds a
`cgra_weights` module (runtime/src/weights_module.cc) that imports the kernels' module and
holds, per binding, the constants and their places in the kernel's argument list.

Why: TVM's VM code generation deduplicates the executable's constants in a hash map keyed by
their structural hash, which reads every byte of every weight, twice (45 ms per 100 MB: 0.5 s of
VGG-19's 0.7 s warm compile, tvm's exec_builder.cc). Weights held by the runtime module are
tensors it references, neither hashed nor copied; `export_library` serialises them with it.
A constant that host code reads too stays in `main` as well (the same tensor, no copy).
"""

from __future__ import annotations

import tvm
from tvm import relax

_CALL_DPS_PACKED = tvm.ir.Op.get("relax.call_dps_packed")


def hold_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with the constant arguments of its calls to NPU kernels held by a `cgra_weights`
    module (see the module's docstring); unchanged when no kernel call passes a constant."""
    externals = list((mod.attrs or {}).get("external_mods", None) or [])
    kernels = [module for module in externals if module.kind == "cgra_kernels"]
    if len(kernels) != 1:
        return mod
    holder = _HoldConstants(kernels[0])
    functions = {gvar: holder.visit_expr(func) if isinstance(func, relax.Function) else func
                 for gvar, func in mod.functions.items()}
    if not holder.names:
        return mod
    weights = tvm.get_global_func("cgra.WeightsModule")(kernels[0], holder.names, holder.symbols,
                                                        holder.positions, holder.tensors)
    held = tvm.IRModule(functions, attrs=mod.attrs)
    return held.with_attr("external_mods", [weights if module.same_as(kernels[0]) else module
                                            for module in externals])


@relax.expr_functor.mutator
class _HoldConstants(relax.PyExprMutator):
    """Drops the constant arguments of the calls to the kernels' module, one binding per call."""

    def __init__(self, kernels):
        super().__init__()
        self.kernels = kernels
        self.names, self.symbols, self.positions, self.tensors = [], [], [], []

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not call.op.same_as(_CALL_DPS_PACKED) or not isinstance(call.args[0], relax.ExternFunc) \
                or not isinstance(call.args[1], relax.Tuple):
            return call
        symbol = str(call.args[0].global_symbol)
        arguments = list(call.args[1].fields)
        held = [i for i, arg in enumerate(arguments) if isinstance(arg, tvm.ir.GenericConst)]
        if not held or not self.kernels.implements_function(symbol):
            return call
        name = f"{symbol}__w{len(self.names)}"
        self.names.append(name)
        self.symbols.append(symbol)
        self.positions.append(held)
        self.tensors.append([arguments[i].value for i in held])
        kept = relax.Tuple([arg for i, arg in enumerate(arguments) if i not in held])
        return relax.Call(call.op, [relax.ExternFunc(name), kept], call.attrs, call.ty_args)
