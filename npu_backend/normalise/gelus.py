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

A bfloat16 / float16 model's chain (`.to(torch.bfloat16)`: every PyTorch op rounds its result
to h; half_powers.py and half_casts.py have written its power and tanh as float32 between casts)
is expanded the same way with its casts between h and float32 read as the identity and its
constants within 2 u of GELU's (u = 2^-8 for bfloat16, 2^-11 for float16: the importer rounds
each scalar to h, a coefficient is a product of two). It becomes `astype(gelu_tanh(astype(x,
float32)), h)`: GELU in float32 with its true constants (PyTorch's scalars are float32 in its
bfloat16 arithmetic), rounded once, where PyTorch rounds after each of its eight ops. Not bit-exact
to PyTorch, then: `half_gelu_bound` states the bound, |NPU - PyTorch| <= 2 u |x| + the smallest
subnormal of h, which tests/test_gelu_half.py checks for every finite bfloat16 and float16 x
against PyTorch's per-op rounding (modelled with ml_dtypes, the model checked bit-exact against
PyTorch itself: its bfloat16 pow(x, 3) rounds x * x, then the product) and on the NPU on every
preset.

Why: tanh and power had no NPU kernel, so GPT-2's MLP crossed to the host and back, and the
host's tanh is the GELU-tanh op the NPU has. A bfloat16 GPT-2 ran its GELU as twelve elementwise
kernels per layer (tanh, six multiplies, adds, four casts): now the up projection's epilogue.
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
HALF_FLOATS = ("bfloat16", "float16")
#: A 16-bit float chain's tolerance: 2 u, its constants rounded to h (a coefficient: two of them).
_HALF_TOLERANCE = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}
#: h -> (2 u, the smallest subnormal): half_gelu_bound's terms.
_HALF_BOUND = {"bfloat16": (2.0 ** -7, 2.0 ** -133), "float16": (2.0 ** -10, 2.0 ** -24)}
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
                and dtype_of(call) in ("float32", *HALF_FLOATS)):
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
        tolerance = _HALF_TOLERANCE.get(dtype_of(leaf), _TOLERANCE)
        if _close(whole, _GELU, tolerance) and \
                _close(expansion.argument, {(power, 0): c for power, c in argument.items()}, tolerance):
            return op(leaf) if dtype_of(leaf) == "float32" else _in_float32(chain, op, leaf)
    return None


def half_gelu_bound(x, dtype: str):
    """The largest difference between the rewritten 16-bit GELU (float32, rounded once to `dtype`)
    and PyTorch's NewGELU run in `dtype` (each op rounded) at the values `x` (module doc)."""
    relative, tiny = _HALF_BOUND[dtype]
    return relative * abs(x) + tiny


def _in_float32(chain: Chain, op, leaf):
    """op(leaf) of a 16-bit float leaf as PyTorch's kernels compute one: in float32 of the leaf
    widened (exactly), rounded once to its dtype. A leaf that is a reshape is widened before it,
    so the cast meets the rounding that made it (a GEMM's rounded-and-widened store: half_bias.py)."""
    builder, dtype = chain.mutator.builder_, dtype_of(leaf)
    reshape = chain.call(leaf, "relax.reshape")
    if reshape is not None and dtype_of(reshape.args[0]) == dtype:
        wide = builder.emit(relax.op.astype(reshape.args[0], "float32"))
        wide = builder.emit(relax.op.reshape(wide, reshape.args[1]))
    else:
        wide = builder.emit(relax.op.astype(leaf, "float32"))
    return relax.op.astype(builder.emit(op(wide)), dtype)


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


def _close(poly: dict, expected: dict, tolerance: float = _TOLERANCE) -> bool:
    """Same terms (exact zeros dropped), each coefficient within `tolerance` relative."""
    terms = {key: c for key, c in poly.items() if c != 0}
    return terms.keys() == expected.keys() and \
        all(abs(terms[key] - c) <= tolerance * abs(c) for key, c in expected.items())


class _Expansion:
    """The value of an expression as a polynomial in `leaf` and t = f(p(leaf)), f tanh or erf,
    {(power of leaf, power of t): coefficient}; None where it is not one. A 16-bit float leaf's
    chain may compute in float32 between casts (module doc)."""

    def __init__(self, chain: Chain, leaf):
        self.chain, self.leaf = chain, leaf
        self.function, self.argument = None, None  # f's op name and p, once met
        self.nodes = 0
        half = dtype_of(leaf) in HALF_FLOATS
        self.dtypes = (dtype_of(leaf), "float32") if half else (dtype_of(leaf),)

    def poly(self, expr):
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            return None
        if isinstance(expr, relax.Var) and (expr.same_as(self.leaf) or self._is_leaf(expr)):
            return {(1, 0): 1.0}
        scalar = _scalar(self.chain, expr)
        if scalar is not None:
            return {(0, 0): scalar}
        call = self.chain.call(expr, *_ELEMENTWISE)
        if call is None or dtype_of(call) not in self.dtypes:
            return None
        return getattr(self, "_" + call.op.name.split(".")[-1])(call)

    def _is_leaf(self, expr) -> bool:
        """Whether a 16-bit chain's `expr` is its leaf widened: the same value through casts to
        float32 and reshapes (half_casts.py widens a linear's output before its reshape), in the
        leaf's shape."""
        if len(self.dtypes) == 1 or not _same_shape(expr, self.leaf):
            return False
        return self._core(expr).same_as(self._core(self.leaf))

    def _core(self, expr):
        """`expr` under its reshapes and casts between h and float32."""
        for _ in range(8):
            call = self.chain.call(expr, "relax.reshape", "relax.astype")
            if call is None or dtype_of(call.args[0]) not in self.dtypes:
                return expr
            expr = call.args[0]
        return expr

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
        divisor = _scalar(self.chain, call.args[1])
        numerator = self.poly(call.args[0])
        return None if numerator is None or not divisor else _scaled(numerator, 1.0 / divisor)

    def _negative(self, call):
        operand = self.poly(call.args[0])
        return None if operand is None else _scaled(operand, -1.0)

    def _astype(self, call):
        """A cast to the value's own dtype; in a 16-bit chain also one between h and float32 (the
        rounding PyTorch does per op, which the rewrite does once: module doc)."""
        source = dtype_of(call.args[0])
        if source == dtype_of(call):
            return self.poly(call.args[0])
        if source not in self.dtypes:
            return None
        return self.poly(call.args[0])

    def _power(self, call):
        exponent, base = _scalar(self.chain, call.args[1]), self.poly(call.args[0])
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


def _scalar(chain: Chain, expr) -> float | None:
    """Chain.scalar, also of a 16-bit float constant (ml_dtypes' bfloat16 is no numpy float kind)
    and of a constant cast (half_powers.py widens a bfloat16 power's exponent)."""
    cast = chain.call(expr, "relax.astype")
    expr = cast.args[0] if cast is not None and dtype_of(cast) in ("float32", *HALF_FLOATS) else expr
    array = chain.array(expr)
    if array is not None and array.size == 1 and str(array.dtype) in HALF_FLOATS:
        return float(array.astype("float32").reshape(()))
    return chain.scalar(expr)


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
