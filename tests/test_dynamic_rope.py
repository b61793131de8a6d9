"""RoPE of a prefill of symbolic length in its q / k / v projection's epilogue, as at a static one
(normalise/rope_epilogues.py, kernels/gemm/rope_epilogue.py): the rotary's cos and sin are views of
the first s rows of tables computed for the bound (frontend/position_tables.py), so the epilogue's
tables are views of the first s rows of (bound, N) tables, loaded like a residual and cut with the
last row tile (lower/ragged.py). One kernel for the projection and its rotary at every length; no
RoPE kernel (kernels/elementwise/rope_length.py) is left. Llama at 128 tokens on cgra-8x8: the
projection, q's and k's RoPE 19,770 + 8,384 + 5,296 cycles a layer before, 21,636 after (what a
static compile of that length runs)."""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import example, given, settings, strategies as st
import tvm
from tvm import relax, tirx

import npu_backend
from test_rope_epilogues import _tables

ARCH, BOUND = "cgra-8x8", 512
K, HEADS, KV, D, ROTARY = 32, 2, 1, 32, 16
TOTAL = HEADS + 2 * KV


def _weights():
    rng = np.random.default_rng(7)
    return (rng.standard_normal((TOTAL * D, K)).astype(np.float32) / 4,
            rng.standard_normal(TOTAL * D).astype(np.float32))


def _view(table, s):
    """The first s rows of a (BOUND, ROTARY) table as (1, 1, s, ROTARY), as tabulate_prefix writes it."""
    return relax.op.memory.view(relax.const(table), relax.ShapeExpr([1, 1, s, ROTARY]), "float32",
                                tirx.IntImm("int64", 0))


def _module():
    """x (s, K) @ W^T + b as (1, s, TOTAL, D) heads; q's and k's first ROTARY dims rotated (x * cos +
    concat(halves swapped) * signed sin, the rest passed through), v a slice; s symbolic."""
    s = tirx.Var("s", "int64")
    w, b = _weights()
    cos, _, signed = _tables(np.arange(BOUND), ROTARY)
    x = relax.Var("x", relax.TensorType((s, K), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_upper_bound": {"s": BOUND}, "tir_var_lower_bound": {"s": 1}}):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(relax.const(w))), out_dtype="float32"))
            y4 = bb.emit(relax.op.reshape(bb.emit(relax.op.add(y, relax.const(b))), relax.ShapeExpr([1, s, TOTAL, D])))
            c, n = bb.emit(_view(cos, s)), bb.emit(_view(signed, s))
            outs = []
            for h0, h1 in ((0, HEADS), (HEADS, HEADS + KV)):
                part = bb.emit(relax.op.permute_dims(bb.emit(relax.op.strided_slice(y4, [2, 3], [h0, 0], [h1, ROTARY])),
                                                     [0, 2, 1, 3]))
                halves = [bb.emit(relax.op.strided_slice(part, [3], [lo], [hi]))
                          for lo, hi in ((ROTARY // 2, ROTARY), (0, ROTARY // 2))]
                turned = bb.emit(relax.op.concat(halves, axis=-1))
                rope = bb.emit(relax.op.add(bb.emit(relax.op.multiply(part, c)), bb.emit(relax.op.multiply(turned, n))))
                rest = bb.emit(relax.op.permute_dims(bb.emit(relax.op.strided_slice(y4, [2, 3], [h0, ROTARY], [h1, D])),
                                                     [0, 2, 1, 3]))
                outs.append(bb.emit(relax.op.concat([rope, rest], axis=-1)))
            outs.append(bb.emit(relax.op.permute_dims(bb.emit(relax.op.strided_slice(y4, [2], [HEADS + KV], [TOTAL])),
                                                      [0, 2, 1, 3])))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return relax.transform.Normalize()(bb.get())


def _expected(data):
    w, b = _weights()
    n = data.shape[0]
    cos, sin, _ = _tables(np.arange(n), ROTARY)
    heads = (data.astype(np.float64) @ w.T.astype(np.float64) + b).reshape(n, TOTAL, D).transpose(1, 0, 2)
    out = []
    for h0, h1 in ((0, HEADS), (HEADS, HEADS + KV)):
        part = heads[h0:h1].copy()
        rot = part[..., :ROTARY]
        turned = np.concatenate([-rot[..., ROTARY // 2:], rot[..., :ROTARY // 2]], axis=-1)
        part[..., :ROTARY] = rot * cos + turned * sin
        out.append(part[None])
    return out + [heads[HEADS + KV:][None]]


@functools.lru_cache(maxsize=1)
def _vm():
    return relax.VirtualMachine(npu_backend.compile(_module(), ARCH), tvm.cpu())


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 300))
@example(n=1)
@example(n=65)
def test_rope_of_a_symbolic_length_is_its_projections_epilogue(n):
    data = np.random.default_rng(n).standard_normal((n, K)).astype(np.float32)
    with npu_backend.profile() as prof:
        out = _vm()["main"](tvm.runtime.tensor(data))
    names = [kernel.name for kernel in prof.kernels]
    assert sum("matmul" in name and "take" in name for name in names) == 1, names  # the epilogue's rotation
    assert not any("concat" in name or "rope" in name for name in names), names
    for got, want in zip(out, _expected(data)):
        got = got.numpy()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
