"""A mean over the tokens of a transposed activation is a mean over the untransposed one's map.

Stage: normalise (after nhwc_convs.py). In: a Relax IRModule. Out: the same module in which
`mean(chain(x))`, chain a row of transposes and reshapes (expand_dims, squeeze) of a
channels-last x (B, N, C) or (B, H, W, C) with at least one transpose, that averages each
channel over every token, is `reshape(mean(x viewed as (B, H, W, C), axes [1, 2]), the
mean's shape)`: the NPU's mean over a channels-last map, no transpose (checked on a random
input in float64 against the chain, not assumed).

Exact up to the order of the additions (the same elements averaged). Why: Swin's pooler
averages `transpose(sequence, 1, 2)` over its last axis, after a transposing layout kernel (928
of the 124 k cycles of tests/transformer_models.py's Swin at 64 x 64 on cgra-8x8) that the mean
never needed. (ConvNeXt's NCHW output is also the model's result, so its transpose stays.)
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from ..relax_info import static_shape
from .norm_folds import _Uses
from .rewrite import as_pass, op_name, replace_functions
from .window_residuals import Edits, fresh_var

_VIEWS = ("relax.reshape", "relax.expand_dims", "relax.squeeze")


def token_means(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with means over a transposed activation's tokens taken over its map."""
    return replace_functions(mod, _rewrite_function)


token_means_pass = as_pass(token_means, "cgra.TokenMeans", ops=("relax.mean",))


def _rewrite_function(func: relax.Function):
    """`func` with every such mean rewritten, or None when none is."""
    uses, edits = _Uses(func), Edits()
    for var, value in uses.values.items():
        if op_name(value) == "relax.mean" and isinstance(value.args[0], relax.Var):
            found = _source(uses, value.args[0])
            if found is not None and _averages_tokens(found, value):
                source, _ = found
                shape = static_shape(source)
                view = shape if len(shape) == 4 else (shape[0], shape[1], 1, shape[2])
                viewed = relax.op.reshape(source, view)
                viewed_var = fresh_var(var, "map", viewed)
                pooled = relax.op.mean(viewed_var, axis=[1, 2], keepdims=False)
                pooled_var = fresh_var(var, "pooled", pooled)
                edits.before[var] = [(viewed_var, viewed), (pooled_var, pooled)]
                edits.replace[var] = relax.op.reshape(pooled_var, static_shape(value))
    return edits.rebuilt(func) if edits.replace else None


def _source(uses: _Uses, var):
    """(x, [link values in order]) of the transposes and views ending at `var`, each read only
    by the next, at least one a transpose, x of rank 3 or 4 with static shape; else None."""
    links = []
    while op_name(uses.values.get(var)) in _VIEWS + ("relax.permute_dims",):
        if len(uses.only(var) or ()) != 1:
            return None
        links.append(uses.values[var])
        var = links[-1].args[0]
        if not isinstance(var, relax.Var):
            return None
    shape = static_shape(var)
    if shape is None or len(shape) not in (3, 4) or not any(op_name(v) == "relax.permute_dims" for v in links):
        return None
    return var, links[::-1]


def _averages_tokens(found, mean) -> bool:
    """Whether the mean of the chain is each channel's mean over x's tokens, in channel order."""
    source, links = found
    shape, out = static_shape(source), static_shape(mean)
    if out is None or math.prod(out) != shape[0] * shape[-1] or any(static_shape(v) is None for v in links):
        return False
    x = np.random.default_rng(0).standard_normal(shape)
    y = x
    for value in links:
        if op_name(value) == "relax.permute_dims":
            given = value.attrs.axes
            y = y.transpose(None if given is None else [int(a) for a in given])
        else:
            y = y.reshape(static_shape(value))
    axes = mean.attrs.axis
    axes = tuple(range(y.ndim)) if axes is None else tuple(int(a) % y.ndim for a in axes)
    expected = y.mean(axis=axes, keepdims=bool(mean.attrs.keepdims))
    pooled = x.reshape(shape[0], -1, shape[-1]).mean(axis=1)
    return expected.size == pooled.size and np.allclose(expected.reshape(-1), pooled.reshape(-1), rtol=1e-12, atol=0)
