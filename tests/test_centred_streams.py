"""A residual stream read only by layer norms is carried centred (normalise/centred_streams.py):
GPT-J's parallel block (one plain layer norm read by two linears, the residual and both branches
added, a final layer norm) becomes RMSNorms in both GEMMs' A panels and a final RMSNorm plus beta, within 1e-5 of float64 even where the stream's mean is 20 standard deviations; a
stream read by anything else stays as it was."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.centred_streams import centre_streams

VOCAB = 12


def _linear(bb, rows, weight, bias=None):
    out = bb.emit(relax.op.matmul(rows, bb.emit(relax.op.permute_dims(relax.const(weight))), out_dtype="float32"))
    return out if bias is None else bb.emit(relax.op.add(out, relax.const(bias)))


def _parallel_layer(tokens, table, wa, wm, bm, gamma, beta, *, expose_stream=False):
    """x = T[ids]; x + a(ln(x)) + m(ln(x)) (a, m linears); the final layer norm (gamma, beta)."""
    width = table.shape[1]
    ones, zeros = relax.const(np.ones(width, "float32")), relax.const(np.zeros(width, "float32"))
    bb = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType((tokens,), "int64"))
    with bb.function("main", [ids]):
        with bb.dataflow():
            x = bb.emit(relax.op.reshape(bb.emit(relax.op.take(relax.const(table), ids, axis=0)), (1, tokens, width)))
            h = bb.emit(relax.op.reshape(bb.emit(relax.op.nn.layer_norm(x, ones, zeros, axes=[-1], epsilon=1e-5)),
                                         (tokens, width)))
            a = bb.emit(relax.op.reshape(_linear(bb, h, wa), (1, tokens, width)))
            m = bb.emit(relax.op.reshape(_linear(bb, h, wm, bm), (1, tokens, width)))
            y = bb.emit(relax.op.add(bb.emit(relax.op.add(a, m)), x))
            out = bb.emit(relax.op.nn.layer_norm(y, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=1e-5))
            result = bb.emit_output(relax.Tuple([out, x]) if expose_stream else out)
        bb.emit_func_output(result)
    return bb.get()


def _layer_norm(x, gamma=1.0, beta=0.0, eps=1e-5):
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + eps) * gamma + beta


@settings(max_examples=4, deadline=None)
@given(tokens=st.integers(2, 32), width=st.sampled_from([32, 64]), offset=st.sampled_from([0.0, 20.0]),
       seed=st.integers(0, 99))
def test_a_parallel_block_runs_rms_norms_in_both_gemms(tokens, width, offset, seed):
    rng = np.random.default_rng(seed)
    table = (rng.standard_normal((VOCAB, width)) + offset).astype("float32")
    wa, wm = (rng.standard_normal((width, width)).astype("float32") / 4 for _ in range(2))
    bm, beta = (rng.standard_normal(width).astype("float32") for _ in range(2))
    gamma = rng.uniform(0.5, 1.5, width).astype("float32")
    ids = rng.integers(0, VOCAB, tokens)
    mod = _parallel_layer(tokens, table, wa, wm, bm, gamma, beta)
    assert "R.nn.rms_norm" in str(centre_streams(mod)["main"])
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](
            tvm.runtime.tensor(ids)).numpy()
    x = table.astype(np.float64)[ids]
    h = _layer_norm(x)
    want = _layer_norm(x + h @ wa.T + h @ wm.T + bm, gamma, beta)
    np.testing.assert_allclose(got[0], want, rtol=0, atol=1e-5 * np.abs(want).max())
    names = [k.name for k in prof.kernels]
    # the take, 2 GEMMs, the final norm as an RMSNorm adding beta (one kernel: kernels/rows/norms.py)
    assert len(names) == 4 and sum("rms_norm" in n for n in names) == 3 and "layer_norm" not in str(names), names


def test_a_stream_read_elsewhere_stays():
    width = 8
    w = np.eye(width, dtype="float32")
    mod = _parallel_layer(4, np.ones((VOCAB, width), "float32"), w, w, np.zeros(width, "float32"),
                          np.ones(width, "float32"), np.zeros(width, "float32"), expose_stream=True)
    tvm.ir.assert_structural_equal(centre_streams(mod), mod)


def _sequential_block(tokens, table, positions, wa, wm, gamma, beta):
    """GPT-2's stream: x = T[ids] + P (P the position rows, a constant of the export); x += a(ln(x));
    x += m(ln(x)) (a, m linears with biases, HF Conv1D's bias-first add); the final layer norm."""
    width = table.shape[1]
    ones, zeros = relax.const(np.ones(width, "float32")), relax.const(np.zeros(width, "float32"))
    bb = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType((tokens,), "int64"))
    with bb.function("main", [ids]):
        with bb.dataflow():
            rows = bb.emit(relax.op.reshape(bb.emit(relax.op.take(relax.const(table), ids, axis=0)), (1, tokens, width)))
            x = bb.emit(relax.op.add(rows, relax.const(positions)))
            for weight, bias in (wa, wm):
                normed = bb.emit(relax.op.reshape(
                    bb.emit(relax.op.nn.layer_norm(x, ones, zeros, axes=[-1], epsilon=1e-5)), (tokens, width)))
                out = bb.emit(relax.op.add(relax.const(bias), bb.emit(relax.op.matmul(normed, relax.const(weight)))))
                x = bb.emit(relax.op.add(bb.emit(relax.op.reshape(out, (1, tokens, width))), x))
            out = bb.emit(relax.op.nn.layer_norm(x, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=1e-5))
            result = bb.emit_output(out)
        bb.emit_func_output(result)
    return bb.get()


@settings(max_examples=4, deadline=None)
@given(tokens=st.integers(2, 32), width=st.sampled_from([32, 64]), offset=st.sampled_from([0.0, 20.0]),
       seed=st.integers(0, 99))
def test_position_rows_added_to_the_lookup_are_centred_with_it(tokens, width, offset, seed):
    """GPT-2's stream (a lookup plus a constant of position rows) is centred, both constants with it:
    every layer norm an RMSNorm, within 1e-5 of float64 even where the rows' mean is 20 deviations."""
    rng = np.random.default_rng(seed)
    table = (rng.standard_normal((VOCAB, width)) + offset).astype("float32")
    positions = (rng.standard_normal((1, tokens, width)) - offset / 2).astype("float32")
    linears = [(rng.standard_normal((width, width)).astype("float32") / 4, rng.standard_normal(width).astype("float32"))
               for _ in range(2)]
    gamma = rng.uniform(0.5, 1.5, width).astype("float32")
    beta = rng.standard_normal(width).astype("float32")
    ids = rng.integers(0, VOCAB, tokens)
    mod = _sequential_block(tokens, table, positions, *linears, gamma, beta)
    text = str(centre_streams(mod)["main"])
    assert text.count("R.nn.rms_norm") == 3 and "R.nn.layer_norm" not in text
    got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(ids)).numpy()
    x = table.astype(np.float64)[ids] + positions[0]
    for weight, bias in linears:
        x = x + _layer_norm(x) @ weight + bias
    want = _layer_norm(x, gamma, beta)
    np.testing.assert_allclose(got[0], want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_a_constant_added_to_anything_but_the_stream_stays():
    """A constant is centred only where it joins the stream: two constants' sum is no stream."""
    width, tokens = 8, 4
    bb = relax.BlockBuilder()
    rows = relax.Var("rows", relax.TensorType((1, tokens, width), "float32"))
    with bb.function("main", [rows]):
        with bb.dataflow():
            x = bb.emit(relax.op.add(rows, relax.const(np.ones((1, tokens, width), "float32"))))
            out = bb.emit_output(bb.emit(relax.op.nn.layer_norm(
                x, relax.const(np.ones(width, "float32")), relax.const(np.zeros(width, "float32")), axes=[-1])))
        bb.emit_func_output(out)
    mod = bb.get()
    tvm.ir.assert_structural_equal(centre_streams(mod), mod)
