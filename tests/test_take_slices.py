"""A take of consecutive constant indices is a strided_slice (normalise/take_slices.py): Falcon's
multi-query `qkv[..., [-2], :]` becomes a box of the projection's view, read by RoPE's epilogue
and the attention, the same elements in the same order; other indices stay takes."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.take_slices import take_slices as takes_as_slices


def _take_then_scale(shape, indices, axis):
    """take(x, indices, axis) * 2: the take alone would be a plain copy."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            taken = bb.emit(relax.op.take(x, relax.const(np.asarray(indices, "int64")), axis=axis, mode="fast"))
            out = bb.emit_output(bb.emit(relax.op.multiply(taken, relax.const(np.float32(2.0)))))
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=6, deadline=None)
@given(heads=st.integers(2, 6), axis=st.sampled_from([1, 2, 3]), data=st.data(), seed=st.integers(0, 99))
def test_consecutive_indices_are_a_slice(heads, axis, data, seed):
    shape = (1, 5, heads, 8)
    begin = data.draw(st.integers(0, shape[axis] - 1))
    count = data.draw(st.integers(1, shape[axis] - begin))
    indices = list(range(begin, begin + count))
    mod = _take_then_scale(shape, indices, axis)
    rewritten = takes_as_slices(mod)
    assert "R.take" not in str(rewritten["main"]) and "R.strided_slice" in str(rewritten["main"])
    x = np.random.default_rng(seed).standard_normal(shape).astype("float32")
    got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(got, np.take(x, indices, axis=axis) * np.float32(2.0))


def test_other_indices_stay_takes():
    for indices in ([1, 0], [0, 2], [3, 3]):
        mod = _take_then_scale((1, 5, 4, 8), indices, 2)
        tvm.ir.assert_structural_equal(takes_as_slices(mod), mod)
