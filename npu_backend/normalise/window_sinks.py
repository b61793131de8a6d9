"""A row permutation before row-by-row work moves after it, next to the copy that follows.

Stage: normalise (after window_residuals.py, before window_stems.py). In: a Relax IRModule. Out:
the same module in which `r = rows(u)`, `rows` a chain of reshapes and transposes moving whole
rows of `u` (Swin's window reverse), read only by row-by-row work (row_wise.py: its MLP's norm,
linears, GELU and the residual add of two such values) whose one result `e` is read only by
reshapes and transposes (the patch merging's), is `r = u` seen in `r`'s shape and `e = rows(e')`,
`e'` the same work on the rows in `u`'s order.

Exact: each row is computed from the same row, the chain only moves rows. Why: Swin's first
stage reverses its windows before the MLP and merges patches after it, two copies of the whole
map with the MLP between; moved after the MLP the reverse stands next to the merge, and
window_stems.py composes the two (and more) into one copy.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from .norm_folds import _Uses
from .rewrite import as_pass, op_name, replace_functions
from .row_wise import row_operand
from .window_residuals import Edits, _chain, _is_link, _static, fresh_var, row_order
from .window_stems import _forward, _moved, as_one_transpose


def window_sinks(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with row permutations moved after the row-by-row work that reads them."""
    return replace_functions(mod, _rewrite_function)


window_sinks_pass = as_pass(window_sinks, "cgra.WindowSinks", ops=("relax.permute_dims",))


def _rewrite_function(func: relax.Function):
    """`func` with every such permutation moved, or None when none is."""
    uses, edits = _Uses(func), Edits()
    for var, value in uses.values.items():
        if op_name(value) == "relax.permute_dims" and not set(edits.replace) & set(uses.values):
            _sink(uses, var, value, edits)
    if not edits.replace:
        return None
    return relax.analysis.remove_all_unused(edits.rebuilt(func))


def _sink(uses: _Uses, var, permute, edits: Edits) -> None:
    """Record the rewrite of the chain through `var = permute` in `edits` where it applies."""
    back = _chain(uses, var)
    if back is None:
        return
    source, links = back
    links = links + _forward(uses, var)
    end = links[-1][0]
    shapes = [_static(source), _static(end)]
    if any(s is None for s in shapes) or shapes[0][-1] != shapes[1][-1] or \
            row_order(shapes[0], links, shapes[0][-1]) is None:
        return
    exit_var = _region_exit(uses, end)
    exit_shape = exit_var is not None and _static(exit_var)
    if not exit_shape or exit_shape[-1] != shapes[1][-1] or math.prod(exit_shape) != math.prod(shapes[1]):
        return
    after = _forward(uses, exit_var)
    last = max((i for i, (_, v) in enumerate(after) if op_name(v) == "relax.permute_dims"), default=None)
    if last is None:
        return
    after = after[:last + 1]
    target, target_shape = after[-1][0], _static(after[-1][0])
    index = _moved(shapes[0], links).reshape(exit_shape)
    one = target_shape and as_one_transpose(_moved(exit_shape, after, index))
    if not one:
        return
    window = fresh_var(exit_var, "window", uses.values[exit_var])
    view = fresh_var(target, "one_view", relax.op.reshape(window, one[0]))
    moved = fresh_var(target, "one_moved", relax.op.permute_dims(view, one[1]))
    edits.replace[end] = relax.op.reshape(source, shapes[1])
    edits.before[target] = [(window, uses.values[exit_var]), (view, relax.op.reshape(window, one[0])),
                            (moved, relax.op.permute_dims(view, one[1]))]
    edits.replace[target] = relax.op.reshape(moved, target_shape)


def _region_exit(uses: _Uses, start):
    """The one value of the row-by-row work reading `start` (transitively) that something else
    reads, when all that reads it is reshapes and transposes; else None."""
    region, queue, exits, pairs = {start}, [start], set(), []
    while queue:
        var = queue.pop()
        if var in uses.elsewhere:
            return None
        for reader, value in uses.users.get(var, []):
            if reader in region:
                continue
            if op_name(value) == "relax.add" and all(isinstance(a, relax.Var) and a in uses.values for a in value.args):
                pairs.append(value)
            elif not var.same_as(row_operand(value, uses.values)):
                exits.add(var)
                continue
            region.add(reader)
            queue.append(reader)
    if any(not all(a in region for a in value.args) for value in pairs) or len(exits) != 1:
        return None
    exit_var, = exits
    readers = uses.only(exit_var)
    if exit_var.same_as(start) or not readers or any(reader in region or not _is_link(value) for reader, value in readers):
        return None
    return exit_var
