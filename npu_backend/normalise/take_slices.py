"""A take of a constant run of consecutive indices as the strided_slice it is.

Stage: normalise (before split_slices.py and rope_epilogues.py; after negative_indices.py has
counted negative entries from the end). In: a Relax IRModule. Out: the same module in which

    take(x, [i, i + 1, ..., i + n - 1], axis)      x float32 of static shape, the indices a 1-D
                                                   constant within the axis

is `strided_slice(x, [axis], [i], [i + n])`: the same elements in the same order and shape.

Why: Falcon's multi-query attention cuts its fused q / k / v heads as `qkv[..., :-2, :]`,
`qkv[..., [-2], :]` and `qkv[..., [-1], :]`: the query heads a slice, the key and value heads a
take each. A take is a copy kernel of its own (416 cycles each, four a model at 32 tokens on
cgra-8x8) and no head box RoPE's epilogue (rope_epilogues.py) or the attention kernel reads as a
view of the projection's output; as slices, the key's RoPE joins the query's in the projection's
epilogue and attention reads k and v as boxes of it.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, static_shape
from .norm_folds import _const, _rebuilt, _Uses
from .rewrite import as_pass, op_name, replace_functions


def takes_as_slices(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every take of consecutive constant indices as a strided_slice (module doc)."""
    return replace_functions(mod, _rewrite_function)


take_slices_pass = as_pass(takes_as_slices, "cgra.TakeSlices", ops=("relax.take",))


def _as_slice(value):
    """The strided_slice a take of consecutive constant indices is, else None."""
    if op_name(value) != "relax.take" or dtype_of(value) != "float32":
        return None
    shape, indices = static_shape(value.args[0]), _const(value.args[1])
    if shape is None or indices is None or indices.ndim != 1 or indices.size == 0 or \
            not np.issubdtype(indices.dtype, np.integer):
        return None
    axis = int(value.attrs.axis) % len(shape)
    begin = int(indices[0])
    if not (0 <= begin and begin + indices.size <= shape[axis]) or \
            not (indices == np.arange(begin, begin + indices.size)).all():
        return None
    return relax.op.strided_slice(value.args[0], [axis], [begin], [begin + indices.size])


def _rewrite_function(func: relax.Function):
    """`func` with its takes of consecutive constant indices as slices, or None when it has none."""
    replace = {}
    for var, value in _Uses(func).values.items():
        sliced = _as_slice(value)
        if sliced is not None:
            replace[var] = sliced
    return _rebuilt(func, replace, {}) if replace else None
