"""KV-cache writes called in place: the cache tensor is the kernel's output as well as its input.

Stage: codegen (right after RunCodegen). In: a module whose offloaded cache writes
(kernels/layout/cache_write.py, patterns `cgra.cache_write` and a prefill's `cgra.cache_rows`) are called in destination-passing
style, `R.call_dps_packed(kernel, (cache, index, row), out)`, which would allocate a new cache
and leave every row but the new one unwritten. Out: the same module calling each of them with
`R.call_inplace_packed(kernel, cache, index, row, cache, inplace_indices=[3])` (its
parameters in the composite's order): the kernel's
output is the cache it was given, so the new row lands in the caller's tensor, the same NPU
memory from one decode step to the next, and the result (the cache written) is that tensor. The
kernel never reads its first parameter, so the alias changes nothing it computes; partition takes
a write only when nothing else reads its cache (partition/composite.py `cache_read_elsewhere`).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

from ..kernels.layout.cache_write import PATTERNS
from ..errors import UnsupportedOperator
from ..partition.composite import composite_name

_CALL_DPS_PACKED = tvm.ir.Op.get("relax.call_dps_packed")


def cache_write_symbols(mod: tvm.IRModule) -> frozenset:
    """The global symbols of `mod`'s offloaded cache writes (before RunCodegen)."""
    return frozenset(str(func.attrs["global_symbol"]) for func in mod.functions.values()
                     if isinstance(func, relax.Function) and func.attrs is not None and "Codegen" in func.attrs
                     and "global_symbol" in func.attrs and _is_cache_write(func))


def _is_cache_write(func) -> bool:
    """Whether the offloaded `func` holds the cache write's composite (an offloaded PrimFunc, a
    user's TensorIR or a MatMulNBits kernel, holds none)."""
    try:
        return composite_name(func) in PATTERNS
    except UnsupportedOperator:
        return False


def writes_in_place(mod: tvm.IRModule, symbols: frozenset) -> tvm.IRModule:
    """`mod` with its calls of the kernels `symbols` made in place (the module docstring)."""
    if not symbols:
        return mod
    rewriter = _InPlace(symbols)
    functions = {gvar: rewriter.visit_expr(func) if isinstance(func, relax.Function) else func
                 for gvar, func in mod.functions.items()}
    return tvm.IRModule(functions, attrs=mod.attrs)


@relax.expr_functor.mutator
class _InPlace(relax.PyExprMutator):
    def __init__(self, symbols: frozenset):
        super().__init__()
        self.symbols = symbols

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.op.same_as(_CALL_DPS_PACKED) or not isinstance(call.args[0], relax.ExternFunc) or \
                str(call.args[0].global_symbol) not in self.symbols:
            return call
        args = list(call.args[1].fields)
        out = call.ty_args[0] if call.ty_args else call.ty
        cache = next(arg for arg in args if tvm_ffi.structural_equal(arg.ty, out))  # the only one of its shape
        return relax.op.call_inplace_packed(call.args[0], *args, cache, inplace_indices=[len(args)], ty_args=[out])
