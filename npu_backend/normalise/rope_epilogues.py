"""RoPE of the q and k heads of one projection as that projection's epilogue.

Stage: normalise (last: after qkv_merges.py, split_slices.py, rotations.py, rotary_pairs.py).
In: a Relax IRModule. Out: the same module in which the rotary units over the heads of one
linear's output, y4 = reshape(Y) (1, S, H, D), Y = [add(b)](matmul(x, permute_dims(W))) (S, N),

    U = add(multiply(P, C), multiply(concat((P[..., h:], P[..., :h]), -1), S))    (either order)
    P = permute_dims(strided_slice(y4, heads h0:h1 [, dims d0:d0 + r]), [0, 2, 1, 3])
    unit = U, or concat((U, permute_dims(strided_slice(y4, h0:h1, d0 + r:d1))), -1)  (partial rotary)

(rotations.py has folded rotate_half's negation into S; C and S one (S, r) table for every head)
become one op over Y and views of it:

    Y' = add(multiply(Y, C'), multiply(take(Y, perm, axis=1), S'))                  (S, N)
    y4 = reshape(Y');  unit = permute_dims(strided_slice(y4, h0:h1, d0:d1), [0, 2, 1, 3])

perm: a rotated column's partner (d0 + (c + h) mod r of its head), C', S': the tables there.
Every other column gets C' = 1, S' = 0 and the same partner as the column of a rotated head at
its place (the heads alike: the partners repeat every D columns, so a GEMM tile of whole heads
holds them all), or, when the units differ but rotate the same dims of blocks of p columns
(GPT-NeoX's q, k and v of a head, 16 columns each, the first 8 rotated: p = 8), as the column
at its place in a rotated block (the partners repeat every p columns: the GEMM's column tiles
may be p wide), else itself. kernels/gemm/rope_epilogue.py runs Y' as the linear's epilogue and
the attention kernel reads the units as boxes of y4.

When C', S' and the partners repeat every W < N columns (GPT-NeoX's heads alike: W = 3 D, 48 of
192), C' and S' are compact (S, W) tables whose columns a take repeats,
take(C, arange(N) mod W, axis=1): the kernel holds them once per row tile instead of loading
a tile of each per output tile (NeoX's q / k / v at 32 tokens on cgra-8x8: 49,152 bytes of
tables, now 12,288).

At a symbolic length (y4 (1, s, H, D), the units' tables views of the first s rows of tables for
the bound: rope_units.py) C' and S' are views of the first s rows of (bound, N) tables, which the
GEMM's epilogue loads like a residual, its last tile cut to the rows that exist (lower/ragged.py).

Exact: a rotated element is the same two products and add (x * cos + partner * sin, in that
order); any other is x * 1 + partner * 0, which is x for finite values (an infinite or NaN partner
makes it NaN; -0 reads +0).
Why: q's and k's RoPE kernels (Llama at 32 tokens on cgra-8x8: 2,240 + 1,456 cycles a layer)
each read and wrote their heads once more through DRAM.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import shape_dims
from .rewrite import as_pass, bound_values, op_name, rewrite_functions
from .rope_units import positions_dims, rope_unit, slice_box
from .rotary_pairs import layout_constant


def rope_epilogues(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with the rotary units over each projection as its epilogue (module doc)."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _EpilogueRewriter))


rope_epilogues_pass = as_pass(rope_epilogues, "cgra.RopeEpilogues", ops=("relax.concat",))


class _Group:
    """The units over the views of one projection's output (one y4, or one per part after
    split_slices.py, Phi-3's): its linear output Y, the tables and partners of Y'."""

    def __init__(self, linear_out, shape, tables):
        self.linear_out, self.shape = linear_out, shape
        self.cos, self.sin, self.perm = tables


@relax.expr_functor.mutator
class _EpilogueRewriter(relax.PyExprMutator):
    def __init__(self, mod=None):
        super().__init__(mod)
        self.groups, self.view_of, self.unit_of = {}, {}, {}  # key -> _Group; view -> key; unit -> unit
        self.emitted = {}  # key -> Y', emitted at the first view's binding
        for func in (mod.functions.values() if mod is not None else ()):
            if isinstance(func, relax.Function) and "Composite" not in (func.attrs or {}):
                self._scan(func)

    def _scan(self, func):
        values, uses = bound_values(func)
        by_key = {}
        for var, value in values.items():
            unit = rope_unit(var, value, values)
            key = _view_key(unit["y"], values) if unit is not None else None
            if key is not None:
                by_key.setdefault(key, []).append(unit)
        for key, units in by_key.items():
            views = [v for v in uses.get(key[0], ()) if _view_key(v, values) == key]
            group = _group(key, views, units, values, uses)
            if group is not None:
                self.groups[key] = group
                self.view_of.update({view: key for view in views})
                self.unit_of.update({unit["var"]: unit for unit in units})

    def visit_var_binding_(self, binding):
        if binding.var in self.view_of:
            key = self.view_of[binding.var]
            if key not in self.emitted:
                self.emitted[key] = self._emit_rotated(self.groups[key])
            value = relax.op.reshape(self.emitted[key], self.groups[key].shape)
        elif binding.var in self.unit_of:
            unit = self.unit_of[binding.var]
            box = relax.op.strided_slice(self.visit_expr(unit["y"]), [2, 3], [unit["h0"], unit["d0"]],
                                         [unit["h1"], unit["d1"]])
            value = relax.op.permute_dims(self.builder_.emit(box), [0, 2, 1, 3])
        else:
            super().visit_var_binding_(binding)
            return
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))

    def _emit_rotated(self, group):
        """Y' = Y * C' + take(Y, perm) * S' (module doc), emitted."""
        emit = self.builder_.emit
        y = self.visit_expr(group.linear_out)
        turned = emit(relax.op.take(y, relax.const(group.perm), axis=1))
        dims = shape_dims(y)
        width = table_period(group, dims[1]) if isinstance(dims[0], int) else dims[1]
        if width < dims[1] and width % COLUMN_TILE_STEP == 0:  # compact tables, columns repeated (module doc)
            cols = relax.const(np.arange(dims[1]) % width)
            cos, sin = (emit(relax.op.take(relax.const(np.ascontiguousarray(table[:, :width])), cols, axis=1))
                        for table in (group.cos, group.sin))
        else:
            cos, sin = (_rows_of(table, dims) for table in (group.cos, group.sin))
        return emit(relax.op.add(emit(relax.op.multiply(y, cos)), emit(relax.op.multiply(turned, sin))))


#: Compact tables only of a multiple of this many columns: the kernel's column tiles must divide
#: them, and a tile is a multiple of the PE array's columns (16 on the largest preset); others
#: keep whole tables.
COLUMN_TILE_STEP = 16


def table_period(group, n: int) -> int:
    """The fewest columns W dividing n after which C', S' and the partners' offsets repeat
    (GPT-NeoX: a head's q, k and v), n when they do not."""
    offsets = group.perm - np.arange(n)
    for width in (w for w in range(1, n) if n % w == 0):
        if all((t.reshape(len(t), n // width, width) == t[:, None, :width]).all() for t in (group.cos, group.sin)) \
                and (offsets.reshape(-1, width) == offsets[:width]).all():
            return width
    return n


def _view_key(y4, values):
    """(the tensor y4 is a reshape of, y4's shape) for a (1, S, H, D) view, S static or a
    symbolic length, else None."""
    value, shape = values.get(y4), positions_dims(y4, 1)
    if op_name(value) != "relax.reshape" or shape is None or shape[0] != 1:
        return None
    return value.args[0], tuple(shape)


def _rows_of(table, dims):
    """A (positions, N) table as the operand of an (S, N) product: the constant, or at a
    symbolic length S the view of its first S rows (rope_units.py)."""
    if isinstance(dims[0], int):
        return relax.const(table)
    return relax.op.memory.view(relax.const(table), relax.ShapeExpr(list(dims)), "float32",
                                tvm.tirx.IntImm("int64", 0))


def _group(key, views, units, values, uses):
    """The _Group of the units over `views` (reshapes of key[0] to key[1]), or None when they
    are no views of a static linear's output read only by the units and by slices clear of
    their rotated columns."""
    source, shape = key
    linear_out = _linear_out(source, values, uses)
    if linear_out is None or set(uses.get(source, ())) != set(views):
        return None
    heads, width = shape[2], shape[3]
    rotated = np.zeros((heads, width), bool)
    for unit in units:
        rotated[unit["h0"]:unit["h1"], unit["d0"]:unit["d0"] + unit["r"]] = True
    read = set().union(*(unit["reads"] for unit in units))
    for reader in (r for view in views for r in uses.get(view, ())):
        if reader not in read and not _clear_of(values.get(reader), rotated):
            return None
    for unit in units:  # nothing else reads a unit's pieces (they would read the rotated y4)
        if any(reader not in unit["inner"] for var in unit["inner"] - {unit["var"]} for reader in uses.get(var, ())):
            return None
    positions = shape[1] if isinstance(shape[1], int) else min(len(unit["cos"]) for unit in units)
    tables = _tables(units, positions, heads, width)
    return None if tables is None else _Group(linear_out, shape, tables)


def _tables(units, positions, heads, width):
    """(C', S', perm) of Y' (module doc), or None when two units overlap or disagree on a table."""
    cos = np.ones((positions, heads, width), np.float32)
    sin = np.zeros((positions, heads, width), np.float32)
    local = np.tile(np.arange(width), (heads, 1))
    alike = len({(u["d0"], u["r"], u["half"]) for u in units}) == 1
    block = None if alike else _sub_period(units, width)
    if block is not None:  # every block of a head partnered as its rotated blocks are (module doc)
        d0, r, half = units[0]["d0"] % block, units[0]["r"], units[0]["half"]
        for start in range(0, width, block):
            local[:, start + d0:start + d0 + r] = start + d0 + (np.arange(r) + half) % r
    for unit in units:
        d0, r, half = unit["d0"], unit["r"], unit["half"]
        turned = d0 + (np.arange(r) + half) % r
        for head in (range(heads) if alike else range(unit["h0"], unit["h1"])) if block is None else ():
            local[head, d0:d0 + r] = turned
        cos[:, unit["h0"]:unit["h1"], d0:d0 + r] = unit["cos"][:positions, None, :]
        sin[:, unit["h0"]:unit["h1"], d0:d0 + r] = unit["sin"][:positions, None, :]
    perm = (local + np.arange(heads)[:, None] * width).reshape(-1)
    return cos.reshape(positions, -1), sin.reshape(positions, -1), perm.astype(np.int64)


def _sub_period(units, width):
    """The fewest columns p dividing a head's width in which every unit rotates the same dims,
    (d0 mod p, r, half) alike and inside the block (GPT-NeoX's q, k, v of a head, 16 columns
    each, q's and k's first 8 rotated: 8), else None."""
    for p in range(max(u["r"] for u in units), width + 1):
        keys = {(u["d0"] % p, u["r"], u["half"]) for u in units}
        if width % p == 0 and len(keys) == 1 and sum(next(iter(keys))[:2]) <= p:
            return p
    return None


def _clear_of(call, rotated) -> bool:
    """Whether a reader of y4 is a slice that reads none of its rotated (head, dim) places."""
    box = slice_box(call)
    if box is None:
        return False
    return not rotated[box].any()


def _linear_out(source, values, uses):
    """The (S, N) output of the float32 linear [+ bias] `source` is (a view of it through
    reshapes each read once), else None."""
    var = source
    while op_name(values.get(var)) == "relax.reshape":
        var = values[var].args[0]
        if len(uses.get(var, ())) != 1:
            return None
    value = values.get(var)
    dims = shape_dims(var) or ()
    if len(dims) != 2 or not isinstance(dims[1], int):
        return None
    if op_name(value) == "relax.add":
        inner = [a for a in value.args if op_name(values.get(a)) == "relax.matmul" and len(uses.get(a, ())) == 1]
        if len(inner) != 1 or not any(isinstance(a, tvm.ir.GenericConst) for a in value.args):
            return None
        value = values[inner[0]]
    if op_name(value) != "relax.matmul" or op_name(values.get(value.args[1])) != "relax.permute_dims" \
            or layout_constant(values[value.args[1]].args[0], values) is None:
        return None
    return var
