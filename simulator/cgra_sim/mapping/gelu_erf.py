"""GELU's erf form, x Phi(x), as FABRIC bodies: a polynomial argument, the fabric's exp, a logistic.

Stage: shared by the compiler (npu_backend/kernels/gemm/fabric_gelu.py, which runs these passes
over a share of a GEMM + GELU kernel's rows on the PE array while the function unit takes the
rest) and the tests. No tvm.

Phi(x) = sigmoid(y(x)) with y = logit(Phi(x)) = x R(x^2), R smooth in u = x^2 (R(0) = 4 /
sqrt(2 pi): GELU's tanh form is R's first two terms). Six passes over the tile:

    HIGH      (float32, reads x) u = min(x^2, 25); q = R's top coefficients c12..c5 by Horner in u.
    LOW       (float32, reads x and q) R = q u^5 + c4 u^4 + ... + c0 (Horner, continued), z = -|x| R
              = -|y| (R > 0 on [0, 25]).
    ROUND, POLYNOMIAL, SCALE   exp.py's three passes: e = exp(z) = exp(-|y|), within 2.3 ulps.
    LOGISTIC  (float32, reads x and e) r = 1 / (1 + e) (sigmoid.py's guess and two Newton steps),
              out = r max(x, min(x, 0) e): x r = x Phi(x) for x > 0 (Phi = 1 / (1 + e)), and x e r =
              x Phi(x) for x <= 0 (Phi = e / (1 + e)), never 1 - r; min(x, 0) keeps x = +inf's
              product out of 0 inf (x = +inf gives +inf, -inf gives NaN: -inf * 0, as PyTorch's
              x * 0.5 * (1 + erf(x / sqrt 2)) does).

A design with one polynomial pass (degree 6 in u, a FABRIC record's 16 nodes) is 1e-4 off in y
(Phi's relative error): logit(Phi(x)) / x grows like |x| / 2, which low degrees in u follow
badly. Degree 12 split over two passes fits y within 2.7e-8 on x in [-5, 5].

Bound (measured against float64's x Phi(x) = x erfc(-x / sqrt 2) / 2, math.erfc, on 600 k points
of [-12, 12] and normal samples; tests/test_fabric_gelu.py): within 4.6 ulps (4.4e-7 relative) for
x >= -1, 8.2 ulps (5.4e-7) for x >= -2, 23 ulps (1.5e-6) for x >= -4 (y's own rounding grows with
|y| = 10 there, and Horner's terms cancel), 1.7e-5 relative for x in [-5, -4) (|GELU| <
1.3e-4 there: 1.9e-10 absolute); below -5, where u is clamped and Phi(x) < 2.9e-7, within
3.2e-7 absolute (6e-8 |x|), decaying to 0. Absolute: |error| <= 2.2e-7 max(|x|, 1e-30) on the
whole line. The function unit's GELU is within 7 ulps; a model's PyTorch match is 1e-5 relative
to its largest output. NaN in, NaN out. `gelu` below is the numpy model of the passes (body.evaluate,
which the functional core computes); the kernels' results are bit-exact to it.

How the constants were fitted (numpy, float64, then rounded to float32): Lawson's iteration
(weighted least squares converging on minimax) of |x| (R_fit(u) - R(u)) = y's error, R from
math.erfc in float64, on 8,000 Chebyshev points of u in [0, 25], in the Chebyshev basis, then
expanded to monomials in u.
"""

from __future__ import annotations

import numpy as np

from . import body as bodies
from . import exp as fabric_exp
from .sigmoid import reciprocal_of_one_plus_b

#: R(u) ~ sum(COEFFICIENTS[i] u^i), u = x^2 in [0, 25]
COEFFICIENTS = (1.5957692861557007, 0.07267086207866669, -7.37793161533773e-05, -0.00010419807222206146,
                5.536543994821841e-06, 2.323172196838641e-07, -5.782884215932427e-08, 4.715210888406318e-09,
                -2.33685876205314e-10, 7.614958143220552e-12, -1.602365565537764e-13, 1.982688559637241e-15,
                -1.0982991499207556e-17)
U_CLAMP = 25.0  # u = min(x^2, 25): |x| <= 5
SPLIT = 5  # LOW evaluates c0..c4, HIGH c5..c12


def high() -> tuple:
    """x -> q = sum(c_i u^(i - SPLIT), i >= SPLIT), u = min(x^2, U_CLAMP) (16 nodes)."""
    top = COEFFICIENTS[SPLIT:]
    nodes = [("mul", "a", "a"), ("min", "n0", U_CLAMP), ("mul", "n1", top[-1]), ("add", "n2", top[-2])]
    for coefficient in reversed(top[:-2]):
        nodes += [("mul", f"n{len(nodes) - 1}", "n1"), ("add", f"n{len(nodes)}", coefficient)]
    return tuple(nodes)


def low() -> tuple:
    """(x, q) -> z = -|x| R(u) = -|y| (15 nodes)."""
    nodes = [("mul", "a", "a"), ("min", "n0", U_CLAMP)]
    for coefficient in reversed(COEFFICIENTS[:SPLIT]):
        last = "b" if len(nodes) == 2 else f"n{len(nodes) - 1}"
        nodes += [("mul", last, "n1"), ("add", f"n{len(nodes)}", coefficient)]
    r = f"n{len(nodes) - 1}"
    nodes += [("mul", "a", -1.0), ("min", "a", f"n{len(nodes)}"), ("mul", f"n{len(nodes) + 1}", r)]
    return tuple(nodes)


def logistic() -> tuple:
    """(x, e = exp(-|y|)) -> x Phi(x) = r max(x, min(x, 0) e), r = 1 / (1 + e) (16 nodes)."""
    nodes = reciprocal_of_one_plus_b()  # r = 1 / (1 + e), as sigmoid.py's logistic
    r = f"n{len(nodes) - 1}"
    nodes += [("min", "a", 0.0), ("mul", f"n{len(nodes)}", "b"), ("max", "a", f"n{len(nodes) + 1}")]
    return tuple(nodes + [("mul", r, f"n{len(nodes) - 1}")])


def bias_add() -> tuple:
    """(acc, bias) -> acc + bias: a GEMM epilogue's sum for the share's rows (kernels/gemm/fabric_gelu.py;
    the bias row streamed as B with row stride 0), one float32 add, as the EPILOGUE's."""
    return (("add", "a", "b"),)


def passes() -> tuple:
    """The six (body, dtype) in turn (module doc): HIGH reads x; LOW x and q; ROUND z;
    POLYNOMIAL z and t; SCALE t and p (int32 bits); LOGISTIC x and e."""
    return ((high(), "float32"), (low(), "float32")) + tuple(fabric_exp.passes()) + ((logistic(), "float32"),)


def gelu(x: np.ndarray) -> np.ndarray:
    """The fabric's x Phi(x) in float32, pass by pass (body.evaluate: what the chip computes)."""
    x = np.asarray(x, "float32")
    z = bodies.evaluate(low(), "float32", x, bodies.evaluate(high(), "float32", x))
    return bodies.evaluate(logistic(), "float32", x, fabric_exp.exp(z))
