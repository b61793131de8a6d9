"""A fused q / k / v projection's split and a partial rotary's empty pass-through at a symbolic
length, as at a static one: split_slices.py takes a split (and the reshape of its part into
heads) along a static axis whatever the other axes are, empty_operands.py drops a concat operand
empty along a static axis of a tensor of symbolic length. Phi-3 (fused qkv_proj, rotary the whole
head) compiled for any length ran both on the host (its prefill at 5 tokens on cgra-8x8: 30
launches, 12,266 host cycles; now 12 launches, none), and its RoPE then runs in the projection's
epilogue (tests/test_dynamic_rope.py)."""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import example, given, settings, strategies as st
import tvm
from tvm import relax, tirx

import npu_backend

ARCH, BOUND = "cgra-8x8", 512
K, HEADS, D = 32, 2, 16


def _weight():
    return np.random.default_rng(5).standard_normal((3 * HEADS * D, K)).astype(np.float32) / 4


def _module():
    """y = x (1, s, K) @ W^T split in three along its channels, each part as heads (1, H, s, D);
    q through concat((q, q[..., D:]), -1) (an empty pass-through), s symbolic."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((1, s, K), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_upper_bound": {"s": BOUND}, "tir_var_lower_bound": {"s": 1}}):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(relax.const(_weight()))), out_dtype="float32"))
            parts = bb.emit(relax.op.split(y, 3, axis=-1))
            outs = []
            for index in range(3):
                part = bb.emit(relax.TupleGetItem(parts, index))
                heads = bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(part, relax.ShapeExpr([1, s, HEADS, D]))),
                                                      [0, 2, 1, 3]))
                if index == 0:
                    empty = bb.emit(relax.op.strided_slice(heads, [3], [D], [D]))
                    heads = bb.emit(relax.op.concat([heads, empty], axis=-1))
                outs.append(heads)
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return relax.transform.Normalize()(bb.get())


@functools.lru_cache(maxsize=1)
def _vm():
    return relax.VirtualMachine(npu_backend.compile(_module(), ARCH), tvm.cpu())


def test_no_split_or_concat_stays_on_the_host():
    ops = {p.op for p in npu_backend.explain(_module(), ARCH, dims={"s": 37}) if p.where == "host"}
    assert not ops & {"split", "concat", "strided_slice"}, ops


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 300))
@example(n=1)
def test_the_parts_match_numpy_at_every_length(n):
    data = np.random.default_rng(n).standard_normal((1, n, K)).astype(np.float32)
    with npu_backend.profile() as prof:
        out = _vm()["main"](tvm.runtime.tensor(data))
    assert prof.host_cycles == 0, prof.host_calls
    y = (data[0].astype(np.float64) @ _weight().T.astype(np.float64)).reshape(n, 3, HEADS, D)
    for index, got in enumerate(out):
        want = y[:, index].transpose(1, 0, 2)[None]
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _heads_taken():
    """Falcon's key head as qkv[:, :, [HEADS]] (a take of one constant index) from the heads of
    y = x @ W^T (1, s, 3 H, D), s symbolic (normalise/take_slices.py makes it a slice)."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((1, s, K), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_upper_bound": {"s": BOUND}, "tir_var_lower_bound": {"s": 1}}):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(relax.const(_weight()))), out_dtype="float32"))
            heads = bb.emit(relax.op.reshape(y, relax.ShapeExpr([1, s, 3 * HEADS, D])))
            taken = bb.emit(relax.op.take(heads, relax.const(np.array([HEADS, HEADS + 1], "int64")), axis=2))
            out = bb.emit_output(relax.op.permute_dims(taken, [0, 2, 1, 3]))
        bb.emit_func_output(out)
    return relax.transform.Normalize()(bb.get())


@settings(max_examples=4, deadline=None)
@given(n=st.integers(1, 300))
@example(n=1)
def test_a_take_of_consecutive_constant_heads_is_a_slice_on_the_npu(n):
    data = np.random.default_rng(n).standard_normal((1, n, K)).astype(np.float32)
    with npu_backend.profile() as prof:
        out = _taken_vm()["main"](tvm.runtime.tensor(data)).numpy()
    assert prof.host_cycles == 0, prof.host_calls
    y = (data[0].astype(np.float64) @ _weight().T.astype(np.float64)).reshape(n, 3 * HEADS, D)
    want = y[:, HEADS:HEADS + 2].transpose(1, 0, 2)[None]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@functools.lru_cache(maxsize=1)
def _taken_vm():
    return relax.VirtualMachine(npu_backend.compile(_heads_taken(), ARCH), tvm.cpu())
