"""The roofline of a launch and of a run of launches: the cycles no schedule can beat.

Stage: simulator, step 5 (statistics; stats.py calls it). In: a launch's decoded commands (their
DMA boxes on the host tensors), its model work in PE-cycles, which slots hold constants, and the
hardware description. Out: the compulsory DRAM bytes (every host element the launch reads loaded
once, every element it writes stored once) and three bounds in cycles, which `KernelStats`
carries; `run_roofline` chains them over the launches of a run (what `Profile.roofline_cycles`
and benchmarks/bench_transformers.py's "x roofline" report).

Why the bytes are counted from the boxes and not from the tensors' sizes: a kernel may read part
of a slot (a KV cache's live rows, a halo-free tile of a larger buffer), and a tensor read twice
(a tiling that reloads its activations once per weight panel) is compulsory once. The union of
the boxes' host elements is exactly "each element the launch needs, moved once".

The bounds (docs/simulator.md, "The roofline"), each a lower bound on the measured cycles:
- `alone`: the launch on an idle chip, max(model MACs / (PEs x MACs per PE), compulsory load
  bytes / DMA bytes a cycle + the DMA latency once, the same for the stores). Each DMA engine has
  the full bandwidth (timing.py), so loads and stores are bounded separately; the latency counts
  once because the last transfer's data arrives that long after the engine is done with it.
- `own`: the same with the constant slots' bytes left out of the load term, on a chip with
  `dma_prefetch`: those may have loaded during the launch before (prefetch.py).
- `load`: the load engine's compulsory work (all the bytes, constants included, + latency).
A run's bound (`run_roofline`): with prefetch, the sum of `alone` can exceed what was measured
(a weight-bound launch after a compute-bound one hides its weights), so the run is bounded by the
smallest prefix sums that give each launch its `own` cycles and the load engine, serial across
launches, all the loads of the launches so far: R_i = max(R_(i-1) + own_i, sum_(j<=i) load_j).
Without prefetch, own == alone and it is their sum.

Beside the roofline, `ideal_cycles` bounds the stream as issued (KernelStats.ideal_cycles): the
same compute term, but the bytes its DMA commands move (a tiling's reloads counted, the halo not)
and no latency. It bounds this schedule, not every schedule: a tiling's reloads can lift it
above the roofline; without them it lies at most the DMA latency below.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np

from .arch import HardwareDescription
from .commands import Command, DmaCommand
from .isa import Op


@dataclasses.dataclass(frozen=True)
class Roofline:
    """A launch's compulsory DRAM bytes and its bounds in cycles (module docstring)."""

    load_bytes: int  # host elements loaded, each once (halo excluded)
    store_bytes: int  # host elements stored, each once
    constant_bytes: int  # the part of `load_bytes` in constant slots
    alone: int
    own: int
    load: int


def launch_roofline(arch: HardwareDescription, commands: list[Command], pe_work: Fraction,
                    constant_slots=()) -> Roofline:
    """The roofline of a validated launch on `arch`: `pe_work` the model's MACs in PE-cycles
    (MACs / MACs per PE per cycle), `constant_slots` the slots the runtime flags constant."""
    loaded, stored = _footprints(commands)
    load_bytes = sum(loaded.values())
    store_bytes = sum(stored.values())
    constant_bytes = sum(nbytes for slot, nbytes in loaded.items() if slot in set(constant_slots))
    compute = compute_cycles(arch, pe_work)
    store = dma_cycles(arch, store_bytes)
    load = dma_cycles(arch, load_bytes)
    own_load = dma_cycles(arch, load_bytes - constant_bytes) if arch.dma_prefetch else load
    return Roofline(load_bytes, store_bytes, constant_bytes, alone=max(compute, load, store),
                    own=max(compute, own_load, store), load=load)


def ideal_cycles(arch: HardwareDescription, pe_work: Fraction, load_bytes: int, store_bytes: int) -> int:
    """The bound on the stream as issued (module docstring): the busiest of the PE array at peak
    (`pe_work` in PE-cycles) and the two DMA engines moving `load_bytes` and `store_bytes` (the
    bytes the commands move) at full bandwidth each, as in timing.py; no latency."""
    return max(compute_cycles(arch, pe_work), transfer_cycles(arch, load_bytes), transfer_cycles(arch, store_bytes))


def compute_cycles(arch: HardwareDescription, pe_work: Fraction) -> int:
    """The fewest cycles the PE array needs for `pe_work` PE-cycles (MACs / MACs per PE per cycle)."""
    return math.ceil(pe_work / arch.num_pes)


def transfer_cycles(arch: HardwareDescription, nbytes: int) -> int:
    """The cycles one DMA engine streams `nbytes` at its bandwidth (no latency)."""
    return -(-nbytes // arch.dma_bytes_per_cycle)


def dma_cycles(arch: HardwareDescription, nbytes: int) -> int:
    """The fewest cycles one DMA engine needs for `nbytes`: the bandwidth, plus the latency once."""
    return transfer_cycles(arch, nbytes) + arch.dma_latency if nbytes else 0


def run_roofline(launches) -> int:
    """The bound on a run of launches, in order on one device: each an object with the
    `roofline_own_cycles` and `roofline_load_cycles` of `KernelStats` (module docstring)."""
    bound = loads = 0
    for launch in launches:
        loads += launch.roofline_load_cycles
        bound = max(bound + launch.roofline_own_cycles, loads)
    return bound


def _footprints(commands: list[Command]) -> tuple[dict, dict]:
    """(loaded, stored): slot -> bytes of its host elements that the DMA_LOAD (DMA_STORE) commands
    move, each element counted once however many boxes cover it (one pass over the commands)."""
    masks = {Op.DMA_LOAD: {}, Op.DMA_STORE: {}}
    itemsize = {}
    for cmd in commands:
        by_slot = masks.get(cmd.op)
        if by_slot is None or cmd.repeat_of >= 0 or cmd.host_points == 0:
            continue  # a repeated record moves the same elements as its first
        mask = by_slot.get(cmd.slot)
        if mask is None:
            mask = by_slot[cmd.slot] = np.zeros(cmd.tensor.shape, dtype=bool)
            itemsize[cmd.slot] = cmd.tensor.dtype.itemsize
        _mark(mask, cmd)
    return tuple({slot: int(np.count_nonzero(mask)) * itemsize[slot] for slot, mask in masks[op].items()}
                 for op in (Op.DMA_LOAD, Op.DMA_STORE))


def _mark(mask: np.ndarray, cmd: DmaCommand) -> None:
    """Sets `mask` where `cmd`'s box lies on its host tensor (halo excluded)."""
    if cmd.halo_free or cmd.inner is not None:
        cmd.box.tensor_view(mask, cmd.inner)[...] = True
        return
    inside = cmd.box.inbounds_mask(mask.shape)
    coords = tuple(np.broadcast_to(cmd.box.coordinates(dim), cmd.box.extents)[inside]
                   for dim in range(mask.ndim))
    mask[coords] = True
