"""Scratchpad regions: the strided blocks of elements a command reads or writes.

Stage: simulator (shared). A `Region` is element (i0, i1, ...) at byte address
`addr + sum(i_d * strides[d])`; strides are in bytes and may be zero or negative. It gives the
numpy view of those elements on the scratchpad (execution), the view of their bytes on a
same-sized boolean map (the written-bytes check), and its bounding byte interval [lo, hi)
(bounds checks and the timing scoreboard).
"""

from __future__ import annotations

import numpy as np


#: A region splits into at most this many byte intervals for the scoreboard; beyond it the
#: bounding interval stands in (conservative: it can only add dependencies, never drop one).
MAX_INTERVALS = 64


class Region:
    """A strided block of scratchpad elements of one dtype."""

    __slots__ = ("name", "addr", "shape", "strides", "dtype", "lo", "hi", "_intervals", "_viewed")

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
        self._intervals = None
        self._viewed = (None, None)  # (scratchpad, view) of the last `view` call

    @property
    def intervals(self) -> list[tuple[int, int]]:
        """The byte intervals the elements occupy: one per row of a 2-D tile whose rows are
        apart (a PE-array sub-tile of a wider accumulator), so neighbouring sub-tiles do not
        look like they overlap; the bounding interval otherwise."""
        if self._intervals is None:
            self._intervals = self._split_rows()
        return self._intervals

    def _split_rows(self):
        dims = [(extent, stride) for extent, stride in zip(self.shape, self.strides) if extent > 1]
        itemsize = self.dtype.itemsize
        if len(dims) != 2 or dims[1][1] != itemsize or dims[0][1] <= dims[1][0] * itemsize \
                or dims[0][0] > MAX_INTERVALS:
            return [(self.lo, self.hi)]
        (rows, row_stride), (cols, _) = dims
        return [(self.addr + r * row_stride, self.addr + r * row_stride + cols * itemsize) for r in range(rows)]

    def view(self, spad: np.ndarray) -> np.ndarray:
        """The elements, as a writable numpy view on the scratchpad byte array `spad`.

        The view is kept for the next call on the same scratchpad: commands repeated in a
        stream share their regions, so a loop of tiles builds each view once."""
        viewed_spad, view = self._viewed
        if viewed_spad is not spad:
            view = np.ndarray(self.shape, self.dtype, buffer=spad, offset=self.addr, strides=self.strides)
            self._viewed = (spad, view)
        return view

    def byte_view(self, byte_map: np.ndarray) -> np.ndarray:
        """The bytes of every element on a map the size of the scratchpad: shape + (itemsize,)."""
        return np.ndarray(self.shape + (self.dtype.itemsize,), byte_map.dtype, buffer=byte_map,
                          offset=self.addr, strides=self.strides + (1,))

    def __repr__(self) -> str:
        return f"Region({self.name}, bytes [{self.lo}, {self.hi}), shape {self.shape})"
