"""A take of constant consecutive indices is a slice.

Stage: normalise (after negative_indices.py has counted negative indices from the end; before
split_slices.py, which merges the slice with the ones around it). In: a Relax IRModule. Out: the
same module in which every `take(x, c, axis)`, c a constant 1-D array of consecutive ascending
in-range indices a, a + 1, .., a + k - 1 along a static axis of x, is
`strided_slice(x, [axis], [a], [a + k])`.

Exact: both read x's elements a .. a + k - 1 along the axis, in that order.
Why: Falcon's attention takes its key and value heads as `qkv[:, :, [-2]]`, `qkv[:, :, [-1]]` (a
take of one constant index); at a symbolic length the NPU's lookup, which takes a static table
(kernels/layout/symbolic_take.py), refused it and the takes ran on the host (Falcon's prefill at
5 tokens on cgra-8x8: 4,396 host cycles). At a static length each take was a gather copy kernel
(416 cycles, four a model at 32 tokens) and no head box for RoPE's epilogue (rope_epilogues.py)
or the attention: as slices the key's RoPE joins the query's in the projection's epilogue and
the attention reads k and v as boxes (Falcon at 32 tokens on cgra-8x8: 75,491 -> 69,451 cycles).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import shape_dims
from .rewrite import as_pass, rewrite_calls


def take_slices(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with the takes of the module doc as slices."""
    return rewrite_calls(mod, "relax.take", _as_slice)


take_slices_pass = as_pass(take_slices, "cgra.TakeSlices", ops=("relax.take",))


def consecutive_range(call) -> tuple[int, int, int] | None:
    """(axis, begin, end) of a take of constant consecutive ascending indices along a static axis,
    else None."""
    data, indices = call.args[0], call.args[1]
    dims = shape_dims(data)
    if not isinstance(indices, tvm.ir.GenericConst) or not dims or call.attrs.axis is None:
        return None
    axis = int(call.attrs.axis) % len(dims)
    values = indices.value.numpy()
    if values.ndim != 1 or not values.size or values.dtype.kind not in "iu" or not isinstance(dims[axis], int):
        return None
    begin = int(values[0])
    if not (values == np.arange(begin, begin + values.size)).all() or begin < 0 or begin + values.size > dims[axis]:
        return None
    return axis, begin, begin + int(values.size)


def _as_slice(_mutator, call):
    """The take as a strided slice, else None."""
    found = consecutive_range(call)
    if found is None:
        return None
    axis, begin, end = found
    return relax.op.strided_slice(call.args[0], [axis], [begin], [end])
