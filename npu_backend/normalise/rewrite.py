"""What the normalise rewrites share: run a Relax mutator over every function of a module, and
wrap a module-to-module function as a pass for the normalise stage's pass list, run only on a
module that calls the operators it rewrites (a Python mutator visits every call: 1.5 ms for
nothing on ShuffleNetV2, where reading its operators takes 0.4 ms, once for all the passes in a
row that find theirs absent)."""

from __future__ import annotations

import contextlib
import threading

import tvm
from tvm import relax


def with_updates(mod: tvm.IRModule, updates: dict) -> tvm.IRModule:
    """`mod` with the functions of `updates` (global var -> function) put in: a copy, so the
    caller's module stays as it was; `mod` itself when there is nothing to put in."""
    if not updates:
        return mod
    mod = mod.clone()
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod


def rewrite_functions(mod: tvm.IRModule, mutator_class) -> tvm.IRModule:
    """`mod` with every Relax function visited by one `mutator_class(mod)` (a PyExprMutator)."""
    mutator = mutator_class(mod)
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()


def rewrite_calls(mod: tvm.IRModule, op: str, rewrite) -> tvm.IRModule:
    """`mod` with every call of operator `op` (its arguments rewritten first) replaced by
    `rewrite(mutator, call)` where that is not None (`mutator.builder_` emits what it needs)."""
    return rewrite_functions(mod, lambda module: _CallRewriter(module, tvm.ir.Op.get(op), rewrite))


@relax.expr_functor.mutator
class _CallRewriter(relax.PyExprMutator):
    """rewrite_calls' mutator: the shell of a rewrite of one operator's calls."""

    def __init__(self, mod, op, rewrite):
        super().__init__(mod)
        self.op, self.rewrite = op, rewrite

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(self.op)):
            return call
        rewritten = self.rewrite(self, call)
        return call if rewritten is None else rewritten


def rewrite_each(mod: tvm.IRModule, rewriter_of) -> tvm.IRModule:
    """`mod` with every Relax function but the composites visited by its own
    `rewriter_of(mod, func)` (a PyExprMutator), then what they left unread removed."""
    updates = {gvar: rewriter_of(mod, func).visit_expr(func) for gvar, func in mod.functions.items()
               if isinstance(func, relax.Function) and "Composite" not in (func.attrs or {})}
    return relax.transform.DeadCodeElimination()(with_updates(mod, updates)) if updates else mod


def replace_functions(mod: tvm.IRModule, rewrite) -> tvm.IRModule:
    """`mod` with each Relax function but the composites replaced by `rewrite(func)` where that is
    not None, the new calls typed (Normalize) and what they left unread removed."""
    updates = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function) and "Composite" not in (func.attrs or {}):
            rewritten = rewrite(func)
            if rewritten is not None:
                updates[gvar] = rewritten
    if not updates:
        return mod
    return relax.transform.DeadCodeElimination()(relax.transform.Normalize()(with_updates(mod, updates)))


def bound_values(func) -> tuple[dict, dict]:
    """(variable -> its bound value, variable -> the variables whose bindings read it, once per
    argument: a tuple argument's fields each, a tuple's fields too) over every binding of
    `func`'s body: the scan the
    rewrites that look across a function (qkv_merges.py, rotary_pairs.py, rope_epilogues.py)
    start from."""
    bindings = [b for block in getattr(func.body, "blocks", ()) for b in block.bindings]
    values = {b.var: b.value for b in bindings if isinstance(b, relax.VarBinding)}
    uses = {}
    for var, value in values.items():
        for arg in value.fields if isinstance(value, relax.Tuple) else getattr(value, "args", ()):
            for leaf in (arg.fields if isinstance(arg, relax.Tuple) else (arg,)):
                if isinstance(leaf, relax.Var):
                    uses.setdefault(leaf, []).append(var)
    return values, uses


def values_and_users(func) -> tuple[dict, dict]:
    """(variable -> its bound value over every block of `func`'s body, variable -> the variables
    that read it in its dataflow block, relax.analysis.udchain's): the scan the rewriters of
    quantised chains (qdq.py, qdq16.py, qdq_outputs.py, qlinear.py, qlayouts.py) and of folded
    weights (fold_weights.py) start from."""
    values, users = {}, {}
    for block in func.body.blocks:
        values.update({b.var: b.value for b in block.bindings})
        if isinstance(block, relax.DataflowBlock):
            users.update(relax.analysis.udchain(block))
    return values, users


def op_name(expr) -> str:
    """The operator's name of a call of a Relax operator ("relax.concat"), else ""."""
    return expr.op.name if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) else ""


def one_value(expr, dtype: str):
    """The Python value of a one-element constant of `dtype` (any rank), else None."""
    if not isinstance(expr, tvm.ir.GenericConst):
        return None
    value = expr.value.numpy()
    return value.item() if value.size == 1 and value.dtype.name == dtype else None


def as_pass(rewrite, name: str, ops: tuple[str, ...] | None = None) -> tvm.transform.Pass:
    """`rewrite(mod) -> mod` as a module pass; with `ops`, one that returns a module calling none
    of those operators as it is."""
    def run(mod, _ctx):
        called = called_ops(mod) if ops is not None else None
        return mod if called is not None and called.isdisjoint(ops) else rewrite(mod)

    return tvm.transform.module_pass(run, opt_level=0, name=name)


_SCANS = threading.local()


@contextlib.contextmanager
def scans_shared():
    """Inside, `called_ops` keeps the last module it read (this thread's): a pass that finds its
    operators absent returns its input, so one read serves all such passes in a row. The module
    is let go on the way out (it holds the weights)."""
    _SCANS.last = (None, None)
    try:
        yield
    finally:
        _SCANS.last = None


def called_ops(mod: tvm.IRModule) -> frozenset | None:
    """The operators `mod`'s Relax functions call at their bindings (normalised Relax binds every
    call: its arguments are leaves); None when a binding holds a branch or a function."""
    last = getattr(_SCANS, "last", None)
    if last is not None and last[0] is not None and last[0].same_as(mod):
        return last[1]
    ops = set()
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        body = func.body
        values = [binding.value for block in body.blocks for binding in block.bindings] + [body.body] \
            if isinstance(body, relax.SeqExpr) else [body]
        if any(isinstance(value, (relax.If, relax.SeqExpr, relax.Function)) for value in values):
            ops = None
            break
        ops |= {value.op.name for value in values if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)}
    found = None if ops is None else frozenset(ops)
    if last is not None:
        _SCANS.last = (mod, found)
    return found
