"""benchmarks/bench_half.py (issue 37): a transformer in float32, bfloat16 and float16 as the
benchmark builds it (weights and float inputs in the format, token ids integers) and, slow, one
run's cycles and error against PyTorch's own run in that format."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from bench_half import _numpy_dtype, half_model, run  # noqa: E402


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_model_holds_its_weights_and_float_inputs_in_the_format(dtype):
    """ViT: its pixels are a float input, cast with the weights."""
    model, inputs = half_model("vit", dtype, tokens=8)
    assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
    for x in inputs:
        assert x.dtype == (getattr(torch, dtype) if x.is_floating_point() else torch.int64)
    # The input TVM is handed is the same bits (float32 holds every bfloat16 / float16 value).
    floats = [x for x in inputs if x.is_floating_point()]
    for x in floats:
        assert np.array_equal(x.float().numpy().astype(_numpy_dtype(dtype)).astype(np.float32), x.float().numpy())


def test_float32_is_the_model_as_built():
    model, inputs = half_model("gpt2", "float32", tokens=8)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert all(x.dtype == torch.int64 for x in inputs)


@pytest.mark.slow  # about 30 s: an export and a compile
def test_a_bfloat16_gpt2_run_is_within_the_formats_tolerance_of_pytorch():
    cycles, dram, error, prof = run("gpt2", "bfloat16", "cgra-8x8", 8)
    assert cycles == prof.total_cycles > 0 and dram > 0
    assert error <= 2.0 ** -5


@pytest.mark.slow  # about 60 s each: an export and a compile
@pytest.mark.parametrize("name, gemms", [("bert", 2 * 5 + 1), ("vit", 2 * 5 + 1)])
def test_a_bfloat16_encoders_q_k_v_are_one_gemm_within_the_formats_tolerance(name, gemms):
    """BERT's and ViT's bf16 q / k / v (rounded, widened back) merge into one linear
    (normalise/qkv_merges.py): per layer one q/k/v GEMM, the attention, its output, fc1 and fc2
    (then the pooler's), 15 before; ViT's pre-attention norm, then read by one linear, runs in its
    prologue. Within 2 ** -5 of the output's scale of PyTorch's bf16 run (measured 7.4e-3, 6.5e-3)."""
    cycles, _, error, prof = run(name, "bfloat16", "cgra-8x8", 32)
    assert error <= 2.0 ** -5
    assert sum("matmul" in k.name for k in prof.kernels) == gemms
    if name == "vit":  # the final norm runs in the last fc2's epilogue, rounded (kernels/gemm/half_post_norm.py)
        assert sum("layer_norm" in k.name and "matmul" not in k.name for k in prof.kernels) == 0
