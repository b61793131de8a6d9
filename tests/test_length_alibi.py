"""A causal attention over a symbolic length with ALiBi's bias row per head (Bloom) runs as one NPU
kernel (kernels/attention/length_rows.py; the row a constant table's prefix,
normalise/length_rows.py): equal to numpy at every length, nothing on the host."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import tvm
from tvm import relax, tirx

import npu_backend
from npu_backend.tools.explain import explain, npu_mac_fraction

ARCH = "cgra-8x8"
DEPTH = 16


def _slopes(heads: int) -> np.ndarray:
    """Bloom's slopes for a power of two of heads: 2^(-8 (h + 1) / H)."""
    return (2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)).astype("float32")


def _bloom_attention(heads: int, slopes: np.ndarray, bound: int = 256, scale: float = 0.25):
    """Bloom's eager attention as torch.export writes it: alibi = slopes (H, 1, 1) * arange(s) as
    float32, tiled; scores = alibi + Q Kᵀ * scale over (H, s, s); + the causal mask
    (arange, less_equal, where) in (1, H, s, s); softmax; P V."""
    s = tirx.Var("s", "int64")
    q, k, v = (relax.Var(name, relax.TensorType([1, heads, s, DEPTH], "float32")) for name in "qkv")
    bb = relax.BlockBuilder()
    op = relax.op
    with bb.function("main", [q, k, v], attrs={"tir_var_upper_bound": {"s": bound}, "tir_var_lower_bound": {"s": 1}}):
        with bb.dataflow():
            position = bb.emit(op.arange(tirx.IntImm("int64", 0), s, tirx.IntImm("int64", 1), dtype="int64"))
            alibi = bb.emit(op.multiply(relax.const(slopes.reshape(heads, 1, 1)), bb.emit(op.astype(position, "float32"))))
            alibi = bb.emit(op.tile(alibi, [1, 1, 1]))
            positions = bb.emit(op.arange(tirx.IntImm("int64", 0), s, tirx.IntImm("int64", 1), dtype="int64"))
            rows = bb.emit(op.reshape(positions, relax.ShapeExpr([s, 1])))
            columns = bb.emit(op.reshape(positions, relax.ShapeExpr([1, s])))
            mask = bb.emit(op.where(bb.emit(op.less_equal(columns, rows)), relax.const(np.float32(0)),
                                    relax.const(np.float32(-np.inf))))
            mask = bb.emit(op.reshape(mask, relax.ShapeExpr([1, 1, s, s])))
            q3, k3, v3 = (bb.emit(op.reshape(x, relax.ShapeExpr([heads, s, DEPTH]))) for x in (q, k, v))
            scores = bb.emit(op.matmul(q3, bb.emit(op.permute_dims(k3, [0, 2, 1]))))
            scores = bb.emit(op.add(alibi, bb.emit(op.multiply(scores, relax.const(np.float32(scale))))))
            scores = bb.emit(op.add(bb.emit(op.reshape(scores, relax.ShapeExpr([1, heads, s, s]))), mask))
            p = bb.emit(op.reshape(bb.emit(op.nn.softmax(scores, axis=-1)), relax.ShapeExpr([heads, s, s])))
            out = bb.emit_output(op.reshape(bb.emit(op.matmul(p, v3)), relax.ShapeExpr([1, heads, s, DEPTH])))
        bb.emit_func_output(out)
    return bb.get()


def _expected(q, k, v, slopes, scale: float = 0.25):
    n = q.shape[2]
    alibi = slopes.reshape(1, -1, 1, 1) * np.arange(n, dtype="float32")
    scores = alibi + (q @ k.transpose(0, 1, 3, 2)) * np.float32(scale)
    scores = np.where(np.tril(np.ones((n, n), bool)), scores, np.float32(-np.inf))
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _run(vm, q, k, v):
    with npu_backend.profile() as prof:
        out = vm["main"](*(tvm.runtime.tensor(a) for a in (q, k, v))).numpy()
    return out, prof


def _inputs(rng, heads: int, n: int, spread: float = 1.0):
    return [(spread * rng.standard_normal((1, heads, n, DEPTH))).astype("float32") for _ in range(3)]


def test_bloom_s_alibi_attention_of_symbolic_length_is_one_kernel_equal_at_every_length():
    heads = 4
    slopes = _slopes(heads)
    mod = _bloom_attention(heads, slopes)
    placements = explain(mod, ARCH, dims={"s": 37})
    assert npu_mac_fraction(placements) == 1.0
    assert "cgra.attention_scale_length_row" in {p.kernel.split(" ")[0] for p in placements if p.where == "npu"}
    assert not [p.op for p in placements if p.where == "host" and p.op not in ("reshape", "permute_dims")], \
        [(p.op, p.where) for p in placements]
    vm = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())
    rng = np.random.default_rng(0)
    for n in (1, 5, 16, 37, 128, 256):
        q, k, v = _inputs(rng, heads, n)
        out, prof = _run(vm, q, k, v)
        np.testing.assert_allclose(out, _expected(q, k, v, slopes), rtol=1e-5, atol=1e-6, err_msg=f"s = {n}")
        assert len(prof.kernels) == 1, n


@settings(max_examples=5, deadline=None)
@given(heads=st.sampled_from([2, 4, 8]), bound=st.sampled_from([64, 96, 256]), seed=st.integers(0, 2**16),
       negative=st.booleans(), data=st.data())
def test_the_alibi_kernel_equals_numpy_at_random_lengths_heads_and_slopes(heads, bound, seed, negative, data):
    rng = np.random.default_rng(seed)
    slopes = rng.uniform(0.0, 2.0, heads).astype("float32") * (-1 if negative else 1)
    vm = relax.VirtualMachine(npu_backend.compile(_bloom_attention(heads, slopes, bound=bound), ARCH), tvm.cpu())
    for n in data.draw(st.lists(st.integers(1, bound), min_size=1, max_size=3), label="lengths"):
        q, k, v = _inputs(rng, heads, n)
        out, prof = _run(vm, q, k, v)
        np.testing.assert_allclose(out, _expected(q, k, v, slopes), rtol=1e-5, atol=1e-6, err_msg=f"s = {n}")
        assert len(prof.kernels) == 1


@pytest.mark.slow
def test_past_the_whole_rows_the_key_tiles_add_the_row_too():
    """At bound 2048 the lengths past the whole-row branches run the key tiles (flash_length.py)."""
    from npu_backend.kernels.attention.flash_length import choose_length_tiling
    from npu_backend.kernels.attention.length_rows import LengthRowSpec

    heads, slopes = 4, _slopes(4)
    spec = LengthRowSpec(1, heads, 1, 2048, 2048, DEPTH, DEPTH, scale=0.25, causal=0, length="s",
                         mask_shape=(1, heads, 1, 1, 2048))
    tiling = choose_length_tiling(spec, npu_backend.load_arch(ARCH))
    longest = tiling.rows[-1][0] if tiling.rows else 0
    assert longest < 2048
    vm = relax.VirtualMachine(npu_backend.compile(_bloom_attention(heads, slopes, bound=2048), ARCH), tvm.cpu())
    rng = np.random.default_rng(3)
    for n in (longest + 1, longest + 37):
        q, k, v = _inputs(rng, heads, n)
        out, _ = _run(vm, q, k, v)
        expected = _expected(q, k, v, slopes)  # (online softmax over 1,500 keys: 1e-5 of the largest, as a model's)
        assert np.abs(out - expected).max() < 1e-5 * np.abs(expected).max(), n
