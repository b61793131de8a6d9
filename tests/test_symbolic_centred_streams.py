"""A residual stream whose sequence axis is symbolic is carried centred too
(normalise/centred_streams.py): only the channel axis must be static, since the centring is per
channel. GPT-J's parallel block exported with a symbolic length runs RMSNorms in its GEMMs, as
the static compile does, within 1e-5 of float64 at 1, 5, 16 and 37 tokens from one compile."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax, tirx

import npu_backend
from npu_backend.normalise.centred_streams import centre_streams
from test_centred_streams import VOCAB, _layer_norm, _parallel_layer

LENGTHS = (1, 5, 16, 37)


@settings(max_examples=3, deadline=None)
@given(width=st.sampled_from([32, 64]), offset=st.sampled_from([0.0, 20.0]), seed=st.integers(0, 99))
def test_a_symbolic_length_stream_runs_rms_norms(width, offset, seed):
    rng = np.random.default_rng(seed)
    table = (rng.standard_normal((VOCAB, width)) + offset).astype("float32")
    wa, wm = (rng.standard_normal((width, width)).astype("float32") / 4 for _ in range(2))
    bm, beta = (rng.standard_normal(width).astype("float32") for _ in range(2))
    gamma = rng.uniform(0.5, 1.5, width).astype("float32")
    mod = _parallel_layer(tirx.Var("s", "int64"), table, wa, wm, bm, gamma, beta)
    text = str(centre_streams(mod)["main"])
    assert text.count("R.nn.rms_norm") == 2 and "R.nn.layer_norm" not in text, text
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    for tokens in LENGTHS:
        ids = rng.integers(0, VOCAB, tokens)
        got = vm["main"](tvm.runtime.tensor(ids)).numpy()
        x = table.astype(np.float64)[ids]
        h = _layer_norm(x)
        want = _layer_norm(x + h @ wa.T + h @ wm.T + bm, gamma, beta)
        np.testing.assert_allclose(got[0], want, rtol=0, atol=1e-5 * np.abs(want).max(), err_msg=f"{tokens} tokens")


def test_a_constant_against_a_symbolic_axis_must_be_one_row():
    """Position rows of a static length added to a symbolic-length stream are no per-channel
    constant: the stream is not centred through them (broadcasting them would be wrong)."""
    width, s = 8, tirx.Var("s", "int64")
    bb = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType((s,), "int64"))
    with bb.function("main", [ids]):
        with bb.dataflow():
            rows = bb.emit(relax.op.reshape(bb.emit(relax.op.take(
                relax.const(np.ones((VOCAB, width), "float32")), ids, axis=0)), (1, s, width)))
            x = bb.emit(relax.op.add(rows, relax.const(np.ones((1, 4, width), "float32"))))
            out = bb.emit_output(bb.emit(relax.op.nn.layer_norm(
                x, relax.const(np.ones(width, "float32")), relax.const(np.zeros(width, "float32")), axes=[-1])))
        bb.emit_func_output(out)
    mod = bb.get()
    tvm.ir.assert_structural_equal(centre_streams(mod), mod)


@settings(max_examples=3, deadline=None)
@given(width=st.sampled_from([16, 32]), offset=st.sampled_from([0.0, 20.0]), seed=st.integers(0, 99))
def test_gpt2s_position_rows_viewed_at_a_symbolic_length_are_centred_with_the_stream(width, offset, seed):
    """GPT-2 exported with a symbolic length adds wpe's first s rows as a memory.view of the table
    (position_tables.py's prefix): the view's table is centred with the token table, and the
    stream's layer norm becomes an RMSNorm, within 1e-5 of float64 at every length."""
    rng = np.random.default_rng(seed)
    bound, s = 64, tirx.Var("s", "int64")
    tokens_table = (rng.standard_normal((VOCAB, width)) + offset).astype("float32")
    positions = (rng.standard_normal((bound, width)) - offset).astype("float32")
    gamma, beta = rng.uniform(0.5, 1.5, width).astype("float32"), rng.standard_normal(width).astype("float32")
    bb = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType((s,), "int64"))
    with bb.function("main", [ids], attrs={"tir_var_upper_bound": {"s": bound}}):
        with bb.dataflow():
            rows = bb.emit(relax.op.take(relax.const(tokens_table), ids, axis=0))
            view = bb.emit(relax.op.memory.view(relax.const(positions), relax.ShapeExpr([1, s, width]), "float32",
                                                tirx.IntImm("int64", 0)))
            x = bb.emit(relax.op.add(rows, bb.emit(relax.op.reshape(view, relax.ShapeExpr([s, width])))))
            out = bb.emit_output(bb.emit(relax.op.nn.layer_norm(x, relax.const(gamma), relax.const(beta), axes=[-1])))
        bb.emit_func_output(out)
    mod = bb.get()
    text = str(centre_streams(mod)["main"])
    assert "R.nn.rms_norm" in text and "R.nn.layer_norm" not in text, text
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    for tokens in LENGTHS:
        picked = rng.integers(0, VOCAB, tokens)
        got = vm["main"](tvm.runtime.tensor(picked)).numpy()
        want = _layer_norm(tokens_table.astype(np.float64)[picked] + positions[:tokens], gamma, beta)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max(), err_msg=f"{tokens} tokens")
