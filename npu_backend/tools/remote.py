"""Running a compiled model on another host the TVM way: an RPC server with the NPU runtime loaded.

Stage: tools (deployment). In: an exported library (`ex.export_library("model.so")`) and inputs;
out: the outputs and the remote run's profile. A board, or any machine with this package
installed, runs `cgra-sim serve --port 9091`: TVM's own RPC server (`tvm.rpc.Server`) started with
`npu_backend` imported, so the runtime library and the device backend (the simulator here, a
driver on a board) are loaded, plus two functions that bracket a run with `npu_backend.profile()`
and hand its JSON back. The host then does what TVM documents for any remote device:

    session = tvm.rpc.connect("board", 9091)
    model = RemoteModel(session, "model.so")   # upload, load_module, VM
    outputs, report = model.run([x])          # outputs and the remote profile (cycles, ...)

Nothing is NPU-specific beyond the import and the profile; the RPC server trusts whoever connects
(TVM's warning applies: run it on a trusted network only).
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import numpy as np

PROFILE_START = "cgra.remote.profile_start"
PROFILE_STOP = "cgra.remote.profile_stop"
OBSERVE = "cgra.remote.observe_host"  # gives a VM loaded there the host observer (device/host_calls.py)
_OPEN: list = []  # the session's open profile: (context manager, Profile)


def _start_profile() -> None:
    import npu_backend

    if _OPEN:
        raise RuntimeError(f"{PROFILE_START}: a profile is already open in this session; call {PROFILE_STOP}")
    manager = npu_backend.profile()
    _OPEN.append((manager, manager.__enter__()))


def _stop_profile() -> str:
    if not _OPEN:
        raise RuntimeError(f"{PROFILE_STOP} called without {PROFILE_START}")
    manager, prof = _OPEN.pop()
    manager.__exit__(None, None, None)
    return prof.to_json()


def _observe_host(vm_module) -> None:
    """The host observer `import npu_backend` gives every local VM, for a VM the client made here."""
    from ..device.host_calls import HostObserver, host_costs_of

    costs = host_costs_of(vm_module)
    if costs is not None:
        vm_module["set_instrument"](HostObserver(costs))


def serve_npu() -> None:
    """The RPC server's start-up (`server_init_callback`): load the NPU runtime and register the
    profile functions as global functions the client can look up."""
    import tvm

    import npu_backend  # noqa: F401  (loads the runtime library, registers the device backend)

    tvm.register_global_func(PROFILE_START, _start_profile, override=True)
    tvm.register_global_func(PROFILE_STOP, _stop_profile, override=True)
    tvm.register_global_func(OBSERVE, _observe_host, override=True)


def start_server(host: str = "127.0.0.1", port: int = 9091, port_end: int = 9199, silent: bool = True):
    """A `tvm.rpc.Server` (its own process) serving with the NPU runtime loaded; `.port` is the port
    it took, `.terminate()` stops it."""
    from tvm import rpc

    try:
        import psutil  # noqa: F401  (tvm.rpc.Server.terminate needs it to stop the server's children)
    except ImportError:
        raise ImportError("the RPC server needs psutil to stop cleanly: pip install 'npu-backend[remote]' "
                          "(or pip install psutil)") from None
    return rpc.Server(host, port, port_end, silent=silent, server_init_callback=serve_npu)


class RemoteModel:
    """A compiled model uploaded to a remote host and loaded there: `run(inputs)` as often as wanted."""

    def __init__(self, session, library: str | os.PathLike, function: str = "main"):
        import tvm

        # A fresh name per upload: writing over a library the server has loaded would change the
        # code under the running process (it crashes on the next load of that path).
        name = f"{uuid.uuid4().hex[:12]}-{os.path.basename(os.fspath(library))}"
        session.upload(os.fspath(library), target=name)
        self.session = session
        self.device = session.cpu()
        self.vm = tvm.relax.VirtualMachine(session.load_module(name), self.device)
        self.session.get_function(OBSERVE)(self.vm.module)  # host calls and crossings in the profile
        self.function = function

    def run(self, inputs):
        """Run on `inputs` (numpy arrays): (the outputs as numpy arrays, the remote profile as a
        dict: total_cycles, kernels with their cycles, MACs, DMA bytes and energy, ...)."""
        import json

        import tvm

        arguments = [tvm.runtime.tensor(np.asarray(a), self.device) for a in inputs]
        self.session.get_function(PROFILE_START)()
        try:
            result = self.vm[self.function](*arguments)
        finally:
            report = json.loads(self.session.get_function(PROFILE_STOP)())
        results = [result] if hasattr(result, "numpy") else list(result)
        return [r.numpy() for r in results], report


def run_remote(session, library: str | os.PathLike, inputs, function: str = "main"):
    """Upload an exported library to `session` (from `tvm.rpc.connect`), load it there and run
    `function` on `inputs` once: `RemoteModel(session, library).run(inputs)`."""
    return RemoteModel(session, library, function).run(inputs)


def serve(host: str, port: int, port_end: int, say=print) -> int:
    """`cgra-sim serve`: run the server until interrupted (Ctrl-C or SIGTERM)."""
    server = start_server(host, port, port_end, silent=False)
    say(f"serving compiled models over TVM RPC on {host}:{server.port} "
        "(tvm.rpc.connect(HOST, PORT), then npu_backend.tools.remote.run_remote); Ctrl-C stops")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    try:
        while not stop:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.terminate()
    return 0
