"""Numpy arrays for the weights normalise folds, without copies of the model's largest arrays.

Stage: normalise (fold_weights.py). The folds read a constant's tensor as a
read-only numpy view of its memory (`read_only_view`) and give their results to TVM sharing the
result's memory (`shared_const`, which needs it 64-byte aligned: `aligned_empty`). Copying
instead cost ResNet-50's warm compile 30 ms and a second copy of its 100 MB of weights.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

#: The alignment TVM requires of memory a tensor shares (tvm.runtime.from_dlpack).
_ALIGNMENT = 64


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised array whose data starts on a 64-byte boundary, so that `shared_const`
    can hand it to TVM without a copy."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(count * dtype.itemsize + _ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGNMENT
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


def shared_const(array: np.ndarray, dtype: str):
    """relax.const(array, dtype), sharing the array's memory when TVM can (contiguous, 64-byte
    aligned, writable: numpy exports no read-only memory), else a copy. The folded weights are a
    model's largest arrays: ResNet-50's batch norms folded 100 MB, copied once more here."""
    if array.dtype.name == dtype and array.dtype.kind in "iuf" and array.size and array.flags.c_contiguous \
            and array.flags.writeable and array.ctypes.data % _ALIGNMENT == 0:  # DLPack has no bfloat16 of numpy's
        return relax.const(tvm.runtime.from_dlpack(array), dtype)
    return relax.const(array, dtype)


def read_only_view(tensor) -> np.ndarray:
    """A constant's tensor as a read-only numpy array over its memory (a copy only for a dtype
    numpy cannot view, e.g. bfloat16): the folds read weights, they never write them."""
    try:
        view = np.from_dlpack(tensor)
    except (BufferError, TypeError, ValueError, RuntimeError):
        return tensor.numpy()
    view.flags.writeable = False
    return view
