"""Swin's layout idioms folded in normalise: a strided slice of a strided slice is one slice
(split_slices.strided_composed: its patch merging's every-other-row-then-column), and a pad of
zero widths is its operand (no_op_pads.py). Checked on the IR and end to end against numpy."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import npu_backend
from models import run
from npu_backend.normalise.no_op_pads import no_op_pads_removed
from npu_backend.normalise.split_slices import split_slices_rewritten


def _module(build, shape=(1, 16, 16, 8)):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod) -> list[str]:
    return [b.value.op.name for b in mod["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]


def _patch_merging(bb, x):
    """x[:, r::2, c::2] for the four (r, c), concatenated on the channels (HF's Swin)."""
    parts = []
    for r, c in ((0, 0), (1, 0), (0, 1), (1, 1)):
        rows = bb.emit(relax.op.strided_slice(x, [1], [r], [16], [2]))
        parts.append(bb.emit(relax.op.strided_slice(rows, [2], [c], [16], [2])))
    return relax.op.concat(parts, axis=3)


def test_a_strided_slice_of_a_strided_slice_is_one_slice():
    mod = split_slices_rewritten(_module(_patch_merging))
    mod = relax.transform.DeadCodeElimination()(mod)
    assert _ops(mod).count("relax.strided_slice") == 4


@pytest.mark.parametrize("first, second", [
    (([1], [1], [16], [2]), ([2], [3], [16], [3])),  # different axes
    (([1], [2], [15], [3]), ([1], [1], [5], [2])),  # the same axis: begin 2 + 1 * 3, step 6
    (([1, 2], [0, 1], [16, 9], [1, 2]), ([2], [1], [4], [1])),  # a unit-step slice of a strided one
])
def test_composed_slices_match_numpy(first, second):
    def build(bb, x):
        return relax.op.strided_slice(bb.emit(relax.op.strided_slice(x, *first)), *second)

    mod = _module(build)
    assert _ops(relax.transform.DeadCodeElimination()(split_slices_rewritten(mod))) == ["relax.strided_slice"]
    x = np.random.default_rng(0).standard_normal((1, 16, 16, 8)).astype(np.float32)
    expected = run(tvm.compile(mod, target="llvm"), [x])
    np.testing.assert_array_equal(run(npu_backend.compile(mod, "cgra-8x8"), [x]), expected)


def test_a_pad_of_zero_widths_is_its_operand():
    def build(bb, x):
        padded = bb.emit(relax.op.nn.pad(x, [0] * 8))
        return relax.op.add(padded, padded)

    mod = _module(build)
    assert _ops(no_op_pads_removed(mod)) == ["relax.add"]
    kept = _module(lambda bb, x: relax.op.nn.pad(x, [0, 0, 0, 1, 0, 0, 0, 0]))
    assert _ops(no_op_pads_removed(kept)) == ["relax.nn.pad"]
