"""The host's side of a run: every host operator call and every tensor crossing between host and
NPU, seen through the VM's instrument while a `profile()` is open.

Stage: runtime (Python side). `import npu_backend` wraps `relax.VirtualMachine.__init__`: a VM of an
executable compiled for the NPU (one holding `__cgra_host_costs`, host_costs.py) gets an
instrument that TVM calls before and after every call instruction. While the calling thread has
a profile open, it
- times every host call (a PrimFunc TVM compiled for the host, or a runtime copy `cgra.host.*`):
  the wall time it took here (measured), and its cycles from the chip's host table (modelled:
  `cgra_sim.host.host_call_cycles` of its arithmetic operations, per element written times the
  elements it wrote, and of the bytes of every tensor it was given), converted to the NPU's clock;
- tells an NPU call (one during which the simulator received a kernel launch) from a host call
  (the VM's builtins, the shape functions TVM made for symbolic shapes and an assert_op of shape
  values alone are neither),
  and follows each tensor from the call that wrote it to the calls that read it: a tensor written
  on one side and read on the other is a crossing, counted once per side it reaches, with its
  bytes. The model's inputs and weights, written by neither, and its outputs, read by neither,
  are not crossings. A tensor is known by its address: an allocation forgets what the memory
  held, a view (a reshape; R.memory.view, runtime.TVMTensorCreateView, which is no host call either)
  takes its tensor's side, and the function's
  parameters are forgotten when the VM checks them on entry.
Without an open profile the instrument returns at once (about a microsecond a call).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import threading
import time

import tvm
import tvm_ffi
from tvm.rpc.base import RPC_SESS_MASK

from cgra_sim.host import host_call_cycles

from . import profile as profile_module
from .host_costs import COSTS_VERSION, HOST_COSTS
from .host_ops import HOST_CONCAT

_RUNTIME_COPIES = HOST_CONCAT.rsplit(".", 1)[0] + "."  # "cgra.host.": the runtime's host operators
_BUILTIN = "vm.builtin."
#: Calls that make a view of a tensor (R.memory.view), no copy: not host calls.
_VIEWS = frozenset({"runtime.TVMTensorCreateView"})
#: Relax's assert_op: given shape values alone (a prefill's length against its caches' bound,
#: frontend/kv_prefill.py), a check like the VM's own shape checks, not a host operator.
_ASSERT = "relax.run.assert_op"
#: A symbolic length checked against its bound on entry (frontend/length_checks.py): no host operator either.
_LENGTH_CHECK = "cgra.check_length"


@dataclasses.dataclass(frozen=True)
class HostCall:
    """One host operator call: its function, modelled cycles (of the NPU's clock, comparable with
    kernels' cycles; and of the host's), measured wall seconds, tensor bytes and operations."""

    name: str
    cycles: int
    host_clock_cycles: int
    seconds: float
    bytes: int
    ops: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Crossing:
    """A tensor written on one side ("host" or "npu") read on the other, by the call `reader`."""

    source: str
    destination: str
    reader: str
    bytes: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class _Run(threading.local):
    """One thread's view of its VM calls: the calls under way, what side wrote each address, and
    the addresses allocated and not yet written."""

    def __init__(self):
        self.calls = []  # (symbol, start seconds, launches before)
        self.sides = {}  # address -> set of sides holding the tensor there
        self.fresh = set()  # addresses allocated, not yet written


class HostObserver:
    """The VM instrument (see the module docstring), with the executable's host costs."""

    def __init__(self, costs: dict):
        self.host = costs["host"]
        self.ops_per_element = costs["ops_per_element"]
        self.bookkeeping = frozenset(costs["shape_functions"])
        self.to_npu_cycles = costs["npu_clock_mhz"] / self.host["clock_mhz"]
        self.run = _Run()

    def __call__(self, func, symbol, before_run, ret_value, *args):
        if not profile_module.any_open() or not isinstance(func, tvm_ffi.Function) or \
                not profile_module.profiles_of_this_thread():
            return 0  # no profile, or a call of another Relax function (its calls are seen one by one)
        symbol = str(symbol)
        if symbol in self.bookkeeping or symbol == _LENGTH_CHECK or (symbol == _ASSERT and not any(_is_tensor(arg) for arg in args)):
            return 0
        if symbol.startswith(_BUILTIN):
            self._builtin(symbol, before_run, ret_value, args)
        elif symbol in _VIEWS:
            self._view(before_run, ret_value, args)
        elif before_run:
            self.run.calls.append((symbol, time.perf_counter(), profile_module.launches_in_this_thread()))
        elif self.run.calls:
            self._finished(*self.run.calls.pop(), args)
        return 0

    def _builtin(self, symbol, before_run, ret_value, args):
        run = self.run
        if before_run and symbol == "vm.builtin.check_tensor_info" and _is_tensor(args[0]):
            run.sides.pop(args[0].data_ptr(), None)  # a parameter of the function: written by neither
            run.fresh.discard(args[0].data_ptr())
        elif not before_run and symbol == "vm.builtin.alloc_tensor" and _is_tensor(ret_value):
            run.sides.pop(ret_value.data_ptr(), None)
            run.fresh.add(ret_value.data_ptr())

    def _view(self, before_run, ret_value, args):
        """A view (R.memory.view: runtime.TVMTensorCreateView) is no call: the same bytes, on the
        side its tensor is on."""
        if before_run or not _is_tensor(ret_value) or not args or not _is_tensor(args[0]):
            return
        sides = self.run.sides.get(args[0].data_ptr())
        if sides is not None:
            self.run.sides[ret_value.data_ptr()] = set(sides)
        self.run.fresh.discard(ret_value.data_ptr())

    def _finished(self, symbol, started, launches_before, args):
        seconds = time.perf_counter() - started
        side = "npu" if profile_module.launches_in_this_thread() > launches_before else "host"
        crossings, total_bytes, written = [], 0, 0
        seen = set()
        for tensor in filter(_is_tensor, args):
            address, size = tensor.data_ptr(), _nbytes(tensor)
            if address in seen:
                continue
            seen.add(address)
            total_bytes += size
            if address in self.run.fresh:
                self.run.fresh.discard(address)
                self.run.sides[address] = {side}
                written += math.prod(tensor.shape)
                continue
            sides = self.run.sides.get(address)
            if sides is not None and side not in sides:
                crossings.append(Crossing(next(iter(sides)), side, symbol, size))
                sides.add(side)
        call = self._host_call(symbol, seconds, total_bytes, written) if side == "host" else None
        for prof in profile_module.profiles_of_this_thread():
            prof._add_host_side(call, crossings)

    def _host_call(self, symbol, seconds, nbytes, written) -> HostCall:
        ops = 0 if symbol.startswith(_RUNTIME_COPIES) else self.ops_per_element.get(symbol, 0.0) * written
        host_cycles = host_call_cycles(self.host, ops, nbytes)
        return HostCall(symbol, round(host_cycles * self.to_npu_cycles), round(host_cycles), seconds, nbytes,
                        round(ops))


def _is_tensor(value) -> bool:
    return isinstance(value, tvm.runtime.Tensor)


def _nbytes(tensor) -> int:
    return math.prod(tensor.shape) * tensor.dtype.itemsize


def host_costs_of(vm_module) -> dict | None:
    """The costs `__cgra_host_costs` of a VM's executable holds (`vm_module`: the VM's module,
    `VirtualMachine.module`; None for another executable)."""
    try:
        if not vm_module.implements_function(HOST_COSTS):
            return None
        costs = json.loads(str(vm_module[HOST_COSTS]()))
    except (RuntimeError, AttributeError, ValueError, TypeError):
        return None
    return costs if costs.get("version") == COSTS_VERSION else None


def install_vm_instrument() -> None:
    """Give every VM of an NPU executable the host observer (idempotent; the module docstring)."""
    machine = tvm.relax.VirtualMachine
    if getattr(machine.__init__, "_cgra_observed", False):
        return
    original = machine.__init__

    @functools.wraps(original)
    def __init__(self, rt_mod, device, *args, **kwargs):
        original(self, rt_mod, device, *args, **kwargs)
        devices = device if isinstance(device, (list, tuple)) else [device]
        if any(d.dlpack_device_type() >= RPC_SESS_MASK for d in devices):
            return  # a remote VM: its instrument would run there, where no profile is open
        costs = host_costs_of(self.module)
        if costs is not None:
            self.set_instrument(HostObserver(costs))

    __init__._cgra_observed = True
    machine.__init__ = __init__
