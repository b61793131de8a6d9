"""A concatenation of every phase of one strided slice is one transpose of a view.

Stage: normalise (after split_slices.py, which merges a slice of a slice). In: a Relax IRModule. Out: the
same module in which `concat([strided_slice(x, axes, begins_k, ..., steps) for k], axis=-1)`,
the slices together taking every phase of the steps once (begins_k < steps) and the steps
dividing x's axes, is `reshape(permute_dims(reshape(x, each sliced axis cut into (n / step,
step)), the phases moved next to the last axis), the concat's shape)`: one layout kernel, the
order of the phases read off the concat's operands (checked on the index map).

Exact: every element moves, none is computed. Why: Swin's patch merging concatenates
`x[:, 0::2, 0::2]`, `x[:, 1::2, 0::2]`, `x[:, 0::2, 1::2]` and `x[:, 1::2, 1::2]` along the
channels: four slice kernels and a concat kernel (4 x 544 + 1,792 of the 127 k cycles of
tests/transformer_models.py's Swin at 64 x 64 on cgra-8x8), each reading or writing the whole
map; one transpose reads and writes it once.
"""

from __future__ import annotations

import collections
import itertools
import math

import numpy as np
import tvm
from tvm import relax

from ..relax_info import static_shape
from .norm_folds import _Uses
from .rewrite import as_pass, op_name, replace_functions
from .split_slices import strided_box
from .window_residuals import Edits, fresh_var
from .window_stems import MAX_AXES  # the most axes a layout copy walks



def patch_merges(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with concatenations of a strided slice's phases as one transpose."""
    return replace_functions(mod, _rewrite_function)


patch_merges_pass = as_pass(patch_merges, "cgra.PatchMerges", ops=("relax.concat",))


def _rewrite_function(func: relax.Function):
    """`func` with every such concatenation rewritten, or None when none is."""
    uses, edits, reads = _Uses(func), Edits(), _reads(func)
    for var, value in uses.values.items():
        if op_name(value) == "relax.concat":
            found = _phases(uses, reads, value)
            steps = found and _transpose(found[0], found[1], static_shape(value))
            if steps is not None:
                view, axes, shape = steps
                cut = relax.op.reshape(found[0], view)
                cut_var = fresh_var(var, "phases", cut)
                moved = relax.op.permute_dims(cut_var, axes)
                moved_var = fresh_var(var, "merged", moved)
                edits.before[var] = [(cut_var, cut), (moved_var, moved)]
                edits.replace[var] = relax.op.reshape(moved_var, shape)
    return edits.rebuilt(func) if edits.replace else None


def _reads(func: relax.Function) -> collections.Counter:
    """How many times each variable is read (a concat's operands sit in a tuple)."""
    reads = collections.Counter()
    count = lambda e: reads.update([e]) if isinstance(e, relax.Var) else None  # noqa: E731
    for block in func.body.blocks:
        for binding in block.bindings:
            relax.analysis.post_order_visit(binding.value, count)
    relax.analysis.post_order_visit(func.body.body, count)
    return reads


def _phases(uses: _Uses, reads, concat):
    """(x, [{axis: (begin, step, count)} of each operand]) when every operand of a concat along
    the last axis is a strided slice of one x that nothing else reads, else None."""
    fields = getattr(concat.args[0], "fields", None)
    shape = static_shape(concat)
    if not fields or shape is None or int(concat.attrs.axis) % len(shape) != len(shape) - 1:
        return None
    data, boxes = None, []
    for field in fields:
        value = uses.values.get(field) if isinstance(field, relax.Var) else None
        if op_name(value) != "relax.strided_slice" or reads[field] != 1:
            return None
        box = strided_box(value)
        if box is None or (data is not None and not value.args[0].same_as(data)):
            return None
        data = value.args[0]
        boxes.append(box)
    return data, boxes


def _transpose(data, boxes: list, out_shape):
    """(view shape, axis order, out_shape) of the transpose taking the concat's elements, or None."""
    shape = static_shape(data)
    axes = sorted(boxes[0])
    steps = {a: boxes[0][a][1] for a in axes}
    if shape is None or not axes or axes[-1] == len(shape) - 1 or len(boxes) != math.prod(steps.values()):
        return None
    if any(sorted(b) != axes or any(b[a][1] != steps[a] or b[a][0] >= steps[a] or b[a][2] * steps[a] != shape[a]
                                    for a in axes) for b in boxes):
        return None
    view, outer, phase = [], [], {}
    for axis, size in enumerate(shape):
        if axis in steps:
            outer.append(len(view))
            phase[axis] = len(view) + 1
            view += [size // steps[axis], steps[axis]]
        else:
            outer.append(len(view))
            view.append(size)
    expected = _gathered(shape, boxes)
    for order in itertools.permutations(axes):
        moved = outer[:-1] + [phase[a] for a in order] + outer[-1:]
        index = np.arange(math.prod(shape)).reshape(view).transpose(moved).reshape(out_shape)
        if np.array_equal(index, expected) and merged_axes(view, moved) <= MAX_AXES:
            return tuple(view), moved, tuple(out_shape)
    return None


def _gathered(shape, boxes: list) -> np.ndarray:
    """The source element of each element of the concatenation of the boxes along the last axis."""
    index = np.arange(math.prod(shape)).reshape(shape)
    parts = []
    for box in boxes:
        cut = [slice(None)] * len(shape)
        for axis, (begin, step, count) in box.items():
            cut[axis] = slice(begin, begin + step * count, step)
        parts.append(index[tuple(cut)])
    return np.concatenate(parts, axis=-1)


def merged_axes(shape, axes) -> int:
    """The number of axes of a transpose of `shape` by `axes` once unit axes are dropped and
    axes that stay next to each other merged (what the layout kernel's DMA boxes walk)."""
    kept = [a for a in axes if shape[a] != 1]
    place = {a: i for i, a in enumerate(sorted(kept))}
    return (1 if kept else 0) + sum(place[b] != place[a] + 1 for a, b in zip(kept, kept[1:]))
