"""What a Relax expression's type says: its dtype and its (static) shape.

Stage: shared by normalise, partition and explain. In: a Relax expression. Out: plain Python
values (a dtype name, a tuple of ints), so that callers compare and report without poking at
TVM's type objects. Relax in this TVM keeps the type in `.struct_info` on some nodes and `.ty`
on others; this module is the one place that knows.
"""

from __future__ import annotations

import re


def type_of(expr):
    """The expression's Relax type (its struct info), or None."""
    return getattr(expr, "struct_info", None) or getattr(expr, "ty", None)


def dtype_of(expr) -> str:
    """The tensor dtype's name ("float32"), or "" for a non-tensor or an unknown dtype."""
    return str(getattr(type_of(expr), "dtype", ""))


def shape_dims(expr):
    """The dimensions of the tensor's shape, each an int when static or the symbolic PrimExpr;
    None when the shape is unknown."""
    values = getattr(getattr(type_of(expr), "shape", None), "values", None)
    if values is None:
        return None
    return [int(d.value) if hasattr(d, "value") else d for d in values]


def expression_name(dim) -> str:
    """A symbolic extent as it reads in a message, and names a kernel's variable for it:
    "(w - 1) // 2 + 1", not "(w - T.int64(1)) // T.int64(2) + T.int64(1)"."""
    return re.sub(r"T\.int(?:32|64)\((-?\d+)\)", r"\1", str(dim))


def holds_condition(dim) -> bool:
    """Whether a symbolic extent holds a condition (Relax's output size of a ceil-mode pool whose
    last window may start in the padding): TVM 0.27 cannot carry such a shape into an offloaded
    function (FuseOpsByPattern has no type rule for if_then_else), so no kernel takes it."""
    return "if_then_else" in str(dim)


def static_shape(expr) -> tuple | None:
    """The shape as a tuple of ints, or None if it is unknown or has a symbolic dimension."""
    dims = shape_dims(expr)
    if dims is None or not all(isinstance(d, int) for d in dims):
        return None
    return tuple(dims)


def require_static_shape(expr, role: str, error, prefix: str = "") -> tuple:
    """The static shape of `expr`, or `error` (an exception class) saying why it has none: no
    known shape, a symbolic dimension (the NPU kernels need static shapes), or a zero-size
    dimension (an empty tensor). `role` names the operand in the message ("the bias"), after
    `prefix` ("add: ")."""
    dims = shape_dims(expr)
    if dims is None:
        raise error(f"{prefix}the {role} has no known shape")
    symbolic = next((d for d in dims if not isinstance(d, int)), None)
    if symbolic is not None:
        raise error(f"{prefix}the {role} has a symbolic dimension ({expression_name(symbolic)}); the NPU kernels need "
                    "static shapes (bind it, e.g. with relax.transform.BindSymbolicVars)")
    if 0 in dims:
        raise error(f"{prefix}the {role} of shape {tuple(dims)} is empty: nothing for the NPU to compute, "
                    "it stays on the host")
    return tuple(dims)
