"""Which Relax calls work row by row: each row of their result (the last axis) computed from the
same row of one operand alone, so a permutation of the rows commutes with them.

Stage: normalise (read by window_stems.py and window_sinks.py). A layer norm over the last
axis, a matmul by a weight (a constant, or a transpose of one), an add or multiply of a constant
that varies along the last axis only (a bias, a layer scale), an elementwise activation, and a
reshape that keeps the last axis (the same rows seen anew).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_info import shape_dims
from .rewrite import op_name

_ACTIVATIONS = ("relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu", "relax.nn.relu", "relax.sigmoid",
                "relax.tanh")


def _constant(expr, values: dict) -> bool:
    """A constant, or a transpose of one (a linear's weight, as fold_weights keeps it)."""
    if isinstance(expr, tvm.ir.GenericConst):
        return True
    value = values.get(expr) if isinstance(expr, relax.Var) else None
    return op_name(value) == "relax.permute_dims" and isinstance(value.args[0], tvm.ir.GenericConst)


def _row_constant(expr) -> bool:
    """A constant whose axes but the last are of extent 1 (one value per column)."""
    dims = shape_dims(expr) if isinstance(expr, tvm.ir.GenericConst) else None
    return dims is not None and all(d == 1 for d in dims[:-1])


def row_operand(value, values: dict):
    """The operand whose rows `value` works on row by row, or None when it does not."""
    name = op_name(value)
    if name in _ACTIVATIONS:
        return value.args[0]
    if name == "relax.nn.layer_norm":
        rank = len(shape_dims(value) or ())
        return value.args[0] if rank and [int(a) % rank for a in value.attrs.axes] == [rank - 1] else None
    if name == "relax.matmul":
        weight = value.args[1]
        return value.args[0] if len(shape_dims(weight) or ()) == 2 and _constant(weight, values) else None
    if name in ("relax.add", "relax.multiply"):
        for data, other in (value.args, value.args[::-1]):
            if isinstance(data, relax.Var) and _row_constant(other):
                return data
        return None
    if name == "relax.reshape":
        before, after = shape_dims(value.args[0]), shape_dims(value)
        return value.args[0] if before and after and before[-1] == after[-1] else None
    return None
