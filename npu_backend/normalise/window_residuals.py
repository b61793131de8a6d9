"""A residual add after a window reverse runs in window order, in the GEMM before the reverse.

Stage: normalise (before norm_folds.py). In: a Relax IRModule. Out: the same module in which

- `add(x, reverse(o))`, `reverse` a chain of reshapes around one permute_dims that moves whole
  rows of `o`'s last axis (Swin's window reverse of its attention output projection), is
  `reverse(add(o, partition(x)))`, `partition` the permute_dims back: `partition(x)`'s rows in
  `o`'s order (checked on the index map, not assumed);
- `partition(layer_norm(x))` (Swin's window partition of its pre-attention norm), `x` the one
  partitioned above, is `layer_norm(partition(x))`: the norm works row by row, and the
  partitioned copy is made once, for the norm and the residual.

Exact: transposes and reshapes only move elements, a layer norm over the last axis reads and
writes one row, an add is elementwise, so every sum is the same two float32 values added. Why:
Swin's block is `x + reverse(o_proj(attention(partition(norm(x)))))`; the reverse stood between
the output projection and the residual add, so the add was a kernel of its own (2.5 k and 1.4 k
of the 131 k cycles of tests/transformer_models.py's Swin at 64 x 64 on cgra-8x8) reading and
writing the residual stream once more; rewritten, it is the projection GEMM's epilogue, and the
copies stay two per block (the partition now of `x` instead of its norm, the reverse).
A shifted window's roll is no such chain: those blocks keep their add.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims, type_of
from .norm_folds import _Uses
from .rewrite import as_pass, op_name, replace_functions

_LAYOUT = ("relax.reshape", "relax.permute_dims")


def _is_link(value) -> bool:
    """Whether `value` moves elements only: a reshape, a transpose or a pad of zero widths (Swin's
    to a multiple of a window that divides the map, removed later by no_op_pads.py)."""
    name = op_name(value)
    return name in _LAYOUT or (name == "relax.nn.pad" and not any(int(w) for w in value.attrs.pad_width))


def window_residuals(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with residual adds after a row-moving transpose chain added before it."""
    return replace_functions(mod, _rewrite_function)


window_residuals_pass = as_pass(window_residuals, "cgra.WindowResiduals", ops=("relax.permute_dims",))


def _rewrite_function(func: relax.Function):
    """`func` with every such residual add moved, or None when none is."""
    uses = _Uses(func)
    edits = Edits()
    partitioned = {}  # x -> (partition(x) var, its row order)
    for var, value in uses.values.items():
        if op_name(value) == "relax.add":
            _residual_add(uses, var, value, edits, partitioned)
    if not partitioned:
        return None
    for var, value in uses.values.items():
        if op_name(value) == "relax.permute_dims":
            _partitioned_norm(uses, var, value, edits, partitioned)
    return edits.rebuilt(func)


class Edits:
    """Bindings to insert before or after a binding, and bindings' new values."""

    def __init__(self):
        self.before, self.after, self.replace = {}, {}, {}

    def rebuilt(self, func: relax.Function) -> relax.Function:
        """`func` with the edits made."""
        blocks = []
        for block in func.body.blocks:
            bindings = []
            for binding in block.bindings:
                var = binding.var
                bindings += [relax.VarBinding(v, e) for v, e in self.before.get(var, ())]
                bindings.append(relax.VarBinding(var, self.replace[var]) if var in self.replace else binding)
                bindings += [relax.VarBinding(v, e) for v, e in self.after.get(var, ())]
            blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                          else relax.BindingBlock(bindings))
        body = relax.SeqExpr(blocks, func.body.body)
        return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)


def _chain(uses: _Uses, var):
    """(source, [(var, value), ...] in order) of the reshapes and transposes ending at `var`,
    each read only by the next (the last by its one reader), or None."""
    links = []
    while _is_link(uses.values.get(var)):
        if len(uses.only(var) or ()) != 1:
            return None
        links.append((var, uses.values[var]))
        var = links[-1][1].args[0]
        if not isinstance(var, relax.Var):
            return None
    return var, links[::-1]


def row_order(source_shape, links, channels: int):
    """The source row of each row of the chain's result, rows being `channels` long, or None
    when the chain moves elements inside a row."""
    index = np.arange(math.prod(source_shape)).reshape(source_shape)
    for _, value in links:
        if op_name(value) == "relax.permute_dims":
            given = value.attrs.axes
            index = index.transpose(None if given is None else [int(a) for a in given])
        elif op_name(value) == "relax.reshape":
            index = index.reshape(shape_dims(value))
    if index.size % channels:
        return None
    rows = index.reshape(-1, channels)
    if (rows[:, 0] % channels).any() or not (rows == rows[:, :1] + np.arange(channels)).all():
        return None
    return rows[:, 0] // channels


def _static(expr):
    dims = shape_dims(expr)
    return tuple(dims) if dims and all(isinstance(d, int) for d in dims) else None


def _residual_add(uses: _Uses, var, add, edits: Edits, partitioned: dict) -> None:
    """Record the rewrite of `var = add(x, reverse(o))` in `edits` where it applies."""
    for moved, other in ((add.args[1], add.args[0]), (add.args[0], add.args[1])):
        if not isinstance(moved, relax.Var) or not isinstance(other, relax.Var) or other not in uses.values:
            continue
        found = _chain(uses, moved)
        shape, source = _static(add), found and found[0]
        if found is None or len(found[1]) < 2 or shape is None or _static(other) != shape or \
                _static(moved) != shape or dtype_of(source) != dtype_of(other) or _static(source) is None:
            continue
        links = found[1]
        permutes = [v for _, v in links if op_name(v) == "relax.permute_dims"]
        channels = shape[-1]
        order = row_order(_static(source), links, channels)
        if len(permutes) != 1 or _static(source)[-1] != channels or order is None or \
                not _precedes(uses, other, links[0][0]):
            continue
        part = _partition(other, permutes[0], _static(source), order, channels, partitioned)
        if part is None:
            continue
        total = fresh_var(links[0][0], "window", relax.op.add(source, part))
        edits.before.setdefault(links[0][0], []).append((total, relax.op.add(source, part)))
        first_var, first = links[0]
        edits.replace[first_var] = relax.Call(first.op, [total] + list(first.args[1:]), first.attrs)
        last = links[-1][1]
        edits.replace[var] = relax.Call(last.op, list(last.args), last.attrs)
        partitioned_var = partitioned[other][0]
        if partitioned[other][2] is not None:
            edits.after.setdefault(other, []).extend(partitioned[other][2])
            partitioned[other] = (partitioned_var, partitioned[other][1], None)
        return


def _precedes(uses: _Uses, first, second) -> bool:
    """Whether `first` is bound before `second` (the partition of `x` is added before the add)."""
    order = list(uses.values)
    return order.index(first) < order.index(second)


def _partition(x, permute, source_shape, order, channels, partitioned: dict):
    """partition(x)'s variable: x's rows in the source's order (the inverse of `permute`'s
    chain), its bindings queued in `partitioned`; None when the inverse does not say so."""
    if x in partitioned:
        return partitioned[x][0] if np.array_equal(partitioned[x][1][order], np.arange(len(order))) else None
    axes = [int(a) for a in permute.attrs.axes]
    inverse = [axes.index(i) for i in range(len(axes))]
    out_shape = _static(permute)
    part_order = _order_of(_static(x), [out_shape, inverse, source_shape], channels)
    if part_order is None or not np.array_equal(part_order[order], np.arange(len(order))):
        return None
    names = ("window_view", "window_moved", "window_rows")
    bindings, value = [], x
    for name, step in zip(names, (lambda v: relax.op.reshape(v, out_shape),
                                  lambda v: relax.op.permute_dims(v, inverse),
                                  lambda v: relax.op.reshape(v, source_shape))):
        call = step(value)
        value = fresh_var(x, name, call)
        bindings.append((value, call))
    partitioned[x] = (value, part_order, bindings)
    return value


def _order_of(shape, steps, channels: int):
    """row_order of reshape(out_shape), permute_dims(axes), reshape(rows_shape) of `shape`."""
    index = np.arange(math.prod(shape)).reshape(shape).reshape(steps[0]).transpose(steps[1]).reshape(steps[2])
    rows = index.reshape(-1, channels)
    if (rows[:, 0] % channels).any() or not (rows == rows[:, :1] + np.arange(channels)).all():
        return None
    return rows[:, 0] // channels


def _partitioned_norm(uses: _Uses, var, permute, edits: Edits, partitioned: dict) -> None:
    """Record `var = layer_norm(partition(x))` for `var = partition(layer_norm(x))`."""
    found = _chain(uses, permute.args[0]) if isinstance(permute.args[0], relax.Var) else None
    if found is None or var in edits.replace:
        return
    norm_var, links = found
    norm = uses.values.get(norm_var)
    if op_name(norm) != "relax.nn.layer_norm" or len(uses.only(norm_var) or ()) != 1 or \
            norm.args[0] not in partitioned:
        return
    rank = len(shape_dims(norm))
    if [int(a) % rank for a in norm.attrs.axes] != [rank - 1]:
        return
    part, part_order, _ = partitioned[norm.args[0]]
    channels, shape = _static(norm)[-1], _static(permute)
    order = row_order(_static(norm), links + [(var, permute)], channels)
    if shape is None or shape[-1] != channels or order is None or not np.array_equal(order, part_order):
        return
    attrs = norm.attrs
    call = relax.op.nn.layer_norm(part, norm.args[1], norm.args[2], axes=[-1], epsilon=float(attrs.epsilon),
                                  center=bool(attrs.center), scale=bool(attrs.scale))
    normed = fresh_var(var, "window_norm", call)
    edits.before.setdefault(var, []).append((normed, call))
    edits.replace[var] = relax.op.reshape(normed, shape)


def fresh_var(like, suffix: str, call):
    """A variable of `like`'s kind (dataflow or not) typed as `call`'s result."""
    var_class = relax.DataflowVar if isinstance(like, relax.DataflowVar) else relax.Var
    return var_class(f"{like.name}_{suffix}", type_of(relax.BlockBuilder().normalize(call)))
