"""Remote runs through TVM RPC (npu_backend/tools/remote.py): an exported model run through a
local RPC server, started in its own process as a board's would be, gives the local outputs and
the local cycles, kernel by kernel."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import rpc

import npu_backend
from models import conv2d_model, matmul_model, run
from npu_backend.tools import remote

pytest.importorskip("psutil")  # tvm.rpc.Server.terminate needs it (the remote extra)


def _local(tmp_path, mod, inputs, arch):
    ex = npu_backend.compile(mod, arch)
    with npu_backend.profile() as prof:
        expected = run(ex, inputs)
    library = tmp_path / "model.so"
    ex.export_library(str(library))
    return library, expected, [(k.name, k.cycles, k.dma_load_bytes, k.energy_pj) for k in prof.kernels]


def _same_as_local(run, inputs, expected, kernels):
    outputs, report = run(inputs)
    np.testing.assert_array_equal(outputs[0], expected)
    assert [(k["name"], k["cycles"], k["dma_load_bytes"], k["energy_pj"]) for k in report["kernels"]] == kernels
    assert report["total_cycles"] == sum(kernel[1] for kernel in kernels)


def test_remote_run_matches_local(tmp_path):
    mod, inputs, _ = conv2d_model(1, 8, 12, 12, 16, 3, 3, (1, 1), (1, 1, 1, 1), "int8")
    library, expected, kernels = _local(tmp_path, mod, inputs, "cgra-4x4")
    server = remote.start_server(port=9301, port_end=9399)
    try:
        session = rpc.connect("127.0.0.1", server.port)
        model = remote.RemoteModel(session, library)
        _same_as_local(model.run, inputs, expected, kernels)
        _same_as_local(model.run, inputs, expected, kernels)  # a second run: the counters start afresh
        # Uploading the same library again (under a fresh name) and running it once.
        _same_as_local(lambda x: remote.run_remote(session, library, x), inputs, expected, kernels)
        with pytest.raises(tvm.error.RPCError, match="called without"):
            session.get_function(remote.PROFILE_STOP)()
    finally:
        server.terminate()


def test_a_remote_profile_counts_the_host_side(tmp_path):
    """A matmul then a softmax on the host: the remote profile has the softmax's call, with the
    local modelled cycles, and the matmul's output crossing to it."""
    mod, inputs, _ = matmul_model(16, 24, 32, "float32", softmax=True)
    ex = npu_backend.compile(mod)
    with npu_backend.profile() as prof:
        run(ex, inputs)
    ex.export_library(str(tmp_path / "model.so"))
    server = remote.start_server(port=9401, port_end=9499)
    try:
        _, report = remote.run_remote(rpc.connect("127.0.0.1", server.port), tmp_path / "model.so", inputs)
    finally:
        server.terminate()
    assert [(c["name"], c["cycles"]) for c in report["host_calls"]] == [(c.name, c.cycles) for c in prof.host_calls]
    assert report["host_cycles"] == prof.host_cycles > 0
    assert report["crossings"] == prof.crossings == 1 and report["crossing_bytes"] == 16 * 24 * 4


def test_cgra_sim_serve(tmp_path):
    """The command a board runs: `cgra-sim serve` prints its port, serves, and stops on SIGTERM."""
    mod, inputs, _ = matmul_model(33, 40, 24, "float32")
    library, expected, kernels = _local(tmp_path, mod, inputs, "cgra-8x8")
    server = subprocess.Popen([sys.executable, "-m", "cgra_cli", "serve", "--host", "127.0.0.1",
                               "--port", "9401", "--port-end", "9499"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        port = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert port, line + server.stderr.read()
        session = rpc.connect("127.0.0.1", int(port.group(1)))
        _same_as_local(lambda x: remote.run_remote(session, library, x), inputs, expected, kernels)
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
