"""CI: with only the README's `onnx` and `remote` extras installed, `cgra-sim serve` starts, runs the
bundled example model for a client exactly as it runs locally (outputs and cycles), and stops on
SIGTERM. (tests/test_remote.py covers the same with the test extras installed; this proves the
remote extra alone is enough.)"""

from __future__ import annotations

import pathlib
import re
import signal
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import tvm
from tvm import rpc

import npu_backend
from npu_backend.tools.remote import RemoteModel

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "tiny_cnn.onnx"


def main() -> int:
    model = onnx.load(str(EXAMPLE))
    (graph_input,) = [i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    shape = [d.dim_value or 1 for d in graph_input.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    ex = npu_backend.compile(npu_backend.from_onnx(model), "cgra-8x8")
    with npu_backend.profile() as prof:
        out = tvm.relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    expected = (out if isinstance(out, tvm.runtime.Tensor) else out[0]).numpy()
    library = pathlib.Path(tempfile.mkdtemp()) / "model.so"
    ex.export_library(str(library))
    command = str(pathlib.Path(sys.executable).parent / "cgra-sim")  # the venv's console script
    server = subprocess.Popen([command, "serve", "--host", "127.0.0.1", "--port", "9601", "--port-end", "9699"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        port = re.search(r"127\.0\.0\.1:(\d+)", line)
        if not port:
            print(f"serve_smoke: cgra-sim serve did not start: {line}{server.stderr.read()}", file=sys.stderr)
            return 1
        outputs, report = RemoteModel(rpc.connect("127.0.0.1", int(port.group(1))), str(library)).run([x])
        np.testing.assert_array_equal(outputs[0], expected)
        assert report["total_cycles"] == prof.total_cycles, (report["total_cycles"], prof.total_cycles)
    finally:
        server.send_signal(signal.SIGTERM)
        status = server.wait(timeout=60)
    print(f"serve_smoke: PASS (the remote run matched the local one, {prof.total_cycles} cycles)")
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
