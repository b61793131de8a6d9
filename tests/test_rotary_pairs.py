"""GPT-J's interleaved rotary as the half rotary the RoPE kernel runs (normalise/rotary_pairs.py):
a Hypothesis property test of the rewritten module against the unrewritten one on the host (the
attention scores q . k and V, which the reordering must leave as they were), the case that must
stay as it is (only one rotated part), and on the NPU: one RoPE kernel per rotated part."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, strategies as st
from tvm import relax

import npu_backend
from models import run
from npu_backend.normalise.rotary_pairs import rotary_pairs_rewritten


def gptj_model(s=8, c=16, heads=2, d=8, r=4, bias=True, units=2, seed=0):
    """main(x): y = linear(x) viewed (1, s, 3 heads, d); q and k (heads [0, heads) and
    [heads, 2 heads)) through GPT-J's rotate_every_two on their first r dims (the negation
    already in the sine, as rotations.py leaves it; `units` = 1: k keeps no rotary), v the rest;
    out: concat((q kᵀ, v), -1) per head."""
    rng = np.random.default_rng(seed)
    width = 3 * heads * d
    w = (rng.standard_normal((width, c)) / np.sqrt(c)).astype("float32")
    b = rng.standard_normal(width).astype("float32")
    angles = np.arange(s)[:, None] * (10000.0 ** (-np.arange(0, r, 2) / max(r, 1)))[None, :]
    cos = np.repeat(np.cos(angles), 2, axis=1).reshape(1, s, 1, r).astype("float32")
    sin = (np.repeat(np.sin(angles), 2, axis=1) * np.tile([-1.0, 1.0], r // 2)).reshape(1, s, 1, r).astype("float32")
    x = relax.Var("x", relax.TensorType((1, s, c), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            flat = bb.emit(relax.op.reshape(x, (s, c)))
            lin = bb.emit(relax.op.matmul(flat, bb.emit(relax.op.permute_dims(relax.const(w))), out_dtype="float32"))
            lin = bb.emit(relax.op.add(lin, relax.const(b))) if bias else lin
            y = bb.emit(relax.op.reshape(lin, (1, s, 3 * heads, d)))

            def box(h0, d0, d1, step=1):
                return bb.emit(relax.op.strided_slice(y, [2, 3], [h0, d0], [h0 + heads, d1], [1, step]))

            def rotated(h0):
                a = box(h0, 0, r)
                pairs = [bb.emit(relax.op.expand_dims(box(h0, start, r, 2), [4])) for start in (1, 0)]
                turned = bb.emit(relax.op.reshape(bb.emit(relax.op.concat(pairs, axis=-1)), (1, s, heads, r)))
                u = bb.emit(relax.op.add(bb.emit(relax.op.multiply(a, relax.const(cos))),
                                         bb.emit(relax.op.multiply(turned, relax.const(sin)))))
                whole = bb.emit(relax.op.concat([u, box(h0, r, d)], axis=-1)) if r < d else u
                return bb.emit(relax.op.permute_dims(whole, [0, 2, 1, 3]))

            q = rotated(0)
            k = rotated(heads) if units == 2 else bb.emit(relax.op.permute_dims(box(heads, 0, d), [0, 2, 1, 3]))
            v = bb.emit(relax.op.permute_dims(box(2 * heads, 0, d), [0, 2, 1, 3]))
            # (as HF's attention: 5-d views of q and k, so that kᵀ stays its own transpose)
            q5, k5 = (bb.emit(relax.op.reshape(t, (1, heads, 1, s, d))) for t in (q, k))
            scores = bb.emit(relax.op.matmul(q5, bb.emit(relax.op.permute_dims(k5, [0, 1, 2, 4, 3]))))
            scores = bb.emit(relax.op.reshape(scores, (1, heads, s, s)))
            out = bb.emit_output(bb.emit(relax.op.concat([scores, v], axis=-1)))
        bb.emit_func_output(out)
    return bb.get(), [rng.standard_normal((1, s, c)).astype("float32")]


def on_host(mod, xs):
    return run(tvm.compile(mod, target="llvm"), xs)


def ops(mod) -> list:
    return [b.value.op.name for b in mod["main"].body.blocks[0].bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


@given(heads=st.integers(1, 3), d=st.sampled_from([4, 8, 16]), half=st.integers(1, 8), s=st.integers(1, 9),
       bias=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_half_rotary_over_reordered_weights_keeps_scores_and_values(heads, d, half, s, bias, seed):
    r = min(2 * half, d)
    mod, xs = gptj_model(s=s, heads=heads, d=d, r=r, bias=bias, seed=seed)
    rewritten = rotary_pairs_rewritten(mod)
    assert "relax.expand_dims" in ops(mod) and "relax.expand_dims" not in ops(rewritten)
    ref = on_host(mod, xs)
    np.testing.assert_allclose(on_host(rewritten, xs), ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_one_rotated_part_is_left_alone():
    """Reordering only q's dims would change every score: without a second unit, no rewrite."""
    mod, _ = gptj_model(units=1)
    assert ops(rotary_pairs_rewritten(mod)) == ops(mod)


def test_the_rotated_parts_run_in_the_projections_epilogue_on_the_npu():
    """As GPT-NeoX's half rotary, the q and k parts are rotated by the projection's GEMM kernel
    (normalise/rope_epilogues.py: no RoPE kernel of their own)."""
    mod, xs = gptj_model(s=32, c=64, heads=4, d=16, r=8)
    ref = on_host(mod, xs)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), xs)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    assert sum("take" in k.source_ops and "matmul" in k.source_ops for k in prof.kernels) == 1
    assert not any("concat" in k.source_ops and "multiply" in k.source_ops for k in prof.kernels)
    assert not any("expand_dims" in k.source_ops for k in prof.kernels)
