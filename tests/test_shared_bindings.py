"""What two bindings compute alike runs once (normalise/shared_sums.py, after masks.py): Bloom's attention form adds the ALiBi rows to the padding mask in every layer, the same
(1, H, s, s) sum each time, which ran as one add kernel a layer."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend


def _two_layers(heads: int, tokens: int):
    """Each of two 'layers' adds reshape(mask) + reshape(alibi) and scales its scores by it."""
    bb = relax.BlockBuilder()
    mask = relax.Var("mask", relax.TensorType((1, 1, tokens, tokens), "float32"))
    alibi = relax.Var("alibi", relax.TensorType((heads, 1, tokens), "float32"))
    scores = relax.Var("scores", relax.TensorType((1, heads, tokens, tokens), "float32"))
    with bb.function("main", [mask, alibi, scores]):
        with bb.dataflow():
            x = scores
            for _ in range(2):
                rows = bb.emit(relax.op.reshape(alibi, (1, heads, 1, tokens)))
                bias = bb.emit(relax.op.add(mask, rows))
                x = bb.emit(relax.op.multiply(x, bias))
            out = bb.emit_output(x)
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=3, deadline=None)
@given(heads=st.sampled_from([2, 4]), tokens=st.sampled_from([8, 16]), seed=st.integers(0, 99))
def test_a_sum_every_layer_repeats_runs_once(heads, tokens, seed):
    rng = np.random.default_rng(seed)
    mask = rng.standard_normal((1, 1, tokens, tokens)).astype("float32")
    alibi = rng.standard_normal((heads, 1, tokens)).astype("float32")
    scores = rng.standard_normal((1, heads, tokens, tokens)).astype("float32")
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(npu_backend.compile(_two_layers(heads, tokens), "cgra-8x8"), tvm.cpu())["main"](
            *(tvm.runtime.tensor(a) for a in (mask, alibi, scores))).numpy()
    bias = mask + alibi.reshape(1, heads, 1, tokens)
    np.testing.assert_array_equal(got, scores * bias * bias)
    adds = [k.name for k in prof.kernels if "add" in k.name]
    assert len(adds) == 1, [k.name for k in prof.kernels]


def test_each_layers_causal_mask_and_other_ops_stay_its_own():
    """Only reshapes and adds of the same operands are shared: each layer's causal mask from
    arange(s) (its attention pattern computes it inside) and each cache write's broadcast position
    stay apart. A general CSE merged them and sent a symbolic Llama's attention and a decode step's
    cache writes to the host."""
    from npu_backend.normalise.shared_sums import shared_sums

    s = tvm.tirx.Var("s", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((s, s), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = x
            for _ in range(2):
                rows = bb.emit(relax.op.arange(0, s, 1, "int64"))
                upper = bb.emit(relax.op.less_equal(bb.emit(relax.op.reshape(rows, (1, s))),
                                                    bb.emit(relax.op.reshape(rows, (s, 1)))))
                mask = bb.emit(relax.op.where(upper, relax.const(0.0), relax.const(float("-inf"))))
                out = bb.emit(relax.op.add(out, mask))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    text = shared_sums(bb.get())["main"].script()
    assert text.count("R.arange") == 2 and text.count("R.less_equal") == 2 and text.count("R.where") == 2
