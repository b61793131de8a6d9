"""Guards of scratchpad copies: which in-bounds tests of the host tensor a copy's guard makes.

Stage: lowering, used by the DMA pass (dma.py). Input: the guard of a copy (a conjunction), the
host indices it reads or writes, the host tensor's shape and the ranges of the enclosing loops.
Output: the dims whose lower / upper bound the guard tests; any conjunct that is not such a test
raises `UnsupportedCopy`, because the DMA halo (zero fill on load, drop on store) computes exactly
"index inside the tensor" and nothing else.

A conjunct is accepted when, on the loops' ranges, it is equivalent to `index_d >= 0` or
`index_d < extent_d`. Three ways to know, cheapest first: its form matches (the expression differs
from index d by a constant); the arithmetic analyzer proves both implications; or, for the forms
TE's simplifier leaves behind (a dilated conv's `ox + 2 * rx >= 2` becomes `ox // 2 + rx >= 1`),
both sides agree at every point of the loop variables they use, when there are few enough points
to enumerate. Nothing is taken on trust.
"""

from __future__ import annotations

import numpy as np
from tvm import sym, tirx

from ..errors import UnsupportedCopy

#: Most points of the loop variables' ranges the exhaustive check evaluates.
MAX_ENUMERATED_POINTS = 1 << 16


def guarded_dims(guard, indices, shape, tensor: str, analyzer, domains):
    """(dims with a lower-bound test, dims with an upper-bound test) of `guard`."""
    guarded_lo, guarded_hi = set(), set()
    conjuncts = _conjuncts(guard)
    for conjunct in conjuncts:
        if proves(analyzer, conjunct):
            continue  # always true on the loops' ranges (e.g. "p % 6 < 6", however it is written)
        tested = _matched_bound(conjunct, indices, shape, analyzer) or \
            _equivalent_bound(conjunct, indices, shape, analyzer, domains)
        if tested is None and _implied(conjunct, conjuncts, analyzer):
            continue  # a looser bound beside a tighter one (a tile buffer's extent beside the tensor's)
        if tested is None:
            raise UnsupportedCopy(f"the guard '{conjunct}' of a copy of '{tensor}' is not an "
                                  f"in-bounds test of its indices {list(indices)}: the DMA halo "
                                  "cannot express it")
        side, dim = tested
        (guarded_lo if side == "lo" else guarded_hi).add(dim)
    return guarded_lo, guarded_hi


def proves(analyzer, cond) -> bool:
    """Whether `cond` holds on the loops' ranges: by the analyzer, with symbolic loop extents
    (a tile loop over ceildiv(n, 32) tiles) as bounds too, and a disjunction when one side does."""
    if isinstance(cond, tirx.Or):
        return proves(analyzer, cond.a) or proves(analyzer, cond.b)
    return analyzer.can_prove(cond) or analyzer.can_prove(cond, sym.ProofStrength.SYMBOLIC_BOUND)


def _matched_bound(conjunct, indices, shape, analyzer):
    """('lo' | 'hi', dim) when the conjunct has the form of a bound test of dim, else None."""
    normalised = _normalise(conjunct)
    if normalised is None:
        return None
    side, expr, limit = normalised
    for dim, index in enumerate(indices):
        delta = analyzer.simplify(expr - index)
        if not isinstance(delta, tirx.IntImm):
            continue
        bound = analyzer.simplify(limit - delta)
        if side == "lo" and _equals(bound, 0):
            return "lo", dim
        if side == "hi" and (_equals(bound, shape[dim]) if isinstance(shape[dim], int)
                             else analyzer.can_prove_equal(bound, shape[dim])):
            return "hi", dim
    return None


def _equivalent_bound(conjunct, indices, shape, analyzer, domains):
    """('lo' | 'hi', dim) when the conjunct is equivalent to a bound test of dim, else None."""
    for dim, index in enumerate(indices):
        for side, test in (("lo", index >= 0), ("hi", index < shape[dim])):
            if _equivalent(conjunct, test, analyzer, domains):
                return side, dim
    return None


def _equivalent(a, b, analyzer, domains) -> bool:
    """a <=> b on the loops' ranges: proved by the analyzer, or checked at every point."""
    if analyzer.can_prove(tirx.Or(tirx.Not(a), b)) and analyzer.can_prove(tirx.Or(tirx.Not(b), a)):
        return True
    points = _grid(_free_vars(a) | _free_vars(b), domains)
    if points is None:
        return False
    return bool(np.array_equal(_evaluate(a, points), _evaluate(b, points)))


def _grid(variables, domains):
    """Every point of `variables` over their constant ranges (name -> array), or None when a
    range is unknown or symbolic, or there are more than MAX_ENUMERATED_POINTS."""
    by_name = {var.name: rng for var, rng in domains.items()}
    axes = []
    for name in sorted(variables):
        rng = by_name.get(name)
        if rng is None or not isinstance(rng.min, tirx.IntImm) or not isinstance(rng.extent, tirx.IntImm):
            return None
        axes.append(np.arange(int(rng.min), int(rng.min) + int(rng.extent), dtype=np.int64))
    if np.prod([len(axis) for axis in axes], dtype=np.float64) > MAX_ENUMERATED_POINTS:
        return None
    mesh = np.meshgrid(*axes, indexing="ij") if axes else []
    return {name: values.ravel() for name, values in zip(sorted(variables), mesh)}


def _free_vars(expr) -> set:
    found = set()

    def visit(node):
        if isinstance(node, tirx.Var):
            found.add(node.name)
        for child in _children(node):
            visit(child)
    visit(expr)
    return found


def _children(node):
    if isinstance(node, (tirx.Not, tirx.Cast)):
        return [node.a if isinstance(node, tirx.Not) else node.value]
    if hasattr(node, "a") and hasattr(node, "b"):
        return [node.a, node.b]
    return []


#: TIR node -> numpy on integer arrays (floor division and modulo, as TIR's floordiv/floormod).
_BINARY = {
    tirx.Add: np.add, tirx.Sub: np.subtract, tirx.Mul: np.multiply,
    tirx.FloorDiv: np.floor_divide, tirx.FloorMod: np.mod, tirx.Min: np.minimum,
    tirx.Max: np.maximum, tirx.LT: np.less, tirx.LE: np.less_equal, tirx.GT: np.greater,
    tirx.GE: np.greater_equal, tirx.EQ: np.equal, tirx.NE: np.not_equal,
    tirx.And: np.logical_and, tirx.Or: np.logical_or,
}


def _evaluate(expr, points):
    """The value of an integer / boolean TIR expression at every point."""
    if isinstance(expr, tirx.IntImm):
        return np.int64(expr.value)
    if isinstance(expr, tirx.Var):
        return points[expr.name]
    if isinstance(expr, tirx.Cast):
        return _evaluate(expr.value, points)
    if isinstance(expr, tirx.Not):
        return np.logical_not(_evaluate(expr.a, points))
    apply = _BINARY.get(type(expr))
    if apply is None:
        raise UnsupportedCopy(f"the guard term '{expr}' ({type(expr).__name__}) cannot be checked")
    return apply(_evaluate(expr.a, points), _evaluate(expr.b, points))


def _conjuncts(cond):
    if cond is None:
        return []
    if isinstance(cond, tirx.And):
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    return [cond]


def _implied(conjunct, conjuncts, analyzer) -> bool:
    """Whether another of `conjuncts` bounds the same expression at least as tightly, so that
    `conjunct` adds nothing: e < a beside e < b with b <= a (or a <= e beside b <= e, a <= b)."""
    mine = _normalise(conjunct)
    if mine is None:
        return False
    side, expr, limit = mine
    for other in conjuncts:
        theirs = _normalise(other) if other is not conjunct else None
        if theirs is None or theirs[0] != side or not _same(theirs[1], expr, analyzer):
            continue
        tighter = theirs[2] <= limit if side == "hi" else limit <= theirs[2]
        if proves(analyzer, tighter):
            return True
    return False


def _same(a, b, analyzer) -> bool:
    return _equals(analyzer.simplify(a - b), 0)


def _normalise(cond):
    """('lo', e, limit) for limit <= e, ('hi', e, limit) for e < limit; None if no comparison."""
    if isinstance(cond, tirx.LT):
        return "hi", cond.a, cond.b
    if isinstance(cond, tirx.LE):
        if isinstance(cond.a, tirx.IntImm):
            return "lo", cond.b, cond.a
        return "hi", cond.a, cond.b + 1
    if isinstance(cond, tirx.GE):
        return "lo", cond.a, cond.b
    if isinstance(cond, tirx.GT):
        if isinstance(cond.b, tirx.IntImm):
            return "lo", cond.a, cond.b + 1
        return "hi", cond.b, cond.a
    return None


def _equals(expr, value: int) -> bool:
    return isinstance(expr, tirx.IntImm) and expr.value == value
