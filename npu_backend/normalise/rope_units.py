"""Reading a rotary unit, RoPE over some heads of a projection's view, for rope_epilogues.py.

Stage: normalise (a helper of rope_epilogues.py). In: a variable, its bound value and the
function's bindings. Out: what the unit rotates, as a dict, or None. The unit is

    U = add(multiply(P, C), multiply(concat((P[..., h:], P[..., :h]), -1), S))   (operands in any order)
    P = permute_dims(strided_slice(y4, heads h0:h1 [, dims d0:d0 + r]), [0, 2, 1, 3])
    unit = U  |  concat((U, permute_dims(strided_slice(y4, heads h0:h1, dims d0 + r:d1))), -1)

C and S constants (through expand_dims, broadcast_to, reshape) of one (S, r) table for every
head: rotate_half after rotations.py (Llama, Qwen2, Mistral, Gemma, Phi-3) and GPT-NeoX's partial
rotary, GPT-J's after rotary_pairs.py. At a symbolic length S (y4 (1, s, H, D)) C and S are views
of the first s rows of (bound, r) tables (position_tables.tabulate_prefix's memory.view, through
reshapes): the unit's tables are then those (bound, r) tables.
"""

from __future__ import annotations

import numpy as np
from tvm import relax, tirx

from ..relax_info import shape_dims
from .rewrite import op_name
from .rotary_pairs import layout_constant, viewed_table

HEADS_FIRST = [0, 2, 1, 3]


def rope_unit(var, value, values) -> dict | None:
    """{var, y, h0, h1, d0, d1, r, half, cos, sin, reads, inner} of the unit bound to `var`
    (module doc): `reads` the slices of y it reads, `inner` every variable of it, else None."""
    pass_box, inner = None, {var}
    rope = value
    if op_name(value) == "relax.concat":
        fields = list(value.args[0].fields) if isinstance(value.args[0], relax.Tuple) else []
        if len(fields) != 2 or int(value.attrs.axis) not in (-1, 3):
            return None
        rope, pass_box = values.get(fields[0]), _heads_box(fields[1], values)
        inner |= {fields[0], fields[1]}
        if pass_box is None:
            return None
    found = _rotated(rope, values)
    if found is None:
        return None
    box, half, cos, sin, rope_inner = found
    y, h0, h1, d0, d_end = box[:5]
    d1 = d_end
    reads = {box[5]}
    if pass_box is not None:
        if not pass_box[0].same_as(y) or pass_box[1:3] != (h0, h1) or pass_box[3] != d_end:
            return None
        d1 = pass_box[4]
        reads.add(pass_box[5])
        inner.add(pass_box[6])
    return dict(var=var, y=y, h0=h0, h1=h1, d0=d0, d1=d1, r=d_end - d0, half=half, cos=cos, sin=sin, reads=reads,
                inner=inner | rope_inner | reads)


def _rotated(add, values):
    """(P's box, h, cos (S, r), sin (S, r), the variables read) of U = add(P C, rotate(P) S)."""
    if op_name(add) != "relax.add":
        return None
    for first, second in (add.args, tuple(reversed(add.args))):
        m1, m2 = values.get(first), values.get(second)
        if op_name(m1) != "relax.multiply" or op_name(m2) != "relax.multiply":
            continue
        for p, c in (m1.args, tuple(reversed(m1.args))):
            for t, s in (m2.args, tuple(reversed(m2.args))):
                found = _matched(p, c, t, s, values)
                if found is not None:
                    box, half, cos, sin, read = found
                    return box, half, cos, sin, {first, second, p, t} | read
    return None


def _matched(p, c, t, s, values):
    """(box, h, cos, sin, variables read) when p is a head box, t its halves swapped, c and s tables."""
    box = _heads_box(p, values)
    shape = positions_dims(p, 2)
    if box is None or shape is None:
        return None
    half, halves = _swapped_halves(t, p, values, shape[-1])
    if half is None:
        return None
    if isinstance(shape[2], int):
        tables = [_table(layout_constant(expr, values), shape) for expr in (c, s)]
    else:  # a symbolic length: views of the first s rows of (bound, r) tables
        tables = [_prefix_rows(expr, values, shape) for expr in (c, s)]
    if any(table is None for table in tables):
        return None
    return box[:6], half, tables[0], tables[1], {box[6]} | halves


def _swapped_halves(t, p, values, width):
    """(h, the slices' variables) of t = concat((p[..., h:], p[..., :h]), -1), else (None, None)."""
    concat = values.get(t)
    fields = list(concat.args[0].fields) if op_name(concat) == "relax.concat" and \
        isinstance(concat.args[0], relax.Tuple) else []
    if len(fields) != 2 or int(concat.attrs.axis) not in (-1, 3):
        return None, None
    bounds = [_last_axis_slice(values.get(f), p, width) for f in fields]
    if None in bounds:
        return None, None
    (hi_begin, hi_end), (lo_begin, lo_end) = bounds
    if lo_begin != 0 or hi_begin != lo_end or hi_end != width or not 0 < lo_end < width:
        return None, None
    return lo_end, set(fields)


def _last_axis_slice(call, p, width):
    """(begin, end) of a unit-step strided_slice of p along its last axis, else None."""
    if op_name(call) != "relax.strided_slice" or not call.args[0].same_as(p):
        return None
    fields = _slice_fields(call)
    if fields is None or [a % 4 for a in fields[0]] != [3]:
        return None
    out = positions_dims(call, 2)
    if out is None:
        return None
    begin = fields[1][0] + width if fields[1][0] < 0 else fields[1][0]
    return begin, begin + out[3]


def _table(value, shape):
    """The (S, r) table a constant broadcast to `shape` (1, H, S, r) holds for every head, else None."""
    if value is None or value.dtype != np.float32:
        return None
    try:
        full = np.broadcast_to(value, shape)
    except ValueError:
        return None
    return np.ascontiguousarray(full[0, 0]) if (full == full[:, :1]).all() else None


def _prefix_rows(expr, values, shape):
    """The (bound, r) table whose first s rows `expr` (a (1, 1, s, r) or (s, r) tensor, s the
    symbolic length of `shape` (1, H, s, r)) views: a memory.view at offset 0 of a float32
    constant, through reshapes; else None."""
    dims = shape_dims(expr)
    width = shape[-1]
    if dims is None or len(dims) < 2 or dims[-1] != width or any(d != 1 for d in dims[:-2]) \
            or not _same(dims[-2], shape[2]):
        return None
    return viewed_table(expr, values, width)


def _same(a, b) -> bool:
    return a == b if isinstance(a, int) or isinstance(b, int) else a.same_as(b)


def positions_dims(expr, axis: int):
    """The rank-4 shape of `expr` whose axes are static but `axis` (the positions: 1 of
    (1, S, H, D), 2 of (1, H, S, D)), which may be a symbolic length; else None."""
    dims = shape_dims(expr)
    if dims is None or len(dims) != 4 or any(not isinstance(d, int) for a, d in enumerate(dims) if a != axis):
        return None
    return dims if isinstance(dims[axis], (int, tirx.Var)) else None


def _heads_box(expr, values):
    """(y, h0, h1, d0, d1, the slice's variable, the transpose's variable) of
    permute_dims(strided_slice(y, ...), [0, 2, 1, 3]) over a static rank-4 y, else None."""
    permute = values.get(expr)
    if op_name(permute) != "relax.permute_dims" or [int(a) for a in permute.attrs.axes or ()] != HEADS_FIRST:
        return None
    box = slice_bounds(values.get(permute.args[0]))
    return None if box is None else (*box, permute.args[0], expr)


def slice_bounds(call):
    """(y, h0, h1, d0, d1) of a unit-step strided_slice of a static (1, S, H, D) y along its head
    and dim axes only, else None."""
    if op_name(call) != "relax.strided_slice":
        return None
    shape, out, fields = positions_dims(call.args[0], 1), positions_dims(call, 1), _slice_fields(call)
    if shape is None or out is None or fields is None or len(shape) != 4:
        return None
    axes, begins, steps = [a % 4 for a in fields[0]], fields[1], fields[3]
    if not set(axes) <= {2, 3} or any(step != 1 for step in steps):
        return None
    start = {axis: (b + shape[axis] if b < 0 else b) for axis, b in zip(axes, begins)}
    h0, d0 = start.get(2, 0), start.get(3, 0)
    return call.args[0], h0, h0 + out[2], d0, d0 + out[3]


def slice_box(call):
    """The numpy index (heads, dims) of the places a slice of y4 reads, else None."""
    bounds = slice_bounds(call)
    return None if bounds is None else (slice(bounds[1], bounds[2]), slice(bounds[3], bounds[4]))


def _slice_fields(call):
    """(axes, begins, ends, steps) of a strided_slice with constant bounds, else None."""
    args = list(call.args[1:])
    if len(args) < 3 or not all(isinstance(a, relax.Tuple) for a in args[:3]):
        return None
    ints = [[int(getattr(f, "value", f)) for f in a.fields] for a in args[:3]]
    steps = [int(getattr(f, "value", f)) for f in args[3].fields] if len(args) > 3 and \
        isinstance(args[3], relax.Tuple) else [1] * len(ints[0])
    return ints[0], ints[1], ints[2], steps
