"""Which fusion patterns can match a module at all: those whose operators it calls.

Stage: partition (before FuseOpsByPattern). In: the op families' patterns and a Relax module.
Out: the patterns each of whose matches needs only operators the module calls (`required_ops`
of the pattern, a subset of `ops_in` the module). A pattern with an operator the module never
calls cannot match, but FuseOpsByPattern still walks the module for it: ShuffleNetV2's 151
patterns took 0.33 s, the 88 its operators allow 0.17 s, with the same result. The fused pairs'
and blocks' patterns need a depthwise conv2d besides (`has_grouped_conv2d`).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax import dpl


def ops_in(mod: tvm.IRModule) -> frozenset:
    """The names of the operators the module's Relax functions call."""
    names = set()

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            names.add(expr.op.name)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return frozenset(names)


def required_ops(pattern) -> frozenset:
    """The operators every match of `pattern` (a dataflow pattern) calls: an alternative needs what
    both sides need, a call its operator and what its arguments need; anything else (a wildcard,
    a constant, a negation) nothing. Sub-patterns are shared (a fabric chain's eight links each
    take the alternatives below them): each is read once. The patterns are built once a process
    (kernels.pattern_table), so the answer is kept with the pattern it is for (8 ms a compile)."""
    key = pattern.__chandle__()
    known = _REQUIRED.get(key)
    if known is None or not known[0].same_as(pattern):
        if len(_REQUIRED) >= 4096:
            _REQUIRED.clear()
        known = _REQUIRED[key] = (pattern, _required(pattern, {}))  # held, so no other pattern gets its address
    return known[1]


_REQUIRED: dict = {}  # pattern's address -> (the pattern, its required_ops)


def _required(pattern, seen: dict) -> frozenset:
    key = pattern.__chandle__()
    if key not in seen:
        seen[key] = _required_here(pattern, seen)
    return seen[key]


def _required_here(pattern, seen: dict) -> frozenset:
    if isinstance(pattern, dpl.OrPattern):
        return _required(pattern.left, seen) & _required(pattern.right, seen)
    if isinstance(pattern, dpl.AndPattern):
        return _required(pattern.left, seen) | _required(pattern.right, seen)
    if isinstance(pattern, dpl.CallPattern):
        return _required(pattern.op, seen).union(*(_required(arg, seen) for arg in pattern.args or []))
    if isinstance(pattern, dpl.ExprPattern):
        return frozenset([pattern.expr.name]) if isinstance(pattern.expr, tvm.ir.Op) else frozenset()
    if isinstance(pattern, (dpl.AttrPattern, dpl.TypePattern, dpl.DataTypePattern, dpl.ShapePattern)):
        return _required(pattern.pattern, seen)
    if isinstance(pattern, dpl.TupleGetItemPattern):
        return _required(pattern.tuple, seen)
    if isinstance(pattern, dpl.TuplePattern):
        return frozenset().union(*(_required(field, seen) for field in pattern.fields))
    return frozenset()


def has_grouped_conv2d(mod) -> bool:
    """Whether a function of `mod` calls a conv2d with groups > 1 (a depthwise one, which every
    fused pair and block holds). Matching their patterns costs VGG-19's partition 28 of 66 ms,
    ResNet-50's 82 of 189 ms, though neither has one."""
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") == "relax.nn.conv2d" and \
                int(expr.attrs.groups) > 1:
            found.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function) and not found:
            relax.analysis.post_order_visit(func, visit)
    return bool(found)
