"""Weight prefetch across kernel launches: the next launch's constant loads in the last one's idle DMA time.

Stage: simulator, step 4 (timing), for a chip whose hardware description sets `dma_prefetch`.
In: what the device kept of the launch it ran last (`DeviceTail`: its hardware description, its
final scratchpad scoreboard, when its load engine went idle, its cycles), the next launch's
decoded commands and which of its slots hold constants (the runtime's slot flag
`SLOT_FLAG_CONSTANT`: a weight the runtime's weights module holds, at an address fixed for the
module's life). Out: a `Prefetch`, the DMA_LOADs that ran early with their cycles counted from
the next launch's start (negative: before it), which `timing.time_commands` takes as done.

Why here and not in the compiler: a load can move across a launch boundary only if the bytes it
writes are free in the launch still running, which only the device knows exactly (the previous
kernel may come from another model or follow a host call); the scoreboard that orders commands
inside a launch already tracks every byte's last access, so carrying it across the boundary is
exact and needs no scratchpad reserved by the compiler. Ethos-U's Vela plans the same overlap at
compile time because its weight buffers are static; here it costs the compiler nothing.

The rules (docs/simulator.md, Weight prefetch), each honest about the hardware:
- only a DMA_LOAD from a constant slot moves (an activation's address and contents are known
  only when the previous kernel has written it), and only if no earlier command of its own
  launch touches its scratchpad bytes (moving it first cannot change what any command reads);
- it runs on the load engine only once that engine has finished the previous launch's own
  loads (`DeviceTail.load_free`): the previous launch's commands keep their cycles exactly;
- it starts only when the previous launch's last access to its bytes has ended (the scoreboard's
  write-after-read and write-after-write: it never overwrites a buffer in use);
- it must start before the previous launch ends, and its transfer must end by then too unless
  it heads the next launch's load queue (every load before it in the stream moved as well): a
  head transfer running on into the next launch keeps the engine busy there, which delays only
  loads the engine would have taken after it anyway. A later load running on would hold back
  loads its launch issues before it (two of ConvNeXt's kernels ran 3.3% and 1.4% slower that
  way). The first load that does not fit, and every later one, loads in its own launch as before.
So the moved loads start and end earlier in the same queue order, or leave the queue: the timing
is a max-plus system, so no command of the next launch starts or ends later
(tests/test_prefetch.py checks it on random streams).
The store engine and host memory are as in a launch (each engine the full bandwidth): the
prefetch takes no bandwidth the previous launch's loads use, since they have all been issued.
Results never change: the same bytes arrive in the scratchpad, only earlier.
"""

from __future__ import annotations

import dataclasses

from .arch import HardwareDescription
from .command_cycles import dma_transfer_cycles
from .commands import Command
from .isa import Op
from .scoreboard import Scoreboard


@dataclasses.dataclass
class DeviceTail:
    """What the device keeps of the launch it ran last: the chip, the final scoreboard (cycles
    counted from that launch's start), when its load engine finished its last transfer, its cycles."""

    arch: HardwareDescription
    board: Scoreboard
    load_free: int
    cycles: int


@dataclasses.dataclass(frozen=True)
class Prefetch:
    """Loads of a launch that ran during the previous one: command index -> (start, end, free),
    cycles from this launch's start (start < 0: before it; free = start + transfer, > 0 only for
    the head of the load queue). `load_free`: when the load engine takes this launch's own loads."""

    loads: dict
    load_free: int = 0

    @property
    def transfer_cycles(self) -> int:
        """Load-engine cycles moved into the previous launch."""
        return sum(min(free, 0) - start for start, _, free in self.loads.values())


NO_PREFETCH = Prefetch({})


def plan_prefetch(arch: HardwareDescription, tail: DeviceTail | None, commands: list[Command],
                  constant_slots) -> Prefetch:
    """The loads of `commands` (a validated launch on `arch`) that ran during the launch `tail`
    describes, by the rules in the module docstring. `constant_slots`: the slots flagged constant.
    Records the moved loads' writes on `tail.board` (a tail serves one next launch)."""
    if tail is None or not arch.dma_prefetch or tail.arch != arch or not constant_slots:
        return NO_PREFETCH
    constant_slots = frozenset(constant_slots)
    touched = Scoreboard(arch.spad_bytes)  # accesses of this launch's earlier commands (end 1)
    engine, loads = tail.load_free, {}
    head = True  # every load of this launch so far has moved: the next is its queue's first
    for cmd in commands:
        intervals = [(lo, hi) for region in cmd.writes for lo, hi in region.intervals]
        if _movable(cmd, constant_slots, touched, intervals):
            start = max([engine] + [tail.board.write_ready(lo, hi) for lo, hi in intervals])
            transfer = dma_transfer_cycles(arch, cmd)
            if start >= tail.cycles or (not head and start + transfer > tail.cycles):
                break  # not enough idle load-engine time left in the previous launch
            end, engine = start + arch.dma_latency + transfer, start + transfer
            for lo, hi in intervals:
                tail.board.record_write(lo, hi, end, -1)
            loads[cmd.index] = (start - tail.cycles, end - tail.cycles, engine - tail.cycles)
        elif cmd.op is Op.DMA_LOAD:
            head = False
        for lo, hi in intervals + [(lo, hi) for region in cmd.reads for lo, hi in region.intervals]:
            touched.record_write(lo, hi, 1, cmd.index)
    return Prefetch(loads, max(0, engine - tail.cycles)) if loads else NO_PREFETCH


def _movable(cmd: Command, constant_slots: frozenset, touched: Scoreboard, intervals) -> bool:
    """A DMA_LOAD from a constant slot whose bytes no earlier command of its launch touched."""
    return cmd.op is Op.DMA_LOAD and cmd.slot in constant_slots \
        and all(touched.write_ready(lo, hi) == 0 for lo, hi in intervals)
