"""A bias row per head over a symbolic length (Bloom's ALiBi) as the prefix of a constant table.

Stage: normalise (a helper of attention_lengths.read_at_lengths and attentions.py). In: the
bias an attention over a symbolic length s adds to its scores besides the causal mask, one row
per head along the keys (rank 5: (1, Hk, G, 1, s)), computed from arange(0, s) by elementwise
float ops and views that keep the key axis last (Bloom: slopes (H, 1, 1) * astype(arange(0, s)),
tiled once). Out: `row_table`, the (1, Hk, G, 1, T) float32 table of that row at the bound T,
and `length_row`, its prefix strided_slice(table, [4], [0], [s]), which the symbolic attention
kernel's pattern reads as its table (kernels/attention/length_rows.py).

Exact: each element of the row is the same float32 operations on the same integer position j at
any length (no op mixes positions: no reduction, no tile along the keys), so the row at s is the
table's first s columns bit for bit. `row_table` evaluates the expression with numpy at the bound
and checks that too at the trial lengths.

Why: the row was five host ops per model and its (H, s, s) add to the scores a host op per
layer (Bloom at 128 tokens: 271,390 host cycles), and the attention fell apart into kernels.
"""

from __future__ import annotations

import numpy as np
from tvm import relax, tirx

from ..relax_info import dtype_of, shape_dims

_DEPTH = 12
_ELEMENTWISE = {"relax.multiply": np.multiply, "relax.add": np.add, "relax.subtract": np.subtract,
                "relax.divide": np.divide}


def module_bounds(mod) -> dict:
    """name -> bound of the symbolic variables of `mod`'s Relax functions (`tir_var_upper_bound`)."""
    bounds = {}
    for func in mod.functions.values():
        attrs = getattr(func, "attrs", None)
        if isinstance(func, relax.Function) and attrs is not None and "tir_var_upper_bound" in attrs:
            bounds.update({str(name): int(bound) for name, bound in attrs["tir_var_upper_bound"].items()})
    return bounds


def row_table(chain, expr, length, bound: int, shape5: tuple, trials) -> np.ndarray | None:
    """The (1, Hk, G, 1, bound) float32 table whose first s columns `expr` is at every length s
    (module docstring), `shape5` its rank-5 broadcast shape at a trial length; else None."""
    if len(shape5) != 5 or shape5[0] != 1 or shape5[3] != 1 or dtype_of(expr) != "float32":
        return None
    tables = {}
    for n in tuple(trials) + (bound,):
        value = _evaluate(chain, expr, length, n, _DEPTH)
        if value is None or value.dtype != np.float32 or value.size != int(np.prod(shape5[:4])) * n or \
                value.shape[-1] != n:
            return None
        tables[n] = value.reshape(shape5[:4] + (n,))
    table = tables[bound]
    if any(not np.array_equal(tables[n], table[..., :n]) for n in trials):
        return None
    return np.ascontiguousarray(table)


def _evaluate(chain, expr, length, n: int, depth: int):
    """`expr`'s value with `length` at n, through constants, arange(0, s, 1), astype, the
    elementwise ops, views keeping the last axis (reshape to ... s, expand_dims, tile of 1 along
    it); None for anything else."""
    array = chain.array(expr)
    if array is not None:
        return array
    call = chain.call(expr, "relax.arange", "relax.astype", "relax.reshape", "relax.expand_dims", "relax.tile",
                      *_ELEMENTWISE)
    if call is None or depth == 0:
        return None
    name = call.op.name
    if name == "relax.arange":
        start, end, step = (_prim(arg, length, n) for arg in call.args)
        return np.arange(start, end, step, dtype=dtype_of(call)) \
            if (start, step) == (0, 1) and end == n else None
    inner = _evaluate(chain, call.args[0], length, n, depth - 1)
    if inner is None:
        return None
    if name == "relax.astype":
        return inner.astype(str(call.attrs.dtype))
    if name in _ELEMENTWISE:
        other = _evaluate(chain, call.args[1], length, n, depth - 1)
        if other is None or inner.dtype != other.dtype:
            return None
        return _ELEMENTWISE[name](inner, other)
    shape = [_prim(d, length, n) for d in (shape_dims(call) or [None])]
    if None in shape or not shape or shape[-1] != inner.shape[-1] or shape[-1] != n:
        return None  # every view keeps the keys last and whole
    if name == "relax.tile" and [int(r) for r in call.attrs.repeats][-1] != 1:
        return None
    if name == "relax.tile":
        return np.tile(inner, [int(r) for r in call.attrs.repeats])
    return inner.reshape(shape) if inner.size == int(np.prod(shape)) else None


def _prim(value, length, n: int):
    """An int of a dimension or PrimValue, `length` at n; None if it is another expression."""
    value = getattr(value, "value", value)
    if isinstance(value, int):
        return value
    if isinstance(value, tirx.IntImm):
        return int(value.value)
    if isinstance(value, tirx.Var) and value.same_as(length):
        return n
    if isinstance(value, tirx.Cast) and isinstance(value.value, tirx.Var) and value.value.same_as(length):
        return n
    return None


def length_row(emit, table: np.ndarray, length):
    """The first `length` columns of the (1, Hk, G, 1, T) table: the normal form's bias row."""
    return emit(relax.op.strided_slice(relax.const(table), [4], [0], [length], assume_inbound=True))
