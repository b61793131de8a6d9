"""The simulator as the runtime's device backend.

Stage: runtime (Python side). The C++ runtime hands every finished kernel launch to the tvm-ffi
global function `cgra.backend.simulator.submit` (docs/runtime-abi.md); this module registers it:
the host tensors become zero-copy numpy views, the command stream is executed by `cgra_sim`, and
each launch's statistics go to every active `profile()` (profile.py). The device remembers the
launch it ran last in each thread (`prefetch.DeviceTail`): on a chip with `dma_prefetch`, the
next launch's constant operands (slots the runtime flags `SLOT_FLAG_CONSTANT`) may have been
loaded in its idle load-engine time (cgra_sim/prefetch.py). A profile opened since forgets it,
so a profile's figures never depend on what ran before it.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time

import numpy as np
import tvm_ffi

from cgra_sim import simulate_detailed
from cgra_sim.arch import HardwareDescription
from cgra_sim.errors import SimulatorError
from cgra_sim.isa import RECORD_WORDS, SLOT_FIELDS, SLOT_FLAG_CONSTANT, SLOT_WORDS, DType
from cgra_sim.stream_file import Launch

from .profile import deliver, profiles_opened, recording

SUBMIT_FUNCTION = "cgra.backend.simulator.submit"
_FLAGS = SLOT_FIELDS.index("flags")
# .tail: what the device keeps of this thread's last launch, .opened: profiles_opened() then
_device = threading.local()


def _last_launch():
    """The DeviceTail of this thread's last launch; None after a profile opened since."""
    tail = getattr(_device, "tail", None)
    return tail if tail is not None and _device.opened == profiles_opened() else None


def _keep_last_launch(tail) -> None:
    _device.tail, _device.opened = tail, profiles_opened()


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
        constants = [slot for slot, flags in enumerate(slot_table[:, _FLAGS]) if flags & SLOT_FLAG_CONSTANT]
        result = simulate_detailed(arch, stream, tensors, name=str(kernel_name), source_ops=ops,
                                   macs_per_output=int(macs_per_output), macs_divisor=int(macs_divisor),
                                   previous=_last_launch(), constant_slots=constants)
    except SimulatorError as err:
        # tvm-ffi rebuilds exceptions by class name and knows only its registered ones; a
        # ValueError with the simulator's message is what reaches the user.
        _keep_last_launch(None)  # the launch never ran: the device is idle
        raise ValueError(f"cgra kernel '{kernel_name}': {err}") from None
    _keep_last_launch(result.tail)
    launch = None
    if inputs is not None:
        launch = Launch.from_tensors(str(kernel_name), ops, str(arch_json), stream, inputs,
                                     [t.copy() for t in tensors], result.stats.to_dict(), int(macs_per_output),
                                     int(macs_divisor), constants)
    device_seconds = time.perf_counter() - started - sum(result.host_seconds.values())
    deliver(result, arch, stream, launch, device_seconds)


def register_backend() -> None:
    """Make the simulator the device backend the C++ runtime submits to."""
    tvm_ffi.register_global_func(SUBMIT_FUNCTION, _submit, override=True)
