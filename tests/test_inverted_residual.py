"""MobileNetV2's whole inverted-residual block as one kernel (kernels/fused/inverted_residual.py).

Against numpy over block shapes (channels, expansion, stride, kernel, padding, tiny and odd
images, every epilogue; property test), the ONNX MobileNetV2-style model against onnxruntime,
the refusals with their reasons (the block then runs as the expansion's kernel and the
separable pair), and the lowering pass that trims the window's padding FILLs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st
from tvm import relax
from tvm.script import tirx as T

import npu_backend
from cgra_sim.arch import load_arch
from models import assert_matches, run
from npu_backend.kernels.fused import inverted_residual_tiles
from npu_backend.kernels.fused.inverted_residual import INVERTED_RESIDUAL
from npu_backend.lower.trim_fills import trim_overwritten_fills
from test_separable import ACTIVATIONS, _always_fused, _ops, _pair_reason, onnx_profile, separable_model

SMALL_SPAD = dataclasses.replace(load_arch("cgra-8x8"), name="cgra-8x8-32k", spad_bytes=32 * 1024)


def _fused():
    """The block always fused where it fits (whatever the unfused kernels' estimates)."""
    return _always_fused(inverted_residual_tiles, "_unfused_cycles")


@given(n=st.integers(1, 2), c=st.integers(1, 12), t=st.integers(1, 6), h=st.integers(1, 12), w=st.integers(1, 12),
       f=st.integers(1, 16), kernel=st.sampled_from([3, 5]), stride=st.integers(1, 2), pad=st.integers(0, 2),
       ex_bias=st.booleans(), ex_act=st.sampled_from(sorted(ACTIVATIONS)), dw_bias=st.booleans(),
       dw_act=st.sampled_from(sorted(ACTIVATIONS)), pw_bias=st.booleans(), pw_act=st.sampled_from(sorted(ACTIVATIONS)),
       residual=st.sampled_from([None, "shortcut", "tensor"]), arch=st.sampled_from(npu_backend.preset_names()))
def test_block_is_one_kernel_and_matches_numpy(n, c, t, h, w, f, kernel, stride, pad, ex_bias, ex_act, dw_bias,
                                              dw_act, pw_bias, pw_act, residual, arch):
    """Every block that fits is one kernel, its padding zero in the expanded map whatever the
    expansion's epilogue, except a bias without relu or clip at 0 where the depthwise pads rows
    (then the expansion is its own kernel, and the check says why)."""
    if min(h, w) + 2 * pad < kernel:
        pad = kernel // 2
    oh, ow = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
    if residual == "shortcut" and (f, oh, ow) != (c, h, w):
        residual = "tensor"
    expansion = max(c * t, 2)
    mod, inputs, ref = separable_model(n, c, h, w, f, kernel, stride, pad, dw_bias, dw_act, pw_bias, pw_act, residual,
                                       expansion=expansion, ex_bias=ex_bias, ex_act=ex_act)
    with _fused():
        reason = _pair_reason(mod, load_arch(arch), INVERTED_RESIDUAL)
        with npu_backend.profile() as prof:
            out = run(npu_backend.compile(mod, arch), inputs)
    assert_matches(out, ref, "float32")
    expand_ops = ("nn.conv2d",) + ("add",) * ex_bias + {"none": (), "relu": ("nn.relu",), "relu6": ("clip",)}[ex_act]
    if reason is None:
        assert [k.source_ops for k in prof.kernels] == [expand_ops + _ops(dw_bias, dw_act, pw_bias, residual, pw_act)]
    else:
        border = ex_bias and ex_act == "none" and pad > 0
        assert ("padding rows" in reason) if border else ("scratchpad" in reason), reason
        assert prof.kernels[0].source_ops == expand_ops


def test_onnx_mobilenet_v2_blocks_are_one_kernel_each_and_match_onnxruntime():
    """The model-zoo MobileNetV2-style network at 32 x 32: its three blocks with an expansion are
    one kernel each (the expanded map never goes to DRAM: each kernel moves fewer bytes than that
    map stored and loaded again would), the block without one the separable kernel, and the result
    is onnxruntime's."""
    from zoo_models import ZOO

    prof = onnx_profile(ZOO["mobilenet_v2"](32), (1, 3, 32, 32))
    blocks = [k for k in prof.kernels if k.source_ops.count("nn.conv2d") >= 2]
    assert [k.source_ops.count("nn.conv2d") for k in blocks] == [2, 3, 3, 3]
    for kernel in blocks[1:]:  # apart, the expansion's output is stored and loaded again
        x, (expanded, *_), *_, out = kernel.tensor_shapes
        n, _, h, w = x
        apart = 4 * (2 * n * expanded * h * w + np.prod(x) + np.prod(out))
        assert kernel.dma_load_bytes + kernel.dma_store_bytes < apart


def test_block_slower_fused_stays_apart_with_a_reason():
    """A stride-1 block on a 56 x 56 map: a tile of a few output rows (what fits beside the input
    window) recomputes the expansion of two halo rows each, slower than the expansion's own
    kernel and the separable pair; the check says so, and the expansion is its own kernel."""
    mod, _, _ = separable_model(1, 24, 56, 56, 24, residual="shortcut", expansion=96)
    reason = _pair_reason(mod, load_arch("cgra-8x8"), INVERTED_RESIDUAL)
    assert reason is not None and "as the expansion's kernel and the separable pair" in reason
    kernels = [p.kernel.split(" ")[0] for p in npu_backend.explain(mod, "cgra-8x8") if p.op == "nn.conv2d"]
    assert kernels[0] == "cgra.conv2d_bias_clip" and "cgra.separable_bias_residual" in kernels[1:]


def test_block_that_does_not_fit_stays_apart_with_a_reason():
    """A 32 KiB scratchpad cannot hold a tile's input window, expanded window and projection
    beside each other; the block runs as the expansion's kernel and the pair, correctly."""
    mod, inputs, ref = separable_model(1, 16, 24, 24, 32, expansion=64)
    reason = _pair_reason(mod, SMALL_SPAD, INVERTED_RESIDUAL)
    assert reason is not None and "scratchpad" in reason and "run as their own kernels" in reason
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, SMALL_SPAD), inputs)
    assert_matches(out, ref, "float32")
    assert max(k.source_ops.count("nn.conv2d") for k in prof.kernels) < 3


@pytest.mark.parametrize("case, words", [
    (dict(ex_act="none"), ("bias, and no relu or clip at 0", "padding rows")),
    (dict(expansion_kernel=3), ("not a 1x1 conv2d",)),
    (dict(dtype="int8"), ("int8", "float32 blocks fuse")),
])
def test_blocks_it_does_not_compute_stay_apart_with_a_reason(case, words):
    """An expansion whose epilogue is not 0 in the depthwise's padding (a bias, no activation),
    an expansion that is not 1x1, int8: each with its reason."""
    reason = _pair_reason(_module(**case), load_arch("cgra-8x8"), INVERTED_RESIDUAL)
    assert reason is not None and all(word in reason for word in words), reason


def _module(ex_act="relu6", expansion_kernel=1, dtype="float32"):
    """x -> conv2d(x, ew) + b0 [act] -> depthwise 3x3 -> conv2d 1x1, in `dtype` (int8 with int32
    accumulators and biases)."""
    acc = "int32" if dtype == "int8" else "float32"
    shapes = (("x", (1, 8, 6, 6), dtype), ("ew", (16, 8, expansion_kernel, expansion_kernel), dtype),
              ("b0", (1, 16, 1, 1), acc), ("dw", (16, 1, 3, 3), acc), ("pw", (8, 16, 1, 1), acc))
    params = [relax.Var(name, relax.TensorType(shape, kind)) for name, shape, kind in shapes]
    builder = relax.BlockBuilder()
    with builder.function("main", params):
        with builder.dataflow():
            x, ew, b0, dw, pw = params
            y = builder.emit(relax.op.add(builder.emit(relax.op.nn.conv2d(
                x, ew, padding=expansion_kernel // 2, out_dtype=acc)), b0))
            y = builder.emit(relax.op.clip(y, 0, 6)) if ex_act == "relu6" else y
            y = builder.emit(relax.op.nn.conv2d(y, dw, padding=1, groups=16, out_dtype=acc))
            out = builder.emit_output(relax.op.nn.conv2d(y, pw, out_dtype=acc))
        builder.emit_func_output(out)
    return builder.get()


def test_border_padding_is_zero_whatever_the_image_and_its_padding():
    """The expansion with a positive bias and relu6 on images smaller than the window, padded by
    2 with a 5x5 depthwise: every padding pixel of the expanded map (rows above and below,
    columns left and right, corners) must be 0, not relu6(bias)."""
    for h, w, stride in ((1, 1, 1), (2, 3, 2), (3, 1, 1)):
        mod, inputs, _ = separable_model(1, 3, h, w, 5, kernel=5, stride=stride, pad=2, expansion=12)
        inputs[2] = np.abs(inputs[2]) + 1  # b0
        with _fused(), npu_backend.profile() as prof:
            out = run(npu_backend.compile(mod, "cgra-8x8"), inputs)
        assert [k.source_ops.count("nn.conv2d") for k in prof.kernels] == [3]
        assert_matches(out, _numpy_block(inputs, stride), "float32")


def _numpy_block(inputs, stride):
    """The block of separable_model(expansion, biases, relu6, relu6, none) in numpy for `inputs`."""
    from models import conv2d_reference

    x, ew, b0, dw, b1, pw, b2 = inputs
    y = np.clip(np.einsum("nchw,ec->nehw", x, ew[:, :, 0, 0]) + b0, 0, 6)
    y = np.clip(conv2d_reference(y, dw, (stride, stride), (2,) * 4, groups=dw.shape[0]) + b1, 0, 6)
    return np.einsum("nchw,fc->nfhw", y, pw[:, :, 0, 0]) + b2


def test_a_fill_the_epilogue_after_it_overwrites_fills_only_the_rest():
    """lower/trim_fills.py: a FILL of 10 rows, then an EPILOGUE writing rows 1..8 of it, becomes
    FILLs of row 0 and row 9; a FILL whose buffer something else reads in between stays."""

    @T.prim_func(s_tir=False)
    def before(acc: T.Buffer((128,), "float32"), win: T.Buffer((160,), "float32")):
        T.call_extern("int32", "cgra_fill", 3, win.data, 0, 10, 16, 16, 0)
        T.call_extern("int32", "cgra_epilogue", 0, 3, 3, 8, 16, acc.data, 0, 16, 0, 0, win.data, 16, 16, 0, 0, 0, 0,
                      0, 0, 0, 0)

    @T.prim_func(s_tir=False)
    def after(acc: T.Buffer((128,), "float32"), win: T.Buffer((160,), "float32")):
        T.call_extern("int32", "cgra_fill", 3, win.data, 0, 1, 16, 16, 0)
        T.call_extern("int32", "cgra_fill", 3, win.data, 144, 1, 16, 16, 0)
        T.call_extern("int32", "cgra_epilogue", 0, 3, 3, 8, 16, acc.data, 0, 16, 0, 0, win.data, 16, 16, 0, 0, 0, 0,
                      0, 0, 0, 0)

    tvm.ir.assert_structural_equal(trim_overwritten_fills(before).with_attr("global_symbol", "after"), after)

    @T.prim_func(s_tir=False)
    def read_between(acc: T.Buffer((128,), "float32"), win: T.Buffer((160,), "float32")):
        T.call_extern("int32", "cgra_fill", 3, win.data, 0, 10, 16, 16, 0)
        T.call_extern("int32", "cgra_epilogue", 0, 3, 3, 8, 16, win.data, 0, 16, 0, 0, acc.data, 0, 16, 0, 0, 0, 0,
                      0, 0, 0, 0)
        T.call_extern("int32", "cgra_epilogue", 0, 3, 3, 8, 16, acc.data, 0, 16, 0, 0, win.data, 16, 16, 0, 0, 0, 0,
                      0, 0, 0, 0)

    tvm.ir.assert_structural_equal(trim_overwritten_fills(read_between), read_between)
