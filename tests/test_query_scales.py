"""An attention's score scale that is no power of two (Swin's 8^-1/2) folds into the query
projection's weights (normalise/query_scales.py): no multiply left for the attention kernel to
apply to every item's Q tile, the result within 1e-5 of float64; a power of two stays."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.query_scales import folded_scale, query_scales
from npu_backend.normalise.stage import normalise
from npu_backend.options import CompileOptions


def _attention(x, weights, biases, mask, heads, scale):
    """HF's eager attention: q, k, v linears of x, scores (q kᵀ) * scale + mask, softmax, P v."""
    s, c = x.shape
    d = c // heads
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            def heads_of(w, b):
                h = bb.emit(relax.op.matmul(xv, relax.op.permute_dims(relax.const(w))))
                h = bb.emit(relax.op.add(h, relax.const(b)))
                h = bb.emit(relax.op.reshape(h, (1, s, heads, d)))
                return bb.emit(relax.op.permute_dims(h, [0, 2, 1, 3]))
            q, k, v = (heads_of(w, b) for w, b in zip(weights, biases))
            scores = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
            scores = bb.emit(relax.op.multiply(scores, relax.const(np.float32(scale))))
            scores = bb.emit(relax.op.add(scores, relax.const(mask)))
            p = bb.emit(relax.op.nn.softmax(scores, axis=-1))
            o = bb.emit(relax.op.permute_dims(bb.emit(relax.op.matmul(p, v)), [0, 2, 1, 3]))
            out = bb.emit_output(relax.op.reshape(o, (s, c)))
        bb.emit_func_output(out)
    return bb.get()


def _expected(x, weights, biases, mask, heads, scale):
    s, c = x.shape
    q, k, v = ((x.astype(np.float64) @ w.T + b).reshape(s, heads, c // heads).transpose(1, 0, 2)
               for w, b in zip(weights, biases))
    scores = q @ k.transpose(0, 2, 1) * np.float64(np.float32(scale)) + mask[0]
    p = np.exp(scores - scores.max(-1, keepdims=True))
    o = (p / p.sum(-1, keepdims=True)) @ v
    return o.transpose(1, 0, 2).reshape(s, c)


def _case(seed, tokens, heads, d):
    rng = np.random.default_rng(seed)
    c = heads * d
    x = rng.standard_normal((tokens, c)).astype("float32")
    weights = [(rng.standard_normal((c, c)) / np.sqrt(c)).astype("float32") for _ in range(3)]
    biases = [rng.standard_normal(c).astype("float32") for _ in range(3)]
    mask = rng.standard_normal((1, heads, tokens, tokens)).astype("float32")  # a relative position bias
    return x, weights, biases, mask


def _multiplies(mod) -> int:
    count = []
    relax.analysis.post_order_visit(mod["main"], lambda e: count.append(1) if isinstance(e, relax.Call) and getattr(
        e.op, "name", "") == "relax.multiply" else None)
    return len(count)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 99), tokens=st.sampled_from([8, 16]), heads=st.integers(1, 3), d=st.sampled_from([8, 24]))
def test_a_scale_folds_into_the_query_weights_within_float64(seed, tokens, heads, d):
    x, weights, biases, mask = _case(seed, tokens, heads, d)
    scale = d ** -0.5
    mod = _attention(x, weights, biases, mask, heads, scale)
    assert _multiplies(normalise(mod, npu_backend.load_arch("cgra-8x8"), CompileOptions())) == 0
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    expected = _expected(x, weights, biases, mask, heads, scale)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_a_power_of_two_or_a_negative_scale_stays():
    x, weights, biases, mask = _case(0, 8, 2, 16)
    for scale in (0.25, -0.3):
        mod = _attention(x, weights, biases, mask, 2, scale)
        tvm.ir.assert_structural_equal(query_scales(mod), relax.transform.CanonicalizeBindings()(mod))
    assert folded_scale(relax.const(np.float32(8 ** -0.5))) == float(np.float32(8 ** -0.5))
    assert folded_scale(relax.const(np.float32(0.125))) is None
    assert folded_scale(relax.const(np.full((2,), 0.3, "float32"))) is None
    assert folded_scale(relax.const(np.float32(np.inf))) is None
