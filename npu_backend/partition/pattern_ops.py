"""Which fusion patterns can match a module at all.

Stage: partition (before FuseOpsByPattern). In: the op families' patterns and a Relax module.
Out: the patterns that can match it (`can_match`). FuseOpsByPattern walks the whole module for
every pattern, one that cannot match included. Two tests leave such a pattern out:
- its operators: a match calls every operator of `required_ops(pattern)`, so those must be among
  the module's (`ModuleCalls.ops`). ShuffleNetV2's 151 patterns took 0.33 s, the 88 its
  operators allow 0.17 s, with the same result;
- its depth: a match is a nest of `call_depth(pattern)` calls, each an operand of the one above,
  all to the pattern's operators, so the module must hold such a run of calls
  (`ModuleCalls.longest_run`). An elementwise chain of eight ops (the fabric's deepest pattern)
  cannot match a ResNet, whose longest run of elementwise calls is an add and a relu.
The fused pairs' and blocks' patterns need a depthwise conv2d besides (`ModuleCalls.grouped_conv2d`).
"""

from __future__ import annotations

import typing

import tvm
from tvm import relax
from tvm.relax import dpl


_HOLDS_CALLS = (relax.Call, relax.If, relax.SeqExpr, relax.Function)


class ModuleCalls:
    """What the checks read of a module, from one walk of its Relax functions: the operators
    they call, whether a conv2d among them has groups > 1, and each binding's operands (a
    call's; a tuple's fields and an item's tuple pass through, as the matcher looks through
    them) for the longest run of calls to some operators."""

    def __init__(self, mod: tvm.IRModule):
        ops, self.grouped_conv2d = set(), False
        self._index = {}  # binding var -> position in _nodes
        self._nodes = []  # (operator name, or None for what passes its operands through; operand positions)
        self._exact = True  # False when a binding holds what the walk does not read (an If): no depth test
        for func in mod.functions.values():
            if not isinstance(func, relax.Function):
                continue
            for block in func.body.blocks if isinstance(func.body, relax.SeqExpr) else ():
                for binding in block.bindings:
                    self._add(binding.var, binding.value, ops)
            self._exact &= isinstance(func.body, relax.SeqExpr) and not isinstance(func.body.body, _HOLDS_CALLS)
        if not self._exact:  # calls the walk did not reach (in a branch, nested in a call): every expression
            ops, self.grouped_conv2d = self._every_call(mod)
        self.ops = frozenset(ops)
        self._runs = {}

    @staticmethod
    def _every_call(mod) -> tuple:
        ops, grouped = set(), []

        def visit(expr):
            if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
                ops.add(expr.op.name)
                if expr.op.name == "relax.nn.conv2d" and int(expr.attrs.groups) > 1:
                    grouped.append(expr)

        for func in mod.functions.values():
            if isinstance(func, relax.Function):
                relax.analysis.post_order_visit(func, visit)
        return ops, bool(grouped)

    def _add(self, var, value, ops) -> None:
        if isinstance(value, relax.Call):
            name = value.op.name if isinstance(value.op, tvm.ir.Op) else ""
            if name:
                ops.add(name)
            if name == "relax.nn.conv2d" and int(value.attrs.groups) > 1:
                self.grouped_conv2d = True
            node = (name, self._operands(value.args))
        elif isinstance(value, relax.Tuple):
            node = (None, self._operands(value.fields))
        elif isinstance(value, relax.TupleGetItem):
            node = (None, self._operands([value.tuple_value]))
        elif isinstance(value, relax.Var):
            node = (None, self._operands([value]))
        else:
            node = ("", ())  # a constant, a shape: no call
            self._exact &= not isinstance(value, _HOLDS_CALLS)
        self._index[var] = len(self._nodes)
        self._nodes.append(node)

    def _operands(self, exprs) -> tuple:
        found = []
        for expr in exprs:
            if isinstance(expr, relax.Var):
                if expr in self._index:
                    found.append(self._index[expr])  # else a parameter: no call
            elif isinstance(expr, relax.Tuple):
                found += self._operands(expr.fields)
            elif isinstance(expr, relax.Call):
                self._exact = False  # a call nested in a call: not in normal form, not read
        return tuple(found)

    def longest_run(self, ops: frozenset | None) -> float:
        """The most calls to `ops` (None: any operator) nested each in the next's operands."""
        if not self._exact or ops is None:
            return float("inf")
        if ops not in self._runs:
            runs = []
            for name, operands in self._nodes:
                below = max((runs[i] for i in operands), default=0)
                runs.append(below + 1 if name in ops else below if name is None else 0)
            self._runs[ops] = max(runs, default=0)
        return self._runs[ops]


def ops_in(mod: tvm.IRModule) -> frozenset:
    """The names of the operators the module's Relax functions call."""
    return ModuleCalls(mod).ops


def can_match(pattern, calls: ModuleCalls) -> bool:
    """False when no match of `pattern` can be in the module `calls` reads."""
    shape = pattern_shape(pattern)
    return shape.required <= calls.ops and shape.depth <= calls.longest_run(shape.ops)


class PatternShape(typing.NamedTuple):
    """What every match of a pattern holds: `required`, the operators each match calls; `depth`,
    the calls nested each in the next's operands (a conv2d, its bias add and a relu: 3); `ops`,
    the operators any of its calls may be (None: a call to anything)."""

    required: frozenset
    depth: int
    ops: frozenset | None


def required_ops(pattern) -> frozenset:
    """The operators every match of `pattern` (a dataflow pattern) calls."""
    return pattern_shape(pattern).required


def pattern_shape(pattern) -> PatternShape:
    """The PatternShape of `pattern`. An alternative needs what both sides need and nests as
    little as the shallower; a call, its operator, what its arguments need, one level above the
    deepest; anything else (a wildcard, a constant, a negation) nothing. Sub-patterns are shared
    (a fabric chain's eight links each take the alternatives below them): each is read once.
    The patterns are built once a process (kernels.pattern_table), so the answer is kept with
    the pattern it is for (8 ms a compile)."""
    key = pattern.__chandle__()
    known = _SHAPES.get(key)
    if known is None or not known[0].same_as(pattern):
        if len(_SHAPES) >= 4096:
            _SHAPES.clear()
        known = _SHAPES[key] = (pattern, _shape(pattern, {}))  # held, so no other pattern gets its address
    return known[1]


_SHAPES: dict = {}  # pattern's address -> (the pattern, its PatternShape)
_NOTHING = PatternShape(frozenset(), 0, frozenset())


def _shape(pattern, seen: dict) -> PatternShape:
    key = pattern.__chandle__()
    if key not in seen:
        seen[key] = _shape_here(pattern, seen)
    return seen[key]


def _shape_here(pattern, seen: dict) -> PatternShape:
    if isinstance(pattern, dpl.OrPattern):
        left, right = _shape(pattern.left, seen), _shape(pattern.right, seen)
        return PatternShape(left.required & right.required, min(left.depth, right.depth), _union(left.ops, right.ops))
    if isinstance(pattern, dpl.AndPattern):
        left, right = _shape(pattern.left, seen), _shape(pattern.right, seen)
        return PatternShape(left.required | right.required, max(left.depth, right.depth), _union(left.ops, right.ops))
    if isinstance(pattern, dpl.CallPattern):
        op = pattern.op
        called = frozenset([op.expr.name]) if isinstance(op, dpl.ExprPattern) and isinstance(op.expr, tvm.ir.Op) else None
        args = _combined([_shape(arg, seen) for arg in pattern.args or []])
        return PatternShape(args.required | (called or frozenset()), args.depth + 1, _union(args.ops, called))
    if isinstance(pattern, (dpl.AttrPattern, dpl.TypePattern, dpl.DataTypePattern, dpl.ShapePattern)):
        return _shape(pattern.pattern, seen)
    if isinstance(pattern, dpl.TupleGetItemPattern):
        return _shape(pattern.tuple, seen)
    if isinstance(pattern, (dpl.TuplePattern, dpl.UnorderedTuplePattern)):
        return _combined([_shape(field, seen) for field in pattern.fields or []])
    return _NOTHING


def _combined(shapes: list) -> PatternShape:
    """Operands matched together: what each needs, the deepest of them."""
    ops = frozenset()
    for shape in shapes:
        ops = _union(ops, shape.ops)
    return PatternShape(frozenset().union(*(s.required for s in shapes)), max((s.depth for s in shapes), default=0), ops)


def _union(a, b):
    return None if a is None or b is None else a | b
