"""Transformer architectures nobody here wrote (tests/transformer_models.py: Hugging Face's own
modules, small configs, random weights) through torch.export and the NPU: each matches PyTorch,
and leaves no more compute ops on the host than the ratchet below allows (it only goes down as
the transformer ops move to the NPU; benchmarks/bench_transformers.py --why lists them).

Needs torch and transformers (`pip install -e ".[hf]"`; CI installs them).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import tvm  # noqa: E402
from tvm.relax.frontend.torch import from_exported_program  # noqa: E402

import npu_backend  # noqa: E402
from transformer_models import ARCHITECTURES, build, first_output, host_op_counts  # noqa: E402

#: The most compute ops each architecture may leave on the host (cgra-8x8, 16 tokens), as measured
#: on 2026-11-27 before the transformer ops ran on the NPU. Lower a number when a change moves ops.
HOST_COMPUTE_AT_MOST = {
    "llama": 41, "qwen2": 41, "mistral": 41, "gemma": 41, "phi3": 41, "gpt2": 31, "gptj": 33, "gpt_neox": 33,
    "bloom": 19, "falcon": 31, "bert": 27, "roberta": 36, "albert": 29, "distilbert": 26, "t5": 36, "vit": 26,
    "deit": 26, "dinov2": 25, "clip": 24, "swin": 29, "convnext": 13, "whisper": 27,
}
#: One of each kind runs by default; the rest with CGRA_SLOW_TESTS=1.
DEFAULT = {"llama", "gpt2", "bloom", "falcon", "bert", "t5", "vit", "whisper"}
#: Known wrong on every target (issue 34): TVM's importer reads Falcon's qkv[..., [-2], :] out of bounds.
WRONG = {"falcon": "take(x, [-2], mode='fast') reads out of bounds (normalise must wrap the index)"}


def test_the_ratchet_names_every_architecture():
    assert set(HOST_COMPUTE_AT_MOST) == set(ARCHITECTURES)


@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name in DEFAULT else pytest.mark.slow)
                                  for name in ARCHITECTURES])
def test_a_transformer_matches_pytorch_with_its_compute_on_the_npu(name):
    if name in WRONG:
        pytest.xfail(WRONG[name])
    model, inputs = build(name)
    with torch.no_grad():
        expected = first_output(model(*inputs)).numpy()
        mod = from_exported_program(torch.export.export(model, inputs))
    host_compute, _, names = host_op_counts(npu_backend.explain(mod, "cgra-8x8"))
    assert host_compute <= HOST_COMPUTE_AT_MOST[name], sorted(names)
    with npu_backend.profile() as prof:
        vm = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
        out = first_output(vm["main"](*[tvm.runtime.tensor(x.numpy()) for x in inputs])).numpy()
    assert prof.kernels, "nothing ran on the NPU"
    error = np.abs(out.astype(np.float64) - expected).max() / np.abs(expected).max()
    assert error < 1e-5, error
