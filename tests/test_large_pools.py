"""Large pooling windows run as a row pass and a column pass (normalise/large_pools.py): the
window's expression never grows with its size (a global average over an 80 x 80 map crashed the
compiler with a stack overflow in te.create_prim_func; issue 12), and the split is exact."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.large_pools import MAX_TAPS, split_large_pools
from npu_backend.tools.workloads import mismatch

RNG = np.random.default_rng(0)


def module(shape, body):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(x))
        bb.emit_func_output(out)
    return bb.get()


def host(mod, a):
    return relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(a)).numpy()


@pytest.mark.parametrize("shape, body", [
    ((1, 8, 80, 80), lambda x: relax.op.mean(x, axis=[2, 3], keepdims=True)),  # the crash
    ((2, 8, 80, 80), lambda x: relax.op.mean(x, axis=[2, 3])),
    ((1, 80, 80, 8), lambda x: relax.op.mean(x, axis=[1, 2])),
    ((1, 8, 72, 90), lambda x: relax.op.nn.adaptive_avg_pool2d(x, 1)),
    ((1, 8, 70, 70), lambda x: relax.op.nn.max_pool2d(x, (70, 70))),
])
def test_a_global_pool_over_a_large_map_compiles_and_runs_on_the_npu(shape, body):
    mod = module(shape, body)
    a = RNG.standard_normal(shape).astype("float32")
    with npu_backend.profile() as prof:
        out = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](
            tvm.runtime.tensor(a)).numpy()
    assert mismatch(out, host(mod, a), "float32") is None
    assert len(prof.kernels) == 2  # the row pass and the column pass, both on the NPU


@settings(deadline=None)
@given(kind=st.sampled_from(["max", "avg"]), kh=st.integers(2, 24), kw=st.integers(2, 24),
       sh=st.integers(1, 4), sw=st.integers(1, 4), dh=st.integers(1, 2), dw=st.integers(1, 2),
       ceil_mode=st.booleans(), count_include_pad=st.booleans(), pads=st.tuples(*[st.integers(0, 3)] * 4))
def test_splitting_a_window_keeps_every_value(kind, kh, kw, sh, sw, dh, dw, ceil_mode, count_include_pad, pads):
    pads = tuple(min(p, (k - 1) // 2) for p, k in zip(pads, (kh, kw, kh, kw)))
    shape = (1, 3, (kh - 1) * dh + 1 + 5, (kw - 1) * dw + 1 + 4)

    def body(x):
        if kind == "max":
            return relax.op.nn.max_pool2d(x, (kh, kw), (sh, sw), pads, (dh, dw), ceil_mode)
        return relax.op.nn.avg_pool2d(x, (kh, kw), (sh, sw), pads, (dh, dw), ceil_mode,
                                      count_include_pad=count_include_pad)

    mod = module(shape, body)
    split = split_large_pools(mod)
    assert tvm_ffi.structural_equal(split, mod) == (kh * kw <= MAX_TAPS)
    a = RNG.standard_normal(shape).astype("float32")
    np.testing.assert_allclose(host(split, a), host(mod, a), rtol=1e-5, atol=1e-6)


def test_small_windows_integer_averages_and_other_means_are_left_alone():
    for shape, body in [((1, 4, 16, 16), lambda x: relax.op.mean(x, axis=[2, 3])),  # 256 taps
                        ((1, 4, 40, 40), lambda x: relax.op.mean(x, axis=[1])),
                        ((1, 4, 40, 40), lambda x: relax.op.nn.max_pool2d(x, (1, 40)))]:
        mod = module(shape, body)
        assert tvm_ffi.structural_equal(split_large_pools(mod), mod)


def test_a_window_longer_than_its_map_is_cut_to_it():
    """Hugging Face's EfficientNet pools its last 1 x 1 map with AvgPool2d(2560, ceil_mode=True):
    on the host TVM padded a 2560 x 2560 window's worth of zeros around each of the 2,560 channels
    (67 GB, std::bad_alloc while the model ran). The window is cut to the map: one 1 x 1 tap."""
    mod = module((1, 2560, 1, 1), lambda x: relax.op.nn.avg_pool2d(x, 2560, 2560, ceil_mode=True))
    assert [int(k) for k in split_large_pools(mod)["main"].body.blocks[0].bindings[-1].value.attrs.pool_size] == [1, 1]
    a = RNG.standard_normal((1, 2560, 1, 1)).astype("float32")
    out = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(a)).numpy()
    np.testing.assert_array_equal(out, a)


@settings(deadline=None)
@given(kind=st.sampled_from(["max", "avg"]), h=st.integers(1, 6), w=st.integers(1, 6), kh=st.integers(1, 12),
       kw=st.integers(1, 12), ceil_mode=st.booleans(), count_include_pad=st.booleans(),
       pads=st.tuples(*[st.integers(0, 2)] * 4))
def test_cutting_a_window_to_its_map_keeps_every_value(kind, h, w, kh, kw, ceil_mode, count_include_pad, pads):
    pads = tuple(min(p, k // 2) for p, k in zip(pads, (kh, kw, kh, kw)))

    def body(x):
        if kind == "max":
            return relax.op.nn.max_pool2d(x, (kh, kw), (kh, kw), pads, ceil_mode=ceil_mode)
        return relax.op.nn.avg_pool2d(x, (kh, kw), (kh, kw), pads, ceil_mode=ceil_mode,
                                      count_include_pad=count_include_pad)

    mod = module((1, 2, h, w), body)
    a = RNG.standard_normal((1, 2, h, w)).astype("float32")
    np.testing.assert_allclose(host(split_large_pools(mod), a), host(mod, a), rtol=1e-6, atol=1e-6)
