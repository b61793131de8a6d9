"""Valid graphs that once failed to compile (issue 12: differential fuzzing against llvm found
them); each must compile for the NPU and match the host build."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import relax

import npu_backend
from npu_backend.tools.workloads import conv2d_model, mismatch, run

RNG = np.random.default_rng(0)


def module(params: dict, body):
    bb = relax.BlockBuilder()
    args = [relax.Var(name, relax.TensorType(shape, dtype)) for name, (shape, dtype) in params.items()]
    with bb.function("main", args):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *args))
        bb.emit_func_output(out)
    return bb.get()


def data(shape, dtype):
    if dtype == "float32":
        return RNG.standard_normal(shape).astype(dtype)
    return RNG.integers(-8, 8, shape).astype(dtype)


def matches_host(mod, params, arch="cgra-8x8"):
    inputs = [data(shape, dtype) for shape, dtype in params.values()]
    expected = run(tvm.compile(mod, target="llvm"), inputs)
    out = run(npu_backend.compile(mod, arch), inputs)
    assert mismatch(out, expected, str(expected.dtype)) is None


def _self_residual(op):
    """z = y + (y + b): the "residual" of the bias add is the kernel's own output."""
    def body(bb, x, w, b):
        y = bb.emit(op(x, w))
        return relax.op.add(y, bb.emit(relax.op.add(y, b)))
    return body


@pytest.mark.parametrize("params, op", [
    ({"x": ((8, 16), "float32"), "w": ((16, 8), "float32"), "b": ((8,), "float32")}, relax.op.matmul),
    ({"x": ((1, 4, 6, 6), "float32"), "w": ((8, 4, 3, 3), "float32"), "b": ((1, 8, 1, 1), "float32")},
     lambda x, w: relax.op.nn.conv2d(x, w, padding=1)),
])
def test_a_residual_that_is_the_kernels_own_output(params, op):
    # Was: InternalError "Check failed: (info->IsArg(tensor))" in te.create_prim_func.
    mod = module(params, _self_residual(op))
    matches_host(mod, params)
    assert {p.where for p in npu_backend.explain(mod)} == {"npu"}  # the adds run on their own


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_a_clip_to_one_value_after_a_matmul(dtype):
    # Was: tensorize failed (TIR folds clip(acc, 3, 3) to 3, an epilogue that reads nothing).
    acc = "int32" if dtype == "int8" else dtype
    params = {"x": ((8, 16), dtype), "w": ((16, 8), dtype)}
    mod = module(params, lambda bb, x, w: relax.op.clip(bb.emit(relax.op.matmul(x, w, out_dtype=acc)), 3, 3))
    matches_host(mod, params)
    assert [(p.op, p.where) for p in npu_backend.explain(mod)] == [("matmul", "npu"), ("clip", "host")]


def test_a_conv2d_on_a_one_pe_array(tmp_path):
    chip = json.loads(npu_backend.load_arch("cgra-4x4").to_json())
    chip.update(name="cgra-1x1", rows=1, cols=1)
    path = tmp_path / "cgra-1x1.json"
    path.write_text(json.dumps(chip))
    mod, inputs, reference = conv2d_model(1, 8, 6, 6, 4, 3, 3, (1, 1), (1, 1, 1, 1))
    assert mismatch(run(npu_backend.compile(mod, str(path)), inputs), reference, "float32") is None


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_a_text_line_conv2d_on_a_small_scratchpad(dtype):
    """A 3x3 conv2d on a 32 x 640 text line stayed on the host of cgra-4x4 ("cannot hold even one
    4x4 tile": its tiles held whole output rows, 640 pixels each). A static image wider than tall
    is tiled by whole columns (32 pixels a step) and runs on the NPU."""
    acc = "int32" if dtype == "int8" else dtype
    params = {"x": ((1, 16, 32, 640), dtype), "w": ((32, 16, 3, 3), dtype)}
    mod = module(params, lambda bb, x, w: relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=(1, 1), out_dtype=acc)))
    placements = npu_backend.explain(mod, "cgra-4x4")
    assert npu_backend.npu_mac_fraction(placements) == 1.0, npu_backend.format_placements(placements)
    matches_host(mod, params, "cgra-4x4")


def test_a_conv2d_whose_output_row_cannot_fit_says_so():
    """A tile holds whole output rows or columns: when even one does not fit the scratchpad, the
    reason names that, not a PE-array tile."""
    params = {"x": ((1, 16, 700, 700), "float32"), "w": ((32, 16, 3, 3), "float32")}
    mod = module(params, lambda bb, x, w: relax.op.nn.conv2d(x, w, padding=(1, 1)))
    (conv,) = [p for p in npu_backend.explain(mod, "cgra-4x4") if p.op == "nn.conv2d"]
    assert conv.where == "host" and "700 output pixels (a whole output row or column" in conv.reason, conv.reason


def test_a_cumsum_of_booleans_counts_them_where_no_target_built_it():
    """Hugging Face's causal-mask code (GPT-2, Llama) numbers packed sequences with
    `(diff != 1).cumsum(-1)`; TVM's PyTorch importer types that cumsum bool, and TVM's LLVM
    code generator then refuses the add of two booleans, for every target. normalise/
    bool_scans.py makes it PyTorch's int64 count."""
    mod = module({"x": ((2, 9), "int64")}, lambda bb, x: bb.emit(relax.op.cumsum(
        bb.emit(relax.op.not_equal(x, relax.const(1, "int64"))), axis=-1)))
    assert str(mod["main"].body.body.ty.dtype) == "bool"  # as the importer writes it
    with pytest.raises(Exception, match="MatchesCode"):
        tvm.compile(mod, target="llvm")
    x = np.array([[1, 1, 0, 1, 3, 1, 1, 2, 1], [0, 0, 1, 1, 1, 0, 1, 1, 1]], "int64")
    out = run(npu_backend.compile(mod, "cgra-8x8"), [x])
    np.testing.assert_array_equal(out, np.cumsum(x != 1, axis=-1))
    assert out.dtype == np.int64
