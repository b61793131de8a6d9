"""A constant causal mask plus constant rows per head (a static Bloom's ALiBi without a padding
mask) reach the attention kernel as its triangle and a mask row (normalise/constant_rows.py): no
(1, H, s, s) mask is added or read, and the kernel computes only the keys up to each query
tile's diagonal. Against numpy in float64, within test_attention's bound; and Bloom exported with
input_ids alone against PyTorch.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

from npu_backend.normalise.constant_rows import triangle
from test_attention import BOUND, _attention_kernels, _reference, _run

op = relax.op
FLT_MIN = np.float32(np.finfo(np.float32).min)


def _alibi_attention(h, sq, d, scale, rows, y):
    """HF Bloom's eager attention with its mask folded: softmax(q kᵀ * scale + (C + A)) V, C the
    causal triangle of 0 and y, A the constant (1, h, 1, sq) rows."""
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(name, relax.TensorType((1, h, sq, d), "float32")) for name in "qkv")
    causal = np.where(np.tril(np.ones((sq, sq), bool)), np.float32(0), np.float32(y)).astype(np.float32)
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            tri = bb.emit(op.reshape(relax.const(causal), (1, 1, sq, sq)))
            alibi = bb.emit(op.reshape(relax.const(rows.reshape(h, sq)), (1, h, 1, sq)))
            mask = bb.emit(op.add(tri, alibi))
            s = bb.emit(op.matmul(q, bb.emit(op.permute_dims(k, [0, 1, 3, 2]))))
            s = bb.emit(op.add(bb.emit(op.multiply(s, relax.const(np.float32(scale)))), mask))
            o = bb.emit_output(op.matmul(bb.emit(op.nn.softmax(s, axis=-1)), v))
        bb.emit_func_output(o)
    return bb.get(), causal


def _alibi(h, sq):
    """Bloom's rows: slope_h times the key's position."""
    slopes = np.float32(2.0) ** (-8.0 * np.arange(1, h + 1) / h)
    return (slopes[:, None] * np.arange(sq)[None, :]).astype(np.float32)


@settings(max_examples=8, deadline=None)
@given(h=st.integers(1, 4), sq=st.integers(2, 40), d=st.sampled_from([8, 16, 32, 64]),
       y=st.sampled_from([-np.inf, FLT_MIN]), rows=st.sampled_from(["alibi", "random"]),
       arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]), seed=st.integers(0, 2 ** 16))
@example(h=4, sq=32, d=16, y=FLT_MIN, rows="alibi", arch="cgra-8x8", seed=0)  # the benchmarks' Bloom
@example(h=2, sq=33, d=16, y=-np.inf, rows="random", arch="cgra-4x4", seed=1)  # a ragged last tile
def test_constant_triangle_and_rows_match_float64(h, sq, d, y, rows, arch, seed):
    rng = np.random.default_rng(seed)
    scale = float(d) ** -0.5
    q, k, v = (rng.standard_normal((1, h, sq, d)).astype(np.float32) for _ in range(3))
    a = _alibi(h, sq) if rows == "alibi" else (rng.standard_normal((h, sq)) * 4).astype(np.float32)
    mod, causal = _alibi_attention(h, sq, d, scale, a, y)
    out, prof = _run(mod, [q, k, v], arch)
    kernels = [kernel.name for kernel in prof.kernels]
    assert len(_attention_kernels(prof)) == 1 and len(kernels) == 1, kernels  # no (1, h, s, s) add
    assert "add_relax_add_relax_nn_softmax" in kernels[0], kernels  # the triangle, then the rows
    mask = causal.astype(np.float64)[None, None] + a.astype(np.float64)[None, :, None, :]
    expected = _reference(q, k, v, mask, scale, safe=False)
    assert np.abs(out - expected).max() <= BOUND * max(np.abs(expected).max(), 1e-30)


def test_only_triangles_of_zero_and_one_minimum_are_read():
    causal = np.tril(np.ones((4, 4), bool))
    assert np.array_equal(triangle(np.where(causal, 0, FLT_MIN).astype(np.float32)),
                          np.where(causal, 0, -np.inf).astype(np.float32))
    assert triangle(np.where(causal, 0, -1e9).astype(np.float32)) is None  # x + y need not round to y
    assert triangle(np.where(causal, 0, -np.inf).astype(np.float64)) is None


def test_a_row_too_large_keeps_the_square_mask():
    """Rows beyond 2^100 could move float32's minimum: the mask stays one operand, read whole
    (an attention pattern with a mask, not the causal one), as rows of moderate size split."""
    import npu_backend

    def patterns(rows):
        mod, _ = _alibi_attention(2, 8, 16, 0.25, rows, FLT_MIN)
        return {p.kernel.split(" ")[0] for p in npu_backend.explain(mod, "cgra-8x8") if "attention" in p.kernel}

    rows = np.full((2, 8), 2.0 ** 101, np.float32)
    assert not any("_causal" in name for name in patterns(rows)), patterns(rows)
    assert all("_causal" in name for name in patterns(_alibi(2, 8))), patterns(_alibi(2, 8))


@pytest.mark.parametrize("length", [24, 37])
def test_static_bloom_without_a_mask_matches_pytorch(length):
    """Bloom exported with input_ids alone for one length: its folded mask and ALiBi are the
    kernel's triangle and rows (no s x s add kernel), within 1e-5 of PyTorch."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import tvm
    from tvm.relax.frontend.torch import from_exported_program

    import npu_backend
    from test_symbolic_exports import _export

    model, _ = _export("bloom", 64)
    ids = torch.randint(0, 100, (1, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        expected = model(ids).numpy()
        mod = from_exported_program(torch.export.export(model, (ids,)))
    vm = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    with npu_backend.profile() as prof:
        out = vm["main"](tvm.runtime.tensor(ids.numpy()))
    out = (out[0] if not hasattr(out, "numpy") else out).numpy()
    kernels = [kernel.name for kernel in prof.kernels]
    assert not any(name.startswith("fused_relax_add_cgra") for name in kernels), kernels
    assert len([name for name in kernels if "softmax" in name]) == 2, kernels
    error = np.abs(out.astype(np.float64) - expected).max() / np.abs(expected).max()
    assert error < 1e-5, error
