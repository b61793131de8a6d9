"""Decoding DMA_LOAD and DMA_STORE records (a box between a host tensor and the scratchpad).

Stage: simulator, step 1 (decode.py's table calls `decode_dma`). Checks: the slot and the
tensor dimensions the box walks exist, every coordinate lies inside the tensor plus its halo,
the box fits the simulator's point limit and the scratchpad, a store writes each tensor element
once and a load each scratchpad element once.
"""

from __future__ import annotations

import math

from .box import DmaBox
from .commands import DTYPE_OF_NUMPY, Checker, DmaCommand
from .isa import BOX_DIMS, DMA_FILL_LOWEST, FIELDS, Op
from .regions import Region

#: A DMA box may have max(spad_bytes, this) points: far above what a scratchpad-sized box needs
#: (a load cannot exceed the scratchpad), low enough that checking and moving it stays cheap.
MIN_BOX_POINT_LIMIT = 1 << 22
_DMA_FLAGS, _DMA_SLOT, _DMA_SPAD_ADDR = (FIELDS[Op.DMA_LOAD].index(name) for name in ("flags", "slot", "spad_addr"))


def decode_dma(check: Checker, index: int, op: Op, record: list[int], tensors) -> DmaCommand:
    flags, slot, spad_addr = record[_DMA_FLAGS], record[_DMA_SLOT], record[_DMA_SPAD_ADDR]
    check.flags(flags, DMA_FILL_LOWEST if op is Op.DMA_LOAD else 0)
    if not 0 <= slot < len(tensors):
        check.fail(f"slot {slot} is out of range: the launch binds {len(tensors)} tensors")
    tensor = tensors[slot]
    box = DmaBox(record)
    if min(box.extents) < 1:
        check.positive(**{f"extent{loop}": box.extents[loop] for loop in range(BOX_DIMS)})
    for loop, tdim in enumerate(box.tdims):
        if not 0 <= tdim < tensor.ndim:
            check.fail(f"tdim{loop} = {tdim} is not a dimension of slot {slot} (rank {tensor.ndim})")
    halo_free = _check_coordinates(check, box, slot, tensor.shape)
    limit = max(check.spad_bytes, MIN_BOX_POINT_LIMIT)
    if box.num_points > limit:
        check.fail(f"the box has {box.num_points} points, more than the simulator's limit of {limit}")
    dtype = tensor.dtype
    strides = tuple(s * dtype.itemsize for s in box.sstrides)
    region = check.region(Region("box", spad_addr, box.extents, strides, dtype))
    if op is Op.DMA_STORE and not box.tensor_injective(tensor.ndim):
        check.fail(f"the box revisits elements of slot {slot}: a store must write each element once")
    if op is Op.DMA_STORE and not tensor.flags.writeable:
        check.fail(f"slot {slot} is read-only and cannot be stored to")
    if op is Op.DMA_LOAD and not box.spad_injective():
        check.fail(f"scratchpad strides {box.sstrides} alias: the load would write elements twice")
    cmd = DmaCommand(index, op)
    cmd.slot, cmd.tensor, cmd.box, cmd.halo_free, cmd.region = slot, tensor, box, halo_free, region
    cmd.fill = DTYPE_OF_NUMPY[dtype].lowest if flags & DMA_FILL_LOWEST else 0
    ranges = None if halo_free else box.inbounds_ranges(tensor.shape)
    if ranges is not None:
        cmd.host_points = math.prod(stop - start for start, stop in ranges)
    else:
        cmd.host_points = box.num_points if halo_free else box.inbounds_points(tensor.shape)
    cmd.inner = None if ranges is None or cmd.host_points == 0 else \
        tuple(slice(start, stop) for start, stop in ranges)
    cmd.host_view = box.tensor_view(tensor, cmd.inner) if halo_free or cmd.inner else None
    if op is Op.DMA_LOAD:
        cmd.writes = (cmd.region,)
    else:
        cmd.reads = (cmd.region,)
    return cmd


def _check_coordinates(check: Checker, box: DmaBox, slot: int, shape) -> bool:
    """Checks the box against the tensor plus halo; returns whether it avoids the halo."""
    halo_free = True
    for dim in range(BOX_DIMS):
        if dim >= len(shape):
            if box.origin[dim] or box.pad_lo[dim] or box.pad_hi[dim]:
                check.fail(f"origin/pad words of dimension {dim} must be 0: slot {slot} has rank "
                           f"{len(shape)}")
            continue
        lo_pad, hi_pad = box.pad_lo[dim], box.pad_hi[dim]
        if lo_pad < 0 or hi_pad < 0:
            check.fail(f"halo of dimension {dim} must be >= 0, got pad_lo {lo_pad}, pad_hi {hi_pad}")
        low, high = box.coordinate_range(dim)
        if low < -lo_pad or high >= shape[dim] + hi_pad:
            check.fail(f"coordinates [{low}, {high + 1}) of dimension {dim} leave slot {slot}'s range "
                       f"[{-lo_pad}, {shape[dim] + hi_pad}) (size {shape[dim]}, halo {lo_pad} below, "
                       f"{hi_pad} above)")
        halo_free = halo_free and low >= 0 and high < shape[dim]
    return halo_free
