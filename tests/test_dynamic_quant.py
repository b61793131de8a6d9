"""Dynamically quantized matmuls (issue 37 item 4): onnxruntime's `quantize_dynamic` models
(DynamicQuantizeLinear -> MatMulInteger) run their integer matmuls on the NPU as int8 x int8 ->
int32 kernels (normalise/dynamic_quant.py), equal to onnxruntime.

1. Property test: a MatMul layer of random shape, 2-D or 3-D activations, quantized by
   onnxruntime's own quantizer with int8 or uint8 weights (7-bit or 8-bit), compiled for cgra:
   every MAC on the NPU (uint8 weights: where, centred on their zero point, they fit int8) and
   the output the ONNX graph's exactly (a numpy model: the integer product is exact, the float
   scale multiply after it the same float32 ops). onnxruntime's own run is compared exactly too
   (and its optimised run, which fuses the scale multiplies in another order, within 1e-6
   relative) where its uint8 x int8 kernel is exact: on a CPU without VNNI it sums pairs of
   products in saturating int16 (AVX2's vpmaddubsw), so 8-bit weights can be off by whole
   steps there (seen: 0.046 of 5.0); onnxruntime's `reduce_range` (7-bit weights) is its fix.
2. What the rewrite leaves alone: an integer matmul whose constant does not fit int8.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import npu_backend
from npu_backend.normalise.dynamic_quant import dynamic_quant_matmuls


def _matmul_model(path, rows, depth, cols, batch, seed):
    """A float MatMul by a constant weight, saved at `path`."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((depth, cols)).astype(np.float32)
    shape = [batch, rows, depth] if batch else [rows, depth]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape[:-1] + [cols])],
        [numpy_helper.from_array(weight, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return shape


def _centred_weights_fit_int8(path) -> bool:
    """Whether the quantized model's MatMulInteger weights minus their zero point fit int8."""
    model = onnx.load(path)
    arrays = {t.name: numpy_helper.to_array(t).astype(np.int32) for t in model.graph.initializer}
    node = next(n for n in model.graph.node if n.op_type == "MatMulInteger")
    centred = arrays[node.input[1]] - (arrays[node.input[3]] if len(node.input) > 3 and node.input[3] else 0)
    return bool(centred.min() >= -128 and centred.max() <= 127)


def _cpu_has_vnni() -> bool:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


def _graph_reference(path, x):
    """The quantized graph (DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul by the product of
    the scales) in numpy, as the ONNX operators define it: the integer product exact in int32."""
    model = onnx.load(path)
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    low, high = np.float32(min(0.0, x.min())), np.float32(max(0.0, x.max()))
    scale = np.float32((high - low) / np.float32(255))
    zero = np.clip(np.round(np.float32(0) - low / scale), 0, 255)
    xq = (np.clip(np.round(x / scale) + zero, 0, 255) - zero).astype(np.int64)
    node = next(n for n in model.graph.node if n.op_type == "MatMulInteger")
    weights = arrays[node.input[1]].astype(np.int64)
    if len(node.input) > 3 and node.input[3]:
        weights = weights - arrays[node.input[3]].astype(np.int64)
    w_scale = next(v for k, v in arrays.items() if v.dtype == np.float32 and v.size == 1)
    return (xq @ weights).astype(np.float32) * np.float32(scale * np.float32(w_scale))


def _onnxruntime(path, x, optimised):
    options = ort.SessionOptions()
    if not optimised:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@settings(max_examples=6, deadline=None)
@given(rows=st.integers(2, 20), depth=st.integers(8, 70), cols=st.integers(4, 40), batch=st.sampled_from([0, 1, 2]),
       weights=st.sampled_from([QuantType.QInt8, QuantType.QUInt8]), reduce_range=st.booleans(),
       seed=st.integers(0, 2**16))
def test_dynamically_quantized_matmul_runs_on_the_npu_as_onnxruntime(tmp_path_factory, rows, depth, cols, batch,
                                                                     weights, reduce_range, seed):
    folder = tmp_path_factory.mktemp("dq")
    shape = _matmul_model(str(folder / "f.onnx"), rows, depth, cols, batch, seed)
    quantize_dynamic(str(folder / "f.onnx"), str(folder / "q.onnx"), weight_type=weights, reduce_range=reduce_range)
    x = (np.random.default_rng(seed + 1).standard_normal(shape) * 3).astype(np.float32)
    mod = from_onnx(onnx.load(str(folder / "q.onnx")), keep_params_in_input=False)
    vm = relax.VirtualMachine(tvm.compile(mod, target="cgra"), tvm.cpu())
    with npu_backend.profile() as prof:
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(out, _graph_reference(str(folder / "q.onnx"), x))
    if reduce_range or _cpu_has_vnni():
        np.testing.assert_array_equal(out, _onnxruntime(str(folder / "q.onnx"), x, optimised=False))
        optimised = _onnxruntime(str(folder / "q.onnx"), x, optimised=True)
        np.testing.assert_allclose(out, optimised, rtol=1e-6, atol=1e-6 * float(np.abs(optimised).max()))
    if weights == QuantType.QUInt8 and not _centred_weights_fit_int8(str(folder / "q.onnx")):
        return  # onnxruntime's uint8 weights spread 0-255 round their zero point: the host's matmul
    matmuls = [k for k in prof.kernels if "matmul" in k.name]
    assert len(matmuls) == 1 and matmuls[0].macs == int(np.prod(shape[:-1])) * depth * cols
    assert not any(call.name.startswith("matmul") for call in prof.host_calls)


def test_an_integer_matmul_whose_weights_do_not_fit_int8_is_left_alone():
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            zero = bb.emit(relax.const(3, "uint8"))
            q = bb.emit(relax.op.quantize(x, relax.const(0.5, "float32"), zero, axis=0, out_dtype="uint8"))
            centred = bb.emit(relax.op.subtract(relax.op.astype(q, "int32"), relax.op.astype(zero, "int32")))
            weight = relax.const(np.full((8, 2), 200, np.int32))
            out = bb.emit_output(bb.emit(relax.op.matmul(centred, weight, out_dtype="int32")))
        bb.emit_func_output(out)
    mod = bb.get()
    tvm.ir.assert_structural_equal(dynamic_quant_matmuls(mod)["main"], mod["main"])


def test_a_dynamically_quantized_bert_runs_every_matmul_on_the_npu(tmp_path):
    """Hugging Face's BertModel (small config, random weights) exported to ONNX and quantized by
    onnxruntime's quantize_dynamic (7-bit weights): its 12 MatMulInteger layers and 4 attention
    matmuls all on the NPU, the output onnxruntime's within float32 rounding."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64)
    torch.manual_seed(0)
    bert = transformers.BertModel(config).eval()

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids):
            return self.bert(input_ids=ids).last_hidden_state

    ids = torch.randint(0, 200, (1, 16))
    with torch.no_grad():
        torch.onnx.export(LastHidden(), (ids,), str(tmp_path / "bert.onnx"), input_names=["ids"], opset_version=17,
                          dynamo=False)
    # 7-bit weights: onnxruntime's uint8 x int8 kernel saturates with 8-bit ones on a CPU without
    # VNNI (the property test above), and its run is the reference here.
    quantize_dynamic(str(tmp_path / "bert.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8,
                     reduce_range=True)
    feeds = {"ids": ids.numpy()}
    expected = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    model = onnx.load(str(tmp_path / "q.onnx"))
    assert sum(node.op_type == "MatMulInteger" for node in model.graph.node) == 12
    vm = relax.VirtualMachine(tvm.compile(from_onnx(model, keep_params_in_input=False), target="cgra"), tvm.cpu())
    with npu_backend.profile() as prof:
        out = vm["main"](tvm.runtime.tensor(feeds["ids"])).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    assert sum("matmul" in k.name for k in prof.kernels) == 12 + 4
    assert not any(call.name.startswith("matmul") for call in prof.host_calls)
