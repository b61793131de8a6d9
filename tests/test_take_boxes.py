"""A take of one index on the next-to-last axis at a symbolic length is a slice of a merged view
(normalise/take_boxes.py): the same values, no take left; a static one is left alone."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from npu_backend.normalise.take_boxes import take_boxes


def _module(index: int, symbolic: bool = True):
    s = tirx.Var("s", "int64") if symbolic else 6
    x = relax.Var("x", relax.TensorType([1, s, 4, 3, 16], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        out = bb.emit(relax.op.take(x, relax.const(index, "int64"), axis=3))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("index", [0, 1, 2])
def test_a_take_of_one_index_is_a_box_of_the_same_values(index):
    mod = take_boxes(_module(index))
    assert "take" not in mod.script() and "strided_slice" in mod.script()
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    for n in (1, 5):
        x = np.random.default_rng(n).standard_normal((1, n, 4, 3, 16)).astype("float32")
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), x[:, :, :, index])


def test_a_static_take_is_left_alone():
    mod = _module(1, symbolic=False)
    assert take_boxes(mod).script() == mod.script()
