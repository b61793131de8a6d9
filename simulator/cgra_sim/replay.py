"""Replay: rerun a recorded launch on its own or another hardware description.

Stage: simulator (standalone). In: a `Launch` (stream_file.py) and optionally another
architecture. Out: a `ReplayResult` with the new statistics and timeline and, when the launch
holds its inputs, the outputs it computes now, compared bit for bit with the recorded ones
(timing never changes results, so on any chip they must match). Pure Python, no tvm.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from .arch import HardwareDescription, load_arch
from .simulate import simulate_detailed
from .stats import KernelStats
from .stream_file import Launch
from .renamed import renamed_property
from .timing import DEFAULT_MAX_CYCLES, Timeline


def compare_outputs(expected, actual) -> list[str]:
    """Bitwise comparison per slot; one line per slot that differs."""
    problems = []
    for slot, (want, got) in enumerate(zip(expected, actual)):
        if want.shape != got.shape or want.dtype != got.dtype:
            problems.append(f"slot {slot}: {got.dtype}{list(got.shape)} != recorded {want.dtype}{list(want.shape)}")
            continue
        differ = np.flatnonzero(want.view(_bits(want)) != got.view(_bits(got)))
        if differ.size:
            first = tuple(int(i) for i in np.unravel_index(int(differ[0]), want.shape))
            problems.append(f"slot {slot}: {differ.size} of {want.size} elements differ, first at "
                            f"{first}: {got[first]} != recorded {want[first]}")
    return problems


def _bits(array: np.ndarray) -> np.dtype:
    """An integer dtype of the element's size, so floats compare bit for bit (NaN included)."""
    return np.dtype(f"u{array.dtype.itemsize}")


@dataclasses.dataclass(frozen=True, eq=False)
class ReplayResult:
    """A launch simulated again: its statistics and timeline, and how its results compare."""

    launch: Launch
    arch: HardwareDescription  # what it was replayed on
    stats: KernelStats
    timeline: Timeline
    outputs: tuple[np.ndarray, ...] | None  # tensors after the replay; None without recorded inputs
    mismatches: tuple[str, ...]  # slots whose results differ from the recorded outputs
    tail: object = None  # prefetch.DeviceTail: what the next replay may prefetch from (`previous=`)

    schedule = renamed_property("schedule", "timeline")

    @property
    def verdict(self) -> str:
        """'match' or 'mismatch' against the recorded outputs, or 'unchecked'."""
        if self.outputs is None or self.launch.outputs is None:
            return "unchecked"
        return "mismatch" if self.mismatches else "match"

    def _unchecked_reason(self) -> str:
        if self.launch.inputs is None:
            return "not checked: the file holds no input contents (timing only)"
        return "not checked: the file holds no recorded outputs"

    def to_dict(self) -> dict:
        recorded = self.launch.recorded_stats or {}
        return {"kernel": self.launch.kernel, "source_ops": list(self.launch.source_ops),
                "arch": self.arch.name, "recorded_arch": json.loads(self.launch.arch_json).get("name"),
                "recorded_cycles": recorded.get("cycles"), "stats": self.stats.to_dict(),
                "outputs": self.verdict, "mismatches": list(self.mismatches)}

    def describe(self) -> str:
        """A few lines a person can read."""
        s, recorded = self.stats, self.launch.recorded_stats or {}
        cycles = f"{s.cycles} (ideal {s.ideal_cycles})"
        if recorded.get("cycles"):
            change = (s.cycles - recorded["cycles"]) / recorded["cycles"]
            cycles += f", recorded {recorded['cycles']} on {recorded.get('arch')} ({change:+.1%})"
        outputs = {"match": f"match the recording ({len(self.outputs or ())} tensors, bit for bit)",
                   "mismatch": "MISMATCH\n" + "\n".join(f"    {m}" for m in self.mismatches),
                   "unchecked": self._unchecked_reason()}[self.verdict]
        return "\n".join([
            f"{s.name} ({', '.join(s.source_ops) or 'no source ops'}): {s.num_commands} commands on {s.arch}",
            f"  cycles       {cycles}, {s.time_us:.3f} us at {self.arch.clock_mhz:g} MHz",
            f"  utilisation  {s.utilisation:.1%} of the PE array: {s.macs} model MACs "
            f"({s.padded_macs} executed, {s.array_utilisation:.1%} with the padding)",
            f"  energy       {s.energy_pj / 1e3:.1f} nJ: " + ", ".join(
                f"{part} {pj / 1e3:.1f}" for part, pj in s.energy_breakdown.items()),
            f"  DMA bytes    load {s.dma_load_bytes} (box {s.dma_load_box_bytes}), "
            f"store {s.dma_store_bytes} (box {s.dma_store_box_bytes})",
            "  busy cycles  " + ", ".join(f"{unit} {cycles}" for unit, cycles in s.busy_cycles.items()),
            f"  outputs      {outputs}"])


def replay(launch: Launch, arch=None, max_cycles: int = DEFAULT_MAX_CYCLES, previous=None) -> ReplayResult:
    """Simulates `launch` again on `arch` (default: the recorded description; or a preset name,
    JSON path or HardwareDescription). With recorded inputs it also runs functionally and compares
    every tensor with the recorded outputs, bit for bit: timing never changes results, so any
    difference is a simulator bug (or a damaged recording). Raises the simulator's errors when the
    stream does not run on `arch` (e.g. a smaller scratchpad: CommandError). `previous`: the `tail`
    of the replay of the launch recorded just before, whose idle load engine may have prefetched
    this launch's constant loads (docs/simulator.md, Weight prefetch across launches): replaying a
    profile's files in order, each with the last one's tail, gives the recorded cycles; alone, a
    launch runs on an idle chip."""
    arch = launch.arch if arch is None else load_arch(arch)
    tensors = launch.fresh_tensors()
    result = simulate_detailed(arch, launch.commands, tensors, name=launch.kernel,
                               source_ops=launch.source_ops, max_cycles=max_cycles,
                               macs_per_output=launch.macs_per_output, macs_divisor=launch.macs_divisor,
                               previous=previous, constant_slots=launch.constant_slots)
    outputs = tuple(tensors) if launch.inputs is not None else None
    mismatches = ()
    if outputs is not None and launch.outputs is not None:
        mismatches = tuple(compare_outputs(launch.outputs, outputs))
    return ReplayResult(launch, arch, result.stats, result.timeline, outputs, mismatches, result.tail)
