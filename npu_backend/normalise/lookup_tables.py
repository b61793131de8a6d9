"""Embedding lookups of constants folded, and a constant row added to (or multiplying) a lookup folded into its table.

Stage: normalise (after constant_indices.py and index_casts.py). In: a Relax IRModule. Out: the same module in which

1. a lookup's index plumbing of constants (astype, reshape, expand_dims, broadcast_to, take of
   constant operands: numpy_ops.py's evaluations, as fold_weights folds them) is a constant. RoBERTa's
   token types are a zero buffer gathered at the position ids, which constant_indices.py makes a
   constant only after the pass list's FoldConstant ran: its cast, reshape and lookup ran as an
   NPU kernel (a DMA gather, 928 cycles at 32 tokens on cgra-8x8) every inference;
2. `add(take(W, ids, axis=0) [reshaped], c)`, W a constant (V, H) table and c a constant equal to
   one row r of H values wherever it broadcasts (RoBERTa's token-type embedding of the default
   type 0), is `take(W + r, ids)` [reshaped]: the add happens once per table row at compile time
   instead of once per token in an elementwise kernel;
3. `multiply(take(W, ids, axis=0) [reshaped], c)`, c such a row or a scalar (Gemma's embedding
   scaled by sqrt(hidden)), is `take(W * r, ids)` [reshaped]: no multiply kernel (889 cycles at
   32 tokens on cgra-8x8).

Exact: the same float32 additions and multiplications (numpy's, rounded as the kernel's), only done when compiling;
a lookup of an index outside the table stays (numpy_ops._take refuses it). A bfloat16 / float16
model's (2. and 3. with a table and row in h) likewise: PyTorch's CPU op in h widens both, computes
in float32 and rounds to h, as the kernel's ELTWISE in h does, and so does the fold (ml_dtypes'
rounding of numpy's float32 result): BERT's token-type embedding in bf16 (an add kernel, 588 cycles
at 32 tokens on cgra-16x16).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims, static_shape
from .norm_folds import _Uses, _const, _rebuilt
from .numpy_ops import NUMPY_OPS
from .rewrite import as_pass, op_name, replace_functions

#: The index plumbing folded when its operands are constants (never a weight's transpose).
_PLUMBING = ("relax.astype", "relax.reshape", "relax.expand_dims", "relax.broadcast_to", "relax.take")


def fold_lookup_tables(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with constant lookups folded and constant rows added to lookups in their tables."""
    return replace_functions(mod, _rewrite_function)


lookup_tables_pass = as_pass(fold_lookup_tables, "cgra.LookupTables", ops=("relax.take",))


def _folded(value, constants: dict):
    """The array a plumbing call of constants computes (numpy_ops' rule), else None."""
    name = op_name(value)
    if name not in _PLUMBING or static_shape(value) is None:
        return None
    if name == "relax.astype" and dtype_of(value.args[0]) in ("bfloat16", "float16"):
        return None  # a 16-bit bias widened for its GEMM's rounding store (half_casts.py), no index
    count, evaluate = NUMPY_OPS[name]
    arrays = [constants.get(arg, _const(arg)) for arg in value.args[:count]]
    if any(array is None for array in arrays):
        return None
    result = evaluate(value, *arrays)
    if result is None or result.dtype.name != dtype_of(value) or result.shape != static_shape(value):
        return None
    return result


def _uniform_row(array: np.ndarray, width: int):
    """The row r when `array` holds r wherever it broadcasts (every row along its other axes
    equal), else None."""
    if array.dtype.name not in _FLOATS or array.shape[-1:] != (width,) or \
            not np.isfinite(array.astype(np.float32)).all():
        return None
    rows = array.reshape(-1, width)
    return rows[0] if np.all(rows == rows[0]) else None


#: The tables' dtypes: a 16-bit float's op computes in float32, rounded to it (PyTorch's CPU op).
_FLOATS = ("float32", "bfloat16", "float16")
#: The elementwise ops whose uniform constant row joins the table, with numpy's form of them.
_TABLE_OPS = {"relax.add": np.add, "relax.multiply": np.multiply}


def _broadcast_row(array: np.ndarray, value, width: int):
    """The row r when `array`, broadcast as `value` reads it, holds r along every other axis; over a
    symbolic length (a prefill's (1, s, H)) `array`'s own rows, which a scalar or a row of one
    value broadcast to `width`; else None."""
    shape, dims = static_shape(value), shape_dims(value) or ()
    if array.ndim > len(dims) or array.shape[-1:] not in ((), (1,), (width,)):
        return None
    return _uniform_row(np.broadcast_to(array, shape or array.shape[:-1] + (width,)), width)


def _table_op(uses: _Uses, value, constants: dict):
    """(the op's lookup operand, the take's var, the take, the row) when `value` adds a uniform
    constant row to (or multiplies by one) a lookup of a constant table (through a reshape), each
    read by the next alone; else None."""
    if op_name(value) not in _TABLE_OPS or dtype_of(value) not in _FLOATS:
        return None
    for operand, constant in (value.args, value.args[::-1]):
        array = constants.get(constant, _const(constant))
        bound = uses.values.get(operand) if isinstance(operand, relax.Var) else None
        if array is None or bound is None or len(uses.only(operand) or ()) != 1 or \
                static_shape(operand) != static_shape(value):  # the constant must not widen the lookup
            continue
        lookup = operand
        if op_name(bound) == "relax.reshape" and isinstance(bound.args[0], relax.Var) and \
                len(uses.only(bound.args[0]) or ()) == 1:
            lookup, bound = bound.args[0], uses.values.get(bound.args[0])
        table = _const(bound.args[0]) if op_name(bound) == "relax.take" else None
        if table is None or table.ndim != 2 or table.dtype.name != dtype_of(value) or bound.attrs.axis is None or \
                int(bound.attrs.axis) != 0:
            continue
        row = _broadcast_row(array, value, table.shape[1])
        if row is not None and row.dtype == table.dtype:
            return operand, lookup, bound, row
    return None


def _table_with_row(op, table: np.ndarray, row: np.ndarray) -> np.ndarray:
    """op(table, row) as the kernel computes it: in float32, a 16-bit float's rounded to it."""
    if table.dtype == np.float32:
        return op(table, row)
    return op(table.astype(np.float32), row.astype(np.float32)).astype(table.dtype)


def _rewrite_function(func: relax.Function):
    """`func` with its constant lookups and table rows folded, or None when it has none."""
    uses = _Uses(func)
    constants, replace = {}, {}
    for var, value in uses.values.items():
        if _const(value) is not None:  # a variable bound to a constant (what constant_indices.py left)
            constants[var] = _const(value)
            continue
        array = _folded(value, constants)
        if array is not None:
            constants[var] = array
            replace[var] = relax.const(array, dtype_of(value))
            continue
        found = _table_op(uses, value, constants)
        if found is None or found[0] in replace or found[1] in replace:
            continue
        operand, lookup, take, row = found
        table = _table_with_row(_TABLE_OPS[op_name(value)], _const(take.args[0]), row)
        replace[lookup] = relax.op.take(relax.const(table), take.args[1], axis=0, mode=take.attrs.mode)
        replace[var] = operand  # an alias CanonicalizeBindings removes
    return _rebuilt(func, replace, {}) if replace else None
