"""The simulator's entry points: validate, time, execute and measure one kernel launch.

Stage: simulator (the device backend behind the runtime, see docs/runtime-abi.md). In: a hardware
description, a command stream (int64 records or their bytes, isa.py) and the host tensors bound to
its slots. Out: `KernelStats`; the host tensors hold what the kernel's DMA_STOREs wrote.

The steps, in order:
    validate  decode.py + validate.py   every command checked; nothing runs if one is bad
    time      timing.py                 start/end per command; may raise CycleLimitExceeded
    execute   functional.py             numpy semantics on a fresh scratchpad, stores in place
    measure   stats.py                  KernelStats
Timing runs before execution so that a kernel over the cycle limit leaves the tensors untouched.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from .arch import HardwareDescription, load_arch
from .functional import execute
from .stats import KernelStats, collect_stats
from .renamed import renamed_property
from .prefetch import NO_PREFETCH, DeviceTail, Prefetch, plan_prefetch
from .timing import DEFAULT_MAX_CYCLES, Timeline, time_launch
from .validate import validate_stream


#: The steps of `simulate_detailed`, in order; `SimulationResult.host_seconds` has one entry each.
STEPS = ("validate", "time", "execute", "stats")


@dataclasses.dataclass(frozen=True)
class SimulationResult:
    """Statistics plus the per-command timeline (for trace export), and the host seconds each
    step took (the simulator's own speed: not part of the deterministic `KernelStats`)."""

    stats: KernelStats
    timeline: Timeline
    host_seconds: dict = dataclasses.field(default_factory=dict)  # step name (STEPS) -> seconds
    # The loads that ran during the previous launch (prefetch.py), and what the device keeps of
    # this launch for the next one's (None unless the chip has `dma_prefetch`).
    prefetch: Prefetch = NO_PREFETCH
    tail: DeviceTail | None = None

    schedule = renamed_property("schedule", "timeline")


def _source_ops(source_ops) -> tuple[str, ...]:
    """Accepts a tuple of names or the runtime's comma-separated string."""
    if isinstance(source_ops, str):
        return tuple(op for op in (part.strip() for part in source_ops.split(",")) if op)
    return tuple(str(op) for op in source_ops)


def split_source_ops(source_ops) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(operators, model nodes) of source ops written "op" or "op@nodes" (the runtime's form,
    docs/runtime-abi.md): one entry each per operator, nodes "" where none were given."""
    entries = [entry.partition("@") for entry in _source_ops(source_ops)]
    return tuple(op for op, _, _ in entries), tuple(nodes for _, _, nodes in entries)


def simulate_detailed(arch: "HardwareDescription | str", commands, tensors, name: str = "kernel",
                      source_ops=(), max_cycles: int = DEFAULT_MAX_CYCLES,
                      macs_per_output: int | None = None, macs_divisor: int = 1, *,
                      previous: DeviceTail | None = None, constant_slots=()) -> SimulationResult:
    """Runs one kernel launch; returns its statistics and timeline.

    `arch`: a HardwareDescription (or a preset name / JSON path, see load_arch). `commands`: int64
    array of shape (n, isa.RECORD_WORDS) or its bytes. `tensors`: numpy arrays for slots 0..k-1
    (C-contiguous, int8/int32/float32, rank 1..4); DMA_STORE writes into them in place.
    `macs_per_output` / `macs_divisor`: the model operator's MACs per element of the last tensor
    (the kernel's `cgra.macs_per_output` and `cgra.macs_divisor`), which `KernelStats.macs`
    counts; None or -1: the PE array's own. `previous`: the `tail` of the launch the device ran
    just before (same thread), whose idle load engine may have run this launch's loads of the
    `constant_slots` when the chip has `dma_prefetch` (prefetch.py); only cycles change.
    Raises LaunchError / CommandError (invalid input, nothing run) or CycleLimitExceeded.
    """
    arch = load_arch(arch)
    clock = [time.perf_counter()]
    decoded = validate_stream(arch, commands, tensors)
    clock.append(time.perf_counter())
    early = plan_prefetch(arch, previous, decoded, constant_slots)
    timeline, board, load_free = time_launch(arch, decoded, max_cycles, early)
    tail = DeviceTail(arch, board, load_free, timeline.cycles) if arch.dma_prefetch else None
    clock.append(time.perf_counter())
    execute(decoded, np.zeros(arch.spad_bytes, dtype=np.uint8))
    clock.append(time.perf_counter())
    stats = collect_stats(arch, decoded, timeline, name, *split_source_ops(source_ops),
                          tensor_shapes=tuple(np.shape(tensor) for tensor in tensors),
                          macs_per_output=macs_per_output, macs_divisor=macs_divisor,
                          constant_slots=constant_slots)
    clock.append(time.perf_counter())
    seconds = {step: clock[i + 1] - clock[i] for i, step in enumerate(STEPS)}
    return SimulationResult(stats=stats, timeline=timeline, host_seconds=seconds, prefetch=early, tail=tail)


def simulate(arch: "HardwareDescription | str", commands, tensors, name: str = "kernel",
             source_ops=(), max_cycles: int = DEFAULT_MAX_CYCLES,
             macs_per_output: int | None = None, macs_divisor: int = 1) -> KernelStats:
    """Runs one kernel launch (see `simulate_detailed`) and returns its `KernelStats`."""
    return simulate_detailed(arch, commands, tensors, name, source_ops, max_cycles, macs_per_output,
                             macs_divisor).stats


def run_functional(arch: "HardwareDescription | str", commands, tensors) -> np.ndarray:
    """Validates and executes without timing; returns the final scratchpad (uint8 array)."""
    arch = load_arch(arch)
    decoded = validate_stream(arch, commands, tensors)
    spad = np.zeros(arch.spad_bytes, dtype=np.uint8)
    execute(decoded, spad)
    return spad
