"""A layer norm of an embedding lookup as a lookup of the normalised table.

Stage: normalise (after lookup_tables.py). In: a Relax IRModule. Out: the same module in which

    layer_norm(take(W, ids, axis=0) [reshaped], gamma, beta, axes=[-1])

W a constant (V, H) float32 table and gamma, beta constants (Bloom's word_embeddings_layernorm),
is `take(N, ids)` [reshaped], N = layer_norm(W, gamma, beta) computed once when compiling: a norm
of each token's row is the row of the normalised table, so the layer norm kernel (2,717 cycles
at 32 tokens on cgra-8x8) goes.

Not the NPU kernel's bits: N is computed in float64 and rounded once to float32 (within half an
ulp of each row's exact norm, where PyTorch's float32 kernel and the NPU's are within a few), so
the result moves towards the exact one, never further than the kernel's bound from PyTorch's.
The table is normalised in blocks of rows (a real vocabulary of 250 k rows: a float64 copy of one
block at a time).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .norm_folds import _Uses, _const, _rebuilt
from .rewrite import as_pass, op_name, replace_functions

#: Rows of the table normalised at a time (float64: 64 MiB for a hidden size of 2,048).
_BLOCK = 4096


def normed_tables(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every layer norm of a constant table's lookup a lookup of the normalised table."""
    return replace_functions(mod, _rewrite_function)


table_norms_pass = as_pass(normed_tables, "cgra.TableNorms", ops=("relax.nn.layer_norm",))


def normalised_table(table: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """layer_norm(table) over its rows in float64, rounded to float32."""
    out = np.empty_like(table)
    for start in range(0, table.shape[0], _BLOCK):
        rows = table[start:start + _BLOCK].astype(np.float64)
        centred = rows - rows.mean(axis=-1, keepdims=True)
        scale = 1.0 / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)
        out[start:start + _BLOCK] = centred * scale * gamma.astype(np.float64) + beta.astype(np.float64)
    return out


def _lookup(uses: _Uses, value):
    """(the take's var, the take) when `value` is a float32 layer norm over the last axis, of
    constant gamma and beta, of a constant table's row lookup (through a reshape keeping the last
    axis), each read by the next alone; else None."""
    if op_name(value) != "relax.nn.layer_norm" or dtype_of(value) != "float32" or \
            not (bool(value.attrs.center) and bool(value.attrs.scale)):
        return None
    dims = shape_dims(value) or ()
    if [int(a) % len(dims) for a in value.attrs.axes] != [len(dims) - 1] or \
            any(_const(a) is None for a in value.args[1:3]):
        return None
    var = value.args[0]
    bound = uses.values.get(var) if isinstance(var, relax.Var) and len(uses.only(var) or ()) == 1 else None
    if op_name(bound) == "relax.reshape" and isinstance(bound.args[0], relax.Var) and \
            len(uses.only(bound.args[0]) or ()) == 1:
        var, bound = bound.args[0], uses.values.get(bound.args[0])
    table = _const(bound.args[0]) if op_name(bound) == "relax.take" else None
    if table is None or table.ndim != 2 or table.dtype != np.float32 or bound.attrs.axis is None or \
            int(bound.attrs.axis) != 0 or not np.isfinite(table).all():
        return None
    return var, bound


def _rewrite_function(func: relax.Function):
    """`func` with its lookups' layer norms folded into their tables, or None when it has none."""
    uses = _Uses(func)
    replace = {}
    for var, value in uses.values.items():
        found = _lookup(uses, value)
        if found is None:
            continue
        lookup, take = found
        gamma, beta = (_const(a) for a in value.args[1:3])
        table = normalised_table(_const(take.args[0]), gamma, beta, float(value.attrs.epsilon))
        replace[lookup] = relax.op.take(relax.const(table), take.args[1], axis=0, mode=take.attrs.mode)
        replace[var] = value.args[0]  # an alias CanonicalizeBindings removes
    return _rebuilt(func, replace, {}) if replace else None
