"""fold_weights (normalise stage): batch norm into conv2d weights and constant arithmetic, in numpy.

Golden: the result is the module TVM's FoldBatchnormToConv2D + FoldConstant give, constants
bit for bit. Property: the folded conv2d + bias equals conv2d then batch norm (float64 numpy) for
any channel count, layout and affine flags. And what must stay: training batch norms, batch norms
whose statistics are used, conv2d outputs used twice, arithmetic numpy would round differently.
"""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given
from hypothesis import strategies as st
from tvm import relax
from onnx import numpy_helper
from tvm.relax.frontend.onnx import from_onnx

import npu_backend

from models import conv2d_reference, relax_module
from npu_backend.normalise.fold_weights import fold_weights, restore_kept_transposes
from onnx_models import _Graph

LAYOUTS = {"NCHW": "OIHW", "NHWC": "HWIO"}


def _ops(mod) -> list[str]:
    return [b.value.op.name.replace("relax.", "") for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


def _conv_bn(channels, layout="NCHW", training=False, share_conv=False, use_mean=False, seed=0,
             center=True, scale=True, conv_bias=None, relu6=False):
    """x -> conv2d (3 input channels, 3x3, constant weights) [-> + bias] -> batch_norm (constant
    statistics). conv_bias "right" adds conv + b (PyTorch's Conv2d(bias=True) imports so, the
    bias reshaped to the output's channel axis), "left" b + conv."""
    rng = np.random.default_rng(seed)
    kernel_layout = LAYOUTS[layout]
    oihw = rng.standard_normal((channels, 3, 3, 3)).astype("float32")
    weight = np.transpose(oihw, ["OIHW".index(a) for a in kernel_layout])
    stats = [rng.uniform(0.5, 1.5, channels), rng.normal(0, 0.5, channels), rng.normal(0, 0.5, channels),
             rng.uniform(0.5, 1.5, channels)]
    data_shape = (1, 3, 6, 6) if layout == "NCHW" else (1, 6, 6, 3)
    bias = rng.normal(0, 0.5, channels).astype("float32")

    def body(bb, x):
        conv = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), data_layout=layout, kernel_layout=kernel_layout))
        if conv_bias is not None:
            row = bb.emit(relax.op.reshape(relax.const(bias), [channels if a == "C" else 1 for a in layout]))
            conv = bb.emit(relax.op.add(conv, row) if conv_bias == "right" else relax.op.add(row, conv))
        norm = bb.emit(relax.op.nn.batch_norm(conv, *[relax.const(s.astype("float32")) for s in stats],
                                              axis=layout.index("C"), training=training, center=center,
                                              scale=scale))
        out = bb.emit(relax.TupleGetItem(norm, 0))
        out = bb.emit(relax.op.clip(out, 0, 6)) if relu6 else out
        extra = [conv] if share_conv else [bb.emit(relax.TupleGetItem(norm, 1))] if use_mean else []
        return relax.Tuple([out, *extra]) if extra else out

    return relax_module([("x", data_shape, "float32")], body), oihw, stats + ([bias] if conv_bias else [])


def test_matches_tvm_fold_batchnorm_and_fold_constant_bit_for_bit():
    graph = _Graph(seed=0)  # a batch norm, Clip's bounds, a transposed Gemm weight
    x = graph.conv_bn("input", 3, 4, act="relu6")
    mod = from_onnx(graph.model("tiny", [1, 3, 4, 4], graph.classifier(x, 4, 2), [1, 2]))
    expected = tvm.transform.Sequential([
        relax.transform.FoldBatchnormToConv2D(), relax.transform.FoldConstant(),
        relax.transform.CanonicalizeBindings()])(mod)
    # fold_weights keeps the Gemm weight's transpose (the next test): TVM folds it here too.
    folded = tvm.transform.Sequential([relax.transform.FoldConstant(), relax.transform.CanonicalizeBindings()])(
        restore_kept_transposes(fold_weights(mod)))
    tvm.ir.assert_structural_equal(folded, expected, map_free_vars=True)


def test_a_transposed_gemm_weight_is_read_as_stored_not_copied():
    graph = _Graph(seed=0)
    mod = from_onnx(graph.model("fc", [1, 3, 4, 4], graph.classifier("input", 3, 5), [1, 5]))
    weight = next(i for i in graph.initializers if i.name.startswith("fc_w"))
    normalised = npu_backend.STAGES[0][1](mod, npu_backend.load_arch("cgra-4x4"), npu_backend.CompileOptions())
    (permute,) = [b.value for block in normalised["main"].body.blocks for b in block.bindings
                  if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.permute_dims"]
    assert isinstance(permute.args[0], tvm.ir.GenericConst)  # the weight as ONNX stores it, (5, 3)
    assert (permute.args[0].value.numpy() == numpy_helper.to_array(weight)).all()
    (placement,) = [p for p in npu_backend.explain(mod, "cgra-4x4") if p.op == "matmul"]
    assert placement.where == "npu"


def _folded_weight_and_bias(mod):
    calls = {b.value.op.name: b.value for block in mod["main"].body.blocks for b in block.bindings
             if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)}
    return calls["relax.nn.conv2d"].args[1].value.numpy(), calls["relax.add"].args[1].value.numpy()


@given(channels=st.integers(1, 8), layout=st.sampled_from(sorted(LAYOUTS)), seed=st.integers(0, 2**16),
       center=st.booleans(), scale=st.booleans(), conv_bias=st.sampled_from([None, "right", "left"]))
def test_folded_conv_plus_bias_equals_conv_then_batch_norm(channels, layout, seed, center, scale, conv_bias):
    mod, oihw, stats = _conv_bn(channels, layout, seed=seed, center=center, scale=scale, conv_bias=conv_bias)
    (gamma, beta, mean, var), conv_b = stats[:4], (stats[4] if conv_bias else np.zeros(channels))
    folded = fold_weights(mod)
    assert _ops(folded) == ["nn.conv2d", "add"]
    weight, bias = _folded_weight_and_bias(folded)
    kernel_layout = LAYOUTS[layout]
    weight = np.transpose(weight, [kernel_layout.index(a) for a in "OIHW"]).astype(np.float64)
    bias = np.transpose(bias, [layout.index(a) for a in "NCHW"]).astype(np.float64)
    assert bias.shape == (1, channels, 1, 1)

    x = np.random.default_rng(seed + 1).standard_normal((1, 3, 6, 6))
    conv = conv2d_reference(x, oihw.astype(np.float64), (1, 1), (0, 0, 0, 0)) + np.reshape(conv_b, (-1, 1, 1))
    gamma, beta = (gamma if scale else np.ones(channels)), (beta if center else np.zeros(channels))
    per_channel = (lambda v: np.reshape(v, (-1, 1, 1)))
    expected = (conv - per_channel(mean)) / np.sqrt(per_channel(var) + 1e-5) * per_channel(gamma) + per_channel(beta)
    got = conv2d_reference(x, weight, (1, 1), (0, 0, 0, 0)) + bias
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_leaves_batch_norms_it_cannot_fold_exactly():
    for kwargs in ({"training": True}, {"share_conv": True}, {"use_mean": True}):
        mod, _, _ = _conv_bn(4, **kwargs)
        assert "nn.batch_norm" in _ops(fold_weights(mod)), kwargs


def test_folds_constant_arithmetic_numpy_rounds_like_tvm_and_leaves_the_rest():
    w = np.arange(12, dtype="float32").reshape(3, 4)

    def body(bb, x):
        weight = bb.emit(relax.op.permute_dims(relax.const(w), [1, 0]))  # transposed for an add: folded
        x = bb.emit(relax.op.add(x, relax.op.permute_dims(weight, [1, 0])))
        bound = bb.emit(relax.op.where(relax.op.isnan(relax.const(6.0, "float32")),
                                       relax.const(np.inf, "float32"), relax.const(6.0, "float32")))
        halves = bb.emit(relax.op.divide(relax.const(np.array([7, -7], "int32")), relax.const(2, "int32")))
        return relax.Tuple([bb.emit(relax.op.minimum(bb.emit(relax.op.matmul(x, weight)), bound)), halves])

    folded = fold_weights(relax_module([("x", (3, 4), "float32")], body))
    calls = {b.value.op.name: b.value for block in folded["main"].body.blocks for b in block.bindings
             if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)}
    assert set(calls) == {"relax.add", "relax.matmul", "relax.minimum", "relax.divide"}  # integer divide left alone
    np.testing.assert_array_equal(calls["relax.add"].args[1].value.numpy(), w)  # transposed twice
    np.testing.assert_array_equal(calls["relax.matmul"].args[1].value.numpy(), w.T)
    assert float(calls["relax.minimum"].args[1].value.numpy()) == 6.0


def test_pytorch_conv_with_bias_then_batch_norm_and_relu6_is_one_npu_kernel():
    """nn.Conv2d (bias=True by default) + nn.BatchNorm2d + nn.ReLU6 as PyTorch imports them: the
    batch norm folds into the conv's weights and bias, the clip into the kernel's epilogue. Before
    the fold took a conv's own bias, the batch norm and the clip ran on the host."""
    import npu_backend
    from models import assert_matches, run

    mod, _, _ = _conv_bn(6, conv_bias="right", relu6=True)
    placements = npu_backend.explain(mod, "cgra-8x8")
    assert [(p.op, p.where) for p in placements] == [("nn.conv2d", "npu"), ("add", "npu"), ("clip", "npu")]
    x = np.random.default_rng(3).standard_normal((1, 3, 6, 6)).astype("float32")
    ref = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert_matches(run(npu_backend.compile(mod, "cgra-8x8"), [x]), ref, "float32")


def test_explain_says_why_a_batch_norm_stays_on_the_host():
    import npu_backend

    mod, _, _ = _conv_bn(4, training=True)
    reasons = [p.reason for p in npu_backend.explain(mod, "cgra-8x8") if p.op == "nn.batch_norm"]
    assert reasons and "folded into the conv2d before it" in reasons[0]


def test_folds_what_pytorch_exports_leave_constant_like_fold_constant():
    """A transformer's position ids (arange, broadcast_to, strided_slice), a Swin window's relative
    position index (take, gather_elements), an attention mask's comparisons, casts and a where of
    scalars bound to variables: all folded in numpy (FoldConstant compiled each one with TVM,
    ~30 ms apiece), each value bit for bit FoldConstant's. What numpy and TVM could disagree on
    stays: a float range, an index outside its axis, a cast of a float past the integer's range.
    The reference is TVM's llvm build of the unfolded module."""
    table = np.arange(24, dtype="float32").reshape(4, 6) * 0.5

    def body(bb, x):
        ids = bb.emit(relax.op.arange(0, 12, 1, "int64"))
        ids = bb.emit(relax.op.broadcast_to(bb.emit(relax.op.expand_dims(ids, 0)), (2, 12)))
        ids = bb.emit(relax.op.strided_slice(ids, axes=[1], begin=[1], end=[9], strides=[2]))  # (2, 4)
        rows = bb.emit(relax.op.take(relax.const(table), relax.const(np.array([3, 0, 2], "int64")), axis=0))
        picked = bb.emit(relax.op.gather_elements(rows, relax.const(np.array([[5, 0], [1, 1], [0, 4]], "int64")),
                                                  axis=1))
        mask = bb.emit(relax.op.greater_equal(bb.emit(relax.op.astype(ids, "float32")), relax.const(4.0, "float32")))
        one = bb.emit(relax.const(1.0, "float32"))  # PyTorch's exports bind scalars to variables
        scores = bb.emit(relax.op.where(mask, one, relax.const(-1e9, "float32")))
        return relax.Tuple([bb.emit(relax.op.add(x, scores)), picked])

    def kept(bb, x):
        return relax.Tuple([bb.emit(relax.op.add(x, bb.emit(relax.op.arange(0.0, 0.4, 0.1, "float32")))),
                            bb.emit(relax.op.take(relax.const(table), relax.const(np.array([4], "int64")), axis=0)),
                            bb.emit(relax.op.astype(relax.const(np.array([3e9], "float32")), "int32"))])

    assert sorted(_ops(fold_weights(relax_module([("x", (4,), "float32")], kept)))) == ["add", "arange", "astype",
                                                                                          "take"]
    mod = relax_module([("x", (2, 4), "float32")], body)
    folded = fold_weights(mod)
    assert _ops(folded) == ["add"]
    # TVM's own evaluation of the unfolded module is the reference, output by output, bit for bit.
    x = np.random.default_rng(0).standard_normal((2, 4)).astype("float32")
    outputs = [tvm.relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x))
               for m in (folded, mod)]
    for ours, theirs in zip(*outputs):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    np.testing.assert_array_equal(outputs[0][1].numpy(), [[11.5, 9.0], [0.5, 0.5], [6.0, 8.0]])


def test_folds_what_yolos_interpolation_leaves_constant_like_fold_constant():
    """YOLOS interpolates its position embeddings with floor, clip (of floats, and of int64
    indices into range) and concat of constants: folded in numpy (FoldConstant built each with
    LLVM, 373 builds, 9.9 s of an 11 s compile), bit for bit TVM's llvm build of the unfolded
    module. Stays: a clip of a NaN (numpy keeps it, TVM's compare pair may not), an integer
    clip to a bound that is not an integer."""
    grid = np.array([-2.5, -0.5, -0.0, 0.4999999, 0.5, 1.5, 2.5, 7.75, 1e30, -np.inf], "float32")

    def body(bb, x):
        low = bb.emit(relax.op.floor(relax.const(grid)))
        high = bb.emit(relax.op.ceil(relax.const(grid)))
        index = bb.emit(relax.op.clip(bb.emit(relax.op.astype(bb.emit(relax.op.clip(low, -3.0, 9.0)), "int64")), 0, 7))
        joined = bb.emit(relax.op.concat([low, high, bb.emit(relax.op.clip(high, -1.0, float("inf")))], axis=0))
        return relax.Tuple([bb.emit(relax.op.add(x, joined)), index])

    def kept(bb, x):
        nan = bb.emit(relax.op.clip(relax.const(np.array([np.nan, 1.0], "float32")), 0.0, 1.0))
        whole = bb.emit(relax.op.clip(relax.const(np.array([1, 9], "int64")), 0.5, 7.0))
        return relax.Tuple([bb.emit(relax.op.add(x, nan)), whole])

    assert sorted(_ops(fold_weights(relax_module([("x", (2,), "float32")], kept)))) == ["add", "clip", "clip"]
    mod = relax_module([("x", (30,), "float32")], body)
    folded = fold_weights(mod)
    assert _ops(folded) == ["add"]
    x = np.random.default_rng(1).standard_normal(30).astype("float32")
    outputs = [tvm.relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x))
               for m in (folded, mod)]
    for ours, theirs in zip(*outputs):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    np.testing.assert_array_equal(outputs[0][1].numpy(), [0, 0, 0, 0, 0, 1, 2, 7, 7, 0])


def test_folds_a_decoders_causal_mask_like_fold_constant():
    """Hugging Face's causal mask (GPT-2, Llama, Falcon) from its position ids: a count of
    packed-sequence starts (cumsum, int64 once normalise/bool_scans.py has run), index_tensor
    lookups, a full(True) and the and of comparisons, all constant; left, the safe softmax after
    it could not be read as a softmax. Folded in numpy, bit for bit TVM's llvm build; stays: an
    index_tensor index outside its axis."""
    positions = np.arange(6, dtype="int64").reshape(1, 6)

    def body(bb, x):
        starts = bb.emit(relax.op.astype(bb.emit(relax.op.not_equal(relax.const(positions), relax.const(
            np.array(1, "int64")))), "int64"))
        packed = bb.emit(relax.op.cumsum(starts, axis=-1, dtype="int64"))
        rows = relax.const(np.zeros((1, 1, 1, 1), "int64"))
        query = bb.emit(relax.op.index_tensor(relax.const(positions), relax.Tuple(
            [rows, relax.const(np.arange(6, dtype="int64").reshape(1, 1, 6, 1))])))
        key = bb.emit(relax.op.index_tensor(relax.const(positions), relax.Tuple(
            [rows, relax.const(np.arange(6, dtype="int64").reshape(1, 1, 1, 6))])))
        causal = bb.emit(relax.op.bitwise_and(bb.emit(relax.op.full((), relax.const(True, "bool"), "bool")),
                                              bb.emit(relax.op.less_equal(key, query))))
        same = bb.emit(relax.op.equal(bb.emit(relax.op.index_tensor(packed, relax.Tuple(
            [rows, relax.const(np.arange(6, dtype="int64").reshape(1, 1, 6, 1))]))), packed))
        mask = bb.emit(relax.op.logical_not(bb.emit(relax.op.logical_not(bb.emit(relax.op.bitwise_and(causal, same))))))
        scores = bb.emit(relax.op.where(mask, relax.const(0.0, "float32"), relax.const(-np.inf, "float32")))
        return bb.emit(relax.op.add(x, scores))

    mod = relax_module([("x", (1, 1, 6, 6), "float32")], body)
    folded = fold_weights(mod)
    assert _ops(folded) == ["add"]
    x = np.random.default_rng(2).standard_normal((1, 1, 6, 6)).astype("float32")
    ours, theirs = (tvm.relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(x)).numpy() for m in (folded, mod))
    np.testing.assert_array_equal(ours, theirs)
    assert np.isinf(ours[0, 0][np.triu_indices(6, 1)]).all() and np.isfinite(np.diagonal(ours[0, 0])).all()
    table = relax.const(np.arange(6, dtype="float32").reshape(1, 6))
    outside = relax_module([("x", (1,), "float32")], lambda bb, x: bb.emit(relax.op.add(x, bb.emit(
        relax.op.index_tensor(table, relax.Tuple([relax.const(np.array([0], "int64")),
                                                                   relax.const(np.array([6], "int64"))]))))))
    assert "index_tensor" in _ops(fold_weights(outside))


def test_the_remaining_constant_calls_fold_as_tvm_foldconstant_folds_them():
    """fold_remaining_constants folds only the calls TVM's FoldConstant can evaluate (constants,
    calls of them, a full_like of a variable: it reads only the shape), in a module of their own,
    and leaves the function FoldConstant leaves: the same module, constants bit for bit (RoPE's
    cos / sin tables, T5's int64 position buckets)."""
    from npu_backend.normalise.fold_constants import fold_remaining_constants

    x = relax.Var("x", relax.TensorType((4, 6), "float32"))
    positions = relax.const(np.arange(24, dtype="int64").reshape(4, 6), "int64")
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            angles = bb.emit(relax.const(np.linspace(0, 3, 24, dtype="float32").reshape(4, 6)))
            cos = bb.emit(relax.op.cos(angles))
            buckets = bb.emit(relax.op.minimum(relax.op.abs(positions), relax.const(7, "int64")))
            scale = bb.emit(relax.op.astype(buckets, "float32"))
            zeros = bb.emit(relax.op.full_like(x, relax.const(0.5, "float32")))
            y = bb.emit(relax.op.add(relax.op.multiply(x, cos), scale))
            out = bb.emit_output(bb.emit(relax.op.add(y, zeros)))
        bb.emit_func_output(out)
    mod = relax.transform.Normalize()(bb.get())
    folded = fold_remaining_constants(mod)
    assert _ops(folded) == ["multiply", "add", "add"]
    dce = relax.transform.DeadCodeElimination()
    tvm.ir.assert_structural_equal(dce(folded)["main"], dce(relax.transform.FoldConstant()(mod))["main"])
