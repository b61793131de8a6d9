"""The simulator as the runtime's device backend.

Stage: runtime (Python side). The C++ runtime hands every finished kernel launch to the tvm-ffi
global function `cgra.backend.simulator.submit` (docs/runtime-abi.md); this module registers it:
the host tensors become zero-copy numpy views, the command stream is executed by `cgra_sim`, and
each launch's statistics go to every active `profile()` (profile.py).
"""

from __future__ import annotations

import ctypes
import functools
import time

import numpy as np
import tvm_ffi

from cgra_sim import simulate_detailed
from cgra_sim.arch import HardwareDescription
from cgra_sim.errors import SimulatorError
from cgra_sim.isa import RECORD_WORDS, SLOT_WORDS, DType
from cgra_sim.stream_file import Launch

from .profile import deliver, recording

SUBMIT_FUNCTION = "cgra.backend.simulator.submit"


@functools.lru_cache(maxsize=16)
def _arch(arch_json: str) -> HardwareDescription:
    return HardwareDescription.from_json(arch_json)


def _host_view(slot) -> np.ndarray:
    """A numpy array over the host tensor's memory (no copy: stores land in the tensor)."""
    address, dtype_code, ndim = int(slot[0]), int(slot[1]), int(slot[2])
    if dtype_code == 0:  # an unbound slot: no command may touch it (the runtime checks)
        return np.zeros(0, dtype=np.int8)
    shape = tuple(int(d) for d in slot[3:3 + ndim])
    dtype = np.dtype(DType(dtype_code).storage)  # bfloat16 as its bits (uint16)
    count = int(np.prod(shape, dtype=np.int64))
    raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(address)
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


def _submit(kernel_name, source_ops, arch_json, slots, commands, macs_per_output, macs_divisor):
    started = time.perf_counter()
    slot_table = np.frombuffer(bytes(slots), dtype=np.int64).reshape(-1, SLOT_WORDS)
    stream = np.frombuffer(bytes(commands), dtype=np.int64).reshape(-1, RECORD_WORDS)
    tensors = [_host_view(slot) for slot in slot_table]
    ops = tuple(op for op in str(source_ops).split(",") if op)
    arch = _arch(str(arch_json))
    inputs = [t.copy() for t in tensors] if recording() else None  # before the stores land
    try:
        result = simulate_detailed(arch, stream, tensors, name=str(kernel_name), source_ops=ops,
                                   macs_per_output=int(macs_per_output), macs_divisor=int(macs_divisor))
    except SimulatorError as err:
        # tvm-ffi rebuilds exceptions by class name and knows only its registered ones; a
        # ValueError with the simulator's message is what reaches the user.
        raise ValueError(f"cgra kernel '{kernel_name}': {err}") from None
    launch = None
    if inputs is not None:
        launch = Launch.from_tensors(str(kernel_name), ops, str(arch_json), stream, inputs,
                                     [t.copy() for t in tensors], result.stats.to_dict(), int(macs_per_output),
                                     int(macs_divisor))
    device_seconds = time.perf_counter() - started - sum(result.host_seconds.values())
    deliver(result, arch, stream, launch, device_seconds)


def register_backend() -> None:
    """Make the simulator the device backend the C++ runtime submits to."""
    tvm_ffi.register_global_func(SUBMIT_FUNCTION, _submit, override=True)
