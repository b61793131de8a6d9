"""The timing layer: a cycle-approximate schedule of a validated command stream.

Stage: simulator, step 4 (independent of the functional core: it only needs decoded commands).
In: decoded commands (decode.py) and the hardware description. Out: a `Schedule`, the start and
end cycle of every command. Nothing here is validated against RTL (there is none); the model is
the analytical one below, with its assumptions in docs/simulator.md.

Model. Four in-order queues, one per `isa.Unit`: LOAD (DMA_LOAD), COMPUTE (GEMM: the PE array),
VECTOR (FILL, EPILOGUE: the vector unit beside the array) and STORE (DMA_STORE). `ready` is when
a command's scratchpad dependencies are met: a scoreboard on byte ranges (scoreboard.py) gives
read-after-write, write-after-read and write-after-write against earlier commands in stream
order. A command starts at max(free, ready), free being when the previous command on its queue
left the unit, and ends:
    DMA (either direction)  start + dma_latency + ceil(box_bytes / dma_bytes_per_cycle)
        box_bytes counts every box element, halo included (the engine makes zeros at full rate).
        The load and the store engine each have the full bandwidth. An engine keeps several
        transfers in flight: it is busy for the transfer (box_bytes / bandwidth) and can start
        the next one then; the latency delays only the command's completion.
    FILL, EPILOGUE (vector unit)  start + ceil(operands * rows * cols / vector_lanes) + 2
        operands: tiles the command streams through the lanes' one scratchpad read port: 1, or
        2 for an EPILOGUE with a residual (acc and residual). The bias row and the clip bounds
        are held in registers; relu and clip are more stages of the lanes' pipeline (free).
    GEMM (output-stationary rows x cols PE array)
        steady = ceil(m / rows) * ceil(n / cols) * ceil(k / macs_per_pe[dtype])  (folds pipelined)
        fill   = min(m, rows) + min(n, cols) - 2: fill and drain of the sub-array the GEMM uses
        After anything but a GEMM of the same dtype, operands enter at
            stream = start (+ config_load_cycles if the PE array held another configuration,
                            i.e. (GEMM, dtype) differs; vector commands leave it alone)
        Right after a GEMM of the same dtype, operands enter as soon as they are ready and the
        previous GEMM's operands are in:  stream = max(ready, previous stream + previous steady)
        end = max(stream + fill, previous end) + steady   (results leave in order)
        So back-to-back GEMMs of one shape pay the fill once: the next fill hides under the
        previous drain. Partial sums stay in the array: a GEMM whose accumulator is exactly the
        previous GEMM's accumulator sees that GEMM's write as done when its operands are in.
The kernel takes max(end) cycles.

Occupancy. Each unit's cycles [0, kernel cycles) split exactly into busy, stalled and idle:
    busy     a command occupies the unit: [start, start + occupancy) (a DMA: the transfer only)
    stalled  the unit is free but the next command on its queue has not started: from the cycle
             the unit became free (0 for its first command) to that command's start. Since
             start = max(free, ready), this is always a wait for a scratchpad dependency
             (`Schedule.waits_for` names the command it waits for). A DMA never waits for its
             engine beyond the engine's busy time: transfers in flight are unlimited.
    idle     after the unit's last command left it (a DMA's latency tail included: the engine
             could take another transfer), or all along for a unit with no commands.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from .arch import HardwareDescription
from .decode import Command, DmaCommand, EpilogueCommand, FillCommand, GemmCommand
from .errors import CycleLimitExceeded
from .isa import DType, Op, Unit
from .regions import Region
from .scoreboard import Scoreboard

DEFAULT_MAX_CYCLES = 10**12
VECTOR_OVERHEAD_CYCLES = 2  # issue + write-back of a vector-unit command


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When every command ran: arrays indexed by the command's position in the stream."""

    ops: np.ndarray  # opcode (isa.Op values)
    units: np.ndarray  # isa.Unit values
    starts: np.ndarray  # first busy cycle
    ends: np.ndarray  # first cycle after it (end - start = duration)
    occupancy: np.ndarray  # cycles the command kept its unit busy (a DMA's latency is not busy)
    config_loads: int  # PE-array configuration loads paid
    # index of the command whose access this command's start waited for; -1 when it did not stall.
    # None in schedules built without it (then stalls are known, but not their cause).
    waits_for: np.ndarray | None = None

    @property
    def cycles(self) -> int:
        """Cycles of the whole kernel: the last end (0 for an empty stream)."""
        return int(self.ends.max()) if len(self.ends) else 0

    def busy_cycles(self, unit: Unit) -> int:
        """Cycles `unit` spent running commands."""
        return int(self.occupancy[self.units == int(unit)].sum())

    def stalls(self) -> np.ndarray:
        """Per command: cycles its unit sat free before it started (0: it started right away)."""
        frees = self.starts + self.occupancy
        previous_free = np.zeros_like(self.starts)  # the kernel's start, for a unit's first command
        for unit in Unit:
            at = np.flatnonzero(self.units == int(unit))
            previous_free[at[1:]] = frees[at[:-1]]
        return self.starts - previous_free

    def stall_cycles(self, unit: Unit, stalls: np.ndarray | None = None) -> int:
        """Cycles `unit` was free while its next command waited for a dependency.
        `stalls`: `self.stalls()`, if already computed."""
        stalls = self.stalls() if stalls is None else stalls
        return int(stalls[self.units == int(unit)].sum())

    def idle_cycles(self, unit: Unit) -> int:
        """Cycles after `unit`'s last command left it (all of them if it had none)."""
        at = np.flatnonzero(self.units == int(unit))
        return self.cycles - (int(self.starts[at[-1]] + self.occupancy[at[-1]]) if len(at) else 0)

    def to_records(self) -> list[dict]:
        """One dict per command (index, op, unit, start, end), e.g. for a trace viewer."""
        return [{"index": i, "op": Op(op).name, "unit": Unit(unit).name, "start": int(s), "end": int(e)}
                for i, (op, unit, s, e) in enumerate(zip(self.ops, self.units, self.starts, self.ends))]


class _PreviousGemm(NamedTuple):
    index: int
    dtype: DType
    acc: tuple  # (addr, shape, strides) of its accumulator
    stream_end: int  # cycle its last operands entered the array


class _ComputeQueue:
    """What the COMPUTE queue remembers between commands: the PE array's state."""

    __slots__ = ("config", "previous_gemm", "config_loads")

    def __init__(self):
        self.config = None  # (Op.GEMM, dtype) loaded in the PE array; None before the first GEMM
        self.previous_gemm = None  # the previous COMPUTE command if it was a GEMM
        self.config_loads = 0

    def forwarding(self, cmd: Command):
        """(region, (writer, cycle)) when `cmd`'s accumulator stays in the array, else None."""
        prev = self.previous_gemm
        if isinstance(cmd, GemmCommand) and prev is not None and prev.dtype is cmd.dtype \
                and prev.acc == _region_key(cmd.acc):
            return cmd.acc, (prev.index, prev.stream_end)
        return None


def _region_key(region: Region) -> tuple:
    return region.addr, region.shape, region.strides


def gemm_steady_cycles(arch: HardwareDescription, cmd: GemmCommand) -> int:
    """Cycles the PE array streams operands: folds of the output times k per MAC rate."""
    folds = -(-cmd.m // arch.rows) * -(-cmd.n // arch.cols)
    return folds * -(-cmd.k // arch.macs_per_pe[cmd.dtype.numpy_name])


def gemm_fill_cycles(arch: HardwareDescription, cmd: GemmCommand) -> int:
    """Pipeline fill and drain of the sub-array the GEMM occupies (rows + cols - 2 when full).

    The sub-array rather than the whole array, so that a tile sized for a smaller array does not
    get slower on a larger one: operands skew only through the PEs that hold outputs.
    """
    return min(cmd.m, arch.rows) + min(cmd.n, arch.cols) - 2


def _time_dma(arch: HardwareDescription, cmd: DmaCommand, ready: int, free: int,
              compute: _ComputeQueue) -> tuple[int, int, int]:
    start = max(free, ready)
    transfer = -(-cmd.box_bytes // arch.dma_bytes_per_cycle)
    return start, start + arch.dma_latency + transfer, start + transfer


def _time_vector(arch: HardwareDescription, cmd: FillCommand | EpilogueCommand, ready: int,
                 free: int, compute: _ComputeQueue) -> tuple[int, int, int]:
    rows, cols = (cmd.region if isinstance(cmd, FillCommand) else cmd.out).shape
    tiles = 2 if isinstance(cmd, EpilogueCommand) and cmd.residual is not None else 1
    start = max(free, ready)
    end = start + -(-tiles * rows * cols // arch.vector_lanes) + VECTOR_OVERHEAD_CYCLES
    return start, end, end


def _time_gemm(arch: HardwareDescription, cmd: GemmCommand, ready: int, free: int,
               compute: _ComputeQueue) -> tuple[int, int, int]:
    start = max(free, ready)
    prev = compute.previous_gemm
    if prev is not None and prev.dtype is cmd.dtype:
        stream = max(ready, prev.stream_end)
    else:
        stream = start
        if compute.config != (Op.GEMM, cmd.dtype):
            stream += arch.config_load_cycles
            compute.config = (Op.GEMM, cmd.dtype)
            compute.config_loads += 1
    steady = gemm_steady_cycles(arch, cmd)
    end = max(stream + gemm_fill_cycles(arch, cmd), free) + steady
    compute.previous_gemm = _PreviousGemm(cmd.index, cmd.dtype, _region_key(cmd.acc), stream + steady)
    return start, end, end


_TIMERS = {
    Op.DMA_LOAD: _time_dma,
    Op.DMA_STORE: _time_dma,
    Op.GEMM: _time_gemm,
    Op.FILL: _time_vector,
    Op.EPILOGUE: _time_vector,
}


def _read_intervals(cmd: Command, region: Region):
    """Row-exact intervals where the command also writes the region (a GEMM's accumulator, whose
    neighbouring sub-tiles other GEMMs update); the bounding interval for read-only operands:
    the only writes into their gaps come from the DMA that loaded them, so it is exact enough,
    and it keeps the scoreboard small."""
    return region.intervals if any(region is written for written in cmd.writes) else [(region.lo, region.hi)]


def _ready(board: Scoreboard, cmd: Command, forwarding) -> int:
    """When every scratchpad dependency of `cmd` is met."""
    held, forward = forwarding if forwarding is not None else (None, None)
    ready = 0
    for region in cmd.reads:
        for lo, hi in _read_intervals(cmd, region):
            ready = max(ready, board.read_ready(lo, hi, forward if region is held else None))
    for region in cmd.writes:
        for lo, hi in region.intervals:
            ready = max(ready, board.write_ready(lo, hi, forward if region is held else None))
    return ready


def _blocker(board: Scoreboard, cmd: Command, forwarding, ready: int) -> int:
    """The command whose access made `cmd` ready at `ready` (mirrors `_ready`; called only
    for a command that stalls, so the common path does not pay for it)."""
    held, forward = forwarding if forwarding is not None else (None, None)
    for region in cmd.reads:
        for lo, hi in _read_intervals(cmd, region):
            found = board.blocker(lo, hi, ready, False, forward if region is held else None)
            if found >= 0:
                return found
    for region in cmd.writes:
        for lo, hi in region.intervals:
            found = board.blocker(lo, hi, ready, True, forward if region is held else None)
            if found >= 0:
                return found
    return -1


def schedule_commands(arch: HardwareDescription, commands: list[Command],
                      max_cycles: int = DEFAULT_MAX_CYCLES) -> Schedule:
    """Times `commands` (decoded and validated); raises `CycleLimitExceeded` past `max_cycles`."""
    board = Scoreboard(arch.spad_bytes)
    queue_free = [0] * len(Unit)
    compute = _ComputeQueue()
    starts, ends, busy, waits_for = [], [], [], []
    for cmd in commands:
        forwarding = compute.forwarding(cmd)
        ready = _ready(board, cmd, forwarding)
        start, end, free = _TIMERS[cmd.op](arch, cmd, ready, queue_free[cmd.unit], compute)
        if end > max_cycles:
            raise CycleLimitExceeded(cmd.index, cmd.op.name, end, max_cycles)
        # start > free only when ready > free (start = max(free, ready)): a dependency stall.
        stalled = start > queue_free[cmd.unit]
        waits_for.append(_blocker(board, cmd, forwarding, start) if stalled else -1)
        for region in cmd.reads:
            for lo, hi in _read_intervals(cmd, region):
                board.record_read(lo, hi, end, cmd.index)
        for region in cmd.writes:
            for lo, hi in region.intervals:
                board.record_write(lo, hi, end, cmd.index)
        queue_free[cmd.unit] = free
        starts.append(start)
        ends.append(end)
        busy.append(free - start)
    return Schedule(ops=np.array([int(c.op) for c in commands], dtype=np.int8),
                    units=np.array([int(c.unit) for c in commands], dtype=np.int8),
                    starts=np.array(starts, dtype=np.int64), ends=np.array(ends, dtype=np.int64),
                    occupancy=np.array(busy, dtype=np.int64), config_loads=compute.config_loads,
                    waits_for=np.array(waits_for, dtype=np.int32))

