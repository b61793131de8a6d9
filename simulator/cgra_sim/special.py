"""The vector unit's special functions: VFUNC's float32 arithmetic, specified step by step.

Stage: simulator (functional.py runs VFUNC with these); the compiler's tests measure against
them. In: float32 numpy arrays. Out: float32 arrays, bit-exact on every machine.

Each function is a fixed sequence of IEEE float32 operations (add, subtract, multiply, divide,
square root, each rounded to nearest even, no fused multiply-add), float32 <-> int32
conversions of integral values and bit operations: numpy performs exactly these on every CPU,
so the results do not depend on numpy's or the C library's exp (whose SIMD paths differ). The
hardware runs the same sequence: a vector lane one operation a cycle (`OPS`), a function unit's
pipeline one stage an operation (function_unit.py).

    exp         n = rint(x log2 e); r = x - n C1 - n C2 (Cody-Waite, C1 exact in 9 bits);
                p = 1 + r + r^2 P(r) (degree 5, Cephes' expf); p 2^(n//2) 2^(n - n//2)
    tanh        |x| < 0.625: x + x^3 Q(x^2) (Cephes' tanhf: accurate near 0, no cancellation);
                else sign(x) (1 - 2 / (exp(2|x|) + 1))
    erf         |x| < 0.875: x S(x^2) (degree 6, fitted); else sign(x) (1 - erfc(|x|))
    erfc(z)     z >= 0.875: exp(-z^2) t T(t), t = 1 / (1 + z/2) (degree 9 in t, fitted to
                erfc(z) e^(z^2) on [0.875, 10.1]); z^2 = h^2 + (z - h)(z + h), h = z with its
                12 low mantissa bits cleared (h^2 exact), reduced as exp's argument with the
                small part added after the exact -h^2 - n C1: z^2's rounding does not multiply
                the relative error by 2 z^2
    gelu        x Phi(x), Phi(x) = erfc(-x / sqrt 2) / 2 (x < 0: no cancellation) or
                1 - erfc(x / sqrt 2) / 2, the exponent -x^2 / 2 split as above
    rsqrt       1 / sqrt(x)         reciprocal  1 / x          identity    x
    sigmoid     e = exp(-|x|), r = 1 / (1 + e): r for x >= 0, e r below (never 1 - r, which
                would lose the small values)
    silu        x sigmoid(x)
    gelu_tanh   x sigmoid(z), z = x (GELU_LINEAR + GELU_CUBIC x^2) = 2 sqrt(2 / pi) (x + 0.044715
                x^3): the tanh form 0.5 x (1 + tanh(z / 2)) without its cancellation for x << 0

Measured maximum errors against float64 (tests/test_special.py holds the bounds):
ERROR_BOUNDS (exp 1 ulp, tanh 1.5, erf 2.5, GELU 7, rsqrt 1.5, reciprocal 0.5, sigmoid 3, SiLU 3.5
(measured 2.69, 3.37); GELU's tanh form 4 + 3 |z| (measured 185 at x = -9.2, z = -70: its float32
argument's rounding, times sigmoid's relative sensitivity |z| in the negative tail; 14 for |x| < 3).
"""

from __future__ import annotations

import numpy as np

F = np.float32
LOG2E, C1, C2 = F(1.4426950408889634), F(0.693359375), F(-2.12194440e-4)
EXP_P = tuple(map(F, (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                      1.6666665459e-1, 5.0000001201e-1)))
TANH_Q = tuple(map(F, (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
                       -3.33332819422e-1)))
ERF_S = tuple(map(F, (8.71393785928376e-05, -0.0008220490417443216, 0.005207619164139032,
                      -0.026861967518925667, 0.11283741146326065, -0.37612637877464294,
                      1.128379225730896)))
ERFC_T = tuple(map(F, (-0.06509256362915039, 0.20231617987155914, -0.1659511774778366,
                       -0.05224306136369705, 0.020615605637431145, 0.06947027891874313,
                       0.18029633164405823, 0.2462022304534912, 0.2821488082408905,
                       0.2820928394794464)))
SQRT1_2 = F(0.7071067811865476)
ERF_SPLIT = F(0.875)

#: Lane operations per element (a divide or square root counted as 4): the cycles a lane spends
#: on one element, the stages of a function unit's pipeline (cost.vfunc_cycles).
OPS = {"identity": 1, "exp": 28, "tanh": 52, "erf": 78, "gelu": 85, "rsqrt": 8, "reciprocal": 4,
       "sigmoid": 36, "silu": 37, "gelu_tanh": 41}

#: Max error against float64, in units in the last place of the float32 result, over the
#: inputs tests/test_special.py samples (random bit patterns, uniform and small values) whose
#: results are at least 2^-100 in magnitude (measured over 4 million inputs each: exp 0.96,
#: tanh 1.32, erf 2.43, gelu 6.35, rsqrt 1.48, reciprocal 0.50).
ERROR_BOUNDS = {"exp": 1.0, "tanh": 1.5, "erf": 2.5, "gelu": 7.0, "rsqrt": 1.5, "reciprocal": 0.5, "identity": 0.0,
                "sigmoid": 3.0, "silu": 3.5, "gelu_tanh": 4.0}
#: GELU's tanh form: ulps of error per unit of |z| on top of its bound (the argument's rounding).
GELU_TANH_PER_Z = 3.0
#: GELU's tanh form as x sigmoid(x (GELU_LINEAR + GELU_CUBIC x^2)): 2 sqrt(2 / pi), times 0.044715
GELU_LINEAR, GELU_CUBIC = F(1.5957691216057308), F(0.07135481627159036)


def _horner(coefficients, x):
    result = coefficients[0]
    for c in coefficients[1:]:
        result = result * x + c
    return result


def _pow2(n: np.ndarray) -> np.ndarray:
    """2^n as float32 for int32 n in [-126, 127], built from its bits."""
    return ((n + 127).astype(np.int32) << 23).view(np.float32)


def _scaled(n: np.ndarray, r: np.ndarray) -> np.ndarray:
    """e^r 2^n for |r| <= ln 2 / 2 and integral float32 n in [-150, 128]."""
    p = (_horner(EXP_P, r) * (r * r) + r) + F(1)
    ni = n.astype(np.int32)
    half = ni >> 1
    return (p * _pow2(half)) * _pow2(ni - half)


def exp(x: np.ndarray) -> np.ndarray:
    """e^x: inf above ~88.72, 0 below ~-103.97 (subnormals in between rounded twice at most)."""
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        xc = np.where(np.isnan(x), F(0), np.clip(x, F(-104), F(89)))
        n = np.rint(xc * LOG2E)
        y = _scaled(n, (xc - n * C1) - n * C2)
    return np.where(np.isnan(x), x, y).astype(np.float32)


def tanh(x: np.ndarray) -> np.ndarray:
    """tanh(x): an odd polynomial below 0.625 (no cancellation near 0), else from exp(2|x|)."""
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        a = np.abs(x)
        z = x * x
        small = _horner(TANH_Q, z) * z * x + x
        s = exp(F(2) * np.minimum(a, F(44)))
        large = F(1) - F(2) / (s + F(1))
        y = np.where(a < F(0.625), small, np.copysign(large, x))
    return np.where(np.isnan(x), x, y).astype(np.float32)


def _exp_neg_square(a: np.ndarray, halve: bool) -> np.ndarray:
    """exp(-a^2) (or exp(-a^2 / 2)) for a >= 0, a^2 split so that its rounding does not grow the
    relative error: h = a rounded down to 12 bits, a^2 = h^2 + (a - h)(a + h), h^2 exact; the
    reduction -h^2 - n C1 is exact too (both multiples of h^2's last bit, below 1), so one
    rounding of the small part enters r."""
    h = (a.view(np.int32) & np.int32(-4096)).view(np.float32)
    big, small = h * h, (a - h) * (a + h)
    if halve:
        big, small = big * F(0.5), small * F(0.5)
    n = np.rint(np.maximum(-(big + small), F(-104)) * LOG2E)
    y = _scaled(n, ((-big - n * C1) - small) - n * C2)
    return np.where(big + small > F(104), F(0), y)


def _erfc_large(z: np.ndarray, e: np.ndarray) -> np.ndarray:
    """erfc(z) for z >= 0.875 given e = exp(-z^2)."""
    t = F(1) / (F(1) + z * F(0.5))
    return e * (_horner(ERFC_T, t) * t)


def _erf_small(z: np.ndarray) -> np.ndarray:
    return _horner(ERF_S, z * z) * z


def erf(x: np.ndarray) -> np.ndarray:
    """erf(x): an odd polynomial below 0.875, else 1 - erfc(|x|) with erf's sign."""
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        a = np.minimum(np.abs(x), F(10))
        large = F(1) - _erfc_large(a, _exp_neg_square(a, False))
        y = np.where(a < ERF_SPLIT, _erf_small(x), np.copysign(large, x))
    return np.where(np.isnan(x), x, y).astype(np.float32)


def gelu(x: np.ndarray) -> np.ndarray:
    """x Phi(x), PyTorch's default (erf) GELU: x (1 + erf(x / sqrt 2)) / 2."""
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        a = np.minimum(np.abs(x), F(15))
        z = a * SQRT1_2
        tail = np.where(z < ERF_SPLIT, F(1) - _erf_small(z), _erfc_large(z, _exp_neg_square(a, True)))
        half = tail * F(0.5)  # Phi(-|x|)
        y = x * np.where(x < 0, half, F(1) - half)
    return y.astype(np.float32)


def rsqrt(x: np.ndarray) -> np.ndarray:
    """1 / sqrt(x), both correctly rounded (inf at 0, NaN below)."""
    with np.errstate(all="ignore"):
        return (F(1) / np.sqrt(np.asarray(x, np.float32))).astype(np.float32)


def reciprocal(x: np.ndarray) -> np.ndarray:
    """1 / x, correctly rounded."""
    with np.errstate(all="ignore"):
        return (F(1) / np.asarray(x, np.float32)).astype(np.float32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) from e = exp(-|x|) (no overflow): 1 / (1 + e) for x >= 0, e / (1 + e) below.
    Lane operations: |x| and its negation (sign bits) 1, exp 28, the add 1, the divide 4, the
    multiply 1, the select 1."""
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        e = exp(-np.abs(x))
        r = F(1) / (F(1) + e)
        y = np.where(x >= 0, r, e * r)
    return y.astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    """x sigmoid(x) (SiLU, swish): sigmoid's sequence and one multiply."""
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        return (x * sigmoid(x)).astype(np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh form x sigmoid(z), z = x (GELU_LINEAR + GELU_CUBIC x^2): 4 operations, sigmoid's
    36 and the multiply."""
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        z = x * (GELU_CUBIC * (x * x) + GELU_LINEAR)
        return (x * sigmoid(z)).astype(np.float32)


def identity(x: np.ndarray) -> np.ndarray:
    """x (a VFUNC of identity applies only its scale and offset)."""
    return np.asarray(x, np.float32).copy()


FUNCTIONS = {"identity": identity, "exp": exp, "tanh": tanh, "erf": erf, "gelu": gelu, "rsqrt": rsqrt,
             "reciprocal": reciprocal, "sigmoid": sigmoid, "silu": silu, "gelu_tanh": gelu_tanh}
