"""Networks nobody here designed: the layer shapes of thirteen model-zoo classics and a YOLOv8n-style
SiLU detector (zoo_models.py), at 64x64 with random weights, compiled for the NPU with every conv,
pool and dense layer on it, and checked against onnxruntime. Each keeps working as the compiler
changes."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
import tvm

import npu_backend
from zoo_models import ZOO

SIZE = 64


@pytest.mark.parametrize("name", sorted(ZOO))
def test_a_model_zoo_network_runs_on_the_npu_and_matches_onnxruntime(name):
    model = ZOO[name](SIZE)
    x = np.random.default_rng(0).standard_normal((1, 3, SIZE, SIZE)).astype("float32")
    ref = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"input": x})[0]
    mod = npu_backend.from_onnx(model)
    assert npu_backend.npu_mac_fraction(npu_backend.explain(mod, "cgra-8x8")) == 1.0
    with npu_backend.profile() as prof:
        out = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](
            tvm.runtime.tensor(x))
    out = (out if hasattr(out, "numpy") else out[0]).numpy()
    assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max()
    assert prof.kernels and all(k.cycles > 0 for k in prof.kernels)
