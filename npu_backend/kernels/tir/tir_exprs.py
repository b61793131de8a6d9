"""Reading a user's elementwise block: which vector-unit or fabric command its expression is.

Stage: partition (kernels/tir/tir.py asks when it reads a user's PrimFunc). In: the block's stored
value, its iterators and the output buffer. Out: ("eltwise", func, lhs walks, rhs walks) for
`a op b` on ELTWISE, ("epilogue", relu, clip) for relu / clip on the EPILOGUE, ("fabric", nodes,
flipped) for any other expression of one input, constants and + - * max min (a FABRIC body,
cgra_sim/mapping/body.py), or None.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from cgra_sim.mapping import body as bodies

EPILOGUE_DTYPES = ("float32", "int32")  # the accumulator dtypes EPILOGUE reads


def indexes_by(indices, iterators, buffer, full_only=False):
    """(walks axis?) per axis if `indices` read `buffer` at the iterators, each axis either at
    its own iterator or (broadcast, an axis of extent 1) at 0; None otherwise."""
    if len(indices) != len(iterators):
        return None
    full = []
    for index, var, extent in zip(indices, iterators, buffer.shape):
        if isinstance(index, tirx.Var) and index.same_as(var):
            full.append(True)
        elif not full_only and isinstance(index, tirx.IntImm) and index.value == 0 and int(extent) == 1:
            full.append(False)
        else:
            return None
    return tuple(full)


def vector_op(value, iterators, out, dtype):
    """("eltwise", func, lhs_full, rhs_full) or ("epilogue", relu, clip) for `value`, else None."""
    def operand(expr):
        if isinstance(expr, tvm.ir.TensorLoad) and str(expr.source.dtype) == dtype:
            return indexes_by(expr.indices, iterators, expr.source)
        return None

    def constant(expr):
        return expr.value if isinstance(expr, (tirx.IntImm, tirx.FloatImm)) else None

    kinds = {tirx.Add: "add", tirx.Sub: "subtract", tirx.Mul: "multiply", tirx.Max: "maximum",
             tirx.Min: "minimum"}
    func = kinds.get(type(value))
    if func is None:
        return None
    a, b = value.a, value.b
    if operand(a) is not None and operand(b) is not None:
        return ("eltwise", func, operand(a), operand(b))
    if dtype not in EPILOGUE_DTYPES:
        return None
    if func == "maximum" and operand(a) == (True,) * len(iterators) and constant(b) == 0:
        return ("epilogue", True, None)
    if func == "minimum" and isinstance(a, tirx.Max) and operand(a.a) == (True,) * len(iterators) \
            and constant(a.b) is not None and constant(b) is not None and constant(a.b) <= constant(b):
        return ("epilogue", False, (constant(a.b), constant(b)))
    return None


_BODY_OPS = {tirx.Add: "add", tirx.Sub: "sub", tirx.Mul: "mul", tirx.Max: "max", tirx.Min: "min"}


def fabric_op(value, iterators, dtype: str):
    """("fabric", nodes, flipped) when `value` is an expression of one input read at the
    iterators (every axis), constants and + - * max min: a FABRIC body; else None."""
    if dtype not in bodies.BODY_DTYPES:
        return None
    nodes, flipped, inputs = [], [], []

    def ref(expr):
        if isinstance(expr, (tirx.IntImm, tirx.FloatImm)):
            return expr.value
        if isinstance(expr, tvm.ir.TensorLoad):
            if str(expr.source.dtype) != dtype or indexes_by(expr.indices, iterators, expr.source) != \
                    (True,) * len(iterators) or any(not expr.source.same_as(s) for s in inputs):
                raise ValueError("not one input read at the iterators")
            inputs.append(expr.source)
            return "a"
        op = _BODY_OPS.get(type(expr))
        if op is None:
            raise ValueError(f"{type(expr).__name__} is not a fabric operation")
        first, second = ref(expr.a), ref(expr.b)
        if not isinstance(first, str):
            if op == "sub" or not isinstance(second, str):
                raise ValueError("a constant first, in a subtraction or of two constants")
            first, second = second, first
            flipped.append(len(nodes))
        nodes.append((op, first, second))
        return f"n{len(nodes) - 1}"

    try:
        ref(value)
    except ValueError:
        return None
    if not nodes or not inputs or len(nodes) > bodies.BODY_MAX_NODES:
        return None
    return ("fabric", tuple(nodes), tuple(flipped))
