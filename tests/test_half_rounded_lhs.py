"""A 16-bit GEMM of a float32 operand rounded to h rounds it on its own A panel
(kernels/gemm/half_rounded_lhs.py): HF Llama's down projection of `act(gate) * up`, which
normalise/half_linears.py writes `matmul(astype(x, h), W_h)`.

Stated bound: the panel's rounding bit for bit numpy / ml_dtypes' (nearest even): with W a
selection (one 1 a row), each output is one rounded input, exactly; with a random W, within
k 2^-20 of the float64 product of the rounded operands (float32 accumulation).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend

NUMPY_HALF = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
ONE_KERNEL = [("astype", "permute_dims", "matmul")]


def _rounded_linear(m: int, k: int, n: int, weight):
    """matmul(astype(x, h), permute_dims(W_h), out_dtype=float32), x float32 (m, k), W (n, k)."""
    half = "bfloat16" if weight.dtype == ml_dtypes.bfloat16 else str(weight.dtype)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            narrow = bb.emit(relax.op.astype(x, half))
            wt = bb.emit(relax.op.permute_dims(relax.const(weight), [1, 0]))
            out = bb.emit_output(relax.op.matmul(narrow, wt, out_dtype="float32"))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, x, arch: str):
    with npu_backend.profile() as prof:
        vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
    return out, [kernel.source_ops for kernel in prof.kernels]


def _inputs(rng, m: int, k: int, dtype: str):
    """float32 values of every exponent h holds finite (float16: below 2^15) with random low
    bits, so that many round up, down and to even; a few exact ties."""
    top = 15 if dtype == "float16" else 60
    x = (rng.standard_normal((m, k)) * 2.0 ** rng.integers(-20, top, (m, k))).astype(np.float32)
    ties = x.view(np.uint32) & np.uint32(0xFFFF0000 if dtype == "bfloat16" else 0xFFFFE000)
    tie_bit = np.uint32(0x8000 if dtype == "bfloat16" else 0x1000)
    return np.where(rng.random((m, k)) < 0.1, (ties | tie_bit).view(np.float32), x)


@settings(max_examples=6, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 48), n=st.integers(1, 24), dtype=st.sampled_from(["bfloat16", "float16"]),
       arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]), seed=st.integers(0, 2 ** 16))
def test_the_panel_rounds_each_input_as_numpy_does(m, k, n, dtype, arch, seed):
    rng = np.random.default_rng(seed)
    half = NUMPY_HALF[dtype]
    picks = rng.integers(0, k, n)
    weight = np.zeros((n, k), half)
    weight[np.arange(n), picks] = 1
    x = _inputs(rng, m, k, dtype)
    out, kernels = _run(_rounded_linear(m, k, n, weight), x, arch)
    assert kernels == ONE_KERNEL
    expected = x.astype(half).astype(np.float32)[:, picks]
    assert out.view(np.uint32).tolist() == expected.view(np.uint32).tolist()


@settings(max_examples=4, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 64), n=st.integers(1, 40), dtype=st.sampled_from(["bfloat16", "float16"]),
       seed=st.integers(0, 2 ** 16))
def test_a_random_weight_is_the_rounded_operands_product(m, k, n, dtype, seed):
    rng = np.random.default_rng(seed)
    half = NUMPY_HALF[dtype]
    weight = rng.standard_normal((n, k)).astype(half)
    x = rng.standard_normal((m, k)).astype(np.float32)
    out, kernels = _run(_rounded_linear(m, k, n, weight), x, "cgra-16x16")
    assert kernels == ONE_KERNEL
    expected = x.astype(half).astype(np.float64) @ weight.astype(np.float64).T
    assert np.abs(out - expected).max() <= k * 2.0 ** -20 * max(np.abs(expected).max(), 1.0)


def test_a_float32_gemm_or_a_widening_keeps_its_cast():
    """astype(x_h, float32) before a float32 GEMM is no rounding: the cast stays a kernel (or is
    folded elsewhere), never this panel's EPILOGUE rounding to h."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "bfloat16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wide = bb.emit(relax.op.astype(x, "float32"))
            out = bb.emit_output(relax.op.matmul(wide, relax.const(np.ones((16, 4), np.float32))))
        bb.emit_func_output(out)
    values = np.arange(128, dtype=np.float32).reshape(8, 16).astype(ml_dtypes.bfloat16)
    out, kernels = _run(bb.get(), values, "cgra-8x8")
    assert ONE_KERNEL[0] not in kernels
    assert (out == values.astype(np.float32) @ np.ones((16, 4), np.float32)).all()
