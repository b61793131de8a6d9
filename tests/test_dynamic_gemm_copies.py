"""A GEMM of symbolic rows gives its per-step operand tiles a third copy where the scratchpad has
room, as a static one does (kernels/gemm/gemm_copies.py): the tile search picks the tiles as
before (minimax regret over the lengths, priced double buffered) and the copies come with them.
Llama's o-projection + residual at 128 tokens on cgra-8x8: 11,406 -> 11,056 cycles (static: 8,816).
The ragged last row tile (lower/ragged.py) is cut as before: right at every length."""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import example, given, settings, strategies as st
import tvm
from tvm import relax, tirx

import npu_backend
from npu_backend.kernels.gemm.gemm import choose_tiling

ARCH = "cgra-8x8"
K, N, BOUND = 64, 64, 2048


def test_symbolic_rows_take_a_third_copy_where_it_fits():
    arch = npu_backend.load_arch(ARCH)
    tiling = choose_tiling(BOUND, N, K, "float32", "float32", False, arch, has_residual=True, any_rows=True,
                           more_copies=True)
    assert tiling.operand_copies == 3, tiling
    plain = choose_tiling(BOUND, N, K, "float32", "float32", False, arch, has_residual=True, any_rows=True)
    assert plain.operand_copies == 2 and plain.tm == tiling.tm and plain.tk == tiling.tk  # the same tiles


def _weight():
    return np.random.default_rng(3).standard_normal((N, K)).astype("float32") / 8


@functools.lru_cache(maxsize=1)
def _vm():
    """x (s, K) @ W^T + r (s, N), s symbolic: one GEMM with the residual in its epilogue."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([s, K], "float32"))
    r = relax.Var("r", relax.TensorType([s, N], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, r], attrs={"tir_var_upper_bound": {"s": BOUND}, "tir_var_lower_bound": {"s": 1}}):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(relax.const(_weight()))), out_dtype="float32"))
            out = bb.emit_output(relax.op.add(r, y))
        bb.emit_func_output(out)
    return relax.VirtualMachine(npu_backend.compile(bb.get(), ARCH), tvm.cpu())


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 300))
@example(n=1)
@example(n=257)
def test_a_gemm_of_symbolic_rows_with_three_copies_is_right_at_every_length(n):
    rng = np.random.default_rng(n)
    x, r = (rng.standard_normal((n, w)).astype("float32") for w in (K, N))
    with npu_backend.profile() as prof:
        out = _vm()["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(r)).numpy()
    assert len(prof.kernels) == 1
    expected = x.astype(np.float64) @ _weight().T.astype(np.float64) + r
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
