"""The logistic sigmoid as FABRIC bodies: exp and a reciprocal from adds, multiplies, max and min.

Stage: shared by the compiler (npu_backend/kernels/elementwise/sigmoid.py, which runs these bodies one after
the other over a scratchpad tile) and the tests. No tvm.

The fabric has no exp, divider or lookup table, and a FABRIC record holds 16 nodes; sigmoid takes
three passes over the tile, each a body the mapper maps like any other (float32):

    EXP_BASE    x -> q = P(c), c = min(|x|, 104): P is a degree-6 polynomial (Horner) of
                exp(-c / 128), fitted for relative error on [0, 104] (below 1e-10).
    SQUARE      q -> e = q^128 = exp(-|x|), seven squarings (past |x| = 104, exp(-|x|) is below
                float32's smallest denormal, and e is 0 or the smallest ones).
    LOGISTIC    (x, e) -> r * m: r = 1 / (1 + e) by a quadratic guess in e (relative error
                below 2%) and two Newton steps r (2 - (1 + e) r) (below 1e-8); m = min(max(x *
                2^100, e), 1) is 1 for x > 0 and e for x <= 0 (x * 2^100 is >= 1 or <= 0 but for
                |x| < 2^-100, where e rounds to 1 anyway). So sigmoid(x) = 1 / (1 + e) for x > 0
                and e / (1 + e) for x <= 0, never 1 - r, which would lose the small values.

The squarings multiply P's rounding by 128: against float64, the result is within 3.1e-5
relative wherever it is a normal float32 (the worst near x = -85), 1.3e-5 for |x| < 30, 1e-5 for
|x| < 10 and 3.2e-6 for x > 0 (float32's own sigmoid: 2e-7). `sigmoid` below is the numpy model
of this arithmetic (each body's meaning, body.evaluate, which the functional core computes); the
kernels' results are bit-exact to it.

SiLU is x * sigmoid(x) (the vector unit's ELTWISE multiplies); GELU's tanh form is
x * sigmoid(z), z = x (1.5957691 + 0.0713548 x^2) = 2 sqrt(2 / pi) (x + 0.044715 x^3), one more
body before EXP_BASE (z has x's sign, so LOGISTIC reads x for it).

How the constants were fitted (numpy, float64, then rounded to float32): least squares of the
relative error on 4,000 Chebyshev points, of sum(b_i u^i) against exp(-104 u / 128) for u in [0, 1]
(coefficient i of c is b_i / 104^i), and of sum(d_i e^i) against 1 / (1 + e) for e in [0, 1].
"""

from __future__ import annotations

import numpy as np

from . import body as bodies

#: exp(-c / 128) ~ sum(EXP_COEFFICIENTS[i] * c^i) for c in [0, 104]
EXP_COEFFICIENTS = (1.0, -0.00781249487772584, 3.0516872357111424e-05, -7.943402380305997e-08,
                    1.5418151477764042e-10, -2.2791070788431844e-13, 2.0912932447798355e-16)
#: 1 / (1 + e) ~ sum(RECIPROCAL_GUESS[i] * e^i) for e in [0, 1]
RECIPROCAL_GUESS = (0.9881728291511536, -0.7976753115653992, 0.3136836290359497)
CLAMP = 104.0  # exp(-104) is below float32's smallest denormal
SQUARINGS = 7  # e = q^(2^7)
SIGN_SCALE = 2.0 ** 100  # x * 2^100 is >= 1 for x > 2^-100
#: GELU's tanh form as x * sigmoid(x (GELU_LINEAR + GELU_CUBIC x^2)): 2 sqrt(2 / pi), times 0.044715
GELU_LINEAR, GELU_CUBIC = 1.5957691, 0.0713548


def _horner(coefficients, variable: str, first: int) -> list[tuple]:
    """Nodes evaluating sum(coefficients[i] * variable^i), the first named n<first>."""
    top = len(coefficients) - 1
    nodes = [("mul", variable, coefficients[top]), ("add", f"n{first}", coefficients[top - 1])]
    for coefficient in reversed(coefficients[:top - 1]):
        last = f"n{first + len(nodes) - 1}"
        nodes += [("mul", last, variable), ("add", f"n{first + len(nodes)}", coefficient)]
    return nodes


def exp_base() -> tuple:
    """x -> P(min(|x|, 104)) ~ exp(-|x| / 128)."""
    nodes = [("mul", "a", -1.0), ("max", "a", "n0"), ("min", "n1", CLAMP)]
    return tuple(nodes + _horner(EXP_COEFFICIENTS, "n2", 3))


def square() -> tuple:
    """q -> q^128."""
    return (("mul", "a", "a"),) + tuple(("mul", f"n{i}", f"n{i}") for i in range(SQUARINGS - 1))


def reciprocal_of_one_plus_b() -> list[tuple]:
    """Nodes whose last is r = 1 / (1 + e) for the body's input b = e in [0, 1]: a quadratic guess
    and two Newton steps r = r (2 - (1 + e) r) (n1 = -(1 + e)); the logistic passes' first 12."""
    nodes = [("mul", "b", -1.0), ("add", "n0", -1.0)]  # n1 = -(1 + e)
    nodes += [("mul", "b", RECIPROCAL_GUESS[2]), ("add", "n2", RECIPROCAL_GUESS[1]), ("mul", "n3", "b"),
              ("add", "n4", RECIPROCAL_GUESS[0])]  # n5 = r0
    for _ in range(2):
        r = f"n{len(nodes) - 1}"
        nodes += [("mul", "n1", r), ("add", f"n{len(nodes)}", 2.0), ("mul", r, f"n{len(nodes) + 1}")]
    return nodes


def logistic() -> tuple:
    """(x, e = exp(-|x|)) -> sigmoid(x)."""
    nodes = reciprocal_of_one_plus_b()
    r = f"n{len(nodes) - 1}"
    nodes += [("mul", "a", SIGN_SCALE), ("max", f"n{len(nodes)}", "b"), ("min", f"n{len(nodes) + 1}", 1.0)]
    return tuple(nodes + [("mul", r, f"n{len(nodes) - 1}")])


def gelu_argument() -> tuple:
    """x -> z = x (GELU_LINEAR + GELU_CUBIC x^2): GELU's tanh form is x * sigmoid(z)."""
    return (("mul", "a", "a"), ("mul", "n0", GELU_CUBIC), ("add", "n1", GELU_LINEAR), ("mul", "n2", "a"))


def passes(kind: str) -> tuple:
    """The bodies a `kind` ("sigmoid", "silu", "gelu_tanh") runs in turn over a tile: the first
    reads x, the next ones the previous result, the last (LOGISTIC) x and e. SiLU and GELU then
    multiply by x (an ELTWISE)."""
    first = (gelu_argument(),) if kind == "gelu_tanh" else ()
    return first + (exp_base(), square(), logistic())


def sigmoid(x: np.ndarray, argument: np.ndarray | None = None) -> np.ndarray:
    """The fabric's sigmoid of `argument` (default x) in float32, pass by pass; the sign is
    read from x (the same as the argument's where the argument is x * a positive factor)."""
    x = np.asarray(x, "float32")
    argument = x if argument is None else argument
    e = bodies.evaluate(square(), "float32", bodies.evaluate(exp_base(), "float32", argument))
    return bodies.evaluate(logistic(), "float32", x, e)


def silu(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, "float32")
    return x * sigmoid(x)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, "float32")
    return x * sigmoid(x, bodies.evaluate(gelu_argument(), "float32", x))
