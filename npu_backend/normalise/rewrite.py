"""What the normalise rewrites share: run a Relax mutator over every function of a module, and
wrap a module-to-module function as a pass for the normalise stage's pass list."""

from __future__ import annotations

import tvm
from tvm import relax


def rewrite_functions(mod: tvm.IRModule, mutator_class) -> tvm.IRModule:
    """`mod` with every Relax function visited by one `mutator_class(mod)` (a PyExprMutator)."""
    mutator = mutator_class(mod)
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()


def as_pass(rewrite, name: str) -> tvm.transform.Pass:
    """`rewrite(mod) -> mod` as a module pass."""
    return tvm.transform.module_pass(lambda mod, _ctx: rewrite(mod), opt_level=0, name=name)
