"""bfloat16 and float16 as the scratchpad holds them: exact widening to float32, and float32
rounded to nearest even into them.

Stage: simulator (the functional core's arithmetic for the 16-bit floats; also the numpy model
that `cgra-sim verify` and the tests compare the NPU with). No tvm, and no dependency beyond
numpy: bfloat16 is held as its 16 bits in a uint16 array (isa.DType.storage), float16 as numpy's
float16.

bfloat16 is the upper half of a float32: widening shifts the bits up 16 (exact), narrowing rounds
the lower 16 away to nearest, ties to even, overflowing to infinity, NaN kept a quiet NaN of the
same sign. float16 uses numpy's conversions (IEEE 754, the same rounding). A product of two
16-bit floats is exact in float32 (8 + 8 or 11 + 11 significand bits of 24, exponents in range),
so a GEMM's only roundings are float32's adds and the one on store.
"""

from __future__ import annotations

import numpy as np

#: Significand bits (the implicit one included) of each 16-bit format: a rounding's relative
#: error is at most 2 ** -bits (half an ulp).
SIGNIFICAND_BITS = {"bfloat16": 8, "float16": 11}
#: The smallest subnormal of each: below 2 ** (1 - bits) of the smallest normal, a rounding's error
#: is at most half of it instead of relative.
SMALLEST_SUBNORMAL = {"bfloat16": 2.0 ** -133, "float16": 2.0 ** -24}


def widen(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values of `values` held as `dtype` ("bfloat16": uint16 bits; "float16"; others as they are)."""
    if dtype == "bfloat16":
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32)


def narrow(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 `values` rounded to nearest even into `dtype`, as the scratchpad holds it."""
    values = np.asarray(values, dtype=np.float32)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16)
    bits = values.view(np.uint32)
    lsb = (bits >> 16) & 1
    with np.errstate(over="ignore"):
        rounded = ((bits + np.uint32(0x7FFF) + lsb) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():  # the carry above could turn a NaN's payload into infinity: keep it a quiet NaN
        rounded = np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)
    return rounded


def to_storage(values: np.ndarray, dtype: str) -> np.ndarray:
    """float values (any float dtype) as `dtype`'s storage, rounded to nearest even through float32
    (a float64 input is first rounded to float32: what a framework's own cast does in two steps
    may differ in the last bit only for values within a float32 ulp of a tie)."""
    return narrow(np.asarray(values, dtype=np.float32), dtype)


def error_bound(model: np.ndarray, terms: np.ndarray, depth: int, dtype: str) -> np.ndarray:
    """Per element, how far a GEMM-shaped kernel's `dtype` output may be from `model` (this
    module's numpy model of it, rounded) when the two sum their float32 terms in different orders:
    one ulp of the format at the result (2 ** (1 - bits) |model|, or its smallest subnormal s among
    the subnormals: the sums may fall on either side of a rounding boundary) plus twice float32's
    summation bound gamma_depth = depth u / (1 - depth u), u = 2 ** -24, times `terms` (the sum of
    the terms' magnitudes: |A| @ |B| + |bias| + |residual|).

    Against the exact result y the NPU's own error is at most 2 ** -bits |y| + s / 2 + (1 + 2 ** -bits)
    gamma_depth * terms: one rounding to the 16-bit format after a float32 sum."""
    unit = depth * 2.0 ** -24
    gamma = unit / (1 - unit)
    ulp = 2.0 ** (1 - SIGNIFICAND_BITS[dtype])
    return ulp * np.abs(np.asarray(model, dtype=np.float64)) + SMALLEST_SUBNORMAL[dtype] + \
        2 * gamma * np.asarray(terms, dtype=np.float64)
