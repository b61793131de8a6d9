"""A {0, 1} mask's words and running count along a symbolic length, on the NPU.

Stage: normalise (a helper of masks.py's rewriter). In: an int32 or int64 Relax tensor whose
last axis is a symbolic length s (RoBERTa's `input_ids` of a model exported with a symbolic
sequence length), or masks.py's int32 twin B (0 or 1) of such a shape, and the rewriter's
`emit`. Out: Relax expressions, emitted but the last:

    length_words(x)            the int32 words of x: x itself, or an int64's low and high words
                               (a (..., s, 2) int32 view, two slices of its last axis, reshaped)
    length_scan(B, bound)      cumsum(B) along s: B's low bytes (int8: a (..., s, 4) view, a
                               slice) times the first s rows of the (bound, bound) int8 upper
                               triangle of ones (int8 x int8 -> int32 on the PE array, the
                               symbolic matmul reading a constant's first rows: matmul_cache),
                               then the first s of each row's `bound` columns (a view for one row)

masks.py's static rewrite multiplies by the n x n triangle; at a symbolic length n is unknown,
so the kernel reads the first s rows of the triangle at the bound and computes every column up
to the bound (columns past s hold the row's total, dropped): s * bound MACs a row instead of
s * s, with no copy of a triangle (a slice of a constant to s x s would be a host copy of s^2
bytes: 11,738 host cycles at 100 tokens, more than the host's cumsum).

Exact: B holds 0 and 1, so its low byte is B; the products are 0 or 1 and integer sums do not
round (below 2^31 for any length the bound allows). Triangle row j is 1 at columns i >= j, so
column i < s sums B[j] over j <= i: the cumsum. A word minus a word of c is 0 exactly where the
words are equal, so an int64 differs from c exactly where a word does (masks.py).

Why: with a symbolic length masks.py's twins and scan need static shapes, and RoBERTa's position
ids (`cumsum(ids != pad) * (ids != pad) + pad`) left not_equal, astype and cumsum on the host
(three host compute ops; with a static length they ran on the NPU).
"""

from __future__ import annotations

import numpy as np
from tvm import relax, tirx

from ..relax_info import dtype_of, shape_dims

#: The largest bound whose triangle is built ((bound, bound) int8 bytes in the executable). One
#: row fills one of the PE array's rows: the GEMM costs about s * bound / 8 cycles on cgra-8x8
#: (RoBERTa at bound 256: 1,434 cycles at 20 tokens, about 4,000 at 128), against a host scan of
#: about 2,500 modelled cycles; above 512 the cumsum stays on the host.
MAX_BOUND = 512


def length_dims(expr) -> list | None:
    """The dimensions of `expr` when its last axis alone is symbolic (a variable), else None."""
    dims = shape_dims(expr)
    if not dims or not isinstance(dims[-1], tirx.Var) or not all(isinstance(d, int) for d in dims[:-1]):
        return None
    return dims


def length_words(emit, source) -> list | None:
    """The int32 words of the int32 or int64 `source` of a symbolic length (module doc), low
    first, each of `source`'s shape; None for another dtype or shape."""
    dims = length_dims(source)
    if dims is None or dtype_of(source) not in ("int32", "int64"):
        return None
    if dtype_of(source) == "int32":
        return [source]
    pairs = emit(relax.op.memory.view(source, shape=(*dims, 2), dtype="int32"))
    rank = len(dims)
    return [emit(relax.op.reshape(emit(relax.op.strided_slice(pairs, [rank], [start], [start + 1])), dims))
            for start in (0, 1)]


def length_scan(emit, twin, bound: int | None):
    """cumsum(twin) along its symbolic last axis, `twin` an int32 tensor of 0 and 1 and `bound`
    the length's upper bound (module doc), not emitted; None without a bound or above MAX_BOUND."""
    dims = length_dims(twin)
    if dims is None or dtype_of(twin) != "int32" or bound is None or not 1 <= bound <= MAX_BOUND:
        return None
    rank, length = len(dims), dims[-1]
    rows = int(np.prod(dims[:-1], dtype=np.int64))
    flat = emit(relax.op.reshape(twin, (rows, length))) if rank != 2 else twin
    bytes_ = emit(relax.op.memory.view(flat, shape=(rows, length, 4), dtype="int8"))
    low = emit(relax.op.reshape(emit(relax.op.strided_slice(bytes_, [2], [0], [1])), (rows, length)))
    triangle = relax.const(np.triu(np.ones((bound, bound), np.int8)))
    first_rows = emit(relax.op.strided_slice(triangle, [0], [0], [length], assume_inbound=True))
    summed = emit(relax.op.matmul(low, first_rows, out_dtype="int32"))
    if rows == 1:  # one row: its first s columns are the tensor's first s elements
        return relax.op.memory.view(summed, shape=dims, dtype="int32")
    kept = relax.op.strided_slice(summed, [1], [0], [length], assume_inbound=True)
    return kept if rank == 2 else relax.op.reshape(emit(kept), dims)


def length_bound(bounds: dict, dims) -> int | None:
    """The upper bound of the symbolic last axis of `dims` from `bounds` (name -> bound), else None."""
    return bounds.get(str(dims[-1].name)) if dims and isinstance(dims[-1], tirx.Var) else None


def scannable(bounds: dict, expr) -> bool:
    """Whether `expr`'s last axis is a symbolic length whose bound length_scan takes: masks.py
    makes an int32 twin over a symbolic length only then (a twin whose scan stayed on the host
    would add NPU kernels and a crossing to the host's ops)."""
    dims = length_dims(expr)
    bound = length_bound(bounds, dims) if dims is not None else None
    return bound is not None and 1 <= bound <= MAX_BOUND
