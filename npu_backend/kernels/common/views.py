"""Elementwise views: a tensor (or two that broadcast) read as (outer..., rows, columns).

Stage: partition (the spec readers of the elementwise families) and kernel definition. The
eltwise family's two operands, and the one operand of relu / clip (activation.py), FABRIC chains
(fabric.py) and the smooth activations (sigmoid.py) when its shape is symbolic, are read through
a compact view: the output's axes of extent 1 dropped and neighbouring axes that each operand
walks or broadcasts alike merged, so that (1, 64, 56, 56) + (1, 64, 1, 1) is (64, 3136) +
(64, 1). The last two view axes are a tile's rows and columns; any before them are loops around
the tiles.

Symbolic sizes (kernels/common/dynamic.py): the output's axis 0 (a batch) stays a view axis of its own
(`symbol`), and its trailing symbolic axes (an NCHW map's height and width) are the view's last
axis, merged with the static axes before them that are walked alike (`tail`, `tail_factor`).
A spec that reads a view has `extents` (at the bounds), `symbol`, `tail` and `tail_factor`;
`view_extents` writes its kernel's extents with the variables, and `cut_levels` says which tile
loops lower/ragged.py cuts to what exists.
"""

from __future__ import annotations

import math

from tvm import tirx

from ...errors import UnsupportedOperator
from .dynamic import dim_var


def eltwise_view(lhs_shape: tuple, rhs_shape: tuple, keep_first: bool = False, tail: int = 0):
    """(output shape, view extents, lhs walks, rhs walks) of a numpy broadcast of two shapes.
    `keep_first`: the output's axis 0 stays a view axis of its own (a symbolic axis); `tail`:
    the output's last `tail` axes (symbolic, walked alike) are kept, whatever their extent, in
    the view's last axis."""
    rank = max(len(lhs_shape), len(rhs_shape))
    lhs, rhs = ((1,) * (rank - len(s)) + tuple(s) for s in (lhs_shape, rhs_shape))
    out = tuple(max(a, b) for a, b in zip(lhs, rhs))
    axes = []  # [extent, lhs walks, rhs walks], neighbours with one pattern merged
    first_tail = rank - tail if tail else rank
    for index, (extent, a, b) in enumerate(zip(out, lhs, rhs)):
        kept = (keep_first and index == 0) or index >= first_tail
        if extent == 1 and not kept:
            continue  # both operands have 1 here: the axis carries nothing
        pattern = (a == extent, b == extent)
        # With keep_first, axes[0] is the output's axis 0 (never skipped): nothing merges into it,
        # not even past unit axes ((n, 1, 3, 3) is viewed (n, 9), not (9n,)). The tail's axes are
        # never skipped either; they merge with one another and with a static axis before them
        # walked alike ((16, 7, w) against (16, 1, 1) is viewed (16, 7w)).
        # Nor does the first tail axis merge into a lone static axis: (1, 64, h, w) + (1, 64, h, w)
        # is viewed (64, hw), not (1, 64hw), whose one row an ELTWISE tile would pad to two.
        lone = len(axes) == 1 and (keep_first or index == first_tail)
        if axes and tuple(axes[-1][1:]) == pattern and not lone:
            axes[-1][0] *= extent
        else:
            axes.append([extent, *pattern])
    if len(axes) == 1 and not keep_first and not tail:  # one axis, walked alike: split it into rows and columns
        extent, *pattern = axes[0]
        rows = _smallest_factor(extent)
        axes = [[rows, *pattern], [extent // rows, *pattern]]
    while len(axes) < 2:  # an ELTWISE tile has rows and columns
        axes.insert(0, [1, True, True])
    extents, lhs_full, rhs_full = (tuple(column) for column in zip(*axes))
    return out, extents, lhs_full, rhs_full


def _smallest_factor(extent: int) -> int:
    """The smallest factor > 1 of `extent` below it, else 1 (a prime: the view keeps one row,
    which the tiling pads to two)."""
    return next((f for f in range(2, math.isqrt(extent) + 1) if extent % f == 0), 1)


def symbolic_axes(func: str, shapes, lhs_names: dict, rhs_names: dict) -> tuple:
    """(the variable of the output's symbolic axis 0 or None, the variables of its trailing
    symbolic axes after axis 0). Per output axis each operand has the axis's variable or 1
    (broadcast; shapes align right as numpy's do); the symbolic axes after axis 0 are the last
    ones, each walked or broadcast alike by an operand (so they are one view axis: an NCHW
    map's height and width, against a per-channel operand). A vector's (rank 1) symbolic axis is
    a trailing one: the columns of a (1, n) view."""
    if not lhs_names and not rhs_names:
        return None, ()
    rank = max(len(s) for s in shapes)
    names = [None] * rank  # the output axis's variable
    walks = []  # per operand, per output axis: its variable there (walks) or not
    for shape, own in zip(shapes, (lhs_names, rhs_names)):
        offset = rank - len(shape)
        walked = [False] * rank
        for axis, extent in enumerate(shape):
            out_axis, name = axis + offset, own.get(axis)
            if name is None:
                continue
            if names[out_axis] not in (None, name):
                raise UnsupportedOperator(f"{func}: the operands' axis {out_axis} are different symbolic sizes "
                                          f"{sorted((names[out_axis], name))}")
            names[out_axis], walked[out_axis] = name, True
        walks.append((shape, offset, walked))
    for shape, offset, walked in walks:  # a static extent against a variable must be 1
        for out_axis, name in enumerate(names):
            axis = out_axis - offset
            if name is not None and not walked[out_axis] and axis >= 0 and shape[axis] != 1:
                raise UnsupportedOperator(f"{func}: one operand's axis {out_axis} is symbolic ({name}), the other's "
                                          f"is {shape[axis]}: they must be one size (or 1)")
    first = 1 if rank > 1 else 0  # a vector's symbolic axis is the columns of a (1, n) view, like a prime length
    tail = [axis for axis in range(first, rank) if names[axis] is not None]
    if tail and tail != list(range(rank - len(tail), rank)):
        raise UnsupportedOperator(f"{func}: a symbolic axis after axis 0 that is not among the last axes (a static "
                                  "axis follows it) stays on the host")
    for _, _, walked in walks:
        if len({walked[axis] for axis in tail}) > 1:
            raise UnsupportedOperator(f"{func}: an operand walks some of the symbolic axes {[names[a] for a in tail]} "
                                      "and broadcasts others: the NPU kernel reads them as one axis")
    return (names[0] if first else None), tuple(names[axis] for axis in tail)


def symbolic_shape(spec, shape: tuple, rank: int | None = None) -> tuple:
    """`shape` with the symbolic axis 0 (when it is the output's, and not a broadcast 1) as its
    variable; `rank`: the output's, for a caller's shape that may be shorter (aligned right),
    whose trailing symbolic axes (`spec.tail`, not a broadcast 1) become their variables too."""
    shape = tuple(shape)
    if rank is not None and spec.tail:
        first = len(shape) - len(spec.tail)
        after_first = 1 if len(shape) == rank > len(spec.tail) else 0  # the output's axis 0 is no tail axis
        shape = tuple(dim_var(spec.tail[axis - first]) if axis >= max(first, after_first)
                      and extent != 1 else extent for axis, extent in enumerate(shape))
    if spec.symbol is None or not shape or (rank is not None and len(shape) != rank) or shape[0] == 1:
        return shape
    return (dim_var(spec.symbol),) + shape[1:]


def view_extents(spec, tiling) -> tuple[tuple, tuple]:
    """(extents, padded): the view's extents as the kernel indexes them, a symbolic axis 0 and the
    trailing symbolic axes' product as their variables, and the same padded to whole tiles of
    tiling.tm rows and tiling.tn columns."""
    extents = symbolic_shape(spec, spec.extents)
    if spec.tail:  # the trailing symbolic axes: the view's last axis, their product
        extents = extents[:-1] + (math.prod((dim_var(name) for name in spec.tail), start=spec.tail_factor),)
    padded = extents[:-2] + (tiling.mp, tiling.np)
    if spec.symbol is not None and len(extents) == 2:  # the symbolic axis is the tiles' rows
        padded = (tirx.ceildiv(extents[0], tiling.tm) * tiling.tm, tiling.np)
    if spec.tail:  # ... and the tiles' columns
        padded = padded[:-1] + (tirx.ceildiv(extents[-1], tiling.tn) * tiling.tn,)
    return extents, padded


def cut_levels(spec, tiling, extents: tuple) -> list:
    """The symbolic tile loops, outermost first, as "rows" / "cols": the last tile of each is cut
    to what exists (lower/ragged.py; kernels/common/dynamic.py CUT_PARAMS). A tile of one row needs no
    cut and its loop is no tile loop; nor do column tiles that divide the static factor of the
    columns: every one is whole."""
    return (["rows"] if spec.symbol is not None and len(extents) == 2 and tiling.tm > 1 else []) + \
        (["cols"] if spec.tail and spec.tail_factor % tiling.tn else [])
