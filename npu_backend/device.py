"""The simulator as the runtime's device backend, and the profiler that collects its statistics.

Stage: runtime (Python side). The C++ runtime hands every finished kernel launch to the tvm-ffi
global function `cgra.backend.simulator.submit` (docs/runtime-abi.md); this module registers it:
the host tensors become zero-copy numpy views, the command stream is executed by `cgra_sim`, and
each launch's `KernelStats` reaches every active `profile()`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import threading

import numpy as np
import tvm_ffi

from cgra_sim import simulate
from cgra_sim.errors import SimulatorError
from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import RECORD_WORDS, SLOT_WORDS, DType

SUBMIT_FUNCTION = "cgra.backend.simulator.submit"

_active_profiles: list["Profile"] = []
_lock = threading.Lock()


class Profile:
    """Per-kernel statistics of every NPU launch made inside a `with profile():` block."""

    def __init__(self):
        self.kernels = []  # cgra_sim KernelStats, in launch order

    @property
    def total_cycles(self) -> int:
        return sum(k.cycles for k in self.kernels)

    @property
    def total_macs(self) -> int:
        return sum(k.macs for k in self.kernels)

    def to_dict(self) -> dict:
        return {"total_cycles": self.total_cycles, "total_macs": self.total_macs,
                "kernels": [k.to_dict() for k in self.kernels]}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def table(self) -> str:
        """A per-kernel table a person can read."""
        lines = [f"{'kernel':<48} {'source ops':<34} {'cycles':>10} {'MACs':>12} {'util':>6} {'DMA bytes':>10}"]
        for k in self.kernels:
            dma = k.dma_load_bytes + k.dma_store_bytes
            lines.append(f"{k.name[:48]:<48} {','.join(k.source_ops)[:34]:<34} {k.cycles:>10} "
                         f"{k.macs:>12} {k.utilisation:>6.1%} {dma:>10}")
        lines.append(f"{'total':<48} {'':<34} {self.total_cycles:>10} {self.total_macs:>12}")
        return "\n".join(lines)


@contextlib.contextmanager
def profile():
    """Collect the statistics of every NPU kernel run inside the block."""
    prof = Profile()
    with _lock:
        _active_profiles.append(prof)
    try:
        yield prof
    finally:
        with _lock:
            _active_profiles.remove(prof)


@functools.lru_cache(maxsize=16)
def _arch(arch_json: str) -> HardwareDescription:
    return HardwareDescription.from_json(arch_json)


def _host_view(slot) -> np.ndarray:
    """A numpy array over the host tensor's memory (no copy: stores land in the tensor)."""
    address, dtype_code, ndim = int(slot[0]), int(slot[1]), int(slot[2])
    if dtype_code == 0:  # an unbound slot: no command may touch it (the runtime checks)
        return np.zeros(0, dtype=np.int8)
    shape = tuple(int(d) for d in slot[3:3 + ndim])
    dtype = np.dtype(DType(dtype_code).numpy_name)
    count = int(np.prod(shape, dtype=np.int64))
    raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(address)
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


def _submit(kernel_name, source_ops, arch_json, slots, commands):
    slot_table = np.frombuffer(bytes(slots), dtype=np.int64).reshape(-1, SLOT_WORDS)
    stream = np.frombuffer(bytes(commands), dtype=np.int64).reshape(-1, RECORD_WORDS)
    tensors = [_host_view(slot) for slot in slot_table]
    ops = tuple(op for op in str(source_ops).split(",") if op)
    try:
        stats = simulate(_arch(str(arch_json)), stream, tensors, name=str(kernel_name), source_ops=ops)
    except SimulatorError as err:
        # tvm-ffi rebuilds exceptions by class name and knows only its registered ones; a
        # ValueError with the simulator's message is what reaches the user.
        raise ValueError(f"cgra kernel '{kernel_name}': {err}") from None
    with _lock:
        for prof in _active_profiles:
            prof.kernels.append(stats)


def register_backend() -> None:
    """Make the simulator the device backend the C++ runtime submits to."""
    tvm_ffi.register_global_func(SUBMIT_FUNCTION, _submit, override=True)
