"""Offload the PrimFuncs a Relax function calls with R.call_tir that the NPU can run.

Stage: partition (after FuseOpsByPattern). Input: a Relax IRModule and `reason_of(prim_func,
name)`, which says why a PrimFunc cannot be an NPU kernel or None when it can (partition/stage.py:
it compiles the PrimFunc through the kernel stages, so a PrimFunc is offloaded only if it will
compile). Output: every such `R.call_tir(f, args)` replaced by a call of a new Relax function
`cgra_tir_<f>` with `Codegen="cgra"` (what RunCodegen hands to relax.ext.cgra), whose body is
the same call_tir and which carries the PrimFunc and its name as attributes (the target hook
sees only the offloaded functions, not the module). One such function per PrimFunc, shared by
all its call sites. A call_tir that stays is compiled for the host by TVM's CPU pipeline, and
explain gives its reason.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
PREFIX = "cgra_tir_"
#: The attribute of an offloaded function that runs a PrimFunc: the PrimFunc's key in
#: `_PRIM_FUNCS` ("<name>#<structural hash>"). The PrimFunc itself cannot be an attribute: TVM's
#: script printer fails on a module holding a PrimFunc as a Relax function's attribute value.
PRIM_FUNC_ATTR = "cgra.prim_func"
_PRIM_FUNCS: dict = {}  # key -> (name, PrimFunc), for the target hook, which sees no module


def remember_prim_func(name: str, func) -> str:
    """The key `prim_func_of` finds `func` (PrimFunc `name`) under."""
    key = f"{name}#{tvm_ffi.structural_hash(func)}"
    _PRIM_FUNCS[key] = (name, func)
    return key


def prim_func_of(wrapper):
    """(name, PrimFunc) an offloaded function made by `offload_call_tir` runs, or None."""
    key = (wrapper.attrs or {}).get(PRIM_FUNC_ATTR)
    return None if key is None else _PRIM_FUNCS[str(key)]


def called_prim_func(mod: tvm.IRModule, call):
    """(name, PrimFunc) that `call` runs with R.call_tir, or None for any other call."""
    if not (isinstance(call, relax.Call) and call.op.same_as(_CALL_TIR)):
        return None
    callee = call.args[0]
    if not isinstance(callee, tvm.ir.GlobalVar) or callee not in mod.functions:
        return None
    func = mod[callee]
    return (callee.name_hint, func) if isinstance(func, tirx.PrimFunc) else None


def call_tir_reason(call) -> str | None:
    """Why this call_tir cannot be offloaded whatever its PrimFunc, or None."""
    if len(call.args) > 2:
        return "it passes symbolic shape values (tir_vars) to the PrimFunc; the NPU path needs static shapes"
    if not isinstance(call.ty_args[0], relax.TensorType):
        return "it returns a tuple; an NPU kernel writes one tensor (split the PrimFunc)"
    return None


def offload_call_tir(mod: tvm.IRModule, reason_of, attrs) -> tvm.IRModule:
    """`mod` with the call_tir sites whose PrimFunc `reason_of` accepts calling NPU kernels.
    `attrs(name)`: the attributes of the offloaded function of PrimFunc `name` (the target
    hook's keys). Every PrimFunc is decided before the module is rewritten, outside TVM's
    visitor, so that an error `reason_of` raises reaches the caller as it is."""
    hosts = [(gvar, func) for gvar, func in mod.functions.items()
             if isinstance(func, relax.Function) and not (func.attrs and "Codegen" in func.attrs)]
    sites = {}  # PrimFunc name -> a call_tir of it that can be offloaded
    for _, func in hosts:
        relax.analysis.post_order_visit(func, lambda expr: _note_site(mod, expr, sites))
    builder = relax.BlockBuilder(mod)
    targets = {name: builder.add_func(_wrapper(call, attrs(name)), PREFIX + name)
               for name, call in sites.items() if reason_of(called_prim_func(mod, call)[1], name) is None}
    if not targets:
        return mod
    rewriter = _Rewriter(builder, targets)
    for gvar, func in hosts:
        rewritten = rewriter.visit_expr(func)
        if not rewritten.same_as(func):
            builder.update_func(gvar, rewritten)
    return builder.get()


def _note_site(mod, expr, sites: dict) -> None:
    """Record `expr` in `sites` (PrimFunc name -> first call) when it is a call_tir that may be offloaded."""
    found = called_prim_func(mod, expr)
    if found is not None and call_tir_reason(expr) is None:
        sites.setdefault(found[0], expr)


def _wrapper(call, attrs: dict) -> relax.Function:
    """A Relax function computing `call` (a call_tir) of its own parameters, marked for the NPU."""
    params = [relax.Var(f"arg{i}", arg.ty) for i, arg in enumerate(call.args[1].fields)]
    body = relax.call_tir(call.args[0], params, call.ty_args[0])
    func = relax.Function(params, body, call.ty_args[0])
    for key, value in {"Codegen": "cgra", **attrs}.items():
        func = func.with_attr(key, value)
    return func


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    """Calls of the PrimFuncs in `targets` (name -> offloaded function) call those functions."""

    def __init__(self, builder, targets):
        super().__init__(builder.get())
        self.targets = targets

    def visit_call_(self, call):
        call = super().visit_call_(call)
        found = called_prim_func(self.builder_.get(), call) if call.op.same_as(_CALL_TIR) else None
        target = self.targets.get(found[0]) if found is not None and call_tir_reason(call) is None else None
        return relax.Call(target, list(call.args[1].fields)) if target is not None else call


def wrapped_call(wrapper):
    """The call_tir inside an offloaded function made by `offload_call_tir`, or None for any
    other function."""
    if PRIM_FUNC_ATTR not in (wrapper.attrs or {}):
        return None
    body = wrapper.body
    if isinstance(body, relax.SeqExpr):
        calls = [b.value for block in body.blocks for b in block.bindings if isinstance(b.value, relax.Call)]
        return calls[0] if calls else body.body
    return body


def offloaded_prim_funcs(mod: tvm.IRModule) -> set:
    """Names of the PrimFuncs that offloaded functions of `mod` run."""
    return {prim_func_of(func)[0] for func in mod.functions.values()
            if isinstance(func, relax.Function) and prim_func_of(func) is not None}


def drop_unused_prim_funcs(mod: tvm.IRModule, names) -> tvm.IRModule:
    """`mod` without the PrimFuncs `names` that no Relax function calls any more (after
    RunCodegen replaced their offloaded calls, or TVM's RewriteDataflowReshape the calls of the
    reshapes LegalizeOps made): the host build would compile them for nothing."""
    called = {gvar.name_hint for func in mod.functions.values() if isinstance(func, relax.Function)
              for gvar in relax.analysis.all_global_vars(func)}
    unused = [gvar for gvar in mod.functions if gvar.name_hint in names and gvar.name_hint not in called]
    if not unused:
        return mod
    mod = mod.clone() if hasattr(mod, "clone") else tvm.IRModule(dict(mod.functions.items()))
    for gvar in unused:
        del mod[gvar]
    return mod
