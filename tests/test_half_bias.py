"""A bfloat16 / float16 linear with a bias, rounded once, as one GEMM kernel (normalise/half_casts.py,
kernels/gemm/half_bias.py).

TVM's importer writes a 16-bit linear with a bias (ViT's projections, through
frontend/torch_import.py) as `astype(add(matmul(x_h, W_h^T, out_dtype=float32), b), h)`, b the
float32 bias (its values h's). The GEMM kernel computes exactly that: the float32 sum, plus b in
float32, rounded once to h on store (the EPILOGUE, its bias row in h widened exactly). With inputs
whose products and sums are exact in float32 the summation order does not matter, and the NPU's
output is bit for bit numpy's model: float32(sum) + b in float32, rounded to nearest even by
ml_dtypes. A bias that is not all h values (a float32 model's, or a user's) keeps the float32 GEMM
and its cast kernel: the same model, two kernels.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.tools.workloads import relax_module, run

HALVES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _module(x_shape, weights, bias, dtype: str, bias_first: bool):
    def body(bb, x):
        product = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(relax.const(weights, dtype))),
                                          out_dtype="float32"))
        summed = relax.op.add(relax.const(bias), product) if bias_first else relax.op.add(product, relax.const(bias))
        return bb.emit(relax.op.astype(bb.emit(summed), dtype))

    return relax_module([("x", x_shape, dtype)], body)


def _exact_values(rng, shape, dtype, scale: int):
    """Small multiples of 1 / scale, exact in `dtype`; their products' sums are exact in float32."""
    return (rng.integers(-8, 9, shape) / scale).astype(np.float32).astype(HALVES[dtype])


def biased_model(x, weights, bias, dtype: str) -> np.ndarray:
    """The exact sum (float32 holds it), plus the float32 bias in float32, rounded once to `dtype`."""
    total = (x.astype(np.float64) @ weights.astype(np.float64).T).astype(np.float32)
    return (total + bias).astype(HALVES[dtype])


@settings(max_examples=8, deadline=None)  # a compile each: about 4 s
@given(m=st.integers(1, 40), k=st.integers(1, 96), n=st.integers(1, 48), dtype=st.sampled_from(sorted(HALVES)),
       arch=st.sampled_from(npu_backend.preset_names()), bias_first=st.booleans(), half_bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_a_16_bit_biased_linear_rounds_once_on_store_bit_exactly(m, k, n, dtype, arch, bias_first, half_bias, seed):
    rng = np.random.default_rng(seed)
    x = _exact_values(rng, (m, k), dtype, 8)
    weights = _exact_values(rng, (n, k), dtype, 16)
    bias = rng.standard_normal(n).astype(np.float32)
    if half_bias:  # as the importer writes a 16-bit model's bias: its values h's
        bias = bias.astype(HALVES[dtype]).astype(np.float32)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(_module((m, k), weights, bias, dtype, bias_first), arch), [x])
    expected = biased_model(x, weights, bias, dtype)
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))
    if half_bias:  # one GEMM kernel storing h (before: the float32 GEMM, then a cast kernel)
        (kernel,) = prof.kernels
        assert kernel.source_ops.count("astype") == 2 and "add" in kernel.source_ops, kernel.source_ops
        assert kernel.dma_store_bytes <= 2 * m * n + 64
    else:
        assert len(prof.kernels) == 2


def test_the_model_rounds_once():
    """Rounding the sum to h and then adding the bias in h (what folding the cast into the matmul
    would compute) differs from the model on these inputs: the test above can fail."""
    rng = np.random.default_rng(5)
    x = _exact_values(rng, (8, 40), "bfloat16", 8)
    weights = _exact_values(rng, (16, 40), "bfloat16", 16)
    bias = rng.standard_normal(16).astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    once = biased_model(x, weights, bias, "bfloat16")
    total = (x.astype(np.float64) @ weights.astype(np.float64).T).astype(np.float32)
    twice = (total.astype(ml_dtypes.bfloat16).astype(np.float32) + bias).astype(ml_dtypes.bfloat16)
    assert not np.array_equal(once.view(np.uint16), twice.view(np.uint16))


@pytest.mark.parametrize("dtype", sorted(HALVES))
def test_a_16_bit_biased_conv2d_rounds_once_on_store_bit_exactly(dtype):
    """The importer's 16-bit conv2d with a bias (ViT's patch embedding) likewise: one kernel."""
    rng = np.random.default_rng(2)
    x = _exact_values(rng, (1, 6, 9, 9), dtype, 8)
    weights = _exact_values(rng, (10, 6, 3, 3), dtype, 16)
    bias = rng.standard_normal((1, 10, 1, 1)).astype(np.float32).astype(HALVES[dtype]).astype(np.float32)

    def body(bb, data):
        conv = bb.emit(relax.op.nn.conv2d(data, relax.const(weights, dtype), out_dtype="float32"))
        return bb.emit(relax.op.astype(bb.emit(relax.op.add(conv, relax.const(bias))), dtype))

    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(relax_module([("x", x.shape, dtype)], body), "cgra-8x8"), [x])
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (3, 3), axis=(2, 3))
    total = np.einsum("nchwij,fcij->nfhw", windows, weights.astype(np.float64)).astype(np.float32)
    expected = (total + bias).astype(HALVES[dtype])
    assert len(prof.kernels) == 1
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))


def _wide_module(x_shape, weights, bias, dtype: str, bias_first: bool):
    def body(bb, x):
        product = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(relax.const(weights, dtype))),
                                          out_dtype="float32"))
        summed = relax.op.add(relax.const(bias), product) if bias_first else relax.op.add(product, relax.const(bias))
        return bb.emit(relax.op.astype(bb.emit(relax.op.astype(bb.emit(summed), dtype)), "float32"))

    return relax_module([("x", x_shape, dtype)], body)


@settings(max_examples=8, deadline=None)  # a compile each: about 4 s
@given(m=st.integers(1, 40), k=st.integers(1, 96), n=st.integers(1, 48), dtype=st.sampled_from(sorted(HALVES)),
       arch=st.sampled_from(npu_backend.preset_names()), bias_first=st.booleans(), seed=st.integers(0, 2**16))
def test_a_16_bit_biased_linear_rounded_and_widened_back_is_one_kernel_bit_exactly(m, k, n, dtype, arch, bias_first,
                                                                                   seed):
    """HF's bf16 ViT's q / k / v and fc1: astype(astype(linear(x) + b, h), float32), one GEMM
    kernel storing float32 (before: the GEMM storing h, then a widening cast kernel)."""
    rng = np.random.default_rng(seed)
    x = _exact_values(rng, (m, k), dtype, 8)
    weights = _exact_values(rng, (n, k), dtype, 16)
    bias = rng.standard_normal(n).astype(np.float32).astype(HALVES[dtype]).astype(np.float32)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(_wide_module((m, k), weights, bias, dtype, bias_first), arch), [x])
    expected = biased_model(x, weights, bias, dtype).astype(np.float32)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))
    (kernel,) = prof.kernels
    assert kernel.source_ops.count("astype") == 3, kernel.source_ops
