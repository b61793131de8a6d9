"""Validation of a whole stream before anything runs: decoding plus the dataflow check.

Stage: simulator, steps 1-2 of `simulate`. In: the raw stream, host tensors, hardware description.
Out: the decoded commands (see decode.py), or a `CommandError` for the first bad command; no
command has run at that point and no host tensor has been touched.

The dataflow check: a command may only read scratchpad bytes that an earlier command wrote. A map
of one boolean per scratchpad byte is walked in stream order (reads checked, then writes marked),
so a kernel bug cannot hide behind stale data left in the scratchpad by something else. A store
whose box reaches into the halo only reads the elements it moves to the tensor.
"""

from __future__ import annotations

import numpy as np

from .arch import HardwareDescription
from .decode import Command, DmaCommand, as_records, check_tensors, decode_stream
from .errors import CommandError
from .isa import Op
from .regions import Region


def validate_stream(arch: HardwareDescription, commands, tensors) -> list[Command]:
    """Decodes and checks the stream; returns the decoded commands."""
    tensors = check_tensors(tensors)
    decoded = decode_stream(arch, as_records(commands), tensors)
    check_dataflow(decoded, arch.spad_bytes)
    return decoded


def check_dataflow(commands: list[Command], spad_bytes: int) -> None:
    """Raises `CommandError` for the first command that reads never-written scratchpad bytes."""
    written = np.zeros(spad_bytes, dtype=bool)
    for cmd in commands:
        if cmd.repeat_of >= 0:
            # The same record passed at `repeat_of`; marks are never cleared, so what it read is
            # still written and what it writes is already marked.
            continue
        for region in cmd.reads:
            _check_written(cmd, region, written)
        for region in cmd.writes:
            region.byte_view(written)[...] = True


def _check_written(cmd: Command, region: Region, written: np.ndarray) -> None:
    marks = region.byte_view(written)
    offset = (0,) * len(region.shape)
    if isinstance(cmd, DmaCommand) and cmd.op is Op.DMA_STORE and not cmd.halo_free:
        if cmd.host_points == 0:
            return
        if cmd.inner is not None:  # only the in-bounds sub-box leaves the scratchpad
            marks = marks[cmd.inner]
            offset = tuple(index.start for index in cmd.inner)
        else:
            marks = np.where(cmd.inbounds_mask()[..., None], marks, True)
    if marks.all():
        return
    first = np.argwhere(~marks)[0]
    index = [int(i) + o for i, o in zip(first[:-1], offset)]
    address = region.addr + sum(i * s for i, s in zip(index, region.strides)) + int(first[-1])
    raise CommandError(cmd.index, cmd.op.name,
                       f"reads scratchpad bytes [{region.lo}, {region.hi}) ({region.name}) but byte "
                       f"{address} was never written by an earlier command")
