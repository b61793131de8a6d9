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

#: The most compute ops each architecture may leave on the host (cgra-8x8, 16 tokens). Measured
#: on 2026-11-27 before the transformer ops ran on the NPU (llama 41, gpt2 31, t5 36, bert 27),
#: then after normalise's transformer rewrites (rms_norms.py, gelus.py, softmaxes.py, the folded
#: causal mask) and the NPU's softmax, norms, GELU, tanh, exp, rsqrt and last-axis reductions
#: (kernels/rows/softmax.py, norms.py, row_reduce.py; kernels/elementwise/special.py), then after
#: the exact rewrites of RoPE's negation, constant indices, boolean masks and the lookup's index
#: cast (normalise/rotations.py, constant_indices.py, masks.py, index_casts.py): a decoder keeps
#: its guarded softmaxes' greater and where (the attention op's to fold), Bloom its ALiBi
#: positions (int64 arithmetic: 4 -> 0 as float32 on the mask's twin, normalise/mask_positions.py); Swin 2 -> 0 when its nn.pad became a DMA copy with a zero halo
#: (kernels/layout/); the decoders 3 -> 0 with the attention as one kernel (normalise/attentions.py,
#: kernels/attention/: the guarded softmax's greater and where with it). Lower a number when a change moves ops.
HOST_COMPUTE_AT_MOST = {
    "llama": 0, "qwen2": 0, "mistral": 0, "gemma": 0, "phi3": 0, "gpt2": 0, "gptj": 0, "gpt_neox": 0,
    "bloom": 0, "falcon": 0, "bert": 0, "roberta": 0, "albert": 0, "distilbert": 0, "t5": 0, "vit": 0,
    "deit": 0, "dinov2": 0, "clip": 0, "swin": 0, "convnext": 0, "whisper": 0,
}
#: One of each kind runs by default; the rest with CGRA_SLOW_TESTS=1.
DEFAULT = {"llama", "gpt2", "bloom", "falcon", "bert", "t5", "vit", "whisper"}
#: Known wrong on every target (none since normalise/negative_indices.py wraps Falcon's qkv[..., [-2], :]).
WRONG: dict = {}


def test_views_are_not_counted_as_host_layout_copies():
    """A reshape (expand_dims, squeeze, flatten) is vm.builtin.reshape, no call: not a layout copy."""
    from npu_backend.tools.explain import Placement

    placements = [Placement(op, "", where, "", "", 0)
                  for op, where in (("reshape", "host"), ("expand_dims", "host"), ("permute_dims", "host"),
                                    ("take", "host"), ("softmax", "host"), ("permute_dims", "npu"))]
    assert host_op_counts(placements) == (1, 2, ["softmax"])


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


@pytest.mark.parametrize("name", ["swin-t", "convnext-t"])
def test_published_widths_leave_no_compute_on_the_host(name):
    """bench_transformers --published measures Swin-T and ConvNeXt-T at their released widths:
    every op that computes must land on the NPU there too (explain only: their simulation takes
    minutes, the benchmark's job)."""
    from transformer_models import PUBLISHED

    model, inputs = build(name)
    assert name in PUBLISHED and inputs[0].shape[-1] == 224
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(model, inputs))
    host_compute, _, names = host_op_counts(npu_backend.explain(mod, "cgra-8x8"))
    assert host_compute == 0, sorted(names)
