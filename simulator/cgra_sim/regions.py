"""Scratchpad regions: the strided blocks of elements a command reads or writes.

Stage: simulator (shared). A `Region` is element (i0, i1, ...) at byte address
`addr + sum(i_d * strides[d])`; strides are in bytes and may be zero or negative. It gives the
numpy view of those elements on the scratchpad (execution), the view of their bytes on a
same-sized boolean map (the written-bytes check), and its bounding byte interval [lo, hi)
(bounds checks and the timing scoreboard).
"""

from __future__ import annotations

import numpy as np


class Region:
    """A strided block of scratchpad elements of one dtype."""

    __slots__ = ("name", "addr", "shape", "strides", "dtype", "lo", "hi")

    def __init__(self, name: str, addr: int, shape: tuple[int, ...], strides: tuple[int, ...],
                 dtype: np.dtype):
        """`strides` in bytes; `dtype` a numpy dtype object."""
        self.name = name
        self.addr = addr
        self.shape = shape
        self.strides = strides
        self.dtype = dtype
        lo = hi = addr
        for stride, extent in zip(self.strides, self.shape):
            span = stride * (extent - 1)
            if span < 0:
                lo += span
            else:
                hi += span
        self.lo, self.hi = lo, hi + dtype.itemsize

    def view(self, spad: np.ndarray) -> np.ndarray:
        """The elements, as a writable numpy view on the scratchpad byte array `spad`."""
        return np.ndarray(self.shape, self.dtype, buffer=spad, offset=self.addr, strides=self.strides)

    def byte_view(self, byte_map: np.ndarray) -> np.ndarray:
        """The bytes of every element on a map the size of the scratchpad: shape + (itemsize,)."""
        return np.ndarray(self.shape + (self.dtype.itemsize,), byte_map.dtype, buffer=byte_map,
                          offset=self.addr, strides=self.strides + (1,))

    def __repr__(self) -> str:
        return f"Region({self.name}, bytes [{self.lo}, {self.hi}), shape {self.shape})"
