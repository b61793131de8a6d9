"""A conv2d between transposes to and from channels-last reads and writes channels-last itself
(normalise/nhwc_convs.py): ConvNeXt's block and downsampling, built in Relax, keep only the
output's transpose and match the unrewritten module run on the host."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.nhwc_convs import nhwc_convs
from npu_backend.normalise.permute_chains import permute_chains_composed
from models import host_output

TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def _convnext(channels: int, size: int, seed: int, bias: bool = True):
    """main(x NCHW) -> NCHW: a 2 x 2 stride-2 downsampling conv of a channels-last norm, then a
    7 x 7 depthwise conv, transposed to channels-last, normed, scaled, transposed back and added
    to its input (HF's ConvNextLayer without the MLP)."""
    rng = np.random.default_rng(seed)
    const = lambda *shape: relax.const(rng.standard_normal(shape).astype(np.float32))  # noqa: E731
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    wide = 2 * channels
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.permute_dims(x, TO_NHWC))
            h = bb.emit(relax.op.nn.layer_norm(h, const(channels), const(channels), axes=[-1]))
            h = bb.emit(relax.op.permute_dims(h, TO_NCHW))
            h = bb.emit(relax.op.nn.conv2d(h, const(wide, channels, 2, 2), strides=2))
            if bias:
                h = bb.emit(relax.op.add(h, const(1, wide, 1, 1)))
            d = bb.emit(relax.op.nn.conv2d(h, const(wide, 1, 7, 7), padding=3, groups=wide))
            if bias:
                d = bb.emit(relax.op.add(d, const(1, wide, 1, 1)))
            d = bb.emit(relax.op.permute_dims(d, TO_NHWC))
            d = bb.emit(relax.op.nn.layer_norm(d, const(wide), const(wide), axes=[-1]))
            d = bb.emit(relax.op.multiply(const(wide), d))
            d = bb.emit(relax.op.permute_dims(d, TO_NCHW))
            out = bb.emit_output(relax.op.add(h, d))
        bb.emit_func_output(out)
    return bb.get()


def _activation_permutes(mod) -> list:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(e, relax.Call) and
                                    e.op.same_as(tvm.ir.Op.get("relax.permute_dims")) else None)
    return found


def test_convnext_keeps_only_the_outputs_transpose():
    rewritten = nhwc_convs(_convnext(8, 8, 0))
    convs = []
    relax.analysis.post_order_visit(rewritten["main"], lambda e: convs.append(e.attrs) if isinstance(e, relax.Call)
                                    and e.op.same_as(tvm.ir.Op.get("relax.nn.conv2d")) else None)
    assert [(str(a.data_layout), str(a.out_layout)) for a in convs] == [("NHWC", "NHWC")] * 2
    assert len(_activation_permutes(rewritten)) == 2  # the input's (to the first norm) and the output's


def test_a_dense_conv_of_nchw_data_stores_nhwc_itself():
    """The stem: a dense conv of NCHW data stores NHWC itself (its store walks the channels
    innermost), no transpose after it."""
    x = relax.Var("x", relax.TensorType((1, 3, 16, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.conv2d(x, relax.const(np.ones((8, 3, 4, 4), np.float32)), strides=4))
            out = bb.emit_output(relax.op.permute_dims(h, TO_NHWC))
        bb.emit_func_output(out)
    rewritten = nhwc_convs(bb.get())
    convs = []
    relax.analysis.post_order_visit(rewritten["main"], lambda e: convs.append(e.attrs) if isinstance(e, relax.Call)
                                    and e.op.same_as(tvm.ir.Op.get("relax.nn.conv2d")) else None)
    assert [(str(a.data_layout), str(a.out_layout)) for a in convs] == [("NCHW", "NHWC")]
    assert not _activation_permutes(rewritten)


@settings(max_examples=3, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(channels=st.sampled_from([4, 8, 16]), size=st.sampled_from([8, 12]), seed=st.integers(0, 2 ** 16),
       bias=st.booleans())
def test_the_rewritten_block_on_the_npu_matches_the_unrewritten_one_on_thehost_output(channels, size, seed, bias):
    """(TVM's host conv2d takes no NHWC data with OIHW weights: the rewritten module runs on the NPU.)"""
    mod = _convnext(channels, size, seed, bias)
    x = np.random.default_rng(seed).standard_normal((1, channels, size, size)).astype(np.float32)
    expected = host_output(mod, x)
    assert len(_activation_permutes(permute_chains_composed(nhwc_convs(mod)))) == 2
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x)).numpy()
    assert np.abs(out - expected).max() <= 1e-5 * np.abs(expected).max()
    assert len([p for p in npu_backend.explain(mod, "cgra-8x8") if p.op == "permute_dims"]) <= 2


@settings(max_examples=3, deadline=None)
@given(channels=st.sampled_from([8, 16]), filters=st.sampled_from([16, 32]), size=st.sampled_from([8, 16]),
       seed=st.integers(0, 2 ** 16))
def test_a_channels_last_output_is_stored_channels_innermost(channels, filters, size, seed):
    """ConvNeXt's downsampling conv (2 x 2, stride 2) of NHWC data to an NHWC output: its store
    walks the channels innermost, the DRAM run and the tile row both contiguous, so the store
    engine moves 16 bytes a cycle (walked outermost, each beat hit one bank 4 times: 2,048
    cycles for 8 KiB on cgra-8x8); the result as numpy's."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, size, size, channels)).astype(np.float32)
    w = (rng.standard_normal((filters, channels, 2, 2)) / 4).astype(np.float32)
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.conv2d(xv, relax.const(w), strides=2, data_layout="NHWC",
                                                    kernel_layout="OIHW", out_layout="NHWC"))
        bb.emit_func_output(out)
    with npu_backend.profile() as prof:
        vm = relax.VirtualMachine(npu_backend.compile(bb.get(), "cgra-8x8"), tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    patches = x.astype(np.float64).reshape(1, size // 2, 2, size // 2, 2, channels)
    expected = np.einsum("nyaxbc,fcab->nyxf", patches, w.astype(np.float64))
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    (kernel,) = prof.kernels
    assert kernel.busy_cycles["store"] == -(-kernel.dma_store_bytes // 16), kernel.busy_cycles
