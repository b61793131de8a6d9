"""CLIP's quick GELU x * sigmoid(1.702 x) between two linears is a SiLU in the first linear's
epilogue, 1 / 1.702 in the second's weights (normalise/quick_gelus.py): two kernels, within 1e-5
of float64; one read by anything but a linear stays as written."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend

C = 1.702


def _mlp(x, w1, b1, w2, b2, *, also_return_activation=False):
    """PyTorch's Linear -> quick GELU -> Linear as the importer writes it (weights (N, K), transposed)."""
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            h = bb.emit(relax.op.add(relax.op.matmul(xv, relax.op.permute_dims(relax.const(w1.T.copy()))), relax.const(b1)))
            h = bb.emit(relax.op.reshape(h, (1, x.shape[0], w1.shape[1])))
            gate = bb.emit(relax.op.sigmoid(relax.op.multiply(h, relax.const(np.float32(C)))))
            act = bb.emit(relax.op.multiply(h, gate))
            flat = bb.emit(relax.op.reshape(act, (x.shape[0], w1.shape[1])))
            out = relax.op.add(relax.op.matmul(flat, relax.op.permute_dims(relax.const(w2.T.copy()))), relax.const(b2))
            out = bb.emit_output(relax.Tuple([out, act]) if also_return_activation else out)
        bb.emit_func_output(out)
    return bb.get()


def _reference(x, w1, b1, w2, b2):
    h = x.astype(np.float64) @ w1 + b1
    return (h / (1 + np.exp(-C * h))) @ w2 + b2


@settings(max_examples=4, deadline=None)
@given(rows=st.integers(2, 40), k=st.sampled_from([16, 64]), n=st.sampled_from([32, 128]), seed=st.integers(0, 99))
def test_a_quick_gelu_between_linears_is_their_epilogue_within_1e5(rows, k, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, k)).astype("float32")
    w1, b1 = (rng.standard_normal((k, n)) / 4).astype("float32"), rng.standard_normal(n).astype("float32")
    w2, b2 = (rng.standard_normal((n, k)) / 4).astype("float32"), rng.standard_normal(k).astype("float32")
    with npu_backend.profile() as prof:
        vm = relax.VirtualMachine(npu_backend.compile(_mlp(x, w1, b1, w2, b2), "cgra-8x8"), tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    expected = _reference(x, w1, b1, w2, b2)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    names = [kernel.name for kernel in prof.kernels]
    assert not any("sigmoid" in name for name in names) and any("silu" in name for name in names), names
    assert prof.host_calls == []


def test_clips_mlp_is_two_kernels():
    """At CLIP's test size (17 tokens, 64 -> 128 -> 64) the SiLU and its scale are the first
    linear's epilogue (a small tile may keep the SiLU a kernel of its own, the epilogue's choice)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((17, 64)).astype("float32")
    w1, b1 = (rng.standard_normal((64, 128)) / 8).astype("float32"), rng.standard_normal(128).astype("float32")
    w2, b2 = (rng.standard_normal((128, 64)) / 8).astype("float32"), rng.standard_normal(64).astype("float32")
    with npu_backend.profile() as prof:
        vm = relax.VirtualMachine(npu_backend.compile(_mlp(x, w1, b1, w2, b2), "cgra-8x8"), tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    expected = _reference(x, w1, b1, w2, b2)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    names = [kernel.name for kernel in prof.kernels]
    assert len(names) == 2 and "silu" in names[0], names


def test_a_quick_gelu_read_elsewhere_stays_as_written():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype("float32")
    w1, b1 = rng.standard_normal((16, 32)).astype("float32"), np.zeros(32, "float32")
    w2, b2 = rng.standard_normal((32, 16)).astype("float32"), np.zeros(16, "float32")
    with npu_backend.profile() as prof:
        vm = relax.VirtualMachine(npu_backend.compile(_mlp(x, w1, b1, w2, b2, also_return_activation=True),
                                                      "cgra-8x8"), tvm.cpu())
        out, act = vm["main"](tvm.runtime.tensor(x))
    h = x.astype(np.float64) @ w1 + b1
    np.testing.assert_allclose(act.numpy().reshape(8, 32), h / (1 + np.exp(-C * h)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.numpy(), _reference(x, w1, b1, w2, b2), rtol=1e-4, atol=1e-4)
    assert any("sigmoid" in kernel.name for kernel in prof.kernels), [k.name for k in prof.kernels]


def test_the_scale_before_the_silu_is_no_copy_of_the_tile_onto_itself():
    """The per-channel scale's ELTWISE writes the tile in place; with no shift, relu or clip after
    it no EPILOGUE follows (it would copy the tile onto itself: 26 cycles a tile of CLIP's MLP)."""
    from cgra_sim import isa

    rng = np.random.default_rng(2)
    x = rng.standard_normal((17, 64)).astype("float32")
    w1, b1 = (rng.standard_normal((64, 128)) / 8).astype("float32"), rng.standard_normal(128).astype("float32")
    w2, b2 = (rng.standard_normal((128, 64)) / 8).astype("float32"), rng.standard_normal(64).astype("float32")
    with npu_backend.profile(keep_timelines=True) as prof:
        vm = relax.VirtualMachine(npu_backend.compile(_mlp(x, w1, b1, w2, b2), "cgra-8x8"), tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    expected = _reference(x, w1, b1, w2, b2)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    fields = isa.FIELDS[isa.Op.EPILOGUE]
    copies = [record for record in prof.timelines[0].commands if int(record[0]) == isa.Op.EPILOGUE and
              int(record[fields.index("flags")]) == 0 and
              int(record[fields.index("acc_addr")]) == int(record[fields.index("out_addr")])]
    assert not copies, len(copies)
