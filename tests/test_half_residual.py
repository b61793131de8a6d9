"""A 16-bit linear's rounded output plus its residual, rounded again, as one GEMM kernel
(kernels/gemm/half_residual.py, kernels/intrinsics/rounded_residual.py): GPT-2's and ViT's
residual adds after the attention's output projection and fc2.

PyTorch's `r + linear(x)` in bfloat16 / float16: the float32 sum plus the bias rounded to h, that
plus r in float32, rounded to h. Hypothesis holds the kernel, on every preset and both formats,
bit for bit to numpy's model of that sequence (ml_dtypes' roundings) on values whose products
and sums are exact in float32 (any summation order gives the one sum), the add either way round,
with the model's (1, S, C) view of the rows or without it.
"""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.tools.workloads import numpy_dtype, relax_module, run

PRESETS = ["cgra-4x4", "cgra-8x8", "cgra-16x16"]
HALVES = ["bfloat16", "float16"]


def _module(dtype: str, w, bias, rows: int, viewed: bool, residual_first: bool, linear: bool):
    """main(x_h, r_h) = r + [reshape](astype(x W + b, h)) as TVM's importer writes the 16-bit
    residual add (W read as a matmul, GPT-2's Conv1D, or through permute_dims, nn.Linear)."""
    n = w.shape[0] if linear else w.shape[1]
    out = (1, rows, n) if viewed else (rows, n)

    def body(bb, x, r):
        weight = bb.emit(relax.op.permute_dims(relax.const(w, dtype))) if linear else relax.const(w, dtype)
        product = bb.emit(relax.op.matmul(x, weight, out_dtype="float32"))
        summed = bb.emit(relax.op.add(relax.const(bias.astype(np.float32)), product))
        rounded = bb.emit(relax.op.astype(summed, dtype))
        rounded = bb.emit(relax.op.reshape(rounded, out)) if viewed else rounded
        return bb.emit(relax.op.add(r, rounded) if residual_first else relax.op.add(rounded, r))
    k = w.shape[1] if linear else w.shape[0]
    return relax_module([("x", (rows, k), dtype), ("r", out, dtype)], body)


def _rounded(value, dtype: str) -> np.ndarray:
    return np.asarray(value, np.float32).astype(numpy_dtype(dtype)).astype(np.float32)


@settings(max_examples=8, deadline=None)  # a compile each: about 3 s
@given(arch=st.sampled_from(PRESETS), dtype=st.sampled_from(HALVES), rows=st.integers(1, 40),
       k=st.sampled_from([16, 64, 256]), n=st.sampled_from([16, 64]), viewed=st.booleans(),
       residual_first=st.booleans(), linear=st.booleans(), seed=st.integers(0, 2**16))
@example(arch="cgra-8x8", dtype="bfloat16", rows=32, k=256, n=64, viewed=True, residual_first=True, linear=False,
         seed=0)  # GPT-2's fc2
@example(arch="cgra-8x8", dtype="bfloat16", rows=17, k=64, n=64, viewed=True, residual_first=False, linear=True,
         seed=1)  # ViT's output projection
@example(arch="cgra-16x16", dtype="float16", rows=5, k=16, n=16, viewed=False, residual_first=False, linear=False,
         seed=2)
@example(arch="cgra-4x4", dtype="float16", rows=32, k=64, n=64, viewed=True, residual_first=True, linear=True, seed=3)
def test_a_rounded_linear_plus_its_residual_is_one_kernel_bit_for_bit(arch, dtype, rows, k, n, viewed,
                                                                     residual_first, linear, seed):
    rng = np.random.default_rng(seed)
    half = numpy_dtype(dtype)
    # eighths and sixteenths: every product and partial sum exact in float32, the rounding to h not
    x = (rng.integers(-64, 65, (rows, k)) / 8).astype(half)
    w = (rng.integers(-16, 17, (k, n)) / 16).astype(half)
    bias = (rng.integers(-64, 65, n) / 8 + rng.uniform(-1, 1, n) / 64).astype(half)
    r = (rng.standard_normal((rows, n)) * 30).astype(half)
    weights = w.T.copy() if linear else w
    mod = _module(dtype, weights, bias, rows, viewed, residual_first, linear)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), [x, r.reshape((1, rows, n)) if viewed else r])
    assert out.dtype == half
    summed = _rounded(x.astype(np.float32) @ w.astype(np.float32) + bias.astype(np.float32), dtype)
    expected = _rounded(summed + r.astype(np.float32), dtype)
    np.testing.assert_array_equal(out.astype(np.float32).reshape(rows, n), expected)
    names = [kernel.name for kernel in prof.kernels]
    assert len(names) == 1, names  # no add kernel


def test_the_model_rounds_twice():
    """The model is not one rounding of the exact sum: PyTorch's rounded linear, then its add."""
    step = np.float32(3 * 2.0 ** -10)  # under half of bfloat16's 2^-7 step at 1; twice it is over
    summed = np.float32(1.0) + step  # rounds to 1 in bfloat16
    once = _rounded(summed + step, "bfloat16")
    twice = _rounded(_rounded(summed, "bfloat16") + step, "bfloat16")
    assert once == 1 + 2.0 ** -7 and twice == 1
