"""export_library, then a fresh process with only `import npu_backend`: same results, same cycles."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import tvm

import npu_backend
from models import conv2d_model, matmul_model, run

FRESH_PROCESS = """
import json, sys
import numpy as np, tvm, npu_backend
lib = tvm.runtime.load_module(sys.argv[1])
vm = tvm.relax.VirtualMachine(lib, tvm.cpu())
data = np.load(sys.argv[2])
inputs = [tvm.runtime.tensor(data[f"arr_{i}"]) for i in range(len(data.files))]
with npu_backend.profile() as prof:
    out = vm["main"](*inputs).numpy()
np.save(sys.argv[3], out)
print(json.dumps([k.cycles for k in prof.kernels]))
"""


def _roundtrip(tmp_path, mod, inputs, target):
    ex = tvm.compile(mod, target=target)
    with npu_backend.profile() as prof:
        expected = run(ex, inputs)
    library = tmp_path / "model.so"
    ex.export_library(str(library))
    np.savez(tmp_path / "inputs.npz", *inputs)
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(library), str(tmp_path / "inputs.npz"),
                           str(tmp_path / "out.npy")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [k.cycles for k in prof.kernels]


def test_export_matmul_int8(tmp_path):
    mod, inputs, _ = matmul_model(100, 50, 70, "int8")
    _roundtrip(tmp_path, mod, inputs, "cgra-16x16")


def test_export_conv2d_float32(tmp_path):
    mod, inputs, _ = conv2d_model(1, 3, 12, 12, 8, 3, 3, (1, 1), (1, 1, 1, 1), "float32")
    _roundtrip(tmp_path, mod, inputs, "cgra")
