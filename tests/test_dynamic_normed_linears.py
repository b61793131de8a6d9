"""A plain RMSNorm read by a linear over a symbolic number of rows (a prefill's (1, s, C)) is
folded into the linear's GEMM, as a static one is (normalise/normed_linears.py,
kernels/gemm/row_norm.py): one kernel, the last tile's panel program cut to the rows that exist
(lower/ragged.py cuts its REDUCE too: its rows past the length were never loaded)."""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import example, given, settings, strategies as st
import tvm
from tvm import relax, tirx

import npu_backend

ARCH = "cgra-8x8"
WIDTH, OUT = 64, 96
EPS = 1e-6


def _normed_linear(bound: int = 2048):
    """linear(rms_norm(x (1, s, 64), ones), W (96, 64)) through the (s, 64) rows, s symbolic."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([1, s, WIDTH], "float32"))
    weight = relax.const(_weight())
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_upper_bound": {"s": bound}, "tir_var_lower_bound": {"s": 1}}):
        with bb.dataflow():
            normed = bb.emit(relax.op.nn.rms_norm(x, relax.const(np.ones(WIDTH, "float32")), axes=[-1], epsilon=EPS))
            rows = bb.emit(relax.op.reshape(normed, relax.ShapeExpr([s, WIDTH])))
            out = bb.emit_output(relax.op.matmul(rows, bb.emit(relax.op.permute_dims(weight))))
        bb.emit_func_output(out)
    return bb.get()


def _weight():
    return np.random.default_rng(1).standard_normal((OUT, WIDTH)).astype("float32") / 8


@functools.lru_cache(maxsize=1)
def _vm():
    return relax.VirtualMachine(npu_backend.compile(_normed_linear(), ARCH), tvm.cpu())


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 300))
@example(n=1)
@example(n=33)
def test_a_norm_before_a_linear_of_symbolic_rows_is_the_gemms_panel_program(n):
    x = np.random.default_rng(n).standard_normal((1, n, WIDTH)).astype("float32")
    with npu_backend.profile() as prof:
        out = _vm()["main"](tvm.runtime.tensor(x)).numpy()
    assert len(prof.kernels) == 1  # the norm is the GEMM's, not a kernel of its own
    rows = x[0].astype(np.float64)
    expected = rows / np.sqrt((rows * rows).mean(-1, keepdims=True) + EPS) @ _weight().T.astype(np.float64)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
