"""A row permutation after row-by-row work on a transposed tensor is one copy, the work after it.

Stage: normalise (after patch_merges.py and window_sinks.py; window_residuals.py has made Swin's
window partition read the norm of its patch embedding). In: a Relax IRModule. Out: the same
module in which

    p = rows(work(moved(s)))

`moved` a chain of reshapes and transposes (one at least) of `s`, `work` row-by-row calls
(row_wise.py: a layer norm, a linear, a bias add, ...) each read only by the next, `rows` a chain
of reshapes and transposes that moves whole rows of the work's result (checked on the index map),
is `p = work(one(s))`: `one` the two chains composed (`rows`' permutation of the rows of
`moved`'s result), written as a single reshape, transpose and reshape (`as_one_transpose`, found
on the index map and checked on every element).

Exact: each row of the work is computed from the same row, the chains only move elements. Why:
Swin's patch embedding is conv2d -> (C, HW) -> (HW, C) (a transposing copy), its layer norm,
then the first block's window partition (a second copy of the whole map): composed, the
partition is the strides of the stem's copy (5 axes: kernels/layout/folds.py), one copy instead
of two.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from ..relax_info import shape_dims
from .norm_folds import _Uses
from .rewrite import as_pass, op_name, replace_functions
from .row_wise import row_operand
from .window_residuals import Edits, _chain, _is_link, _static, fresh_var, row_order

#: The most axes a layout copy walks (kernels/layout/folds.py's MAX_AXES; normalise imports no kernels).
MAX_AXES = 8



def window_stems(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every row permutation of a norm of a transposed tensor composed into one copy."""
    return replace_functions(mod, _rewrite_function)


window_stems_pass = as_pass(window_stems, "cgra.WindowStems", ops=("relax.permute_dims",))


def _rewrite_function(func: relax.Function):
    """`func` with every such chain composed, or None when none is."""
    uses, edits = _Uses(func), Edits()
    for var, value in uses.values.items():
        if op_name(value) == "relax.permute_dims":
            _compose(uses, var, edits)
    return edits.rebuilt(func) if edits.replace else None


def _forward(uses: _Uses, var) -> list:
    """[(var, value), ...]: the links after `var`, each the one reader of the one before."""
    links = []
    while True:
        readers = uses.only(var)
        if not readers or len(readers) != 1 or not _is_link(readers[0][1]):
            return links
        links.append(readers[0])
        var = readers[0][0]


def _work_before(uses: _Uses, x):
    """(the chain `moved` with a transpose whose end the row-by-row work ending at `x` reads, as
    window_residuals._chain gives it), or None: each value of the work read once, by the next."""
    var = x
    while True:
        value = uses.values.get(var)
        if _is_link(value) and row_operand(value, uses.values) is None:
            found = _chain(uses, var)
            return found if found and any(op_name(v) == "relax.permute_dims" for _, v in found[1]) else None
        data = row_operand(value, uses.values)
        if not isinstance(data, relax.Var) or len(uses.only(data) or ()) != 1:
            return None
        var = data


def _compose(uses: _Uses, var, edits: Edits) -> None:
    """Record `end = work(one(s))` in `edits` where the module doc's form holds (`var`: the
    transpose of `rows`)."""
    back = _chain(uses, var)
    if back is None or var in edits.replace:
        return
    x, links = back
    links = links + _forward(uses, var)
    end_var = links[-1][0]
    if op_name(uses.values.get(x)) in ("", None) or _is_link(uses.values.get(x)) or len(uses.only(x) or ()) != 1:
        return
    found = _work_before(uses, x)
    shapes = [_static(x), _static(end_var)]
    if found is None or any(s is None for s in shapes) or shapes[1][-1] != shapes[0][-1]:
        return
    order = row_order(shapes[0], links, shapes[0][-1])
    source, moved = found
    m_var, m_shape, s_shape = moved[-1][0], _static(moved[-1][0]), _static(source)
    if order is None or m_shape is None or s_shape is None or m_var in edits.replace or \
            math.prod(m_shape) // m_shape[-1] != len(order):
        return
    one = as_one_transpose(_moved(s_shape, moved).reshape(len(order), -1)[order])
    if one is None:
        return
    view, axes = one
    bindings, value = [], source
    for suffix, step in (("stem_view", lambda v: relax.op.reshape(v, view)),
                         ("stem_moved", lambda v: relax.op.permute_dims(v, axes))):
        call = step(value)
        value = fresh_var(m_var, suffix, call)
        bindings.append((value, call))
    edits.before[m_var] = bindings
    edits.replace[m_var] = relax.op.reshape(value, m_shape)
    edits.replace[end_var] = relax.op.reshape(x, shapes[1])


def _moved(shape, links, index: np.ndarray | None = None) -> np.ndarray:
    """The source element of each element of the chain's result (`index`: of its source, else
    the source itself)."""
    index = np.arange(math.prod(shape)).reshape(shape) if index is None else index.reshape(shape)
    for _, value in links:
        if op_name(value) == "relax.permute_dims":
            given = value.attrs.axes
            index = index.transpose(None if given is None else [int(a) for a in given])
        else:
            index = index.reshape(shape_dims(value))
    return index


def as_one_transpose(index: np.ndarray):
    """(view, axes): `index` (each element's source in the flat source) as
    `arange(n).reshape(view).transpose(axes)` flattened, or None when no one transpose is. The
    output's digits read innermost first: each an extent and a source stride; the strides must
    tile the source (1, e1, e1 * e2, ...), and every element is checked."""
    flat, digits, block = index.reshape(-1), [], 1
    if flat.size == 0 or flat[0] != 0:
        return None
    while block < flat.size:
        stride, extent = int(flat[block]), 1
        while block * extent < flat.size and int(flat[block * extent]) == extent * stride:
            extent += 1
        if flat.size % (block * extent):
            return None
        digits.append((extent, stride))
        block *= extent
    by_stride = sorted(range(len(digits)), key=lambda d: digits[d][1])
    expected = 1
    for d in by_stride:
        if digits[d][1] != expected:
            return None
        expected *= digits[d][0]
    order = by_stride[::-1]  # the view's axes, outermost first
    view = tuple(digits[d][0] for d in order)
    axes = [order.index(d) for d in reversed(range(len(digits)))]
    if len(view) > MAX_AXES:
        return None
    if not np.array_equal(np.arange(flat.size).reshape(view).transpose(axes).reshape(-1), flat):
        return None
    return view, axes
