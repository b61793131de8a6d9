"""Scalar constants passed to offloaded functions become constants inside them.

Stage: partition (right after FuseOpsByPattern). In: a module whose offloaded functions
(attribute Codegen = "cgra") take every constant of their match as a parameter
(`bind_constants=False` keeps weights as arguments, so the kernels can DMA them). Out: the same
module in which each 0-d constant argument of an offloaded function's only call is bound inside
that function and inside the composite it calls, and dropped from the call.

Why: a requantisation's output scale (1.0) and zero point (qdq_form.py) are 0-d constants that
the kernel needs at compile time (the zero point is a word of the EPILOGUE command), not tensors
to load at run time; a weight or bias stays an argument.
"""

from __future__ import annotations

import hashlib

import numpy as np
import tvm
from tvm import relax

from ..errors import UnsupportedOperator
from .composite import composite_name


def bind_scalar_arguments(mod: tvm.IRModule, takes_immediates=lambda composite: False,
                          takes_constants=lambda composite: False) -> tvm.IRModule:
    """`mod` with the 0-d constant arguments of its offloaded functions bound inside them, and
    every one-element constant (any shape) where `takes_immediates(composite name)` says the
    kernel reads its constants at compile time (a fabric body's immediates), every constant where
    `takes_constants` says the kernel builds what it holds (an attention's causal triangle). A function called
    with different scalars at different sites (partitioning gives structurally equal kernels one
    function) gets one copy per set of scalars."""
    # In name order: a set of GlobalVars iterates by address, and the variants are added to the
    # module in this order, which is the order of the kernels in the compiled object.
    offloaded = sorted((gvar for gvar, func in mod.functions.items()
                        if isinstance(func, relax.Function) and (func.attrs or {}).get("Codegen") == "cgra"),
                       key=lambda gvar: gvar.name_hint)
    variants = {}  # (global var, scalar key) -> {argument index: constant}
    modes = {gvar: takes_constants(_composite_of(mod[gvar])) or takes_immediates(_composite_of(mod[gvar]))
             for gvar in offloaded}
    immediates = {gvar: "all" if mode is True and takes_constants(_composite_of(mod[gvar])) else mode
                  for gvar, mode in modes.items() if mode}
    for gvar, sites in _calls_of(mod, offloaded).items():
        for call in sites:
            bound = _bound(call, immediates.get(gvar, False))
            if bound:
                variants.setdefault((gvar, _key(bound)), bound)
    if not variants:
        return mod
    # Bound functions change type: they get new global vars (the builder types them), and the
    # other functions call those without the bound arguments.
    replaced = {gvar for gvar, _ in variants}
    builder = relax.BlockBuilder(tvm.IRModule({g: f for g, f in mod.functions.items() if g not in replaced},
                                              attrs=mod.attrs))
    updated = {}  # (old global var, scalar key) -> (new global var, bound argument indices)
    taken = {g.name_hint for g in mod.functions}
    for (gvar, key), bound in variants.items():
        func = mod[gvar].bind_params({mod[gvar].params[i]: value for i, value in bound.items()})
        name = _variant_name(gvar, [g for g, _ in updated], taken)
        taken.add(name)
        if name != gvar.name_hint:
            func = func.with_attr("global_symbol", name)
        updated[(gvar, key)] = (builder.add_func(_InlineScalars(immediates.get(gvar, False)).visit_expr(func), name), bound)
    mod = builder.get()
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function) and (func.attrs or {}).get("Codegen") != "cgra":
            mod[gvar] = _DropArguments(updated, immediates).visit_expr(func)
    return mod


def _variant_name(gvar, done, taken) -> str:
    """The first variant keeps the function's name, the k-th is `<name>_s<k>` (kernel symbols
    come from these names and must differ)."""
    count = sum(1 for other in done if other.same_as(gvar))
    if count == 0:
        return gvar.name_hint
    while f"{gvar.name_hint}_s{count + 1}" in taken:
        count += 1
    return f"{gvar.name_hint}_s{count + 1}"


def _key(bound: dict) -> tuple:
    """What identifies a set of scalar arguments: positions, dtypes and values (a digest of a
    larger constant's)."""
    def value(arg):
        array = arg.value.numpy()
        return array.item() if array.size == 1 else hashlib.sha256(array.tobytes()).hexdigest() + str(array.shape)
    return tuple((i, str(arg.ty.dtype), value(arg)) for i, arg in sorted(bound.items()))


def _is_scalar_constant(expr) -> bool:
    return isinstance(expr, tvm.ir.GenericConst) and getattr(expr.ty, "ndim", None) == 0


def _composite_of(func) -> str:
    """The composite's name, "" for an offloaded user's PrimFunc (partition/call_tir.py)."""
    try:
        return composite_name(func)
    except UnsupportedOperator:
        return ""


def _bound(call, every_one) -> dict:
    """Argument index -> constant, of the arguments of `call` to bind inside its callee: 0-d ones,
    one-element ones with `every_one` True, all with `every_one` "all", the integer ones (indices)
    with "indices", one-element ones and those of only 0 and -inf with "triangles"."""
    return {i: arg for i, arg in enumerate(call.args)
            if _is_scalar_constant(arg) or every_one is True and _is_one_element_constant(arg)
            or every_one == "all" and isinstance(arg, tvm.ir.GenericConst)
            or every_one == "indices" and isinstance(arg, tvm.ir.GenericConst) and "int" in str(arg.ty.dtype)
            or every_one == "triangles" and (_is_one_element_constant(arg) or _is_triangle_like(arg))}


def _is_triangle_like(expr) -> bool:
    """A constant of only +-0 and -inf (a causal triangle the kernel builds); a constant mask row
    of other values (a static Bloom's ALiBi, normalise/constant_rows.py) stays an operand."""
    if not isinstance(expr, tvm.ir.GenericConst):
        return False
    values = expr.value.numpy()
    return values.dtype.kind == "f" and bool(np.all((values == 0) | (values == -np.inf)))


def _is_one_element_constant(expr) -> bool:
    return isinstance(expr, tvm.ir.GenericConst) and expr.value.numpy().size == 1


def _calls_of(mod, targets) -> dict:
    """Every call of each function in `targets`, over the module's other Relax functions."""
    calls: dict = {gvar: [] for gvar in targets}

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op in calls:
            calls[expr.op].append(expr)

    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function) and gvar not in targets:
            relax.analysis.post_order_visit(func, visit)
    return calls


@relax.expr_functor.mutator
class _InlineScalars(relax.PyExprMutator):
    """Inside an offloaded function: a call of a local function (the composite) with 0-d
    constant arguments (any one-element ones with `every_one`) calls that function with those
    parameters bound instead."""

    def __init__(self, every_one: bool = False):
        super().__init__()
        self.functions = {}
        self.every_one = every_one

    def visit_var_binding_(self, binding):
        if isinstance(binding.value, relax.Function):
            self.functions[binding.var] = binding.value
        super().visit_var_binding_(binding)

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        callee = self.functions.get(call.op, call.op)
        scalars = set(_bound(call, self.every_one))
        if not isinstance(callee, relax.Function) or not scalars:
            return call
        bound = callee.bind_params({callee.params[i]: call.args[i] for i in scalars})
        return relax.Call(bound, [arg for i, arg in enumerate(call.args) if i not in scalars])


@relax.expr_functor.mutator
class _DropArguments(relax.PyExprMutator):
    """At the call sites: the new function, without the arguments that were bound."""

    def __init__(self, updated: dict, immediates: set):
        super().__init__()
        self.updated = updated
        self.immediates = immediates

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        bound = _bound(call, self.immediates.get(call.op, False))
        if not bound or (call.op, _key(bound)) not in self.updated:
            return call
        callee, dropped = self.updated[(call.op, _key(bound))]
        return relax.Call(callee, [arg for i, arg in enumerate(call.args) if i not in dropped],
                          call.attrs, call.ty_args)
