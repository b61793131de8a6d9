"""A decoder's final norm in the epilogue of its last GEMM at a symbolic length
(kernels/gemm/post_norm_rows.py): norm(h W^T + b + x) [+ beta], the norm over (1, s, C) read as
its (s, C) rows (normalise/symbolic_rows.py), is one kernel compiled once for every length; its
last row tile's commands cut to the rows that exist (lower/ragged.py). Within 1e-5 of float64
relative to the output's largest value at random lengths up to the bound, on every preset, and
the kernel stores the output's bytes and no more (nothing past the buffer at the ragged tile)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm
from hypothesis import example, given, settings, strategies as st
from tvm import relax, tirx

import npu_backend
from npu_backend.tools.explain import explain

BOUND, HIDDEN, DEPTH, EPS = 256, 64, 128, 1e-5
KINDS = ("layer_norm", "rms_norm", "rms_norm_beta")
PRESETS = ("cgra-8x8", "cgra-16x16")


def _final_norm(kind: str):
    """main(h (s, DEPTH), x (s, HIDDEN)) = norm(reshape(h W^T + b + x, (1, s, HIDDEN))) [+ beta],
    as a centred stream's GPT-NeoX (rms_norm_beta) or GPT-2 (layer_norm) ends its prefill."""
    s = tirx.Var("s", "int64")
    rng = np.random.default_rng(KINDS.index(kind))
    consts = {"w": rng.standard_normal((HIDDEN, DEPTH)) / np.sqrt(DEPTH), "b": rng.standard_normal(HIDDEN),
              "gamma": rng.uniform(0.5, 1.5, HIDDEN), "beta": rng.standard_normal(HIDDEN)}
    consts = {name: value.astype("float32") for name, value in consts.items()}
    h = relax.Var("h", relax.TensorType([s, DEPTH], "float32"))
    x = relax.Var("x", relax.TensorType([s, HIDDEN], "float32"))
    op, bb = relax.op, relax.BlockBuilder()
    with bb.function("main", [h, x], attrs={"tir_var_upper_bound": {"s": BOUND}}):
        with bb.dataflow():
            y = bb.emit(op.matmul(h, bb.emit(op.permute_dims(relax.const(consts["w"])))))
            total = bb.emit(op.add(bb.emit(op.add(y, relax.const(consts["b"]))), x))
            rows = bb.emit(op.reshape(total, relax.ShapeExpr([1, s, HIDDEN])))
            gamma, beta = relax.const(consts["gamma"]), relax.const(consts["beta"])
            if kind == "layer_norm":
                out = op.nn.layer_norm(rows, gamma, beta, axes=[-1], epsilon=EPS)
            else:
                out = op.nn.rms_norm(rows, gamma, axes=[-1], epsilon=EPS)
                out = op.add(bb.emit(out), beta) if kind == "rms_norm_beta" else out
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get(), consts


def _reference(kind: str, h, x, w, b, gamma, beta):
    total = h.astype(np.float64) @ w.T.astype(np.float64) + b + x
    if kind == "layer_norm":
        d = total - total.mean(-1, keepdims=True)
        return d / np.sqrt((d ** 2).mean(-1, keepdims=True) + EPS) * gamma + beta
    normed = total / np.sqrt((total ** 2).mean(-1, keepdims=True) + EPS) * gamma
    return normed + beta if kind == "rms_norm_beta" else normed


@functools.lru_cache(maxsize=None)
def _compiled(kind: str, arch: str):
    mod, consts = _final_norm(kind)
    return relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu()), consts


@pytest.mark.parametrize("kind", KINDS)
def test_the_final_norm_joins_the_gemm_at_a_symbolic_length(kind):
    mod, _ = _final_norm(kind)
    npu = [p for p in explain(mod, "cgra-8x8", dims={"s": 37}) if p.where == "npu"]
    assert len({p.symbol for p in npu}) == 1, sorted({p.kernel for p in npu})
    assert "post_norm" in npu[0].kernel and {"matmul", "add"} <= {p.op for p in npu}


@settings(max_examples=12, deadline=None)
@given(kind=st.sampled_from(KINDS), arch=st.sampled_from(PRESETS), length=st.integers(1, BOUND),
       seed=st.integers(0, 2 ** 16), mean=st.sampled_from([0.0, 20.0]))
@example(kind="rms_norm_beta", arch="cgra-8x8", length=1, seed=0, mean=0.0)
@example(kind="rms_norm_beta", arch="cgra-8x8", length=5, seed=0, mean=0.0)
@example(kind="layer_norm", arch="cgra-8x8", length=16, seed=0, mean=20.0)
@example(kind="rms_norm", arch="cgra-16x16", length=37, seed=0, mean=0.0)
@example(kind="layer_norm", arch="cgra-16x16", length=128, seed=0, mean=0.0)
@example(kind="rms_norm_beta", arch="cgra-8x8", length=BOUND, seed=0, mean=0.0)
def test_symbolic_gemm_and_post_norm_match_float64(kind, arch, length, seed, mean):
    """At any length up to the bound, the ragged last tile included; `mean`: rows far from
    zero mean (a residual stream's), where a layer norm's centring loses the most."""
    vm, c = _compiled(kind, arch)
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((length, DEPTH)).astype("float32")
    x = (rng.standard_normal((length, HIDDEN)) + mean).astype("float32")
    with npu_backend.profile() as prof:
        got = vm["main"](tvm.runtime.tensor(h), tvm.runtime.tensor(x)).numpy()
    expected = _reference(kind, h, x, c["w"], c["b"], c["gamma"], c["beta"])
    assert got.shape == (1, length, HIDDEN)
    error = np.abs(got[0] - expected).max() / np.abs(expected).max()
    assert error < 1e-5, (kind, arch, length, error)
    (kernel,) = prof.kernels
    assert kernel.dma_store_bytes == got.nbytes, (kernel.dma_store_bytes, got.nbytes)
