"""The number formats side by side (issue 37): benchmarks/bench_formats.py's models and conversions,
and what running them in each format found.

The decoder step of benchmarks/format_models.py at a small width: float32 equal to onnxruntime,
its MatMulNBits form (only the weight matmuls, attention's two kept) equal to onnxruntime within
float32 rounding, and its DRAM bytes about a third of bfloat16's. A bfloat16 conv2d + batch norm
(a ResNet's every layer) folds into one NPU kernel: the host's batch norm on bfloat16 returned
float32, which the next NPU kernel refused.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

import format_models as fm  # noqa: E402  (benchmarks/ on the path first)
from bench_formats import measure  # noqa: E402

import npu_backend  # noqa: E402

SMALL = dict(layers=1, hidden=256, heads=4, kv_heads=2, intermediate=768, past=15)


def _onnxruntime(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_the_decoder_step_runs_on_the_npu_in_float32_and_with_4_bit_weights_as_onnxruntime_does():
    """float32: every output within float32 summation rounding of onnxruntime; int4: the seven
    weight matmuls are MatMulNBits, attention's two matmuls of activations stay MatMuls, and the
    NPU equals onnxruntime's run of that model as closely."""
    model = fm.decoder_step(**SMALL)
    feeds = fm.random_inputs(model)
    q4 = fm.int4_weights(model)
    assert sorted(n.op_type for n in q4.graph.node if "MatMul" in n.op_type) == ["MatMul"] * 2 + ["MatMulNBits"] * 7
    for variant in (model, q4):
        expected = _onnxruntime(variant, feeds)[0]
        out = measure(variant, feeds, npu_backend.load_arch("cgra-8x8"))["output"]
        assert np.abs(out - expected).max() <= 1e-5 * np.abs(expected).max()


def test_4_bit_weights_cut_a_decode_steps_dram_bytes_to_about_a_third_of_bfloat16s():
    """0.64 bytes a weight (a nibble, a float32 scale and a 4-bit zero point a block of 32)
    against bfloat16's 2, the float32 KV cache and activations on top: under 0.4 of bfloat16's
    bytes (measured 0.36), and bfloat16 half of float32's."""
    arch = npu_backend.load_arch("cgra-8x8")
    model = fm.decoder_step(**SMALL)
    feeds = fm.random_inputs(model)
    dram = {name: measure(variant, feeds, arch)["dram_bytes"] for name, variant in
            (("float32", model), ("bfloat16", fm.to_half(model, "bfloat16")), ("int4", fm.int4_weights(model)))}
    assert dram["bfloat16"] <= 0.51 * dram["float32"]
    assert dram["int4"] < 0.4 * dram["bfloat16"]


def test_a_bfloat16_conv_and_batch_norm_fold_into_one_npu_kernel():
    """Conv (no bias) -> BatchNormalization -> Relu in bfloat16: the batch norm folds into the
    conv's weights and bias in float32, rounded to bfloat16 once; one NPU kernel, within 2 ** -6 of
    the output's scale of onnxruntime's float32 run (the weights' and output's bfloat16 rounding)."""
    from onnx import TensorProto, helper

    g = fm._Graph(np.random.default_rng(0))
    w = g.init("w", g.rng.standard_normal((8, 4, 3, 3)) / 6)
    stats = [g.init(name, value) for name, value in (("gamma", 1 + 0.1 * g.rng.standard_normal(8)),
                                                     ("beta", 0.1 * g.rng.standard_normal(8)),
                                                     ("mean", 0.1 * g.rng.standard_normal(8)),
                                                     ("var", 1 + g.rng.random(8)))]
    y = g.node("Relu", [g.node("BatchNormalization", [g.node("Conv", ["x", w], "conv", pads=[1, 1, 1, 1])] + stats,
                               "bn")], "relu")
    graph = helper.make_graph(g.nodes, "conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 8, 8, 8])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = fm.random_inputs(model)
    expected = _onnxruntime(model, feeds)[0]
    result = measure(fm.to_half(model, "bfloat16"), feeds, "cgra-8x8")
    assert result["kernels"] == [("nn.conv2d", "add", "nn.relu")]
    assert np.abs(result["output"] - expected).max() <= 2.0 ** -6 * np.abs(expected).max()


def _int4_qdq_mlp(tmp_path):
    """x (8, 512) -> MatMul -> Relu -> MatMul (256), quantized by onnxruntime's quantize_static
    with int4 weights, every QuantizeLinear's output a model output too."""
    from onnx import TensorProto, helper
    from qdq_models import with_quantized_outputs

    g = fm._Graph(np.random.default_rng(0))
    h = g.node("Relu", [g.node("MatMul", ["x", g.weight("w0", 512, 256)], "fc0")], "relu")
    y = g.node("MatMul", [h, g.weight("w1", 256, 128)], "fc1")
    graph = helper.make_graph(g.nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 512])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, [8, 128])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return with_quantized_outputs(fm.int8_int4_static(model, str(tmp_path)))[0], fm.random_inputs(model, 7)


def test_int4_qdq_weights_run_as_integer_kernels_bit_exact_to_onnxruntime(tmp_path):
    """quantize_static(weight_type=QInt4): the INT4 initializers (weights, zero points) import as
    int8 values (TVM's importer failed on them), and both matmuls are int8 x int4 -> int32 NPU
    kernels (weights packed two per byte in DRAM, UNPACK4_INT8) requantising to int8; every
    quantized tensor equals onnxruntime's (which computes these layers as DequantizeLinear + a
    float32 MatMul: an exact tie could round one step apart; none did here). The weights' DRAM
    bytes halve: the kernels load 93184 bytes, 175104 as int8 weights (before qdq_int4.py)."""
    model, feeds = _int4_qdq_mlp(tmp_path)
    assert sum(init.data_type == 22 for init in model.graph.initializer) == 4  # TensorProto.INT4
    expected = _onnxruntime(model, feeds)
    import tvm

    with npu_backend.profile() as prof:
        vm = tvm.relax.VirtualMachine(npu_backend.compile(npu_backend.from_onnx(model), "cgra-8x8"), tvm.cpu())
        outputs = vm["main"](tvm.runtime.tensor(feeds["x"]))
    packed = [k for k in prof.kernels if k.source_ops[0].startswith("call_tir qdq_int4_matmul")]
    assert len(packed) == 2
    weights = 512 * 256 + 256 * 128
    # half a byte a weight, x once (8 rows of int8), 4 bytes of bias and of multiplier a channel
    assert sum(k.dma_load_bytes for k in packed) == weights // 2 + 8 * (512 + 256) + 8 * (256 + 128)
    for out, want in zip(outputs, expected):
        assert np.array_equal(out.numpy(), want)


def test_a_decoder_steps_int4_qdq_matmuls_are_integer_kernels(tmp_path):
    """The decoder step quantized with int4 weights (its weight matmuls only): the seven matmuls
    of a (1, 1, K) activation are integer NPU kernels (qdq.py took 2-D activations only), the
    output as onnxruntime's (whose QDQ propagation fails on this graph: it runs without it)."""
    model = fm.decoder_step(**SMALL)
    feeds = fm.random_inputs(model)
    q = fm.int8_int4_static(model, str(tmp_path))
    expected = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"],
                                    disabled_optimizers=["QDQPropagationTransformer"]).run(None, feeds)[0]
    result = measure(q, feeds, "cgra-8x8")
    assert sum(ops[0].startswith("call_tir qdq_int4_matmul") for ops in result["kernels"]) == 7  # packed
    assert np.abs(result["output"] - expected).max() <= 1e-5 * np.abs(expected).max()


def test_a_4_bit_kernels_profile_counts_the_layers_macs_once():
    """A hand-written kernel (`cgra.kernel` with `cgra.macs`: MatMulNBits') reports its layer's
    M * N * K MACs in the profile and a utilisation within the PE array's slots: its MACs per
    output element were its whole MACs (a kernel's output shape was taken as ()), times the
    output's size again, K * N * N for a decode step's layer."""
    model = fm.decoder_step(**SMALL)
    feeds = fm.random_inputs(model)
    import tvm

    vm = tvm.relax.VirtualMachine(npu_backend.compile(npu_backend.from_onnx(fm.int4_weights(model)), "cgra-8x8"),
                                  tvm.cpu())
    with npu_backend.profile() as prof:
        vm["main"](*[tvm.runtime.tensor(feeds[i.name]) for i in model.graph.input])
    hidden, kv, mlp = SMALL["hidden"], SMALL["kv_heads"] * SMALL["hidden"] // SMALL["heads"], SMALL["intermediate"]
    layers = {"q": hidden * hidden, "k": hidden * kv, "v": hidden * kv, "o": hidden * hidden,
              "gate": hidden * mlp, "up": hidden * mlp, "down": mlp * hidden}
    kernels = {k.name.split("_")[-2]: k for k in prof.kernels if k.name.endswith("_Q4")}
    assert {name: k.macs for name, k in kernels.items()} == layers
    assert all(0 < k.utilisation <= 1 for k in kernels.values())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_batch_norm_no_conv_took_is_a_scale_and_shift_in_its_format(dtype):
    """An inference batch norm before a conv (nothing to fold into) on bfloat16 / float16: a
    multiply and an add by per-channel constants in the format (NPU ELTWISE kernels), so the conv
    gets its format (TVM's host batch norm on bfloat16 returned float32, refused by the conv);
    within 2 ** -6 of the output's scale of float64 arithmetic on the same rounded inputs."""
    import ml_dtypes
    import tvm
    from tvm import relax

    np_type = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 6, 6)).astype(np_type)
    w = (rng.standard_normal((4, 8, 3, 3)) / 8).astype(np_type)
    gamma, beta, mean = (rng.standard_normal(8).astype(np_type) for _ in range(3))
    var = (1 + rng.random(8)).astype(np_type)
    bb = relax.BlockBuilder()
    xv, wv = relax.Var("x", relax.TensorType(x.shape, dtype)), relax.Var("w", relax.TensorType(w.shape, dtype))
    with bb.function("main", [xv, wv]):
        with bb.dataflow():
            norm = bb.emit(relax.op.nn.batch_norm(xv, *[relax.const(s, dtype) for s in (gamma, beta, mean, var)],
                                                  axis=1, training=False))
            out = bb.emit_output(relax.op.nn.conv2d(bb.emit(relax.TupleGetItem(norm, 0)), wv, padding=[1, 1, 1, 1]))
        bb.emit_func_output(out)
    with npu_backend.profile() as prof:
        vm = tvm.relax.VirtualMachine(npu_backend.compile(bb.get(), "cgra-8x8"), tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy().astype(np.float64)
    assert [k.source_ops for k in prof.kernels] == [("multiply",), ("add",), ("nn.conv2d",)]
    f = [a.astype(np.float64) for a in (x, w, gamma, beta, mean, var)]
    normed = (f[0] - f[4][:, None, None]) / np.sqrt(f[5][:, None, None] + 1e-5) * f[2][:, None, None] + f[3][:, None, None]
    padded = np.pad(normed[0], ((0, 0), (1, 1), (1, 1)))
    want = np.einsum("cyxij,fcij->fyx", np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2)), f[1])
    assert np.abs(got[0] - want).max() <= 2.0 ** -6 * np.abs(want).max()
