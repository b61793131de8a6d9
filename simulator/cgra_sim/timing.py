"""The timing layer: a cycle-approximate timeline of a validated command stream.

Stage: simulator, step 4 (independent of the functional core: it only needs decoded commands).
In: decoded commands (decode.py) and the hardware description. Out: a `Timeline`, the start and
end cycle of every command. Nothing here is validated against RTL (there is none); the model is
the analytical one below, with its assumptions in docs/simulator.md.

Model. Four in-order queues, one per `isa.Unit`: LOAD (DMA_LOAD), COMPUTE (GEMM, DEPTHWISE: the
PE array), VECTOR (FILL, EPILOGUE, POOL, ELTWISE: the vector unit beside the array) and STORE (DMA_STORE). `ready` is when
a command's scratchpad dependencies are met: a scoreboard on byte ranges (scoreboard.py) gives
read-after-write, write-after-read and write-after-write against earlier commands in stream
order. A command starts at max(free, ready), free being when the previous command on its queue
left the unit, and ends after its cycles, the closed forms of cost.py read off the command
(command_cycles.py; the compiler's tile searches use the same ones): a DMA's latency and transfer, a vector command's lanes and
overhead, a GEMM's or DEPTHWISE's steady stream and fill, read off the decoded command here.
    PE array  After anything but a GEMM of the same dtype, operands enter at
            stream = max(ready, free + config)   (config: the systolic cell's configuration,
                            config_load_cycles a context slot (cost.pe_array_config_cycles), if
                            (GEMM, dtype) is not in the PE array's context memory, else 0; vector
                            commands leave it alone. It comes from the command stream, not the
                            scratchpad: it loads while the operands arrive, the command starting
                            at stream - config)
        Right after a GEMM of the same dtype, operands enter as soon as they are ready and the
        previous GEMM's operands are in:  stream = max(ready, previous stream + previous steady)
        end = max(stream + fill, previous end) + steady   (results leave in order)
        So back-to-back GEMMs of one shape pay the fill once: the next fill hides under the
        previous drain. Partial sums stay in the array: a GEMM whose accumulator is exactly the
        previous GEMM's accumulator sees that GEMM's write as done when its operands are in.
        DEPTHWISE likewise, keyed by (DEPTHWISE, dtype): switching between GEMM and DEPTHWISE
        loads a configuration only if it is not resident (context memory, below).
    FABRIC  end = start (+ the body's configuration load, cost.fabric_config_cycles, if it is not
            in the context memory, overlapping the wait for the operands as a GEMM's does) +
            cost.fabric_run_cycles (its mapping's latency, lanes and II: mapping/body.py).
    Context memory: a PE holds `fabric.context_depth` configuration slots; GEMM and DEPTHWISE
        take the cell's (mapping/pe_array.py: 1 on the presets), a FABRIC body its II. Switching
        to a resident configuration is free (a multi-context CGRA changes its context pointer);
        loading one evicts the least recently used until the resident ones fit.
Scratchpad banks (banks.py): the streaming part of every command above (a DMA's transfer, a
vector command's tiles, a GEMM's steady folds, a DEPTHWISE's window traffic) is stretched by its
bank slowdown, >= 1 and exactly 1 for a conflict-free access pattern; computed once per
distinct record (`_ComputeQueue.cycles_of`).
The kernel takes max(end) cycles.

Occupancy. Each unit's cycles [0, kernel cycles) split exactly into busy, stalled and idle:
    busy     a command occupies the unit: [start, start + occupancy) (a DMA: the transfer only)
    stalled  the unit is free but the next command on its queue has not started: from the cycle
             the unit became free (0 for its first command) to that command's start. Since
             start = max(free, ready), this is always a wait for a scratchpad dependency
             (`Timeline.waits_for` names the command it waits for). A DMA never waits for its
             engine beyond the engine's busy time: transfers in flight are unlimited.
    idle     after the unit's last command left it (a DMA's latency tail included: the engine
             could take another transfer), or all along for a unit with no commands.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from . import cost
from .arch import HardwareDescription
from .command_cycles import (depthwise_steady_cycles, dma_transfer_cycles, eltwise_reads, fabric_cycles,
                             gemm_fill_cycles, gemm_steady_cycles, vector_cycles)
from .commands import (Command, DepthwiseCommand, DmaCommand, EltwiseCommand, EpilogueCommand, FabricCommand,
                       FillCommand, GemmCommand, PoolCommand, ReduceCommand, VfuncCommand)
from .errors import CycleLimitExceeded
from .isa import DType, Op, Unit
from .regions import Region
from .scoreboard import Scoreboard

DEFAULT_MAX_CYCLES = 10**12


@dataclasses.dataclass(frozen=True)
class Timeline:
    """When every command ran: arrays indexed by the command's position in the stream."""

    ops: np.ndarray  # opcode (isa.Op values)
    units: np.ndarray  # isa.Unit values
    starts: np.ndarray  # first busy cycle
    ends: np.ndarray  # first cycle after it (end - start = duration)
    occupancy: np.ndarray  # cycles the command kept its unit busy (a DMA's latency is not busy)
    config_loads: int  # PE-array configuration loads paid
    # index of the command whose access this command's start waited for; -1 when it did not stall.
    # None in timelines built without it (then stalls are known, but not their cause).
    waits_for: np.ndarray | None = None
    # Context slots those loads wrote into every PE (a GEMM's cell 1 on the presets, a FABRIC
    # body its II): what the configuration energy counts.
    config_slots: int = 0

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
            # A queue runs in stream order, so its starts and frees never decrease, except for a
            # load prefetched during the previous launch (times clamped to 0): taken in start order.
            at = at[np.argsort(self.starts[at], kind="stable")]
            previous_free[at[1:]] = np.maximum.accumulate(frees[at[:-1]])
        return np.maximum(self.starts - previous_free, 0)

    def stall_cycles(self, unit: Unit, stalls: np.ndarray | None = None) -> int:
        """Cycles `unit` was free while its next command waited for a dependency.
        `stalls`: `self.stalls()`, if already computed."""
        stalls = self.stalls() if stalls is None else stalls
        return int(stalls[self.units == int(unit)].sum())

    def idle_cycles(self, unit: Unit) -> int:
        """Cycles after `unit`'s last command left it (all of them if it had none)."""
        at = np.flatnonzero(self.units == int(unit))
        return self.cycles - (int((self.starts[at] + self.occupancy[at]).max()) if len(at) else 0)

    def to_records(self) -> list[dict]:
        """One dict per command (index, op, unit, start, end), e.g. for a trace viewer."""
        return [{"index": i, "op": Op(op).name, "unit": Unit(unit).name, "start": int(s), "end": int(e)}
                for i, (op, unit, s, e) in enumerate(zip(self.ops, self.units, self.starts, self.ends))]


class _PreviousGemm(NamedTuple):
    index: int
    op: Op  # GEMM or DEPTHWISE: what the PE array is configured for
    dtype: DType
    acc: tuple  # (addr, shape, strides) of its accumulator
    stream_end: int  # cycle its last operands entered the array


class _ComputeQueue:
    """What the COMPUTE queue remembers between commands: the PE array's state. Every timer gets
    it; `cycles_of` caches, per stream, the cycles a record costs on its unit (its first
    command's index -> cycles), so a repeated record does not recompute its bank conflicts."""

    __slots__ = ("resident", "previous_gemm", "config_loads", "config_slots", "cycles_of")

    def __init__(self):
        # The configurations in the PE array's context memory, least recently used first:
        # key -> context slots per PE ((GEMM or DEPTHWISE, dtype): 1; (FABRIC, dtype, body): II).
        self.resident = {}
        self.previous_gemm = None  # the previous COMPUTE command (GEMM or DEPTHWISE)
        self.config_loads = 0
        self.config_slots = 0
        self.cycles_of = {}

    def switch(self, key, slots: int, depth: int) -> bool:
        """Make configuration `key` (`slots` contexts per PE) the active one; whether it had to be
        loaded (it was not resident). Loading evicts the least recently used configurations until
        the resident ones fit the `depth` contexts of a PE."""
        loaded = key not in self.resident
        self.resident.pop(key, None)
        while self.resident and sum(self.resident.values()) + slots > depth:
            self.resident.pop(next(iter(self.resident)))
        self.resident[key] = slots
        self.config_loads += loaded
        self.config_slots += loaded * slots
        return loaded

    def forwarding(self, cmd: Command):
        """(region, (writer, cycle)) when `cmd`'s accumulator stays in the array, else None."""
        prev = self.previous_gemm
        if cmd.unit is Unit.COMPUTE and prev is not None and (prev.op, prev.dtype) == (cmd.op, cmd.dtype) \
                and prev.acc == _region_key(cmd.acc):
            return cmd.acc, (prev.index, prev.stream_end)
        return None


def _region_key(region: Region) -> tuple:
    return region.addr, region.shape, region.strides


def _cycles(arch: HardwareDescription, cmd: Command, compute: _ComputeQueue, cycles_fn) -> int:
    """`cycles_fn(arch, cmd)`, once per distinct record of the stream."""
    key = cmd.index if cmd.repeat_of < 0 else cmd.repeat_of
    cycles = compute.cycles_of.get(key)
    if cycles is None:
        cycles = compute.cycles_of[key] = cycles_fn(arch, cmd)
    return cycles


def _time_dma(arch: HardwareDescription, cmd: DmaCommand, ready: int, free: int,
              compute: _ComputeQueue) -> tuple[int, int, int]:
    start = max(free, ready)
    transfer = _cycles(arch, cmd, compute, dma_transfer_cycles)
    return start, start + arch.dma_latency + transfer, start + transfer


def _time_vector(arch: HardwareDescription, cmd: FillCommand | EpilogueCommand, ready: int,
                 free: int, compute: _ComputeQueue) -> tuple[int, int, int]:
    start = max(free, ready)
    end = start + _cycles(arch, cmd, compute, vector_cycles)
    return start, end, end


def _time_eltwise(arch: HardwareDescription, cmd: EltwiseCommand, ready: int, free: int,
                  compute: _ComputeQueue) -> tuple[int, int, int]:
    start = max(free, ready)
    end = start + cost.eltwise_cycles(arch, cmd.elements, eltwise_reads(cmd))
    return start, end, end


def _time_reduce(arch: HardwareDescription, cmd: ReduceCommand, ready: int, free: int,
                 compute: _ComputeQueue) -> tuple[int, int, int]:
    start = max(free, ready)
    end = start + cost.reduce_cycles(arch, *cmd.a.shape)
    return start, end, end


def _time_vfunc(arch: HardwareDescription, cmd: VfuncCommand, ready: int, free: int,
                compute: _ComputeQueue) -> tuple[int, int, int]:
    start = max(free, ready)
    func, scale, offset = cmd.func.name.lower(), cmd.scale is not None, cmd.offset is not None
    end = start + cost.vfunc_cycles(arch, cmd.elements, func, scale, offset)
    # on the function unit the fill delays the results, not the next command (cost.py)
    return start, end, start + cost.vfunc_issue_cycles(arch, cmd.elements, func, scale, offset)


def _time_unpack4(arch: HardwareDescription, cmd, ready: int, free: int,
                  compute: _ComputeQueue) -> tuple[int, int, int]:
    start = max(free, ready)
    end = start + cost.unpack4_cycles(arch, cmd.elements)
    return start, end, end


def _time_lookup(arch: HardwareDescription, cmd, ready: int, free: int,
                 compute: _ComputeQueue) -> tuple[int, int, int]:
    start = max(free, ready)
    end = start + cost.lookup_cycles(arch, cmd.elements)
    return start, end, end


def _time_pool(arch: HardwareDescription, cmd: PoolCommand, ready: int, free: int,
               compute: _ComputeQueue) -> tuple[int, int, int]:
    start = max(free, ready)
    end = start + cost.pool_cycles(arch, cmd.taps)
    return start, end, end


def _time_pe_array(arch: HardwareDescription, cmd: GemmCommand | DepthwiseCommand, ready: int,
                   free: int, compute: _ComputeQueue) -> tuple[int, int, int]:
    prev = compute.previous_gemm
    if prev is not None and (prev.op, prev.dtype) == (cmd.op, cmd.dtype):
        start = max(free, ready)
        stream = max(ready, prev.stream_end)
    else:
        dtype = cmd.dtype.numpy_name
        loaded = compute.switch((cmd.op, cmd.dtype), cost.pe_array_slots(arch, dtype), arch.fabric["context_depth"])
        config = cost.pe_array_config_cycles(arch, dtype) if loaded else 0
        start = _configured_start(free, ready, config)
        stream = start + config
    steady_cycles, fill_cycles = _PE_ARRAY_CYCLES[cmd.op]
    steady = _cycles(arch, cmd, compute, steady_cycles)
    end = max(stream + fill_cycles(arch, cmd), free) + steady
    compute.previous_gemm = _PreviousGemm(cmd.index, cmd.op, cmd.dtype, _region_key(cmd.acc), stream + steady)
    return start, end, end


def _configured_start(free: int, ready: int, config: int) -> int:
    """When a PE-array command that first loads a configuration of `config` cycles starts: the
    configuration comes from the command stream, not the scratchpad, so it loads while the
    operands are still arriving, as soon as the array is free; the operands enter when both the
    configuration and they are in (at max(free + config, ready))."""
    return max(free, ready - config)


def _time_fabric(arch: HardwareDescription, cmd: FabricCommand, ready: int, free: int,
                 compute: _ComputeQueue) -> tuple[int, int, int]:
    config, run, slots = _cycles(arch, cmd, compute, fabric_cycles)
    loaded = compute.switch((Op.FABRIC, cmd.dtype, cmd.body), slots, arch.fabric["context_depth"])
    start = _configured_start(free, ready, config if loaded else 0)
    start_run = start + config if loaded else start
    compute.previous_gemm = None  # the array no longer holds a GEMM's partial sums
    end = start_run + run
    return start, end, end


#: Per PE-array opcode: (steady cycles, fill and drain cycles).
_PE_ARRAY_CYCLES = {
    Op.GEMM: (gemm_steady_cycles, gemm_fill_cycles),
    Op.DEPTHWISE: (depthwise_steady_cycles, lambda arch, cmd: cost.depthwise_fill_cycles(arch, cmd.dtype.numpy_name)),
}


_TIMERS = {
    Op.DMA_LOAD: _time_dma,
    Op.DMA_STORE: _time_dma,
    Op.GEMM: _time_pe_array,
    Op.FILL: _time_vector,
    Op.EPILOGUE: _time_vector,
    Op.DEPTHWISE: _time_pe_array,
    Op.POOL: _time_pool,
    Op.ELTWISE: _time_eltwise,
    Op.FABRIC: _time_fabric,
    Op.REDUCE: _time_reduce,
    Op.VFUNC: _time_vfunc,
    Op.UNPACK4: _time_unpack4,
    Op.LOOKUP: _time_lookup,
}


def _read_intervals(cmd: Command, region: Region):
    """Row-exact intervals where the command also writes the region (a GEMM's accumulator, whose
    neighbouring sub-tiles other GEMMs update); the bounding interval for read-only operands:
    the only writes into their gaps come from the DMA that loaded them, so it is exact enough,
    and it keeps the scoreboard small."""
    return region.intervals if any(region is written for written in cmd.writes) else [(region.lo, region.hi)]


def _accesses(cmd: Command) -> tuple[tuple[int, int, Region, bool], ...]:
    """Every scratchpad access of `cmd` as (lo, hi, region, is_write): the reads, then the
    writes, in the order `_ready`, `_blocker` and the scoreboard updates walk them."""
    reads = tuple((lo, hi, region, False) for region in cmd.reads for lo, hi in _read_intervals(cmd, region))
    return reads + tuple((lo, hi, region, True) for region in cmd.writes for lo, hi in region.intervals)


def _ready(board: Scoreboard, accesses, forwarding) -> int:
    """When every scratchpad dependency of a command with these `accesses` is met."""
    ready = 0
    if forwarding is None:  # the common case, without the per-access forwarding test
        read_ready, write_ready = board.read_ready, board.write_ready
        for lo, hi, _, write in accesses:
            cycle = write_ready(lo, hi) if write else read_ready(lo, hi)
            if cycle > ready:
                ready = cycle
        return ready
    held, forward = forwarding
    for lo, hi, region, write in accesses:
        ready_fn = board.write_ready if write else board.read_ready
        ready = max(ready, ready_fn(lo, hi, forward if region is held else None))
    return ready


def _blocker(board: Scoreboard, accesses, forwarding, ready: int) -> int:
    """The command whose access made the command ready at `ready` (mirrors `_ready`; called
    only for a command that stalls, so the common path does not pay for it)."""
    held, forward = forwarding if forwarding is not None else (None, None)
    for lo, hi, region, write in accesses:
        found = board.blocker(lo, hi, ready, write, forward if region is held else None)
        if found >= 0:
            return found
    return -1


def time_commands(arch: HardwareDescription, commands: list[Command],
                  max_cycles: int = DEFAULT_MAX_CYCLES) -> Timeline:
    """Times `commands` (decoded and validated); raises `CycleLimitExceeded` past `max_cycles`."""
    return time_launch(arch, commands, max_cycles)[0]


def time_launch(arch: HardwareDescription, commands: list[Command], max_cycles: int = DEFAULT_MAX_CYCLES,
                prefetch=None) -> tuple[Timeline, Scoreboard, int]:
    """`time_commands`, with the loads `prefetch` (prefetch.Prefetch) ran during the previous launch
    taken as done when it says (clamped to this launch's cycle 0: their start and transfer were the
    previous launch's, but for a head's transfer running on: the queue's first free cycle) and out
    of the load queue; also returns the final scoreboard and when the load engine
    finished its last transfer (what prefetch.DeviceTail keeps for the next launch)."""
    board = Scoreboard(arch.spad_bytes)
    queue_free = [0] * len(Unit)
    early = prefetch.loads if prefetch is not None else {}
    if early:
        queue_free[Unit.LOAD] = prefetch.load_free  # the head's transfer running on into this launch
    load_free = queue_free[Unit.LOAD]
    compute = _ComputeQueue()
    starts, ends, busy, waits_for = [], [], [], []
    accesses_of = {}  # index of a record's first command -> its accesses (repeats share them)
    for cmd in commands:
        first = cmd.index if cmd.repeat_of < 0 else cmd.repeat_of
        accesses = accesses_of.get(first)
        if accesses is None:
            accesses = accesses_of[first] = _accesses(cmd)
        if cmd.index in early:
            start, end, free = (max(0, cycle) for cycle in early[cmd.index])
            for lo, hi, _, _ in accesses:  # a load only writes
                board.record_write(lo, hi, end, cmd.index)
            starts.append(start)
            ends.append(end)
            busy.append(free - start)
            waits_for.append(-1)
            continue
        forwarding = compute.forwarding(cmd)
        ready = _ready(board, accesses, forwarding)
        start, end, free = _TIMERS[cmd.op](arch, cmd, ready, queue_free[cmd.unit], compute)
        if end > max_cycles:
            raise CycleLimitExceeded(cmd.index, cmd.op.name, end, max_cycles)
        # start > free only when ready > free (start = max(free, ready), or ready less a
        # configuration load that overlaps the wait): a dependency stall, on what made `ready`.
        stalled = start > queue_free[cmd.unit]
        waits_for.append(_blocker(board, accesses, forwarding, ready) if stalled else -1)
        for lo, hi, _, write in accesses:
            (board.record_write if write else board.record_read)(lo, hi, end, cmd.index)
        queue_free[cmd.unit] = free
        if cmd.unit is Unit.LOAD:
            load_free = free
        starts.append(start)
        ends.append(end)
        busy.append(free - start)
    timeline = Timeline(ops=np.array([int(c.op) for c in commands], dtype=np.int8),
                        units=np.array([int(c.unit) for c in commands], dtype=np.int8),
                        starts=np.array(starts, dtype=np.int64), ends=np.array(ends, dtype=np.int64),
                        occupancy=np.array(busy, dtype=np.int64), config_loads=compute.config_loads,
                        waits_for=np.array(waits_for, dtype=np.int32), config_slots=compute.config_slots)
    return timeline, board, load_free

