"""A hand-written GELU becomes `R.nn.gelu_tanh` (its tanh form) or `R.nn.gelu` (its erf form).

Stage: normalise (before partition, after fold_weights: constants arrive folded). In: a Relax
IRModule. Out: the same module in which each chain of elementwise operators computing

    x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))      -> gelu_tanh(x)
    x / 2 * (1 + erf(x / sqrt 2))                              -> gelu(x)

is that one operator, whatever order and grouping the model wrote it in: Hugging Face's NewGELU
(GPT-2, GPT-J, ALBERT: `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3))))`),
Bloom's `x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))`, and the like.

How: the chain's value is expanded symbolically as a polynomial in x and t = tanh(p(x)) (or
erf(p(x))) with float64 coefficients, through add, subtract, multiply, divide by a constant,
negative and small integer powers of scalar constants; it is a GELU when p(x) and the whole are
GELU's polynomials, every coefficient within 1e-6 relative of GELU's (float32 rounding of the
written constants: Bloom's 0.79788456 for sqrt(2 / pi) is 1e-9 off) and no other term. A chain
that computes anything else is left as it is.

Why: tanh and power had no NPU kernel, so GPT-2's MLP crossed to the host and back, and the
host's tanh is the GELU-tanh op the NPU has.
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import dtype_of, shape_dims
from .chain_match import Chain
from .rewrite import as_pass, rewrite_functions

_TOLERANCE = 1e-6
_MAX_NODES = 24  # a GELU is about ten operators; a longer chain is something else
_ROOT_OPS = {tvm.ir.Op.get(f"relax.{name}") for name in ("multiply", "add", "divide")}
_ELEMENTWISE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.negative", "relax.power",
                "relax.tanh", "relax.erf", "relax.astype")
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)

#: function -> (its argument p(x), the whole as {(power of x, power of t): coefficient}, the op)
_FORMS = {
    "relax.tanh": ({1: _SQRT_2_OVER_PI, 3: _SQRT_2_OVER_PI * 0.044715}, relax.op.nn.gelu_tanh),
    "relax.erf": ({1: 1 / math.sqrt(2)}, relax.op.nn.gelu),
}
_GELU = {(1, 0): 0.5, (1, 1): 0.5}


def gelus_as_ops(mod: tvm.IRModule) -> tvm.IRModule:
    """Every hand-written GELU of `mod` as one op (the chain removed if nothing else reads it)."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _GeluRewriter))


gelus_pass = as_pass(gelus_as_ops, "cgra.GelusAsOps", ops=("relax.tanh", "relax.erf"))


@relax.expr_functor.mutator
class _GeluRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and any(call.op.same_as(op) for op in _ROOT_OPS)
                and dtype_of(call) in ("float32", "float16")):
            return call
        gelu = _as_gelu(Chain(self), call)
        return with_span(gelu, call.span) if gelu is not None else call


def _as_gelu(chain: Chain, call):
    """The GELU op `call` computes of one of the variables it is made from, else None."""
    candidates = _candidates(chain, call)
    if not any(chain.call(var, *_FORMS) is not None for var in candidates):
        return None  # no tanh or erf in reach: nothing to expand
    for leaf in candidates:
        if not _same_shape(leaf, call) or dtype_of(leaf) != dtype_of(call):
            continue
        expansion = _Expansion(chain, leaf)
        whole = expansion.poly(call)
        if whole is None or expansion.function is None:
            continue
        argument, op = _FORMS[expansion.function]
        if _close(whole, _GELU) and _close(expansion.argument, {(power, 0): c for power, c in argument.items()}):
            return op(leaf)
    return None


def _same_shape(a, b) -> bool:
    """Whether `a` and `b` have one shape (symbolic dimensions the same expression)."""
    dims_a, dims_b = shape_dims(a), shape_dims(b)
    return dims_a is not None and dims_b is not None and len(dims_a) == len(dims_b) and \
        all(x == y if isinstance(x, int) or isinstance(y, int) else tvm_ffi.structural_equal(x, y)
            for x, y in zip(dims_a, dims_b))


def _candidates(chain: Chain, call) -> list:
    """The variables the chain ending at `call` reads, nearest first (x is one of them)."""
    seen, queue, found = set(), list(call.args), []
    while queue and len(seen) < _MAX_NODES:
        expr = queue.pop(0)
        if not isinstance(expr, relax.Var) or expr in seen:
            continue
        seen.add(expr)
        found.append(expr)
        value = chain.call(expr, *_ELEMENTWISE)
        if value is not None:
            queue += list(value.args)
    return found


def _close(poly: dict, expected: dict) -> bool:
    """Same terms (exact zeros dropped), each coefficient within _TOLERANCE relative."""
    terms = {key: c for key, c in poly.items() if c != 0}
    return terms.keys() == expected.keys() and \
        all(abs(terms[key] - c) <= _TOLERANCE * abs(c) for key, c in expected.items())


class _Expansion:
    """The value of an expression as a polynomial in `leaf` and t = f(p(leaf)), f tanh or erf,
    {(power of leaf, power of t): coefficient}; None where it is not one."""

    def __init__(self, chain: Chain, leaf):
        self.chain, self.leaf = chain, leaf
        self.function, self.argument = None, None  # f's op name and p, once met
        self.nodes = 0

    def poly(self, expr):
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            return None
        if isinstance(expr, relax.Var) and expr.same_as(self.leaf):
            return {(1, 0): 1.0}
        scalar = self.chain.scalar(expr)
        if scalar is not None:
            return {(0, 0): scalar}
        call = self.chain.call(expr, *_ELEMENTWISE)
        if call is None or dtype_of(call) != dtype_of(self.leaf):
            return None
        return getattr(self, "_" + call.op.name.split(".")[-1])(call)

    def _operands(self, call):
        polys = [self.poly(arg) for arg in call.args[:2]]
        return None if any(p is None for p in polys) else polys

    def _add(self, call):
        polys = self._operands(call)
        return None if polys is None else _sum(polys[0], polys[1])

    def _subtract(self, call):
        polys = self._operands(call)
        return None if polys is None else _sum(polys[0], _scaled(polys[1], -1.0))

    def _multiply(self, call):
        polys = self._operands(call)
        return None if polys is None else _product(polys[0], polys[1])

    def _divide(self, call):
        divisor = self.chain.scalar(call.args[1])
        numerator = self.poly(call.args[0])
        return None if numerator is None or not divisor else _scaled(numerator, 1.0 / divisor)

    def _negative(self, call):
        operand = self.poly(call.args[0])
        return None if operand is None else _scaled(operand, -1.0)

    def _astype(self, call):  # a cast to the value's own dtype (the caller checked the dtype)
        return self.poly(call.args[0]) if dtype_of(call.args[0]) == dtype_of(call) else None

    def _power(self, call):
        exponent, base = self.chain.scalar(call.args[1]), self.poly(call.args[0])
        if base is None or exponent not in (1.0, 2.0, 3.0, 4.0):
            return None
        result = {(0, 0): 1.0}
        for _ in range(int(exponent)):
            result = _product(result, base)
        return result

    def _tanh(self, call):
        return self._function(call)

    def _erf(self, call):
        return self._function(call)

    def _function(self, call):
        """t itself: the chain's one tanh (or erf), of a polynomial in x alone."""
        argument = self.poly(call.args[0])
        if argument is None or any(t for _, t in argument) or self.function is not None:
            return None
        self.function, self.argument = call.op.name, argument
        return {(0, 1): 1.0}


def _sum(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, c in b.items():
        out[key] = out.get(key, 0.0) + c
    return out


def _scaled(a: dict, factor: float) -> dict:
    return {key: c * factor for key, c in a.items()}


def _product(a: dict, b: dict) -> dict:
    out = {}
    for (xa, ta), ca in a.items():
        for (xb, tb), cb in b.items():
            key = (xa + xb, ta + tb)
            out[key] = out.get(key, 0.0) + ca * cb
    return out
