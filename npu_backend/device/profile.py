"""The profiler: every NPU kernel launch's statistics, collected inside `with profile():`.

Stage: runtime (Python side). The simulator backend (simulator_backend.py) hands each finished
launch to `deliver`, which adds it to every `Profile` the launching thread has open: its
`KernelStats`, optionally its timeline (for a Chrome trace) and a launch file for `cgra-sim
replay`. A profile sees the launches of the thread that opened it (the runtime submits a launch
in the thread that called the kernel), so two threads, each with its own VM and its own profile,
count their own kernels only.

The host's side (host_calls.py) arrives through `_add_host_side`: every host operator call, with
its cycles modelled from the chip's host table (what `host_cycles` and `npu_share` add up: the
same on every machine) and its wall time measured here (`host_op_seconds`, reported beside them),
and every tensor crossing between host and NPU with its bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading

import numpy as np

from cgra_sim.arch import HardwareDescription
from cgra_sim.roofline import run_roofline
from cgra_sim.renamed import renamed_property, warn_renamed
from cgra_sim.simulate import STEPS
from cgra_sim.stream_file import SUFFIX, Launch, save_launch
from cgra_sim.trace import TracedLaunch, chrome_trace

_active_profiles: list[tuple["Profile", int]] = []  # (profile, the thread that opened it)
_lock = threading.Lock()
# .count: kernel launches delivered in this thread (host_calls.py reads it); .profiles_opened
_launches = threading.local()


class Profile:
    """Per-kernel statistics of every NPU launch made inside a `with profile():` block.

    With `keep_timelines`, `timelines` holds every launch's `TracedLaunch` (timeline, clock,
    commands) for `chrome_trace()`; with `record_dir`, every launch is saved there as a launch
    file (inputs before, tensors after) and `recorded` lists the paths, in launch order.
    `host_calls` and `crossing_records` hold the host's side (host_calls.py): `host_cycles`,
    `host_op_seconds`, `crossings`, `crossing_bytes` and `npu_share` sum them up.
    """

    def __init__(self, record_dir=None, keep_timelines: bool = False, on_launch=None):
        self.kernels = []  # cgra_sim KernelStats, in launch order
        self.record_dir = None if record_dir is None else os.fspath(record_dir)
        self.keep_timelines = keep_timelines
        self.on_launch = on_launch  # called with each launch's KernelStats (progress output)
        self.timelines = []  # cgra_sim TracedLaunch per launch, with keep_timelines
        self.recorded = []  # launch files written, with record_dir
        # Host seconds per simulator step (cgra_sim.STEPS) and in the device glue around it
        # ("device": host views, stream copies), summed over launches: the simulator's speed.
        self.host_seconds = dict.fromkeys(STEPS + ("device",), 0.0)
        self.host_calls = []  # host_calls.HostCall per host operator call, in call order
        self.crossing_records = []  # host_calls.Crossing per tensor crossing between host and NPU

    schedules = renamed_property("schedules", "timelines")

    @property
    def total_cycles(self) -> int:
        return sum(k.cycles for k in self.kernels)

    @property
    def total_macs(self) -> int:
        """The model's multiply-accumulates the kernels computed (no padding)."""
        return sum(k.macs for k in self.kernels)

    @property
    def total_padded_macs(self) -> int:
        """The multiply-accumulates the PE array executed, padding of partial tiles included."""
        return sum(k.padded_macs for k in self.kernels)

    @property
    def roofline_cycles(self) -> int:
        """The cycles no schedule of these launches can beat (cgra_sim/roofline.py): each launch's
        MACs on the PE array at peak or its compulsory DRAM bytes at the DMA bandwidth (+ latency
        once), whichever is larger, summed over the launches; on a chip with `dma_prefetch`, a
        launch's constant bytes may load during the launch before it (the load engine serial)."""
        return run_roofline(self.kernels)

    @property
    def total_energy_pj(self) -> float:
        """The kernels' energy in pJ (KernelStats.energy_pj; cgra_sim/energy.py)."""
        return sum(k.energy_pj for k in self.kernels)

    @property
    def host_cycles(self) -> int:
        """The host operator calls' cycles, modelled from the chip's host table (cgra_sim/host.py)
        and counted at the NPU's clock: comparable with `total_cycles`, the same on every machine."""
        return sum(call.cycles for call in self.host_calls)

    @property
    def host_op_seconds(self) -> float:
        """The host operator calls' wall time, measured on this machine (beside `host_cycles`)."""
        return sum((call.seconds for call in self.host_calls), 0.0)

    @property
    def crossings(self) -> int:
        """Tensors written on one side (host or NPU) and read on the other (host_calls.py)."""
        return len(self.crossing_records)

    @property
    def crossing_bytes(self) -> int:
        return sum(crossing.bytes for crossing in self.crossing_records)

    @property
    def npu_share(self) -> float:
        """The NPU's share of the whole run's cycles: NPU cycles / (NPU cycles + modelled host
        cycles at the NPU's clock); 0.0 when nothing ran."""
        whole = self.total_cycles + self.host_cycles
        return self.total_cycles / whole if whole else 0.0

    def to_dict(self) -> dict:
        return {"total_cycles": self.total_cycles, "total_macs": self.total_macs,
                "total_padded_macs": self.total_padded_macs, "roofline_cycles": self.roofline_cycles,
                "total_energy_pj": self.total_energy_pj,
                "kernels": [k.to_dict() for k in self.kernels], **self.host_side()}

    def host_side(self) -> dict:
        """The host's figures for reports: modelled cycles, measured seconds, crossings, the NPU's
        share, and each host call and crossing."""
        return {"host_cycles": self.host_cycles, "host_op_seconds": self.host_op_seconds,
                "crossings": self.crossings, "crossing_bytes": self.crossing_bytes, "npu_share": self.npu_share,
                "host_calls": [call.to_dict() for call in self.host_calls],
                "crossing_records": [crossing.to_dict() for crossing in self.crossing_records]}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def table(self) -> str:
        """A per-kernel table a person can read: each launch's output shape (its sizes, for a
        kernel compiled for symbolic ones), and the model nodes (ONNX node names) it came from,
        when the model was imported with them (npu_backend.from_onnx). MACs are the model's; PE MACs
        what the array executed, padding included; util is the model's MACs over the array's peak;
        energy in nJ (cgra_sim/energy.py)."""
        lines = [f"{'kernel':<44} {'source ops':<26} {'output':>14} {'cycles':>10} {'MACs':>12} {'PE MACs':>12} "
                 f"{'util':>6} {'DMA bytes':>10} {'nJ':>9}  model nodes"]
        for k in self.kernels:
            dma = k.dma_load_bytes + k.dma_store_bytes
            output = "x".join(str(d) for d in k.tensor_shapes[-1]) if k.tensor_shapes else ""
            lines.append(f"{elide(k.name, 44):<44} {','.join(k.source_ops)[:26]:<26} {output[:14]:>14} {k.cycles:>10} "
                         f"{k.macs:>12} {k.padded_macs:>12} {k.utilisation:>6.1%} {dma:>10} "
                         f"{k.energy_pj / 1000:>9.1f}  {','.join(k.model_nodes)}".rstrip())
        lines.append(f"{'total':<44} {'':<26} {'':>14} {self.total_cycles:>10} {self.total_macs:>12} "
                     f"{self.total_padded_macs:>12} {'':>6} {'':>10} {self.total_energy_pj / 1000:>9.1f}")
        return "\n".join(lines + [self.host_footer()])

    def host_footer(self) -> str:
        """The host's side in a line: calls, modelled cycles (at the NPU clock) and measured time,
        crossings and their bytes, the NPU's share of the whole run's cycles."""
        calls = len(self.host_calls)
        return (f"host: {calls} call{'' if calls == 1 else 's'}, {self.host_cycles} cycles modelled at the NPU clock "
                f"({self.host_op_seconds * 1e3:.3f} ms measured here); {self.crossings} host/NPU crossings, "
                f"{self.crossing_bytes} bytes; NPU share of the run's cycles {self.npu_share:.1%}")

    def chrome_trace(self) -> dict:
        """The launches on one timeline, in the Chrome trace format (see cgra_sim.trace)."""
        if not self.keep_timelines:
            raise ValueError("this profile kept no timelines: use npu_backend.profile(keep_timelines=True)")
        return chrome_trace(self.timelines)

    def _add_host_side(self, call, crossings) -> None:
        """One host call (or None, for an NPU call) and the crossings into it (host_calls.py)."""
        if call is not None:
            self.host_calls.append(call)
        self.crossing_records.extend(crossings)

    def _add(self, result, arch: HardwareDescription, commands: np.ndarray, launch: "Launch | None",
             device_seconds: float = 0.0):
        self.kernels.append(result.stats)
        for step, seconds in result.host_seconds.items():
            self.host_seconds[step] = self.host_seconds.get(step, 0.0) + seconds
        self.host_seconds["device"] += device_seconds
        if self.keep_timelines:
            self.timelines.append(TracedLaunch(result.stats.name, result.timeline, arch.clock_mhz, commands))
        if self.record_dir is not None and launch is not None:
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", launch.kernel)[:96]
            path = os.path.join(self.record_dir, f"{len(self.kernels) - 1:04d}_{name}{SUFFIX}")
            try:
                save_launch(path, launch)
            except OSError as err:
                raise RuntimeError(f"cgra kernel '{launch.kernel}': cannot record the launch to "
                                   f"'{path}': {err.strerror or err}") from None
            self.recorded.append(path)
        if self.on_launch is not None:
            self.on_launch(result.stats)


def elide(name: str, width: int) -> str:
    """`name` in at most `width` characters: a longer one keeps its start and its end (a fused
    kernel's symbol ends in what tells its copies apart, "..._cgra_3") around a "~"."""
    if len(name) <= width:
        return name
    tail = width // 3
    return name[:width - tail - 1] + "~" + name[-tail:]


@contextlib.contextmanager
def profile(record_dir=None, keep_timelines: bool = False, on_launch=None, *,
            keep_schedules: bool | None = None):
    """Collect the statistics of every NPU kernel this thread runs inside the block.

    `record_dir`: also save every launch there as `<index>_<kernel>.cgra` (created if missing),
    with its inputs and outputs, for `cgra-sim replay`. `keep_timelines`: also keep every launch's
    per-command timeline and commands (`Profile.timelines`, `Profile.chrome_trace()`): about 300
    bytes per command (the 256-byte record and 30 bytes of timeline), no extra simulation time.
    `on_launch`: called with each launch's `KernelStats` once it is simulated (progress output).
    `keep_schedules` is the deprecated name of `keep_timelines`.
    """
    if keep_schedules is not None:
        warn_renamed("profile(keep_schedules=...)", "profile(keep_timelines=...)", stacklevel=4)
        keep_timelines = keep_timelines or keep_schedules
    if record_dir is not None:
        os.makedirs(record_dir, exist_ok=True)
    _launches.profiles_opened = profiles_opened() + 1  # the device forgets its last launch
    prof = Profile(record_dir, keep_timelines, on_launch)
    entry = (prof, threading.get_ident())
    with _lock:
        _active_profiles.append(entry)
    try:
        yield prof
    finally:
        with _lock:
            _active_profiles.remove(entry)


def any_open() -> bool:
    """Whether any thread has a profile open (read without the lock: a hint, for a fast no)."""
    return bool(_active_profiles)


def profiles_opened() -> int:
    """Profiles this thread has opened so far: the simulator backend lets a launch prefetch from
    the one before only when no profile opened in between (a profile starts on an idle device)."""
    return getattr(_launches, "profiles_opened", 0)


def launches_in_this_thread() -> int:
    """Kernel launches this thread has delivered to profiles so far."""
    return getattr(_launches, "count", 0)


def profiles_of_this_thread() -> list["Profile"]:
    """The profiles the calling thread has open."""
    thread = threading.get_ident()
    with _lock:
        return [prof for prof, owner in _active_profiles if owner == thread]


def recording() -> bool:
    """Whether a profile of this thread records launches to files (the backend then keeps the inputs)."""
    return any(prof.record_dir is not None for prof in profiles_of_this_thread())


def deliver(result, arch: HardwareDescription, commands: np.ndarray, launch: "Launch | None",
            device_seconds: float) -> None:
    """Adds one simulated launch to every profile the launching thread has open."""
    _launches.count = launches_in_this_thread() + 1
    for prof in profiles_of_this_thread():
        prof._add(result, arch, commands, launch, device_seconds)
