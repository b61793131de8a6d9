"""Whole PyTorch networks on the NPU: ResNet-18 and MobileNetV2 through torch.export.

`torch.export.export` -> `from_exported_program` -> `npu_backend.compile`, run on the simulator
and compared with PyTorch's own output. Batch norms (random statistics) fold into the convolutions,
depthwise convolutions run as grouped conv2d kernels, the classifier (`nn.Linear`) as a matmul; at
least 99% of the multiply-accumulates must run on the NPU.

torch is an optional extra (`pip install -e ".[torch]"`): without it this module is skipped.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm.relax.frontend.torch import from_exported_program  # noqa: E402

import npu_backend  # noqa: E402
from torch_models import mobilenet_v2, randomize_batch_norm, resnet18  # noqa: E402

ARCH = "cgra-8x8"
SIZE = 64  # 1x3x64x64 input: every stage of both networks keeps a spatial extent >= 2

# Measured on 2 cores shared with other jobs: ResNet-18 about 16 s; MobileNetV2 about 100 s, so
# it is marked slow. Most of MobileNetV2's time goes to simulating the one-column GEMMs of its
# depthwise layers; folding its 52 batch norms (npu_backend/fold_weights.py) takes about 1 s
# (FoldConstant took 25-50 s per model, twice with explain).
MODELS = [
    pytest.param(resnet18, id="resnet18"),
    pytest.param(mobilenet_v2, id="mobilenet_v2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("make_model", MODELS)
def test_torch_network_matches_pytorch_with_its_macs_on_the_npu(make_model):
    torch.manual_seed(0)
    model = randomize_batch_norm(make_model(num_classes=10), seed=1)
    x = torch.randn(1, 3, SIZE, SIZE)
    with torch.no_grad():
        expected = model(x).numpy()
        exported = torch.export.export(model, (x,))
    mod = from_exported_program(exported)

    placements = npu_backend.explain(mod, ARCH)
    host_ops = {p.op for p in placements if p.where == "host"}
    assert not {"nn.conv2d", "matmul", "nn.batch_norm"} & host_ops, npu_backend.format_placements(placements)
    assert npu_backend.npu_mac_fraction(placements) >= 0.99, npu_backend.format_placements(placements)

    executable = npu_backend.compile(mod, ARCH)
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
    with npu_backend.profile() as prof:
        outputs = vm["main"](tvm.runtime.tensor(x.numpy()))
    out = outputs[0].numpy()  # from_exported_program returns a tuple

    assert out.shape == expected.shape
    rel_error = float(np.abs(out.astype(np.float64) - expected).max() / np.abs(expected).max())
    assert rel_error <= 1e-4, rel_error
    assert prof.kernels and prof.total_cycles > 0
    # Every offloaded multiply-accumulate ran on the simulator (the simulator counts the GEMMs it
    # was given, tile padding included, so it may count more than the model has).
    assert prof.total_macs >= sum(p.macs for p in placements if p.where == "npu") > 0
