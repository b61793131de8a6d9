"""An attention mask's 32-bit words as float32 flags and rows: one int32 chain a word.

Stage: normalise (called by masks.py). In: an int32 or int64 Relax tensor (an attention_mask
input) and the rewriter's `emit`. Out: Relax expressions, emitted but the last:

    nonzero_float(x)         1.0 where x is nonzero, else +0.0             (B, masks.py's twin)
    padding_row_of_words(x)  +0.0 where x is nonzero, else -inf             (where(x != 0, 0, -inf))

Per 32-bit word w (an int64 viewed as pairs of words, little-endian): n = min(max(w, 0) * -1, w)
is -|w| without an overflow (INT_MIN stays INT_MIN), then max(n, -1) * -bits or max(n + 1, 0) *
bits, the float32 of `bits` where the word is nonzero (or zero), +0.0 elsewhere, viewed as
float32: one int32 chain, a FABRIC body on the PE fabric (forms TVM's simplifier keeps, so the
body is the chain). An int64 is nonzero where either word is: the pair's maximum (a row max).
Its padding row: -2^127 where a word is zero, the pair's maximum times 4 (one row kernel,
rows/row_reduce.py's scaled max: -2^127 where both words are zero, which 4 * -2^127 = -2^129
overflows to -inf); an int32's row is the chain alone, -inf's bits where the word is zero.

Exact: every step is an integer one in int32 that cannot overflow, then a bit pattern; the
maximum and the multiply by 4 round nothing but the overflow. The maximum of -inf words would
not do: TVM's host max starts from -FLT_MAX, not -inf, so a row all padding would read -FLT_MAX
there and -inf on the NPU.

Why: the twin B (an int32 chain, a float32 chain after the view, a row max) and (B - 1) * 2 *
FLT_MAX after it were four kernels of a few hundred cycles of launch latency each for a 1 x s
row (930 cycles in GPT-NeoX and Llama at 32 tokens on cgra-8x8): now two (458).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..relax_info import dtype_of, static_shape

_ONE_BITS = int(np.float32(1).view(np.int32))  # 0x3F800000
_INF_BITS = int(np.float32(-np.inf).view(np.int32))  # 0xFF800000, -8388608 as an int32
_HUGE_BITS = int(np.float32(-2.0 ** 127).view(np.int32))  # 0xFF000000: times 4 it overflows to -inf


def _i32(value) -> relax.Expr:
    return relax.const(np.int32(value))


def word_bits(emit, source, bits: int, zero: bool = False):
    """Per 32-bit word w of the int32 or int64 `source` (an int64 as (..., n, 2) words, a view),
    the float32 of bits `bits` where w is nonzero (`zero`: where it is zero), else +0.0: the
    chain of the module doc, its float32 view not emitted; None for another dtype or shape."""
    shape = static_shape(source)
    if not shape or dtype_of(source) not in ("int32", "int64"):
        return None
    words = source
    if dtype_of(source) == "int64":
        words = emit(relax.op.memory.view(source, shape=(*shape, 2), dtype="int32"))
    magnitude = emit(relax.op.minimum(emit(relax.op.multiply(emit(relax.op.maximum(words, _i32(0))), _i32(-1))), words))
    if zero:
        flag, scale = relax.op.maximum(emit(relax.op.add(magnitude, _i32(1))), _i32(0)), bits
    else:
        flag, scale = relax.op.maximum(magnitude, _i32(-1)), -bits
    return relax.op.memory.view(emit(relax.op.multiply(emit(flag), _i32(scale))), dtype="float32")


def nonzero_float(emit, source):
    """1.0 where the int32 or int64 `source` is nonzero, else +0.0 (an int64's words' pair
    maximum), not emitted; else None."""
    flags = word_bits(emit, source, _ONE_BITS)
    if flags is None or dtype_of(source) != "int64":
        return flags
    return relax.op.max(emit(flags), axis=[-1])


def padding_row_of_words(emit, source):
    """where(source != 0, 0, -inf) for the int32 or int64 `source` (module doc), emitted; else None."""
    pairs = dtype_of(source) == "int64"
    flags = word_bits(emit, source, _HUGE_BITS if pairs else _INF_BITS, zero=True)
    if flags is None:
        return None
    flags = emit(flags)
    return emit(relax.op.multiply(emit(relax.op.max(flags, axis=[-1])), relax.const(np.float32(4)))) if pairs else flags
