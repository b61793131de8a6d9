"""GPT-J's interleaved rotary at a symbolic length (normalise/rotary_pairs.py): its cos and sin are
views of the first s rows of (bound, r) tables (position_tables.tabulate_prefix), the half rotary's
are views of those tables with their columns reordered. A Hypothesis property test of the rewritten
module against the unrewritten one on the host at several lengths (the scores q . k and V), and on
the NPU: one compile, the rotary in the projection's epilogue at every length (before: 18 slice,
concat, multiply and add kernels a layer, symbolic GPT-J 1.58x a static compile at 16 tokens)."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax, tirx

import npu_backend
from npu_backend.normalise.rotary_pairs import rotary_pairs_rewritten

BOUND = 64


def _tables(r: int):
    """(bound, r) cos and sin (the negation in the sine, as rotations.py leaves it), pairs repeated."""
    angles = np.arange(BOUND)[:, None] * (10000.0 ** (-np.arange(0, r, 2) / r))[None, :]
    cos = np.repeat(np.cos(angles), 2, axis=1).astype("float32")
    sin = (np.repeat(np.sin(angles), 2, axis=1) * np.tile([-1.0, 1.0], r // 2)).astype("float32")
    return cos, sin


def gptj_model(c=16, heads=2, d=8, r=4, seed=0):
    """tests/test_rotary_pairs.py's model with x (1, s, c), s symbolic (at most BOUND), and cos /
    sin (1, s, 1, r) views of the bound's tables."""
    rng = np.random.default_rng(seed)
    width = 3 * heads * d
    w = (rng.standard_normal((width, c)) / np.sqrt(c)).astype("float32")
    b = rng.standard_normal(width).astype("float32")
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((1, s, c), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_lower_bound": {"s": 1}, "tir_var_upper_bound": {"s": BOUND}}):
        with bb.dataflow():
            cos, sin = (bb.emit(relax.op.memory.view(relax.const(t), relax.ShapeExpr([1, s, 1, r]), "float32",
                                                     tirx.IntImm("int64", 0))) for t in _tables(r))
            flat = bb.emit(relax.op.reshape(x, (s, c)))
            lin = bb.emit(relax.op.matmul(flat, bb.emit(relax.op.permute_dims(relax.const(w))), out_dtype="float32"))
            y = bb.emit(relax.op.reshape(bb.emit(relax.op.add(lin, relax.const(b))), (1, s, 3 * heads, d)))

            def box(h0, d0, d1, step=1):
                return bb.emit(relax.op.strided_slice(y, [2, 3], [h0, d0], [h0 + heads, d1], [1, step]))

            def rotated(h0):
                a = box(h0, 0, r)
                pairs = [bb.emit(relax.op.expand_dims(box(h0, start, r, 2), [4])) for start in (1, 0)]
                turned = bb.emit(relax.op.reshape(bb.emit(relax.op.concat(pairs, axis=-1)), (1, s, heads, r)))
                u = bb.emit(relax.op.add(bb.emit(relax.op.multiply(a, cos)), bb.emit(relax.op.multiply(turned, sin))))
                whole = bb.emit(relax.op.concat([u, box(h0, r, d)], axis=-1)) if r < d else u
                return bb.emit(relax.op.permute_dims(whole, [0, 2, 1, 3]))

            q, k = rotated(0), rotated(heads)
            v = bb.emit(relax.op.permute_dims(box(2 * heads, 0, d), [0, 2, 1, 3]))
            # (as HF's attention: 5-d views of q and k, so that kᵀ stays its own transpose)
            q5, k5 = (bb.emit(relax.op.reshape(t, (1, heads, 1, s, d))) for t in (q, k))
            scores = bb.emit(relax.op.matmul(q5, bb.emit(relax.op.permute_dims(k5, [0, 1, 2, 4, 3]))))
            scores = bb.emit(relax.op.reshape(scores, (1, heads, s, s)))
            out = bb.emit_output(bb.emit(relax.op.concat([scores, v], axis=-1)))
        bb.emit_func_output(out)
    return bb.get()


def _run(executable, n: int, c: int, seed: int = 0):
    x = np.random.default_rng(seed + n).standard_normal((1, n, c)).astype("float32")
    return relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _ops(mod) -> list:
    return [b.value.op.name for b in mod["main"].body.blocks[0].bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


@settings(max_examples=10, deadline=None)
@given(heads=st.integers(1, 3), d=st.sampled_from([4, 8, 16]), half=st.integers(1, 8), seed=st.integers(0, 2 ** 16))
def test_half_rotary_at_a_symbolic_length_keeps_scores_and_values(heads, d, half, seed):
    r = min(2 * half, d)
    mod = gptj_model(heads=heads, d=d, r=r, seed=seed)
    rewritten = rotary_pairs_rewritten(mod)
    assert "relax.expand_dims" in _ops(mod) and "relax.expand_dims" not in _ops(rewritten)
    before, after = tvm.compile(mod, "llvm"), tvm.compile(rewritten, "llvm")
    for n in (1, 5, BOUND):
        ref = _run(before, n, 16, seed)
        np.testing.assert_allclose(_run(after, n, 16, seed), ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_the_rotary_runs_in_the_projections_epilogue_at_every_length():
    mod = gptj_model(c=64, heads=4, d=16, r=8)
    reference, executable = tvm.compile(mod, "llvm"), npu_backend.compile(mod, "cgra-8x8")
    for n in (2, 16, 37):
        ref = _run(reference, n, 64)
        with npu_backend.profile() as prof:
            out = _run(executable, n, 64)
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
        assert sum("take" in k.source_ops and "matmul" in k.source_ops for k in prof.kernels) == 1
        assert not any(op in k.source_ops and "matmul" not in k.source_ops
                       for k in prof.kernels for op in ("multiply", "expand_dims", "add"))
        # (the test's own tail, q kᵀ without a softmax and the concat with V, may run on the host)
        assert not [c.name for c in prof.host_calls if c.name not in ("matmul", "cgra.host.concat")]
