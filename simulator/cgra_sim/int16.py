"""The 16x8 integer format: int16 activations times int8 weights, accumulated in int64.

Stage: simulator, step 3 (functional.py calls these for GEMM and EPILOGUE on INT16 / INT64).
The arithmetic, which the compiler's intrinsics describe and the tests model in numpy:

    GEMM (dtype INT16)   acc[i, j] (+)= sum_k int64(A[i, k]) * int64(B[k, j])   A int16, B int8
    EPILOGUE (INT64 acc) x = acc (+ bias[j]) (+ residual[i, j]), [relu], [clip]   int64, wrapping
                         with REQUANTISE, to int16:
                         rne(clamp(float32(x) * scale[j], -32768 - zp, 32767 - zp)) + zp

A product is below 2**22 in magnitude, so an int64 accumulator is exact for any k below 2**41
(a 48-bit accumulator, as Arm's Ethos-U 16x8 mode has, for k below 2**25: every layer here).
The requantisation is int8's (the same float32 multiplier, scale row and rounding) with int16's
bounds: float32(x) rounds an accumulator above 2**24 to 24 significant bits, a relative error
of 2**-24, below 2**-9 of an int16 step. onnxruntime has no integer kernel for int16 QDQ layers
(its CPU provider runs DequantizeLinear, the float32 Conv / MatMul, then QuantizeLinear, which
divides the float32 sum by the output scale): its float32 sums are off the exact value by more
than this rounding, so about one output in a thousand rounds to the neighbouring int16 value
there (tests/test_int16_qdq.py measures it; the same holds for the exact float64 product).
"""

from __future__ import annotations

import numpy as np

INT16_MIN, INT16_MAX = -(1 << 15), (1 << 15) - 1


def gemm16x8(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """int16 `a` (m, k) @ int8 `b` (k, n) in int64, exactly."""
    return a.astype(np.int64) @ b.astype(np.int64)


def requantise16(acc: np.ndarray, scale: np.ndarray, zero_point: int) -> np.ndarray:
    """int64 `acc` (m, n) -> int16 with float32 `scale` (1, n) or (n,) and an int16 zero point:
    rne(clamp(float32(acc) * scale, -32768 - zp, 32767 - zp)) + zp, each float32 step rounded to
    nearest even. fmax / fmin send a NaN product to the lower bound, as int8's requantisation."""
    product = acc.astype(np.float32) * scale.astype(np.float32, copy=False)
    lo, hi = np.float32(INT16_MIN - zero_point), np.float32(INT16_MAX - zero_point)
    clamped = np.fmin(np.fmax(product, lo), hi)
    return (np.rint(clamped) + np.float32(zero_point)).astype(np.int16)
