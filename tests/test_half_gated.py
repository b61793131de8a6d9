"""A bfloat16 / float16 model's SwiGLU as one gated GEMM kernel that keeps the model's rounding
(normalise/gated_linears.py, kernels/gemm/gated.py).

TVM's importer writes a 16-bit Llama's MLP as

    g = matmul(x_h, W_gate^T, out_dtype=float32)        u = matmul(x_h, W_up^T, out_dtype=float32)
    out = astype(astype(g * sigmoid(g), h), float32) * u

(HF's SiLU rounded to the model's dtype, widened back for the multiply). The kernel computes the
same: both GEMMs' float32 sums, the chip's SiLU (cgra_sim/special.py: x sigmoid(x)), one rounding
to h (nearest even), the float32 multiply. With inputs whose products and sums are exact in
float32 (multiples of 1/8 and 1/16 of a few bits), the summation order does not matter and the
NPU's output is bit for bit numpy's model of exactly those steps (ml_dtypes rounding): dropping
the rounding, or rounding the product too, fails it. Before, the rounding cost the unit its
fusion: two GEMM kernels and a cast round-trip kernel between them.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from cgra_sim import function_unit, special
from npu_backend.tools.workloads import relax_module, run

HALVES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _unit_module(x_shape, gate, up, dtype: str):
    """The importer's graph of a 16-bit SwiGLU (module doc), W constants in `dtype`."""
    def linear(bb, x, weights):
        return bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(relax.const(weights, dtype))),
                                       out_dtype="float32"))

    def body(bb, x):
        g, u = linear(bb, x, gate), linear(bb, x, up)
        silu = bb.emit(relax.op.multiply(g, bb.emit(relax.op.sigmoid(g))))
        rounded = bb.emit(relax.op.astype(bb.emit(relax.op.astype(silu, dtype)), "float32"))
        return bb.emit(relax.op.multiply(rounded, u))

    return relax_module([("x", x_shape, dtype)], body)


def _exact_values(rng, shape, dtype, scale: int):
    """Small multiples of 1 / scale, exact in `dtype`; their products' sums are exact in float32."""
    return (rng.integers(-8, 9, shape) / scale).astype(np.float32).astype(HALVES[dtype])


def unit_model(x, gate, up, dtype: str) -> np.ndarray:
    """numpy's model: the exact sums, the chip's SiLU in float32, rounded to `dtype`, times u."""
    wide = [a.astype(np.float64) for a in (x, gate, up)]
    g, u = ((wide[0] @ w.T).astype(np.float32) for w in wide[1:])
    rounded = special.silu(g).astype(HALVES[dtype]).astype(np.float32)
    return rounded * u


def _run(m: int, k: int, n: int, dtype: str, arch: str, seed: int):
    """(the NPU's output, numpy's model of it, the profile) of a random exact unit."""
    rng = np.random.default_rng(seed)
    x = _exact_values(rng, (m, k), dtype, 8)
    gate, up = (_exact_values(rng, (n, k), dtype, 16) for _ in range(2))
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(_unit_module((m, k), gate, up, dtype), arch), [x])
    return out, unit_model(x, gate, up, dtype), prof


#: The presets whose function unit runs SiLU (a chip without keeps the unit's parts, and its
#: sigmoid as FABRIC bodies: another function than special.silu's).
SILU_PRESETS = [name for name in npu_backend.preset_names()
                if function_unit.runs(npu_backend.load_arch(name).function_unit, "silu")]


@settings(max_examples=6, deadline=None)  # a compile each: about 4 s
@given(m=st.integers(1, 40), k=st.integers(1, 96), n=st.integers(1, 48), dtype=st.sampled_from(sorted(HALVES)),
       arch=st.sampled_from(SILU_PRESETS), seed=st.integers(0, 2**16))
def test_a_16_bit_swiglu_rounds_its_activation_bit_exactly(m, k, n, dtype, arch, seed):
    """Fused, or (tiles padded far beyond a tiny unit: gemm/epilogue_tail.check_tail_padding) as
    its parts, bit for bit the model."""
    out, expected, _ = _run(m, k, n, dtype, arch, seed)
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("arch", SILU_PRESETS)
@pytest.mark.parametrize("dtype", sorted(HALVES))
def test_a_16_bit_swiglu_is_one_gated_kernel(dtype, arch):
    """The tests/transformer_models.py Llama's unit (16 tokens, hidden 64, MLP 128): gate, up,
    SiLU, rounding and multiply in one kernel (before: two GEMMs and a round-trip cast kernel)."""
    out, expected, prof = _run(16, 64, 128, dtype, arch, 0)
    (kernel,) = prof.kernels
    assert "astype" in kernel.source_ops and "strided_slice" in kernel.source_ops, kernel.source_ops
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


def test_the_model_rounds_where_the_graph_does():
    """The model above is the graph's arithmetic: dropping its rounding changes the result (so the
    bit-exact test can fail), and TVM's own host run of the graph agrees with it within the
    host's sigmoid (llvm's exp, not the chip's)."""
    rng = np.random.default_rng(3)
    x = _exact_values(rng, (8, 24), "bfloat16", 8)
    gate, up = (_exact_values(rng, (12, 24), "bfloat16", 16) for _ in range(2))
    expected = unit_model(x, gate, up, "bfloat16")
    wide = [a.astype(np.float64) for a in (x, gate, up)]
    g, u = ((wide[0] @ w.T).astype(np.float32) for w in wide[1:])
    assert not np.array_equal(expected, special.silu(g) * u)
    import tvm

    host = run(tvm.compile(_unit_module((8, 24), gate, up, "bfloat16"), target="llvm"), [x])
    np.testing.assert_allclose(host, expected, rtol=2.0 ** -7, atol=1e-6)

