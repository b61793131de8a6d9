"""The constant operations fold_weights evaluates with numpy, exactly as TVM's build would.

Stage: normalise (fold_weights.py reads `NUMPY_OPS`). Each entry: an operator -> (how many
leading tensor arguments must be constant, its numpy evaluation, or None where numpy and TVM
could disagree). A tuple argument (concat's) arrives as a tuple of arrays. The caller folds only
when the result has exactly the dtype and shape Relax inferred.

Why: what is left constant goes to TVM's FoldConstant, which builds every constant call with
LLVM, about 10-30 ms each. YOLOS interpolates its position embeddings with floor, clip and
concat of constants: 373 builds, 9.9 s of an 11 s compile.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, static_shape

FLOAT = ("float16", "float32", "float64")


def _reshape_to_output(call, data):
    return data.reshape(static_shape(call))


def _of_bools_or_ints(fn):
    """fn(a, b) of two bool or two integer arrays of one dtype (no promotion)."""
    return lambda call, a, b: fn(a, b) if a.dtype == b.dtype and a.dtype.kind in "biu" else None


def _float_only(fn):
    return lambda call, *arrays: fn(*arrays) if all(a.dtype.name in FLOAT for a in arrays) else None


# op -> (number of leading tensor arguments that must be constant, numpy evaluation). The other
# arguments (a reshape's target shape) are read off the call's output type.
NUMPY_OPS = {
    "relax.add": (2, lambda call, a, b: np.add(a, b)),
    "relax.subtract": (2, lambda call, a, b: np.subtract(a, b)),
    "relax.multiply": (2, lambda call, a, b: np.multiply(a, b)),
    "relax.divide": (2, _float_only(np.divide)),  # integer division rounds differently
    "relax.sqrt": (1, _float_only(np.sqrt)),
    "relax.negative": (1, lambda call, a: np.negative(a)),
    "relax.reshape": (1, _reshape_to_output),
    "relax.expand_dims": (1, _reshape_to_output),
    "relax.squeeze": (1, _reshape_to_output),
    "relax.permute_dims": (1, lambda call, a: np.transpose(
        a, None if call.attrs.axes is None else [int(x) for x in call.attrs.axes])),
    "relax.isnan": (1, lambda call, a: np.isnan(a)),
    "relax.where": (3, lambda call, c, a, b: np.where(c, a, b)),
    # What PyTorch's exports leave constant (a transformer's position ids, a Swin window's
    # relative position index): each left for FoldConstant cost a TVM build, ~30 ms apiece.
    "relax.broadcast_to": (1, lambda call, a: np.broadcast_to(a, static_shape(call)).copy()),
    "relax.arange": (3, lambda call, start, end, step: _arange(call, start, end, step)),
    "relax.strided_slice": (1, lambda call, a: _strided_slice(call, a)),
    "relax.take": (2, lambda call, a, indices: _take(call, a, indices)),
    "relax.gather_elements": (2, lambda call, a, indices: _gather_elements(call, a, indices)),
    "relax.astype": (1, lambda call, a: _astype(a, dtype_of(call))),
    # What YOLOS's position-embedding interpolation leaves constant (floor, clip, concat).
    "relax.floor": (1, _float_only(np.floor)),
    "relax.ceil": (1, _float_only(np.ceil)),
    "relax.clip": (1, lambda call, a: _clip(call, a)),
    "relax.concat": (1, lambda call, parts: _concat(call, parts)),
    **{f"relax.{name}": (2, lambda call, a, b, fn=fn: fn(a, b)) for name, fn in (
        ("equal", np.equal), ("not_equal", np.not_equal), ("less", np.less), ("less_equal", np.less_equal),
        ("greater", np.greater), ("greater_equal", np.greater_equal))},
    # What Hugging Face's causal-mask code leaves constant (the packed-sequence count, the
    # position lookups, the and of the masks): without them the mask of every decoder stayed
    # a dozen host operators.
    "relax.cumsum": (1, lambda call, a: _cumsum(call, a)),
    "relax.index_tensor": (2, lambda call, a, indices: _index_tensor(a, indices)),
    "relax.full": (2, lambda call, shape, fill: np.full(static_shape(call), fill, dtype_of(call))),
    "relax.logical_not": (1, lambda call, a: np.logical_not(a) if a.dtype.kind == "b" else None),
    **{f"relax.{name}": (2, _of_bools_or_ints(fn)) for name, fn in (
        ("bitwise_and", np.bitwise_and), ("bitwise_or", np.bitwise_or),
        ("logical_and", np.logical_and), ("logical_or", np.logical_or))},
}



def _cumsum(call, a):
    """Integer scans along an axis (a float sum's rounding depends on its order; bool is counted
    by bool_scans.py first)."""
    if call.attrs.axis is None or a.dtype.kind not in "iu" or dtype_of(call) != a.dtype.name:
        return None
    out = np.cumsum(a, axis=int(call.attrs.axis), dtype=a.dtype)
    return out - a if bool(call.attrs.exclusive) else out


def _index_tensor(a, indices):
    """Advanced indexing by integer arrays, each inside its axis (numpy broadcasts them as TVM)."""
    if len(indices) > a.ndim or not all(_inside(index, a.shape[axis]) for axis, index in enumerate(indices)):
        return None
    return a[tuple(indices)].copy()


def _astype(a, dtype: str):
    """Conversions numpy and LLVM agree on: any to float (both round to nearest even) or bool,
    integer to integer (both wrap), float to integer within the integer's range (both truncate)."""
    target = np.dtype(dtype)
    if a.dtype.kind == "f" and target.kind in "iu":
        limits = np.iinfo(target)
        if not (np.isfinite(a).all() and (a > limits.min - 1).all() and (a < limits.max + 1).all()):
            return None
    if target.kind == "b":
        return a != 0
    return a.astype(target)


def _inside(indices, extent: int) -> bool:
    """Integer indices, each inside [0, extent): TVM's take / gather modes differ on the others."""
    return np.issubdtype(indices.dtype, np.integer) and \
        not (indices.size and (indices.min() < 0 or indices.max() >= extent))


def _gather_elements(call, a, indices):
    axis = int(call.attrs.axis)
    return np.take_along_axis(a, indices, axis=axis) if _inside(indices, a.shape[axis]) else None


def _arange(call, start, end, step):
    """Integer ranges only (a float range's values depend on how each side rounds)."""
    if not all(np.issubdtype(v.dtype, np.integer) for v in (start, end, step)) or int(step) == 0:
        return None
    return np.arange(int(start), int(end), int(step)).astype(dtype_of(call))


def _ints(expr) -> list[int] | None:
    """The integers of a tuple of IntImms (a strided_slice's axes, begin, end)."""
    if not isinstance(expr, relax.Tuple):
        return None
    values = []
    for field in expr.fields:
        if not isinstance(field, tvm.tirx.IntImm):
            return None
        values.append(int(field.value))
    return values


def _strided_slice(call, a):
    """Positive strides, Python's slice semantics (the caller checks the shape Relax inferred)."""
    axes, begin, end = (_ints(arg) for arg in call.args[1:4])
    strides = _ints(call.args[4]) if len(call.args) > 4 else [1] * len(axes or ())
    if None in (axes, begin, end, strides) or any(step <= 0 for step in strides):
        return None
    index = [slice(None)] * a.ndim
    for axis, lo, hi, step in zip(axes, begin, end, strides):
        index[axis] = slice(lo, hi, step)
    return a[tuple(index)].copy()


def _take(call, a, indices):
    """Along an axis (None flattens: not folded)."""
    if call.attrs.axis is None or not _inside(indices, a.shape[int(call.attrs.axis)]):
        return None
    return np.take(a, indices, axis=int(call.attrs.axis))


def _clip(call, a):
    """Floats without NaN (numpy keeps a NaN, TVM's compare pair may not), or integers between
    integer bounds the dtype holds (an index clamped into range)."""
    lo, hi = (_number(bound) for bound in call.args[1:3])
    if lo is None or hi is None or not lo <= hi:
        return None
    if a.dtype.kind in "iu":
        limits = np.iinfo(a.dtype)
        if not all(float(bound).is_integer() for bound in (lo, hi)) or not limits.min <= lo <= hi <= limits.max:
            return None
        lo, hi = int(lo), int(hi)
    elif a.dtype.name not in FLOAT or np.isnan(a).any():
        return None
    return np.minimum(np.maximum(a, np.array(lo, a.dtype)), np.array(hi, a.dtype))


def _number(expr) -> int | float | None:
    """The value of a FloatImm / IntImm (or of a PrimValue holding one), an IntImm's exactly."""
    value = getattr(expr, "value", None)
    value = getattr(value, "value", value)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _concat(call, parts):
    """Along an axis (None flattens: not folded), every part of one dtype."""
    if call.attrs.axis is None or not parts or len({part.dtype for part in parts}) != 1:
        return None
    return np.concatenate(parts, axis=int(call.attrs.axis))
