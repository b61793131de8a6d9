"""A 16-bit linear whose weight TVM's importer widened to its float32 input (HF Llama's down
projection of `act(gate) * up`) as the 16-bit GEMM PyTorch computes (normalise/half_linears.py):
the input rounded to h, h x h products accumulated in float32.

Stated bound: the NPU's result within 2 ** -20 of the largest |output| times k of the float64
product of the rounded operands (float32 accumulation), and the rewrite only where the weight is
a 16-bit constant widened (a float32 model's linear, a widened run-time weight stay).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.half_linears import half_widened_linears

NUMPY_HALF = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _linear(m: int, k: int, n: int, weight, constant: bool = True):
    """matmul(x, astype(permute_dims(W), float32), out_dtype=float32), TVM's import of a 16-bit
    linear of a float32 input; W (n, k) a constant or (`constant` False) a parameter."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    params = [x]
    w = relax.const(weight)
    if not constant:
        w = relax.Var("w", relax.TensorType(weight.shape, str(weight.dtype) if weight.dtype != ml_dtypes.bfloat16
                                            else "bfloat16"))
        params.append(w)
    with bb.function("main", params):
        with bb.dataflow():
            wt = bb.emit(relax.op.permute_dims(w, [1, 0]))
            wide = bb.emit(relax.op.astype(wt, "float32"))
            out = bb.emit_output(relax.op.matmul(x, wide, out_dtype="float32"))
        bb.emit_func_output(out)
    return bb.get()


def _matmul_operands(mod) -> list:
    """The dtypes of the result's matmul's operands."""
    matmul = mod["main"].body.blocks[0].bindings[-1].value
    assert str(matmul.op.name) == "relax.matmul" and str(matmul.attrs.out_dtype) == "float32"
    return [str(arg.ty.dtype) for arg in matmul.args]


def test_the_widened_weight_becomes_a_16_bit_gemm_of_the_rounded_input():
    for dtype in ("bfloat16", "float16"):
        weight = np.ones((4, 8), NUMPY_HALF[dtype])
        assert _matmul_operands(half_widened_linears(_linear(2, 8, 4, weight))) == [dtype, dtype]


def test_a_float32_weight_or_a_run_time_one_stays():
    assert _matmul_operands(half_widened_linears(_linear(2, 8, 4, np.ones((4, 8), np.float32)))) == ["float32"] * 2
    mod = half_widened_linears(_linear(2, 8, 4, np.ones((4, 8), ml_dtypes.bfloat16), constant=False))
    assert _matmul_operands(mod) == ["float32"] * 2


@settings(max_examples=4, deadline=None)
@given(m=st.integers(1, 20), k=st.integers(1, 40), n=st.integers(1, 24), dtype=st.sampled_from(["bfloat16", "float16"]),
       seed=st.integers(0, 2 ** 16))
def test_the_npu_computes_h_products_of_the_rounded_input(m, k, n, dtype, seed):
    rng = np.random.default_rng(seed)
    half = NUMPY_HALF[dtype]
    weight = rng.standard_normal((n, k)).astype(half)
    x = rng.standard_normal((m, k)).astype(np.float32)
    with npu_backend.profile() as prof:
        vm = relax.VirtualMachine(npu_backend.compile(_linear(m, k, n, weight), "cgra-8x8"), tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
    # the input's rounding on the GEMM's A panel (kernels/gemm/half_rounded_lhs.py): one kernel
    assert [kernel.source_ops for kernel in prof.kernels] == [("permute_dims", "astype", "matmul")]
    expected = x.astype(half).astype(np.float64) @ weight.astype(np.float64).T
    assert np.abs(out - expected).max() <= k * 2.0 ** -20 * max(np.abs(expected).max(), 1.0)
