"""exp(z) of float32 as three FABRIC bodies: a range reduction, a polynomial and exponent bits.

Stage: shared by the compiler (npu_backend/kernels/attention/fabric_exps.py, which runs these
bodies over a share of a softmax's rows on the PE array while the function unit takes the rest)
and the tests. No tvm.

The fabric has no exp, compare or select, and a FABRIC record holds 16 nodes of add, sub, mul,
max, min (float32) or shifts (int32). exp(z) = 2^n exp(r), n = round(z log2(e)), r = z - n ln2:

    ROUND       (float32, reads z) t = max(z, -104) log2(e) + 1.5 x 2^23: adding 1.5 x 2^23 rounds
                to an integer, so t = 1.5 x 2^23 + n exactly and n sits in t's low mantissa bits.
    POLYNOMIAL  (float32, reads z and t) n = t - 1.5 x 2^23 (exact), r = max(z, -104) - n LN2_HI
                - n LN2_LO (LN2_HI has 9 significant bits: n LN2_HI is exact for |n| < 2^15),
                p = 1 + r (c1 + r (c2 + r (c3 + r (c4 + r c5)))) ~ exp(r) on |r| <= ln2 / 2 (p in
                [0.70, 1.42]: a positive normal float, its biased exponent 126 or 127).
    SCALE       (int32, reads t's and p's bits) max((bits(t) << 23) + bits(p), 0): bits(1.5 x 2^23)
                has nine low zero bits, so bits(t) << 23 is n << 23 (mod 2^32), added to p's
                exponent field. Where 2^n p is a normal float that is its bits. Past the bottom
                (n < -126 or so) the sum is negative as an int32 (n >= -150: no wrap), and the max
                makes it +0; where the exponent lands on 0 exactly the bits are a denormal below
                2^-126 (p's mantissa without its leading one).

So for z <= 0 (a softmax's z = s - max(s); larger z are outside the domain: n > 127 would
overflow the exponent field): within 2^-21 relative of float64's exp where exp(z) >= 2^-126 (z >=
-87.33; measured 1.85e-7, 2.3 ulps, on 2.9 M points of [-87.5, 0] and tests/test_fabric_exps.py),
within 2^-126 absolute below that, exactly +0 for z <= -88.03 and for z = -inf (a masked score),
exactly 1 for z = 0 (the row's maximum: c0 is 1). A NaN z gives NaN or +0 (a NaN with its sign
bit set reads as a negative int32): the kernel takes the fabric only where z cannot be NaN unless
its whole row is (a plain softmax: every exp of such a row then makes its sum 0 or NaN and the
row's output NaN, as the function unit's would).

A power-of-two `scale` (exp(scale z): rows.py's scale at the exp) folds in exactly: the clamp and
LN2's parts are divided by it and log2(e) and c_i multiplied (by scale^i), every intermediate of
POLYNOMIAL is then scale^-k times the unscaled one (k its place in the Horner steps), each rounding
the same: the bits of exp(fl(scale z)).

How the constants were fitted (numpy, float64, then rounded to float32): c0 fixed at 1, c1..c5 by
Lawson's iteration (weighted least squares converging on minimax) of the relative error of
1 + sum(c_i r^i) against exp(r) on 4,000 Chebyshev points of [-ln2 / 2, ln2 / 2] (9.1e-8).
LN2_HI and LN2_LO are Cephes' split of ln 2.
"""

from __future__ import annotations

import math

import numpy as np

from . import body as bodies

LOG2E = 1.4426950408889634
SHIFTER = 12582912.0  # 1.5 x 2^23: t = z log2(e) + SHIFTER rounds to an integer in t's low bits
LN2_HI, LN2_LO = 0.693359375, -2.1219444005469057e-4  # ln 2 = LN2_HI + LN2_LO
COEFFICIENTS = (1.0, 0.9999997019767761, 0.4999915063381195, 0.1666763573884964, 0.04189793020486832,
                0.008290314115583897)  # exp(r) ~ sum(COEFFICIENTS[i] r^i), |r| <= ln2 / 2
CLAMP = -104.0  # exp(-104) = 6.8e-46: the sum in SCALE is negative there (+0); n >= -150 (no int32 wrap)
EXPONENT_SHIFT = 23  # float32's mantissa bits


def _scale_of(scale) -> float:
    s = 1.0 if scale is None else float(scale)
    if s <= 0 or math.frexp(s)[0] != 0.5:
        raise ValueError(f"the fabric's exp folds only a positive power-of-two scale, not {scale}")
    return s


def round_body(scale=None) -> tuple:
    """z -> t = max(z, CLAMP / scale) (scale log2(e)) + SHIFTER (float32)."""
    s = _scale_of(scale)
    return (("max", "a", CLAMP / s), ("mul", "n0", float(np.float32(LOG2E)) * s), ("add", "n1", SHIFTER))


def polynomial_body(scale=None) -> tuple:
    """(z, t) -> p = 1 + r (c1 + ... ) ~ exp(r), r = scale z - n ln2 (float32, 16 nodes)."""
    s = _scale_of(scale)
    nodes = [("sub", "b", SHIFTER), ("max", "a", CLAMP / s), ("mul", "n0", LN2_HI / s), ("sub", "n1", "n2"),
             ("mul", "n0", float(np.float32(LN2_LO)) / s), ("sub", "n3", "n4")]  # n5 = r / scale
    c = [float(np.float32(value)) * s ** i for i, value in enumerate(COEFFICIENTS)]
    nodes.append(("mul", "n5", c[5]))
    for i in (4, 3, 2, 1):
        nodes += [("add", f"n{len(nodes) - 1}", c[i]), ("mul", f"n{len(nodes)}", "n5")]
    nodes.append(("add", f"n{len(nodes) - 1}", c[0]))
    return tuple(nodes)


def scale_body() -> tuple:
    """(bits(t), bits(p)) -> bits(2^n p), or 0 past the bottom (int32)."""
    return (("shl", "a", EXPONENT_SHIFT), ("add", "n0", "b"), ("max", "n1", 0))


def passes(scale=None) -> tuple:
    """The three (body, dtype) in turn: ROUND reads z, POLYNOMIAL z and ROUND's t, SCALE t and
    POLYNOMIAL's p (as int32 bits)."""
    return ((round_body(scale), "float32"), (polynomial_body(scale), "float32"), (scale_body(), "int32"))


def exp(z: np.ndarray, scale=None) -> np.ndarray:
    """The fabric's exp(scale z) in float32, pass by pass (body.evaluate: what the chip computes)."""
    z = np.asarray(z, "float32")
    (first, _), (second, _), (third, _) = passes(scale)
    t = bodies.evaluate(first, "float32", z)
    p = bodies.evaluate(second, "float32", z, t)
    bits = bodies.evaluate(third, "int32", t.view("int32"), p.view("int32"))
    return bits.view("float32")
