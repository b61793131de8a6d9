"""GPT-J's interleaved rotary (rotate_every_two) as the half rotary the RoPE kernel runs, by
de-interleaving the rotated dims in the q and k projection's weights.

Stage: normalise (after qkv_merges.py, split_slices.py and rotations.py). In: a Relax IRModule.
Out: the same module in which every

    permute_dims(concat((U, y[:, :, h0:h1, r:D]), -1), [0, 2, 1, 3])            (the pass part optional)
    U = add(multiply(y[:, :, h0:h1, :r], C), multiply(reshape(concat((expand_dims(y[..., 1:r:2]),
            expand_dims(y[..., 0:r:2])), -1)), S))                              (HF's rotate_every_two)

over y = reshape(linear(x, W, b), (1, S, H, D)) (a constant W, the merged q / k / v projection) is,
with the r rotated dims of every such head reordered in W and b (evens first, then odds: perm),

    x = permute_dims(y[:, :, h0:h1, :r]);  x * C' + concat((x[..., r/2:], x[..., :r/2])) * S'
    then concat with permute_dims(y[:, :, h0:h1, r:D])                          C' = C[..., perm]

GPT-NeoX's form, which kernels/elementwise/rope.py runs as one kernel. Every rotated element is the
same two products and add as before (pair i: dims 2i, 2i + 1 are now i, r/2 + i). q and k are
reordered alike, so every score q . k is the same sum in another order (within float32 rounding,
not bit for bit); V's heads and the pass dims keep their places. Only when at least two rotary
units (q and k) read y and nothing else reads the rotated dims of their heads.
At a symbolic length S (y (1, s, H, D)) C and S are views of the first s rows of (bound, r) tables
(position_tables.tabulate_prefix's memory.view, through reshapes): C' and S' are then views of those
tables with their columns reordered, which rope_epilogues.py reads as it reads Llama's.
Why: GPT-J's rotary was 8 multiply kernels, 8 concats, 16 slices, 4 broadcasts and 4 adds for 2
layers (about 25 k of its 135 k cycles at 32 tokens on cgra-8x8).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import shape_dims, static_shape
from .rewrite import as_pass, bound_values, op_name, rewrite_functions


def rotary_pairs_rewritten(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with GPT-J's interleaved rotaries as half rotaries over reordered weights (module doc)."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _PairsRewriter))


rotary_pairs_pass = as_pass(rotary_pairs_rewritten, "cgra.RotaryPairs", ops=("relax.concat",))


@relax.expr_functor.mutator
class _PairsRewriter(relax.PyExprMutator):
    def __init__(self, mod=None):
        super().__init__(mod)
        self.units, self.heads = {}, {}  # permute var -> unit; y var -> (linear parts, rotated heads, r)
        for func in (mod.functions.values() if mod is not None else ()):
            if isinstance(func, relax.Function) and "Composite" not in (func.attrs or {}):
                self._scan(func)

    def _scan(self, func):
        values, uses = bound_values(func)
        by_y = {}
        for var, value in values.items():
            unit = _unit(var, value, values)
            if unit is not None:
                by_y.setdefault(unit["y"], []).append(unit)
        for y, units in by_y.items():
            linear = _linear(y, values, uses)
            if linear is None or len(units) < 2 or len({u["r"] for u in units}) != 1:
                continue
            heads = set().union(*(range(u["h0"], u["h1"]) for u in units))
            read = set().union(*(u["reads"] for u in units))
            r = units[0]["r"]
            if any(not _clear_of(values.get(v), heads, r) for v in uses.get(y, ()) if v not in read):
                continue
            self.heads[y] = (linear, sorted(heads), r)
            self.units.update({u["var"]: u for u in units})

    def visit_var_binding_(self, binding):
        if binding.var in self.heads:
            self._bind(binding.var, self._reordered(binding.var))
        elif binding.var in self.units:
            self._bind(binding.var, self._half_rotary(self.units[binding.var]))
        else:
            super().visit_var_binding_(binding)

    def _bind(self, var, value):
        self.builder_.emit_normalized(relax.VarBinding(var, self.builder_.normalize(value)))

    def _reordered(self, y):
        """y over the linear with each rotated head's first r outputs reordered (evens, odds)."""
        (flat, weights, bias), heads, r = self.heads[y]
        d = _dims(y)[-1]
        order = np.arange(weights.shape[0])
        for h in heads:
            order[h * d:h * d + r] = h * d + _perm(r)
        emit = self.builder_.emit
        out = emit(relax.op.matmul(self.visit_expr(flat), emit(relax.op.permute_dims(relax.const(weights[order]))),
                                   out_dtype="float32"))
        if bias is not None:
            out = emit(relax.op.add(out, relax.const(bias[order])))
        return relax.op.reshape(out, relax.ShapeExpr(_dims(y)))

    def _half_rotary(self, unit):
        """GPT-NeoX's form of one unit, heads first (module doc)."""
        emit, y = self.builder_.emit, self.visit_expr(unit["y"])
        h0, h1, r, d = unit["h0"], unit["h1"], unit["r"], _dims(unit["y"])[-1]

        def part(begin, end):
            return emit(relax.op.permute_dims(emit(relax.op.strided_slice(y, [2, 3], [h0, begin], [h1, end])),
                                              [0, 2, 1, 3]))

        x = part(0, r)
        halves = [emit(relax.op.strided_slice(x, [3], [b], [e])) for b, e in ((r // 2, r), (0, r // 2))]
        turned = emit(relax.op.concat(halves, axis=-1))
        rope = relax.op.add(emit(relax.op.multiply(x, _table_expr(unit["cos"], unit["y"]))),
                            emit(relax.op.multiply(turned, _table_expr(unit["sin"], unit["y"]))))
        return rope if r == d else relax.op.concat([emit(rope), part(r, d)], axis=-1)


def _table_expr(table, y):
    """A (1, 1, S, r) constant, or at a symbolic length (a (bound, r) table) the view of its
    first s rows (y (1, s, H, D))."""
    if table.ndim == 4:
        return relax.const(table)
    shape = relax.ShapeExpr([1, 1, _dims(y)[1], table.shape[-1]])
    return relax.op.memory.view(relax.const(table), shape, "float32", tvm.tirx.IntImm("int64", 0))


def _dims(expr):
    """The shape of `expr`, every axis static but axis 1 (the positions), which may be a symbolic
    length; else None."""
    dims = shape_dims(expr)
    if dims is None or any(not isinstance(d, int) for a, d in enumerate(dims) if a != 1):
        return None
    return dims


def _perm(r: int) -> np.ndarray:
    return np.concatenate([np.arange(0, r, 2), np.arange(1, r, 2)])


def _unit(var, value, values):
    """The rotary unit a permute_dims(concat((U, pass))) bound to `var` is, else None."""
    if op_name(value) != "relax.permute_dims" or [int(a) for a in value.attrs.axes or ()] != [0, 2, 1, 3]:
        return None
    inner = values.get(value.args[0])
    parts = list(inner.args[0].fields) if op_name(inner) == "relax.concat" else [value.args[0]]
    if op_name(inner) == "relax.concat" and int(inner.attrs.axis) not in (-1, 3):
        return None
    found = _rotated(values.get(parts[0]), values)
    if found is None or len(parts) > 2:
        return None
    found.update(var=var)
    d = _dims(found["y"])[-1]
    if len(parts) == 2:
        rest = _box(values.get(parts[1]), values)
        if rest is None or not rest[0].same_as(found["y"]) or rest[1:] != (found["h0"], found["r"], found["h1"], d, 1):
            return None
        found["reads"].add(parts[1])
    elif found["r"] != d:
        return None
    return found


def _rotated(add, values):
    """{y, h0, h1, r, cos, sin, reads} of add(multiply(a, C), multiply(rotate_every_two(a), S)), else None."""
    if op_name(add) != "relax.add":
        return None
    for first, second in (add.args, reversed(add.args)):
        m1, m2 = values.get(first), values.get(second)
        if op_name(m1) != "relax.multiply" or op_name(m2) != "relax.multiply":
            continue
        for a, c in (m1.args, reversed(m1.args)):
            for t, s in (m2.args, reversed(m2.args)):
                found = _matched(a, c, t, s, values)
                if found is not None:
                    return found
    return None


def _matched(a, c, t, s, values):
    box = _box(values.get(a), values)
    if box is None or box[2] != 0 or box[5] != 1:
        return None
    y, h0, _, h1, r, _ = box
    shape = _dims(a)
    if shape is not None and not isinstance(shape[1], int):  # a symbolic length
        tables = [_prefix_table(e, values, shape) for e in (c, s)]
        if any(table is None for table in tables) or r % 2 or not _pairs_swapped(t, values, y, h0, h1, r):
            return None
        return _found(y, h0, h1, r, [table[:, _perm(r)].copy() for table in tables], a, t, values)
    cos, sin = layout_constant(c, values), layout_constant(s, values)
    if cos is None or sin is None or r % 2 or shape is None or not _pairs_swapped(t, values, y, h0, h1, r):
        return None
    tables = []
    for table in (cos, sin):
        try:
            full = np.broadcast_to(table, shape)
        except ValueError:
            return None
        if table.dtype != np.float32 or not (full == full[:, :, :1, :]).all():
            return None
        tables.append(np.ascontiguousarray(full[0, :, 0, :][:, _perm(r)]).reshape(1, 1, shape[1], r))
    return _found(y, h0, h1, r, tables, a, t, values)


def _found(y, h0, h1, r, tables, a, t, values):
    reads = {a}
    reshape = values.get(t)
    concat = values.get(reshape.args[0])
    reads |= {values[f].args[0] for f in concat.args[0].fields}
    return dict(y=y, h0=h0, h1=h1, r=r, cos=tables[0], sin=tables[1], reads=reads)


def _prefix_table(expr, values, shape):
    """The (bound, r) float32 table whose first s rows `expr` (a (1, s, 1, r) tensor, s the
    symbolic length of `shape` (1, s, h, r)) views: a memory.view at offset 0 of a constant,
    through reshapes; else None."""
    dims = shape_dims(expr)
    r = shape[-1]
    if dims is None or len(dims) != 4 or dims[0] != 1 or dims[2] != 1 or dims[3] != r \
            or isinstance(dims[1], int) or not dims[1].same_as(shape[1]):
        return None
    return viewed_table(expr, values, r)


def viewed_table(expr, values, width: int):
    """The (bound, width) float32 table `expr` views from its first row: a memory.view at offset 0
    of a constant, through up to three reshapes (position_tables.py's prefix views); else None."""
    for _ in range(4):
        value = values.get(expr)
        if op_name(value) == "relax.reshape":
            expr = value.args[0]
            continue
        if op_name(value) != "relax.memory.view" or not isinstance(value.args[0], tvm.ir.GenericConst):
            return None
        offset = value.args[3] if len(value.args) > 3 else 0
        while hasattr(offset, "value"):  # a PrimValue of an IntImm
            offset = offset.value
        table = value.args[0].value.numpy()
        if offset != 0 or table.dtype != np.float32 or table.size % width:
            return None
        return np.ascontiguousarray(table.reshape(-1, width))
    return None


def _pairs_swapped(t, values, y, h0, h1, r) -> bool:
    """Whether `t` is reshape(concat((expand_dims(y[.., 1:r:2]), expand_dims(y[.., 0:r:2])), -1))."""
    reshape = values.get(t)
    concat = values.get(reshape.args[0]) if op_name(reshape) == "relax.reshape" else None
    if op_name(concat) != "relax.concat" or len(concat.args[0].fields) != 2:
        return None
    starts = []
    for field in concat.args[0].fields:
        expand = values.get(field)
        if op_name(expand) != "relax.expand_dims" or [int(a) for a in expand.attrs.axis] not in ([4], [-1]):
            return False
        box = _box(values.get(expand.args[0]), values)
        if box is None or not box[0].same_as(y) or (box[1], box[3], box[5]) != (h0, h1, 2) or box[4] > r:
            return False
        starts.append(box[2])
    return starts == [1, 0] and _dims(t) is not None and _dims(t)[-1] == r


def _box(call, values):
    """(y, h0, d0, h1, d1, dim step) of strided_slice(y, [2, 3], ...) over a 4-D y with unit head
    steps, else None."""
    if op_name(call) != "relax.strided_slice" or len(call.args) < 4:
        return None
    y = call.args[0]
    shape, out = _dims(y), _dims(call)
    if shape is None or out is None or len(shape) != 4:
        return None
    fields = [[int(getattr(f, "value", f)) for f in a.fields] if isinstance(a, relax.Tuple) else None
              for a in call.args[1:5]] + [None] * max(0, 5 - len(call.args))
    axes, begin, _, steps = fields[:4]
    steps = steps or [1] * len(axes or ())
    if axes is None or begin is None or [a % 4 for a in axes] != [2, 3] or steps[0] != 1 or min(begin) < 0:
        return None
    return y, begin[0], begin[1], begin[0] + out[2], begin[1] + steps[1] * (out[3] - 1) + 1, steps[1]


def _clear_of(call, heads, r) -> bool:
    """Whether a slice of y reads none of the first r dims of `heads`."""
    if op_name(call) != "relax.strided_slice":
        return False
    shape = _dims(call.args[0])
    fields = [[int(getattr(f, "value", f)) for f in a.fields] for a in call.args[1:3]]
    bounds = {axis % 4: (b, b + n) for axis, b, n in zip(fields[0], fields[1], [0] * len(fields[0]))}
    out = _dims(call)
    if shape is None or out is None:
        return False
    h = (bounds[2][0], bounds[2][0] + out[2]) if 2 in bounds else (0, shape[2])
    d0 = bounds[3][0] if 3 in bounds else 0
    steps = [int(getattr(f, "value", f)) for f in call.args[4].fields] \
        if len(call.args) > 4 and isinstance(call.args[4], relax.Tuple) else [1]
    return all(s == 1 for s in steps) and (d0 >= r or not heads & set(range(*h)))


def _linear(y, values, uses):
    """((flat operand, W, b or None)) of y = reshape([add(b)](matmul(flat, permute_dims(W)))) read
    only through y, else None."""
    reshape = values.get(y)
    if op_name(reshape) != "relax.reshape" or len(uses.get(reshape.args[0], ())) != 1:
        return None
    value, bias = values.get(reshape.args[0]), None
    if op_name(value) == "relax.add":
        for m, b in (value.args, reversed(value.args)):
            if op_name(values.get(m)) == "relax.matmul" and isinstance(b, tvm.ir.GenericConst) \
                    and len(uses.get(m, ())) == 1:
                value, bias = values[m], b.value.numpy()
                break
        else:
            return None
    if op_name(value) != "relax.matmul":
        return None
    permute = values.get(value.args[1])
    if op_name(permute) != "relax.permute_dims" or not isinstance(permute.args[0], tvm.ir.GenericConst):
        return None
    weights = permute.args[0].value.numpy()
    if weights.ndim != 2 or (bias is not None and bias.shape != (weights.shape[0],)):
        return None
    return value.args[0], weights, bias


def layout_constant(expr, values, depth=0):
    """The numpy value of a constant or of expand_dims / broadcast_to / reshape of one, else None."""
    if isinstance(expr, tvm.ir.GenericConst):
        return expr.value.numpy()
    call = values.get(expr)
    shape = static_shape(expr)
    if depth > 8 or shape is None or op_name(call) not in ("relax.expand_dims", "relax.broadcast_to", "relax.reshape"):
        return None
    inner = layout_constant(call.args[0], values, depth + 1)
    if inner is None:
        return None
    return np.broadcast_to(inner, shape).copy() if op_name(call) == "relax.broadcast_to" else inner.reshape(shape)
