"""A batched matmul whose constant right operand repeats one matrix (torch.export's linear of a
3-D input under no_grad, its weight's transpose and broadcast folded) reads that matrix once
(normalise/shared_weights.py): one GEMM with the bias and the residual in its epilogue, within
1e-5 of float64; a constant whose batch slices differ, or that shapes the result, stays."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.shared_weights import repeated_matrix, shared_weights


def _block(x_shape, weight, bias, residual):
    """matmul(x, weight) + bias + residual with constant weight, bias and residual."""
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x_shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(xv, relax.const(weight), out_dtype="float32"))
            h = bb.emit(relax.op.add(h, relax.const(bias)))
            out = bb.emit_output(relax.op.add(h, relax.const(residual)))
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=4, deadline=None)
@given(batch=st.integers(2, 16), rows=st.integers(1, 17), k=st.sampled_from([8, 16, 32]), n=st.sampled_from([8, 16]),
       seed=st.integers(0, 99))
def test_a_repeated_weight_is_one_gemm_with_its_residual(batch, rows, k, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, rows, k)).astype("float32")
    w = (rng.standard_normal((k, n)) / 4).astype("float32")
    b = rng.standard_normal(n).astype("float32")
    residual = rng.standard_normal((batch, rows, n)).astype("float32")
    mod = _block(x.shape, np.broadcast_to(w, (batch, k, n)).copy(), b, residual)
    with npu_backend.profile() as prof:
        vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    expected = x.astype(np.float64) @ w + b + residual
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    assert len(prof.kernels) == 1 and prof.host_calls == [], [kernel.name for kernel in prof.kernels]


def test_differing_slices_and_a_shaping_constant_stay():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 8, 8)).astype("float32")
    differ = _block((4, 3, 8), w, np.zeros(8, "float32"), np.zeros((4, 3, 8), "float32"))
    tvm.ir.assert_structural_equal(shared_weights(differ), differ)
    same = np.broadcast_to(w[0], (4, 8, 8)).copy()
    shaping = _block((3, 8), same, np.zeros(8, "float32"), np.zeros((4, 3, 8), "float32"))  # x has no batch
    tvm.ir.assert_structural_equal(shared_weights(shaping), shaping)


def test_slices_compare_as_bits():
    same = np.zeros((3, 2, 2), "float32")
    assert (repeated_matrix(same) == 0).all()
    same[1, 0, 0] = -0.0  # equal as floats, not as bits: a sign the GEMM could carry
    assert repeated_matrix(same) is None
    nan = np.full((2, 2, 2), np.nan, "float32")
    assert repeated_matrix(nan).shape == (2, 2)
    assert repeated_matrix(np.zeros((2, 2), "float32")) is None
