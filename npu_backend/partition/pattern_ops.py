"""Which fusion patterns can match a module at all.

Stage: partition (before FuseOpsByPattern). In: the op families' patterns and a Relax module.
Out: the patterns that can match it (`can_match`). FuseOpsByPattern walks the whole module and
rebuilds it for every pattern, one that cannot match included: about 1 ms a pattern on a
250-binding module before any matching. Three tests, cheapest first, leave such a pattern out:
- its operators: a match calls every operator of `required_ops(pattern)`, so those must be among
  the module's (`ModuleCalls.ops`). ShuffleNetV2's 151 patterns took 0.33 s, the 88 its
  operators allow 0.17 s, with the same result;
- its depth: a match is a nest of `pattern_shape(pattern).depth` calls, each an operand of the
  one above, all to the pattern's operators, so the module must hold such a run of calls
  (`ModuleCalls.longest_run`). An elementwise chain of eight ops (the fabric's deepest pattern)
  cannot match a SqueezeNet, whose longest run of elementwise calls is a bias add and a relu;
- a match: the pattern matched at each call to its root's operator, as FuseOpsByPattern matches
  it, but once for all patterns and without rebuilding anything (`ModuleCalls.has_match`; 2.5 us
  a try). Earlier patterns' fusions only take matches away from later ones, so a pattern that
  matches nowhere here matches nowhere there. Skipped for patterns whose alternatives multiply
  past MATCH_BRANCHES (the fabric's deeper chains: milliseconds a pattern to try).
The fused pairs' and blocks' patterns need a depthwise conv2d besides (`ModuleCalls.grouped_conv2d`).
"""

from __future__ import annotations

import math
import typing

import tvm
from tvm import relax
from tvm.relax import dpl


_HOLDS_CALLS = (relax.Call, relax.If, relax.SeqExpr, relax.Function)


def _grouped_conv2d(call) -> bool:
    return getattr(call.op, "name", "") == "relax.nn.conv2d" and int(call.attrs.groups) > 1


class ModuleCalls:
    """What the checks read of a module, from one walk of its Relax functions: the operators
    they call, whether a conv2d among them has groups > 1, and each binding's operands (a
    call's; a tuple's fields and an item's tuple pass through, as the matcher looks through
    them) for the longest run of calls to some operators; and the contents of its constants of
    at most `small` elements and of its vectors (`small_constants`, for the partition's plan:
    partition/plans.py)."""

    def __init__(self, mod: tvm.IRModule, small: int = 64):
        ops, self.grouped_conv2d = set(), False
        self._small, self._constants = small, []
        self._index = {}  # binding var -> position in _nodes
        self._nodes = []  # (operator name, or None for what passes its operands through; operand positions)
        self._exact = True  # False when a binding holds what the walk does not read (an If): no depth test
        self._calls = {}  # operator name -> [(call, its function's position in _functions)]
        self._functions = []  # [(function, its var -> value map, made on first use)]
        for func in mod.functions.values():
            if not isinstance(func, relax.Function):
                continue
            self._functions.append([func, None])
            for block in func.body.blocks if isinstance(func.body, relax.SeqExpr) else ():
                for binding in block.bindings:
                    self._add(binding.var, binding.value, ops)
            self._exact &= isinstance(func.body, relax.SeqExpr) and not isinstance(func.body.body, _HOLDS_CALLS)
        if not self._exact:  # calls the walk did not reach (in a branch, nested in a call): every expression
            ops, self.grouped_conv2d = self._every_call(mod)
        self.ops = frozenset(ops)
        self._runs = {}

    @property
    def small_constants(self) -> list[bytes] | None:
        """The small constants' dtypes, shapes and bytes, in the order of the walk; None when
        the walk did not reach every expression (an If, a call nested in a call)."""
        return self._constants if self._exact else None

    def _constant(self, const) -> None:
        tensor = const.value
        if not hasattr(tensor, "shape"):  # a dtype or a shape argument (memory.view's), not a tensor
            return
        # Vectors whole as well: a plain norm's check reads whether its gamma is all ones, and
        # a plan made for gamma = ones would leave out the weighted norm's pattern (its layer to
        # the host) for a model that differs only there. Vectors are few bytes next to weights.
        if math.prod(tensor.shape) <= self._small or len(tensor.shape) <= 1:
            self._constants.append(f"{tensor.dtype}{tensor.shape}".encode() + tensor.numpy().tobytes())

    @staticmethod
    def _every_call(mod) -> tuple:
        ops, grouped = set(), []

        def visit(expr):
            if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
                ops.add(expr.op.name)
                if _grouped_conv2d(expr):
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
                self._calls.setdefault(name, []).append((value, len(self._functions) - 1))
            self.grouped_conv2d |= _grouped_conv2d(value)
            node = (name, self._operands(value.args))
        elif isinstance(value, relax.Tuple):
            node = (None, self._operands(value.fields))
        elif isinstance(value, relax.TupleGetItem):
            node = (None, self._operands([value.tuple_value]))
        elif isinstance(value, relax.Var):
            node = (None, self._operands([value]))
        else:
            if isinstance(value, tvm.ir.GenericConst):
                self._constant(value)
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
            elif isinstance(expr, tvm.ir.GenericConst):
                self._constant(expr)
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


    def has_match(self, pattern, roots: frozenset) -> bool:
        """Whether `pattern` matches at a call to one of `roots`, operands looked up through
        their bindings as FuseOpsByPattern does."""
        if not self._exact:
            return True
        for root in roots:
            for call, position in self._calls.get(root, ()):
                function = self._functions[position]
                if function[1] is None:
                    function[1] = relax.analysis.get_var2val(function[0])
                if pattern.extract_matched_expr(call, function[1]) is not None:
                    return True
        return False


#: Most alternative-free patterns a pattern may stand for (its alternatives multiplied out) for
#: `can_match` to try it. A fabric chain of one link stands for 24, of two 576, of three 13,824;
#: trying the three-link one at each of ResNet-50's 119 adds and relus took 2.9 ms (the deeper
#: ones up to 7 ms), more than the walk it would save. The fused blocks stand for at most 36.
MATCH_BRANCHES = 64


def can_match(pattern, calls: ModuleCalls) -> bool:
    """False when no match of `pattern` can be in the module `calls` reads."""
    shape = pattern_shape(pattern)
    if not shape.required <= calls.ops or shape.depth > calls.longest_run(shape.ops):
        return False
    if shape.roots is None or not shape.plain or shape.branches > MATCH_BRANCHES:
        return True
    return calls.has_match(pattern, shape.roots)


class PatternShape(typing.NamedTuple):
    """What every match of a pattern holds: `required`, the operators each match calls; `depth`,
    the calls nested each in the next's operands (a conv2d, its bias add and a relu: 3); `ops`,
    the operators any of its calls may be (None: a call to anything); `roots`, those its root
    call may be (None: not known); `branches`, the alternative-free patterns it stands for;
    `plain`, whether it is made only of the kinds of pattern read here (calls, operators,
    alternatives, wildcards, constants, tuples, items and attribute / type tests), for which a
    match in a module holds in that module with some calls fused too."""

    required: frozenset
    depth: int
    ops: frozenset | None
    roots: frozenset | None = None
    branches: int = 1
    plain: bool = True


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
_LEAVES = (dpl.WildcardPattern, dpl.ConstantPattern)
_WRAPPERS = (dpl.AttrPattern, dpl.TypePattern, dpl.DataTypePattern, dpl.ShapePattern)


def _shape(pattern, seen: dict) -> PatternShape:
    key = pattern.__chandle__()
    if key not in seen:
        seen[key] = _shape_here(pattern, seen)
    return seen[key]


def _shape_here(pattern, seen: dict) -> PatternShape:
    if isinstance(pattern, (dpl.OrPattern, dpl.AndPattern)):
        left, right = _shape(pattern.left, seen), _shape(pattern.right, seen)
        either = isinstance(pattern, dpl.OrPattern)
        return PatternShape(
            left.required & right.required if either else left.required | right.required,
            min(left.depth, right.depth) if either else max(left.depth, right.depth),
            _union(left.ops, right.ops),
            roots=_union(left.roots, right.roots) if either else None,
            branches=left.branches + right.branches if either else left.branches * right.branches,
            plain=left.plain and right.plain)
    if isinstance(pattern, dpl.CallPattern):
        op = pattern.op
        called = frozenset([op.expr.name]) if isinstance(op, dpl.ExprPattern) and isinstance(op.expr, tvm.ir.Op) else None
        args = _combined([_shape(arg, seen) for arg in pattern.args or []])
        return PatternShape(args.required | (called or frozenset()), args.depth + 1, _union(args.ops, called),
                            roots=called, branches=args.branches, plain=args.plain and called is not None)
    if isinstance(pattern, _WRAPPERS):
        return _shape(pattern.pattern, seen)
    if isinstance(pattern, dpl.TupleGetItemPattern):
        return _shape(pattern.tuple, seen)._replace(roots=None)
    if isinstance(pattern, (dpl.TuplePattern, dpl.UnorderedTuplePattern)):
        fields = _combined([_shape(field, seen) for field in pattern.fields or []])
        return fields._replace(plain=fields.plain and isinstance(pattern, dpl.TuplePattern))
    return _NOTHING._replace(plain=isinstance(pattern, _LEAVES))


def _combined(shapes: list) -> PatternShape:
    """Operands matched together: what each needs, the deepest of them."""
    ops, branches = frozenset(), 1
    for shape in shapes:
        ops, branches = _union(ops, shape.ops), branches * shape.branches
    return PatternShape(frozenset().union(*(s.required for s in shapes)), max((s.depth for s in shapes), default=0),
                        ops, branches=branches, plain=all(s.plain for s in shapes))


def _union(a, b):
    return None if a is None or b is None else a | b
