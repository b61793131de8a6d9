"""Each layout op's index map: the pieces (copy_kernel.Piece) an op's output is made of, read from
the Relax call.

Stage: partition (layout.py's spec). A reader takes (call, in_shapes, out_shape) and returns
(pieces, gather, views): a piece says which input axis each output axis walks, at which step and
from which origin (a slice's start, a pad's negative halo); a lookup is a Gather instead; `views`
are the caller's shapes of operands read through a merged view (a concatenation's rank 2 or 3).
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from ...errors import UnsupportedOperator
from .copy_kernel import Gather, Piece

INDEX_DTYPES = ("int32", "int64")

def kept_names(names: dict, kept: list) -> dict:
    """`names` (axis -> variable) renumbered to the compact view's axes (`kept`: the original axis
    of each view axis)."""
    return {view_axis: names[axis] for view_axis, axis in enumerate(kept) if axis in names}


def _ints(expr) -> list:
    """The ints of a Relax tuple of PrimValues, a ShapeExpr or an attribute array."""
    values = getattr(expr, "fields", None) or getattr(expr, "values", None) or expr
    return [int(getattr(getattr(v, "value", v), "value", getattr(v, "value", v))) for v in values]


def _identity(shape) -> tuple:
    return tuple((a, 1) for a in range(len(shape)))


def _permute(call, in_shapes, out_shape):
    rank = len(out_shape)
    axes = call.attrs.axes
    axes = list(reversed(range(rank))) if axes is None else [int(a) % rank for a in axes]
    return [Piece("lhs", (0,) * rank, out_shape, tuple((a, 1) for a in axes), (0,) * rank)], None, ()


def _strided_slice(call, in_shapes, out_shape):
    shape = in_shapes[0][1]
    args = list(call.args[1:])
    if len(args) < 3 or any(not isinstance(a, (relax.Tuple, relax.ShapeExpr)) for a in args[:3]):
        raise UnsupportedOperator("strided_slice with bounds computed at run time: the NPU's copy takes constant ones")
    axes, begin = [a % len(shape) for a in _ints(args[0])], _ints(args[1])
    steps = _ints(args[3]) if len(args) > 3 and args[3] is not None else [1] * len(axes)
    origin, walks = [0] * len(shape), [(a, 1) for a in range(len(shape))]
    for axis, start, step in zip(axes, begin, steps):
        if step <= 0:
            raise UnsupportedOperator(f"strided_slice with step {step}: the NPU's copy takes positive steps")
        start = min(max(start + shape[axis] if start < 0 else start, 0), shape[axis])
        origin[axis], walks[axis] = start, (axis, step)
        if start + (out_shape[axis] - 1) * step >= shape[axis]:
            raise UnsupportedOperator("strided_slice reaching past its operand")  # relax's shape says it cannot
    return [Piece("lhs", (0,) * len(shape), out_shape, tuple(walks), tuple(origin))], None, ()


def _broadcast_to(call, in_shapes, out_shape):
    shape = in_shapes[0][1]
    skip = len(out_shape) - len(shape)
    walks = tuple((-1, 0) if a < skip or shape[a - skip] != out_shape[a] else (a - skip, 1)
                  for a in range(len(out_shape)))
    return [Piece("lhs", (0,) * len(out_shape), out_shape, walks, (0,) * len(shape))], None, ()


def _repeat(call, in_shapes, out_shape):
    """A repeat of unit axes (no_op_broadcasts.py's form of a broadcast at a symbolic length):
    the repeated axis walks nothing, a broadcast."""
    shape = in_shapes[0][1]
    axis = None if call.attrs.axis is None else int(call.attrs.axis) % len(shape)
    if axis is None or shape[axis] != 1:
        raise UnsupportedOperator("repeat of an axis longer than 1 (or of the flattened tensor): the NPU's copy "
                                  "repeats unit axes only, a broadcast")
    walks = tuple((-1, 0) if a == axis else (a, 1) for a in range(len(shape)))
    return [Piece("lhs", (0,) * len(out_shape), out_shape, walks, (0,) * len(shape))], None, ()


def _pad(call, in_shapes, out_shape):
    shape = in_shapes[0][1]
    attrs = call.attrs
    if str(attrs.pad_mode) != "constant" or float(attrs.pad_value) != 0.0:
        raise UnsupportedOperator(f"nn.pad mode {attrs.pad_mode} value {attrs.pad_value}: the DMA fills a halo "
                                  "with zeros only")
    widths = [int(w) for w in attrs.pad_width]
    if any(w < 0 for w in widths):
        raise UnsupportedOperator("nn.pad with a negative width (a crop): a strided_slice's job")
    lows = widths[0::2]
    guarded = tuple(a for a in range(len(shape)) if widths[2 * a] or widths[2 * a + 1])
    return [Piece("lhs", (0,) * len(shape), out_shape, _identity(shape), tuple(-lo for lo in lows), guarded)], None, ()


def concat_views(axis: int, in_shapes: tuple, out_shape: tuple) -> tuple:
    """(inputs as views, the output's view, the pieces, the caller shapes): every tensor as
    (axes before `axis`, `axis`, axes after it) merged, the first dropped when it is 1, so a
    concatenation of any rank is one of rank 2 or 3."""
    def view(shape):
        outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
        return ((outer,) if outer > 1 else ()) + (shape[axis], inner)

    views, pieces, offset = [], [], 0
    out_view = view(out_shape)
    at = len(out_view) - 2  # the concatenated axis in the views
    for role, shape, kind in in_shapes:
        views.append((role, view(shape), kind))
        extent = view(shape)
        start = tuple(offset if a == at else 0 for a in range(len(extent)))
        pieces.append(Piece(role, start, extent, _identity(extent), (0,) * len(extent)))
        offset += shape[axis]
    callers = tuple((role, shape) for (role, shape, _), (_, viewed, _) in zip(in_shapes, views) if shape != viewed)
    callers += (("out", out_shape),) if out_shape != out_view else ()
    return tuple(views), out_view, pieces, callers


def symbolic_concat_views(axis: int, in_shapes: tuple, out_shape: tuple, names: dict) -> tuple:
    """concat_views for tensors with a symbolic axis, which is never merged with another (its
    extent is the bound): the output's unit axes dropped from every tensor, nothing merged; and
    `names` renumbered to those views. The concatenated axis must be static."""
    if axis in names["out"] or any(axis in names[role] for role, _, _ in in_shapes):
        raise UnsupportedOperator("concat along a symbolic axis: the NPU's copy places each input at an offset "
                                  "known when compiling")
    kept = [a for a, extent in enumerate(out_shape) if extent != 1 or a == axis or a in names["out"]]
    at = kept.index(axis)
    views, pieces, offset = [], [], 0
    for role, shape, kind in in_shapes:
        extent = tuple(shape[a] for a in kept)
        views.append((role, extent, kind))
        pieces.append(Piece(role, tuple(offset if k == at else 0 for k in range(len(extent))), extent,
                            _identity(extent), (0,) * len(extent)))
        offset += shape[axis]
    out_view = tuple(out_shape[a] for a in kept)
    callers = tuple((role, shape) for (role, shape, _), (_, viewed, _) in zip(in_shapes, views) if shape != viewed)
    callers += (("out", out_shape),) if out_shape != out_view else ()
    renamed = {role: kept_names(axes, kept) for role, axes in names.items()}
    return tuple(views), out_view, pieces, callers, renamed


def _concat(call, in_shapes, out_shape):
    return [], None, ()  # layout_spec reads it through concat_views


def _take(call, in_shapes, out_shape):
    (_, table, _), (_, indices, index_dtype) = in_shapes
    if index_dtype not in INDEX_DTYPES:
        raise UnsupportedOperator(f"take with {index_dtype} indices: the NPU's lookup reads {' or '.join(INDEX_DTYPES)}")
    axis = 0 if call.attrs.axis is None else int(call.attrs.axis) % len(table)
    p = 1
    for extent in table[:axis]:
        p *= extent
    q = 1
    for extent in table[axis + 1:]:
        q *= extent
    count = 1
    for extent in indices:
        count *= extent
    index = call.args[1]
    constants = None
    if isinstance(index, tvm.ir.GenericConst):  # origins known now: no index read at run time
        values = index.value.numpy().astype("int64").ravel()
        constants = tuple(int(v) for v in np.clip(np.where(values < 0, values + table[axis], values), 0, table[axis] - 1))
    gather = Gather((p, table[axis], q), count, scalar=not indices, constants=constants)
    views = (("lhs", table), ("out", out_shape)) + ((("rhs", indices),) if indices else ())
    return [], gather, views


READERS = {"permute_dims": _permute, "strided_slice": _strided_slice, "broadcast_to": _broadcast_to, "pad": _pad,
            "concat": _concat, "take": _take, "repeat": _repeat}
