"""Hugging Face transformers' own architectures (tests/hf_models.py: CNNs, vision transformers,
hybrids, text and speech encoders) through torch.export -> from_exported_program ->
npu_backend.compile, run on the simulator against PyTorch: every multiply-accumulate on the NPU,
within float32 tolerance.

Optional: skipped without torch and transformers (`pip install -e ".[hf]"`). The first few run by
default, the rest with CGRA_SLOW_TESTS=1 (`python benchmarks/bench_hf.py` prints the figures).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm.relax.frontend.torch import from_exported_program  # noqa: E402

import npu_backend  # noqa: E402
# A transformers that cannot build its models (an optional dependency of it installed but
# broken: a torchvision built for another torch) skips these tests rather than stopping the run.
hf_models = pytest.importorskip("hf_models", reason="transformers cannot build its models here")
ARCHITECTURES, build, first_output = hf_models.ARCHITECTURES, hf_models.build, hf_models.first_output

ARCH = "cgra-8x8"
QUICK = ("resnet", "vit", "convnext", "bert", "squeezebert", "efficientnet")


@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name in QUICK else pytest.mark.slow)
                                  for name in ARCHITECTURES])
def test_public_architecture_matches_pytorch_on_the_npu(name):
    model, inputs = build(name)
    with torch.no_grad():
        expected = first_output(model(*inputs)).numpy()
        exported = torch.export.export(model, inputs)
    assert np.abs(expected).max() > 0  # a comparison with zeros would prove nothing
    mod = from_exported_program(exported)

    placements = npu_backend.explain(mod, ARCH)
    assert npu_backend.npu_mac_fraction(placements) >= 0.99, npu_backend.format_placements(placements)

    vm = tvm.relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())
    out = first_output(vm["main"](*[tvm.runtime.tensor(x.numpy()) for x in inputs])).numpy()
    assert out.shape == expected.shape
    rel_error = float(np.abs(out.astype(np.float64) - expected).max() / np.abs(expected).max())
    assert rel_error <= 1e-4, rel_error
