"""The kernels' weights are held by the runtime's cgra_weights module, not the VM executable
(npu_backend/device/weights.py, runtime/src/weights_module.cc). The export round trip through a
fresh process is test_export.py's."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm

import npu_backend
from onnx_models import resnet


def _pool_tensors(executable) -> list[str]:
    """The tensors in the executable's constant pool, as its stats print them ("[16, 3, 3, 3]";
    shapes print as "shapetuple[...]")."""
    pool = next(line for line in executable.stats().splitlines() if "Constant pool" in line)
    return re.findall(r", (\[[\d, ]+\])", pool)


def _kinds(module, depth=0) -> list[tuple[int, str]]:
    return [(depth, module.kind)] + [kind for imported in module.imports for kind in _kinds(imported, depth + 1)]


def test_kernel_weights_leave_the_executable():
    # A ResNet stage has identical layers with different weights: one binding per call site.
    mod = npu_backend.from_onnx(resnet(size=16, stages=(8, 8), blocks=2))
    image = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    host = tvm.compile(mod, target="llvm")
    npu = tvm.compile(mod, target="cgra")
    assert _pool_tensors(host), "the llvm build keeps its weights in the constant pool (what this test tells apart)"
    assert _pool_tensors(npu) == []
    assert (1, "cgra_weights") in _kinds(npu.mod) and (2, "cgra_kernels") in _kinds(npu.mod)
    expected = tvm.relax.VirtualMachine(host, tvm.cpu())["main"](tvm.runtime.tensor(image)).numpy()
    out = tvm.relax.VirtualMachine(npu, tvm.cpu())["main"](tvm.runtime.tensor(image)).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("data, reason", [
    (b"not weights", "not a weights block"),
    (b"CGRAWTS1" + (1).to_bytes(8, "little") + (40).to_bytes(8, "little"), "end early"),
])
def test_damaged_weights_are_refused(data, reason):
    load = tvm.get_global_func("ffi.Module.load_from_bytes.cgra_weights")
    with pytest.raises(ValueError, match=reason):
        load(data)
