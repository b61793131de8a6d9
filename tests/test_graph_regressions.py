"""Valid graphs that once failed to compile (issue 12: differential fuzzing against llvm found
them); each must compile for the NPU and match the host build."""

from __future__ import annotations

import json
import time

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


def test_a_bias_add_whose_result_is_added_to_itself():
    """y = matmul(x, wT) + b; z = y + y; z + c (issue 35, on cgra-4x4): the residual pattern
    took y + y with the bias add's own result as its "residual". Was: InternalError "Check failed:
    (info->IsArg(tensor)) ... PlaceholderOp(name="residual")" in te.create_prim_func."""
    params = {"x": ((8, 16), "float32"), "w": ((8, 16), "float32"), "b": ((8,), "float32"),
              "c": ((8, 8), "float32")}

    def body(bb, x, w, b, c):
        y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(w)))), b))
        return relax.op.add(bb.emit(relax.op.add(y, y)), c)

    mod = module(params, body)
    matches_host(mod, params, "cgra-4x4")
    placements = npu_backend.explain(mod, "cgra-4x4")
    assert [p.where for p in placements if p.op == "add"] == ["npu", "host", "npu"]  # y + y: one tensor twice


@pytest.mark.parametrize("layout, shape", [("NHWC", (1, 13, 13, 8)), ("NCHW", (1, 8, 13, 13))])
def test_an_int8_average_pool_on_the_host_feeds_an_npu_kernel_int8(layout, shape):
    """int8 avg_pool2d (3x3/2, ceil mode) -> minimum(y, y) -> max_pool2d (issue 35, cgra-4x4):
    Relax types the average int8, TVM's legalization computes it as int64, and the max pool's
    kernel, compiled for int8, got int64 at run time (ValueError "argument 0 ('data'): expected
    dtype int8, got int64"). The host now casts the average to its declared int8
    (device/host_averages.py); llvm returns the same values as int64."""
    params = {"x": (shape, "int8")}

    def body(bb, x):
        y = bb.emit(relax.op.nn.avg_pool2d(x, (3, 3), (2, 2), ceil_mode=True, layout=layout))
        return relax.op.nn.max_pool2d(bb.emit(relax.op.minimum(y, y)), (2, 2), (2, 2), layout=layout)

    mod = module(params, body)
    inputs = [data(shape, "int8")]
    expected = run(tvm.compile(mod, target="llvm"), inputs)
    out = run(npu_backend.compile(mod, "cgra-4x4"), inputs)
    assert expected.dtype == np.int64 and out.dtype == np.int8  # TVM's int64; the graph's int8
    np.testing.assert_array_equal(out, expected)
    assert [p.where for p in npu_backend.explain(mod, "cgra-4x4")] == ["host", "host", "npu"]


@pytest.mark.parametrize("shape, axes", [
    ((1, 24, 1, 6400), [2, 3]), ((1, 24, 6400, 1), [2, 3]), ((1, 24, 1, 5184), [2, 3]),  # were SIGSEGV
    ((1, 24, 1, 4096), [2, 3]), ((1, 24, 2, 3200), [2, 3]),  # were 107 s and 68 s to compile
    ((1, 5209, 1, 8), [1, 2]),  # NHWC, a prime height: windows padded with zeros, then scaled
])
def test_a_global_mean_over_a_long_thin_map_compiles_in_seconds(shape, axes):
    """A mean over H and W of a map one pixel high or wide was one window of thousands of taps
    (issue 35): the 2-D split (a row pass, a column pass) left it whole. Now no pool window has
    more than MAX_TAPS taps, whatever the map's shape (normalise/large_pools.py)."""
    params = {"x": (shape, "float32")}
    mod = module(params, lambda bb, x: relax.op.mean(x, axis=axes))
    start = time.perf_counter()
    matches_host(mod, params, "cgra-4x4")
    assert time.perf_counter() - start < 20
    assert "mean" not in [p.op for p in npu_backend.explain(mod, "cgra-4x4")]  # pools of <= MAX_TAPS taps


def test_a_max_pool_over_a_whole_long_row_and_one_too_long_to_split():
    """A window over the whole 1 x 3000 map is a global max in passes of at most MAX_TAPS taps; a
    1 x 300 window sliding along it cannot be split so and runs on the host, not as a POOL of 300."""
    params = {"x": ((1, 4, 1, 3000), "float32")}
    whole = module(params, lambda bb, x: relax.op.nn.max_pool2d(x, (1, 3000)))
    matches_host(whole, params, "cgra-4x4")
    sliding = module(params, lambda bb, x: relax.op.nn.max_pool2d(x, (1, 300), (1, 100)))
    (pool,) = npu_backend.explain(sliding, "cgra-4x4")
    assert pool.where == "host" and "300 taps" in pool.reason, pool.reason
    matches_host(sliding, params, "cgra-4x4")


def test_an_onnx_gemm_with_a_scalar_bias():
    """ONNX's backend node case test_gemm_default_scalar_bias: Gemm(a, b, c) with c of shape ()
    a graph input. Was: IndexError in matmul_spec (a rank-0 bias is no row of columns)."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    info = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    graph = helper.make_graph([helper.make_node("Gemm", ["a", "b", "c"], ["y"])], "gemm",
                              [info("a", [2, 3]), info("b", [3, 4]), info("c", [])], [info("y", [2, 4])])
    mod = npu_backend.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    a, b, c = data((2, 3), "float32"), data((3, 4), "float32"), np.array(3.14, "float32")
    out = run(npu_backend.compile(mod, "cgra-4x4"), [a, b, c])
    np.testing.assert_allclose(out, a @ b + c, rtol=1e-5, atol=1e-5)
    assert [p.where for p in npu_backend.explain(mod, "cgra-4x4")] == ["npu", "host"]


def test_a_conv2d_plus_a_scalar_input_is_no_bias():
    """The same rank-0 input after a conv2d: a bias of shape () read as "no bias" would drop it."""
    params = {"x": ((1, 4, 6, 6), "float32"), "w": ((8, 4, 3, 3), "float32"), "c": ((), "float32")}
    mod = module(params, lambda bb, x, w, c: relax.op.add(bb.emit(relax.op.nn.conv2d(x, w, padding=1)), c))
    matches_host(mod, params, "cgra-4x4")


@pytest.mark.parametrize("bias_shape", [(1, 1, 16), (1, 1, 1, 16)])
def test_a_2d_matmul_plus_a_bias_of_more_axes(bias_shape):
    """(8, 16) @ (16, 16) + a (1, 1, 16) bias is (1, 8, 16): the kernel's spec did not record the
    output's view and the compile failed ("the output of the matmul kernel is (8, 16) but the caller
    passes (1, 8, 16)"; found by the house engineer, 2026-11-29)."""
    params = {"x": ((8, 16), "float32"), "w": ((16, 16), "float32"), "b": (bias_shape, "float32")}
    mod = module(params, lambda bb, x, w, b: relax.op.add(bb.emit(relax.op.matmul(x, w)), b))
    matches_host(mod, params, "cgra-8x8")
    placements = npu_backend.explain(mod, "cgra-8x8")
    assert [p.where for p in placements] == ["npu", "npu"] and len({p.kernel for p in placements}) == 1
