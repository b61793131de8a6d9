"""Geometry of a DMA box: which tensor coordinates and scratchpad elements its loops visit.

Stage: simulator (shared by validation, functional execution and statistics). In: the box words of
a DMA record (isa.py: origin, pad_lo, pad_hi, and per loop extent/tdim/tstep/sstride). Out:
coordinate ranges computed in closed form (for the bounds checks), coordinate arrays built by
broadcasting (for execution when the box reaches into the halo), and counts.

Loop `l` has index i_l in [0, extent_l). The box visits the loop points in the product of the four
ranges; at point (i_0..i_3) the tensor coordinate along dimension d is
    c[d] = origin[d] + sum over loops l with tdim_l == d of tstep_l * i_l
and the scratchpad element is sum_l sstride_l * i_l past the box's scratchpad address. Every loop
walks exactly one tensor dimension, so the set of visited points is a product over dimensions:
the in-bounds points are counted per dimension and multiplied.
"""

from __future__ import annotations

import math

import numpy as np

from .isa import BOX_DIMS, FIELDS, Op

_WORDS = FIELDS[Op.DMA_LOAD]
_ORIGIN = _WORDS.index("origin0")
_PAD_LO = _WORDS.index("pad_lo0")
_PAD_HI = _WORDS.index("pad_hi0")
_LOOPS = _WORDS.index("extent0")
_LOOP_WORDS = 4  # extent, tdim, tstep, sstride


class DmaBox:
    """The box of one DMA record, as plain Python ints."""

    __slots__ = ("origin", "pad_lo", "pad_hi", "extents", "tdims", "tsteps", "sstrides")

    def __init__(self, record: list[int]):
        self.origin = tuple(record[_ORIGIN:_ORIGIN + BOX_DIMS])
        self.pad_lo = tuple(record[_PAD_LO:_PAD_LO + BOX_DIMS])
        self.pad_hi = tuple(record[_PAD_HI:_PAD_HI + BOX_DIMS])
        loops = record[_LOOPS:_LOOPS + BOX_DIMS * _LOOP_WORDS]
        self.extents = tuple(loops[0::_LOOP_WORDS])
        self.tdims = tuple(loops[1::_LOOP_WORDS])
        self.tsteps = tuple(loops[2::_LOOP_WORDS])
        self.sstrides = tuple(loops[3::_LOOP_WORDS])

    @property
    def num_points(self) -> int:
        return math.prod(self.extents)

    def loops_on(self, dim: int) -> list[int]:
        """The loops that walk tensor dimension `dim`."""
        return [loop for loop in range(BOX_DIMS) if self.tdims[loop] == dim]

    def coordinate_range(self, dim: int) -> tuple[int, int]:
        """Smallest and largest coordinate (inclusive) the box visits along `dim`."""
        low = high = self.origin[dim]
        for tdim, step, extent in zip(self.tdims, self.tsteps, self.extents):
            if tdim == dim:
                span = step * (extent - 1)
                if span < 0:
                    low += span
                else:
                    high += span
        return low, high

    def coordinates(self, dim: int) -> np.ndarray:
        """c[dim] at every loop point, as an int64 array broadcastable to `extents`."""
        coords = np.full((1,) * BOX_DIMS, self.origin[dim], dtype=np.int64)
        for loop in self.loops_on(dim):
            shape = [1] * BOX_DIMS
            shape[loop] = self.extents[loop]
            coords = coords + self.tsteps[loop] * np.arange(self.extents[loop], dtype=np.int64).reshape(shape)
        return coords

    def inbounds_mask(self, shape: tuple[int, ...]) -> np.ndarray:
        """Boolean array of `extents`: True where the point lies inside the tensor (not the halo)."""
        mask = np.ones((1,) * BOX_DIMS, dtype=bool)
        for dim, size in enumerate(shape):
            coords = self.coordinates(dim)
            mask = mask & (coords >= 0) & (coords < size)
        return np.broadcast_to(mask, self.extents)

    def inbounds_points(self, shape: tuple[int, ...]) -> int:
        """Number of loop points inside the tensor: the elements actually moved to/from the host."""
        count = 1
        for dim, size in enumerate(shape):
            coords = self.coordinates(dim)
            count *= int(np.count_nonzero((coords >= 0) & (coords < size)))
        return count

    def inbounds_ranges(self, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...] | None:
        """Per loop, the index range [start, stop) whose points lie inside the tensor, in closed
        form; None when two loops of extent > 1 walk one dimension (then the in-bounds points
        are not a product of ranges: use `inbounds_mask`). An empty box has some stop <= start.

        With one loop l on dimension d, c[d] = origin[d] + tstep_l * i is monotone in i, so the
        in-bounds i form one range; the box is the product of those ranges (the halo-free
        sub-box), which lets loads and stores move it as one strided copy."""
        ranges = [(0, extent) for extent in self.extents]
        walked = set()
        for loop, (extent, dim, step) in enumerate(zip(self.extents, self.tdims, self.tsteps)):
            if extent == 1:
                continue
            if dim in walked:
                return None
            walked.add(dim)
            ranges[loop] = _inbounds_range(self.origin[dim], step, extent, shape[dim])
        for dim, size in enumerate(shape):
            if dim not in walked and not 0 <= self.origin[dim] < size:
                return ((0, 0),) * BOX_DIMS
        return tuple(ranges)

    def tensor_view(self, tensor: np.ndarray, inner: tuple[slice, ...] | None = None) -> np.ndarray:
        """The box as a strided numpy view on `tensor` (no copy): the whole box, which must
        avoid the halo, or with `inner` (per loop, a slice of indices inside the tensor, see
        `inbounds_ranges`) that sub-box."""
        origin, extents = list(self.origin), self.extents
        if inner is not None:
            for index, dim, step in zip(inner, self.tdims, self.tsteps):
                origin[dim] += step * index.start
            extents = tuple(index.stop - index.start for index in inner)
        offset = sum(o * stride for o, stride in zip(origin, tensor.strides))
        strides = tuple(step * tensor.strides[dim] for step, dim in zip(self.tsteps, self.tdims))
        return np.ndarray(extents, tensor.dtype, buffer=tensor, offset=offset, strides=strides)

    def tensor_injective(self, rank: int) -> bool:
        """Whether no two loop points visit the same tensor coordinate (stores need this)."""
        for dim in range(rank):
            loops = self.loops_on(dim)
            if not is_injective([self.tsteps[l] for l in loops], [self.extents[l] for l in loops]):
                return False
        return True

    def spad_injective(self) -> bool:
        """Whether no two loop points land on the same scratchpad element (loads need this)."""
        return is_injective(self.sstrides, self.extents)


def _inbounds_range(origin: int, step: int, extent: int, size: int) -> tuple[int, int]:
    """The i in [0, extent) with 0 <= origin + step * i < size, as [start, stop) (possibly empty)."""
    if step == 0:
        start, stop = (0, extent) if 0 <= origin < size else (0, 0)
    elif step > 0:
        start, stop = -(origin // step), (size - 1 - origin) // step + 1
    else:
        start, stop = -((size - 1 - origin) // -step), origin // -step + 1
    start, stop = max(start, 0), min(stop, extent)
    return (start, stop) if start < stop else (0, 0)


def is_injective(steps, extents) -> bool:
    """Whether i -> sum(step_l * i_l) over the box of `extents` never maps two points to one value.

    Fast path: sorted by |step|, each step clears the whole span of the smaller ones (the usual
    nested-loop layout). Otherwise the values are enumerated and compared; there are at most
    span + 1 of them, where span is the distance between the smallest and the largest value.
    """
    loops = sorted((abs(s), e) for s, e in zip(steps, extents) if e > 1)
    span = 0
    for step, extent in loops:
        if step <= span:
            break
        span += step * (extent - 1)
    else:
        return True
    span = sum(step * (extent - 1) for step, extent in loops)
    if any(step == 0 for step, _ in loops) or math.prod(e for _, e in loops) > span + 1:
        return False  # more points than values: some coincide
    values = np.zeros((), dtype=np.int64)
    for step, extent in loops:
        values = np.add.outer(values, step * np.arange(extent, dtype=np.int64))
    return np.unique(values).size == values.size
