"""Each offloaded call site's model nodes, recorded on the function it calls.

Stage: partition (after FuseOpsByPattern). Input: the module before partitioning (its calls carry
the model nodes as spans, see provenance.py) and after. Output: the partitioned module in which
every offloaded function has the attribute `cgra.source_nodes` (per operator of its composite,
in order: that operator's node names joined by "+", "" when unknown) and no function is called
from two sites with different nodes: partitioning gives structurally equal kernels one function
(spans are not compared), so such a function is copied, the copy named `<name>_<k>`.

How a site finds its nodes: the partitioned main is walked in order next to the original one.
Every call there (host operator, or each operator inside an offloaded composite with its
parameters bound to the site's arguments) is looked up among the original bindings by operator,
attributes and arguments (variables mapped to the original ones); the original binding's span
gives the nodes. What cannot be matched keeps "" and the kernel still runs.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

from ..frontend.provenance import NODE_JOIN, SOURCE_NODES_ATTR, span_names
from .call_tir import wrapped_call
from .composite import composite_call


def record_source_nodes(before: tvm.IRModule, after: tvm.IRModule) -> tvm.IRModule:
    """`after` with `cgra.source_nodes` on every offloaded function (see the module docstring)."""
    sites = []  # (host function's GlobalVar, call binding's var, callee GlobalVar, nodes)
    for gvar, func in after.functions.items():
        if _is_host_function(func) and gvar.name_hint in [g.name_hint for g in before.functions]:
            sites += [(gvar, *site) for site in _kernel_sites(after, func, before[gvar.name_hint])]
    if not sites:
        return after
    after = after.clone()
    chosen = {}  # callee -> the nodes of its first site, which it keeps
    for _, _, callee, nodes in sites:
        if callee not in chosen:
            chosen[callee] = nodes
            after[callee] = after[callee].with_attr(SOURCE_NODES_ATTR, list(nodes))
    builder = relax.BlockBuilder(after)  # its GlobalVars carry the copies' types
    copies, renames = {}, {}  # (callee, nodes) -> copy; (host, hash of site var) -> copy
    for host, var, callee, nodes in sites:
        if chosen[callee] != nodes:
            if (callee, nodes) not in copies:
                copies[(callee, nodes)] = _copy(builder, after[callee], callee.name_hint, nodes)
            renames[(host.name_hint, hash(var))] = copies[(callee, nodes)]
    return _redirect(builder.get(), renames) if renames else after


def _is_host_function(func) -> bool:
    attrs = func.attrs or {}
    return isinstance(func, relax.Function) and "Codegen" not in attrs and "Composite" not in attrs


def _copy(builder, func, name, nodes):
    """A copy of offloaded function `func` for a site with other nodes, under a new name."""
    taken = {g.name_hint for g in builder.get().functions}
    count = 2
    while f"{name}_{count}" in taken:
        count += 1
    name = f"{name}_{count}"
    func = func.with_attr("global_symbol", name).with_attr(SOURCE_NODES_ATTR, list(nodes))
    return builder.add_func(func, name)


def _redirect(mod, renames):
    for gvar, func in list(mod.functions.items()):
        targets = {site: copy for (host, site), copy in renames.items() if host == gvar.name_hint}
        if targets:
            mod[gvar] = _Redirect(mod, targets).visit_expr(func)
    return mod


@relax.expr_functor.mutator
class _Redirect(relax.PyExprMutator):
    """Calls of the sites in `targets` (hash of the bound var -> GlobalVar) go to their copy."""

    def __init__(self, mod, targets):
        super().__init__(mod)
        self.targets = targets

    def visit_var_binding_(self, binding):
        copy = self.targets.get(hash(binding.var))
        if copy is None:
            return super().visit_var_binding_(binding)
        call = binding.value
        args = [self.visit_expr(arg) for arg in call.args]
        value = self.builder_.normalize(relax.Call(copy, args, call.attrs, call.ty_args, call.span))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, value))


def _kernel_sites(mod, func, original):
    """[(binding var, callee GlobalVar, nodes per composite operator)] of `func`'s offloaded calls."""
    index = _index(original)
    mapped = {}  # hash of a var of `func` -> the original var holding the same value
    sites = []
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            callee = getattr(value, "op", None)
            if isinstance(callee, tvm.ir.GlobalVar) and "Codegen" in (mod[callee].attrs or {}):
                out, nodes = _match_composite(mod[callee], [_mapped(a, mapped) for a in value.args], index)
                sites.append((binding.var, callee, tuple(nodes)))
            else:
                out = index.get(_key(value, mapped), (None, None))[0]
            if out is not None:
                mapped[hash(binding.var)] = out
    return sites


def _match_composite(wrapper, args, index):
    """(original var of the composite's output or None, nodes per composite operator)."""
    outer = dict(zip([hash(p) for p in wrapper.params], args))
    tir_call = wrapped_call(wrapper)
    if tir_call is not None:  # a user's PrimFunc: one call_tir, one operator
        var, span = index.get(_key(tir_call, outer), (None, None))
        return var, [NODE_JOIN.join(span_names(span))]
    composite, call = composite_call(wrapper)
    inner_args = call.args if call is not None else wrapper.params
    local = {hash(p): outer.get(hash(a), a) for p, a in zip(composite.params, inner_args)}
    nodes = []
    for block in composite.body.blocks:
        for binding in block.bindings:
            var, span = index.get(_key(binding.value, local), (None, None))
            if isinstance(binding.value, relax.Call) and isinstance(binding.value.op, tvm.ir.Op):
                nodes.append(NODE_JOIN.join(span_names(span)))
            if var is not None:
                local[hash(binding.var)] = var
    return local.get(hash(composite.body.body)), nodes


def _index(func) -> dict:
    """Key of each binding's value -> (its var, its value's span), over the original function."""
    index = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            key = _key(binding.value, {})
            if key is not None:
                index.setdefault(key, (binding.var, getattr(binding.value, "span", None)))
    return index


def _mapped(expr, mapped):
    return mapped.get(hash(expr), expr) if isinstance(expr, relax.Var) else expr


def _key(expr, mapped):
    """What identifies a value: operator, attributes and arguments (variables through `mapped`,
    constants by identity, anything else by structure). None for what is not looked up."""
    if isinstance(expr, relax.Call):
        op = expr.op.name if isinstance(expr.op, tvm.ir.Op) else _key(expr.op, mapped)
        attrs = tvm_ffi.structural_hash(expr.attrs) if expr.attrs is not None else 0
        return ("call", op, attrs, tuple(_key(arg, mapped) for arg in expr.args))
    if isinstance(expr, relax.TupleGetItem):
        return ("item", _key(expr.tuple_value, mapped), int(expr.index))
    if isinstance(expr, relax.Tuple):
        return ("tuple", tuple(_key(field, mapped) for field in expr.fields))
    if isinstance(expr, (relax.Var, tvm.ir.GenericConst)):
        return ("object", hash(_mapped(expr, mapped)))
    if isinstance(expr, tvm.ir.GlobalVar):
        return ("global", expr.name_hint)
    return ("structure", tvm_ffi.structural_hash(expr))
