"""A layer norm of an embedding lookup is a lookup of the normalised table (normalise/table_norms.py):
Bloom's word_embeddings_layernorm costs no kernel, and the result is within the norm's bound of
the exact one (the table normalised in float64, rounded once)."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.table_norms import normed_tables


def _normed_lookup(table, gamma, beta, tokens: int, also_read: bool = False):
    """layer_norm(reshape(take(table, ids)), gamma, beta) [+ the lookup itself]."""
    bb = relax.BlockBuilder()
    ids = relax.Var("input_ids", relax.TensorType((1, tokens), "int64"))
    hidden = table.shape[1]
    with bb.function("main", [ids]):
        with bb.dataflow():
            words = bb.emit(relax.op.take(relax.const(table), relax.op.reshape(ids, (tokens,)), axis=0))
            words = bb.emit(relax.op.reshape(words, (1, tokens, hidden)))
            out = bb.emit(relax.op.nn.layer_norm(words, relax.const(gamma), relax.const(beta), axes=[-1],
                                                 epsilon=1e-5))
            out = bb.emit_output(relax.op.add(out, words) if also_read else out)
        bb.emit_func_output(out)
    return bb.get()


def _exact(rows, gamma, beta):
    rows = rows.astype(np.float64)
    centred = rows - rows.mean(-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + 1e-5) * gamma + beta


@settings(max_examples=4, deadline=None)
@given(tokens=st.integers(1, 40), hidden=st.sampled_from([16, 64]), offset=st.floats(-100, 100),
       seed=st.integers(0, 99))
def test_a_normed_lookup_reads_the_normalised_table(tokens, hidden, offset, seed):
    rng = np.random.default_rng(seed)
    table = (rng.standard_normal((50, hidden)) + offset).astype("float32")  # a large mean: the centring matters
    gamma, beta = (rng.standard_normal(hidden).astype("float32") for _ in range(2))
    ids = rng.integers(0, 50, (1, tokens))
    mod = _normed_lookup(table, gamma, beta, tokens)
    folded = str(normed_tables(mod)["main"])
    assert "layer_norm" not in folded and folded.count("R.take(") == 1
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](
            tvm.runtime.tensor(ids)).numpy()
    exact = _exact(table[ids[0]], gamma, beta)
    assert np.abs(got[0] - exact).max() <= 1e-6 * np.abs(exact).max()  # one rounding of the exact norm
    assert len(prof.kernels) == 1 and "take" in prof.kernels[0].name, [k.name for k in prof.kernels]


def test_a_lookup_read_elsewhere_too_keeps_its_norm():
    rng = np.random.default_rng(5)
    table = rng.standard_normal((50, 16)).astype("float32")
    mod = _normed_lookup(table, np.ones(16, "float32"), np.zeros(16, "float32"), 4, also_read=True)
    assert "layer_norm" in str(normed_tables(mod)["main"])
