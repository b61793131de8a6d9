"""A take of one constant index along the next-to-last axis, at a symbolic length, is a box.

Stage: normalise (after take_slices.py, which takes 1-D index arrays; before split_slices.py). In:
a Relax IRModule. Out: the same module in which each `take(x, c, axis=-2)`, c a scalar integer
constant in range, x of a symbolic dimension before that axis and static ones from it, x's shape
(.., N, M, D), is

    strided_slice(reshape(x, (.., N, M * D)), [-1], [c * D], [(c + 1) * D])    # (.., N, D)

Exact: both read x[.., c, :] in order; the reshape is a view of the same memory.

Why: Bloom's fused q / k / v projection is viewed (B, s, H, 3, D) and each part taken with a
scalar index on axis 3; at a symbolic length the NPU's lookup takes a static table, so the six
takes of a two-layer model ran on the host (Bloom at 16 tokens on cgra-8x8: 17,916 host
cycles). As slices of a (B, s, H, 3 D) view they are boxes of a (B, s, N, D) tensor, which the
attention over a symbolic length reads itself (kernels/attention/length_layouts.py).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_info import shape_dims
from .rewrite import as_pass, rewrite_calls


def take_boxes(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with the takes of the module doc as boxes."""
    return rewrite_calls(mod, "relax.take", _as_box)


take_boxes_pass = as_pass(take_boxes, "cgra.TakeBoxes", ops=("relax.take",))


def _box(call) -> tuple | None:
    """(merged shape, begin, end) of the module doc's take, else None."""
    data, index = call.args[0], call.args[1]
    dims = shape_dims(data)
    if not isinstance(index, tvm.ir.GenericConst) or not dims or len(dims) < 3 or call.attrs.axis is None:
        return None
    value = index.value.numpy()
    if value.ndim != 0 or value.dtype.kind not in "iu" or int(call.attrs.axis) % len(dims) != len(dims) - 2:
        return None
    m, d = dims[-2:]
    if not isinstance(m, int) or not isinstance(d, int) or all(isinstance(x, int) for x in dims[:-2]):
        return None
    c = int(value)
    if not 0 <= c < m:
        return None
    return tuple(dims[:-2]) + (m * d,), c * d, (c + 1) * d


def _as_box(mutator, call):
    """The take as a slice of the merged view, else None."""
    found = _box(call)
    if found is None:
        return None
    shape, begin, end = found
    merged = mutator.builder_.emit(relax.op.reshape(call.args[0], relax.ShapeExpr(list(shape))))
    return relax.op.strided_slice(merged, [len(shape) - 1], [begin], [end], assume_inbound=True)
