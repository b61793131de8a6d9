"""The models benchmarks/bench_formats.py compares, and their number formats.

A Llama-style decoder step built with onnx.helper (`decoder_step`) and the ONNX CNNs of tests/,
each in float32, then converted to each format the way a user gets one:

- bfloat16 / float16 (`to_half`): every float32 initializer, input and output in the format, as a
  model exported from PyTorch after `.to(torch.bfloat16)` / `.half()` or converted with onnx's
  float16 tools holds them;
- int8 (`int8_dynamic`: onnxruntime's `quantize_dynamic`, the usual way language models are
  quantized for CPUs; `int8_static`: `quantize_static` QDQ, per channel, for a CNN);
- int8 activations x int4 weights (`int8_int4_static`: `quantize_static` QDQ with
  `weight_type=QuantType.QInt4`, per channel);
- int4 weights (`int4_weights`: onnxruntime's MatMulNBits, block 32, zero points, float32
  activations).

Only the matmuls with constant weights are quantized (the projections and the MLP's three), as
onnxruntime's LLM recipes do; attention's two matmuls of activations keep the activations' format.
"""

from __future__ import annotations

import os
import runpy

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")


class _Graph:
    """Nodes and float32 initializers of a graph being built; each node is named after its output."""

    def __init__(self, rng):
        self.rng, self.nodes, self.inits = rng, [], []

    def init(self, name: str, value, dtype=np.float32) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def node(self, op: str, inputs, name: str, **attrs) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op, list(inputs), [name], name=name, **attrs))
        return name

    def weight(self, name: str, k: int, n: int) -> str:
        return self.init(name, self.rng.standard_normal((k, n)) / np.sqrt(k))

    def rms_norm(self, x: str, prefix: str, hidden: int) -> str:
        """x / sqrt(mean(x * x) + eps) * w, as an ONNX export of Llama's RMSNorm spells it."""
        mean = self.node("ReduceMean", [self.node("Mul", [x, x], f"{prefix}_sq"), "last_axis"], f"{prefix}_mean",
                         keepdims=1)
        std = self.node("Sqrt", [self.node("Add", [mean, "eps"], f"{prefix}_var")], f"{prefix}_std")
        normed = self.node("Mul", [x, self.node("Div", ["one", std], f"{prefix}_inv")], f"{prefix}_normed")
        return self.node("Mul", [normed, self.init(f"{prefix}_w", 1 + 0.1 * self.rng.standard_normal(hidden))],
                         f"{prefix}_out")


def decoder_step(seed: int = 0, layers: int = 2, hidden: int = 1024, heads: int = 16, kv_heads: int = 4,
                 intermediate: int = 2816, past: int = 127):
    """One token through `layers` Llama-style decoder layers (RMSNorm; q / k / v projections;
    grouped-query attention, `heads` query heads sharing `kv_heads` key / value heads, over the KV
    cache's `past` rows and the new one; output projection; residual; RMSNorm; SwiGLU MLP;
    residual), random weights. The defaults are Llama 3's proportions at a small model's width
    (head 64, 4 query heads a KV head, MLP 8/3 of hidden rounded up to 256). Inputs: x (1, 1,
    hidden), past_key_<l> / past_value_<l> (1, kv_heads, past, head); outputs: the hidden state and
    the present caches (past + 1 rows, the new row concatenated as an ONNX export without a cache op
    does). A group's query heads are one (group, head) matrix against their KV head, as decoding
    kernels compute grouped attention (no copy of the cache per query head). No rotary embedding
    (elementwise and weightless: it moves no weight bytes)."""
    from onnx import TensorProto, helper

    g, head, group = _Graph(np.random.default_rng(seed)), hidden // heads, heads // kv_heads
    g.init("eps", 1e-6), g.init("one", 1.0), g.init("scale", 1 / np.sqrt(head))
    g.init("q_shape", [1, kv_heads, group, head], np.int64), g.init("kv_shape", [1, 1, kv_heads, head], np.int64)
    g.init("hidden_shape", [1, 1, hidden], np.int64), g.init("last_axis", [-1], np.int64)
    cache = [1, kv_heads, past, head]
    inputs, outputs, x = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, hidden])], [], "x"
    for layer in range(layers):
        p = f"l{layer}"
        h = g.rms_norm(x, f"{p}_attn_norm", hidden)
        q = g.node("Reshape", [g.node("MatMul", [h, g.weight(f"{p}_wq", hidden, hidden)], f"{p}_q"), "q_shape"],
                   f"{p}_q_groups")
        present = []
        for kind in ("key", "value"):
            new = g.node("MatMul", [h, g.weight(f"{p}_w{kind[0]}", hidden, kv_heads * head)], f"{p}_{kind[0]}")
            new = g.node("Transpose", [g.node("Reshape", [new, "kv_shape"], f"{p}_{kind[0]}_heads")],
                         f"{p}_{kind[0]}_t", perm=[0, 2, 1, 3])
            inputs.append(helper.make_tensor_value_info(f"past_{kind}_{layer}", TensorProto.FLOAT, cache))
            present.append(g.node("Concat", [f"past_{kind}_{layer}", new], f"present_{kind}_{layer}", axis=2))
            outputs.append(helper.make_tensor_value_info(present[-1], TensorProto.FLOAT, cache[:2] + [past + 1, head]))
        scores = g.node("Mul", [g.node("MatMul", [q, g.node("Transpose", [present[0]], f"{p}_kt", perm=[0, 1, 3, 2])],
                                       f"{p}_qk"), "scale"], f"{p}_scores")
        attn = g.node("MatMul", [g.node("Softmax", [scores], f"{p}_probs", axis=-1), present[1]], f"{p}_pv")
        attn = g.node("Reshape", [attn, "hidden_shape"], f"{p}_attn")
        x = g.node("Add", [x, g.node("MatMul", [attn, g.weight(f"{p}_wo", hidden, hidden)], f"{p}_o")], f"{p}_res1")
        h = g.rms_norm(x, f"{p}_mlp_norm", hidden)
        gate = g.node("MatMul", [h, g.weight(f"{p}_wgate", hidden, intermediate)], f"{p}_gate")
        up = g.node("MatMul", [h, g.weight(f"{p}_wup", hidden, intermediate)], f"{p}_up")
        silu = g.node("Mul", [gate, g.node("Sigmoid", [gate], f"{p}_sig")], f"{p}_silu")
        down = g.node("MatMul", [g.node("Mul", [silu, up], f"{p}_gated"), g.weight(f"{p}_wdown", intermediate, hidden)],
                      f"{p}_down")
        x = g.node("Add", [x, down], f"{p}_res2")
    outputs.insert(0, helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 1, hidden]))
    graph = helper.make_graph(g.nodes, "decoder_step", inputs, outputs, g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])  # 21: int4 QDQ


def random_inputs(model, seed: int = 0) -> dict:
    """Standard-normal float32 values for every input of `model` (static shapes)."""
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


def to_half(model, dtype: str):
    """`model` with every float32 initializer, input, output and value in `dtype` ("bfloat16" or
    "float16"), rounded to nearest even."""
    import ml_dtypes
    import onnx
    from onnx import TensorProto, helper

    elem, np_type = {"bfloat16": (TensorProto.BFLOAT16, ml_dtypes.bfloat16),
                     "float16": (TensorProto.FLOAT16, np.float16)}[dtype]
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for init in model.graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            bits = onnx.numpy_helper.to_array(init).astype(np_type)
            init.CopyFrom(helper.make_tensor(init.name, elem, bits.shape, bits.view(np.uint16).tobytes(), raw=True))
    for value in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = elem
    model.ir_version = 10
    return model


def weight_matmuls(model) -> list:
    """The names of `model`'s MatMul nodes whose second operand is an initializer."""
    names = {init.name for init in model.graph.initializer}
    return [node.name for node in model.graph.node if node.op_type == "MatMul" and node.input[1] in names]


def int8_dynamic(model, directory: str):
    """`model`'s weight matmuls dynamically quantized by onnxruntime (int8 weights per tensor,
    uint8 activations quantized at run time: DynamicQuantizeLinear -> MatMulInteger)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    onnx.save(model, f"{directory}/float.onnx")
    quantize_dynamic(f"{directory}/float.onnx", f"{directory}/dynamic.onnx", weight_type=QuantType.QInt8,
                     nodes_to_quantize=weight_matmuls(model))
    return onnx.load(f"{directory}/dynamic.onnx")


def int8_static(model, directory: str):
    """`model` quantized by onnxruntime's `quantize_static` (QDQ, int8 activations and weights,
    per channel, calibrated on four random inputs: tests/qdq_models.py)."""
    from qdq_models import onnxruntime_quantized

    return onnxruntime_quantized(model, directory, activation_type="QInt8", weight_type="QInt8", per_channel=True)


def int16_static(model, directory: str):
    """`model` quantized by onnxruntime's `quantize_static` with int16 activations and int8 weights
    per channel (QDQ: the 16x8 mode, normalise/qdq16.py)."""
    from qdq_models import onnxruntime_quantized

    return onnxruntime_quantized(model, directory, activation_type="QInt16", weight_type="QInt8", per_channel=True)


def int4_weights(model):
    """`model`'s weight matmuls as MatMulNBits (4 bits, block 32, zero points), as onnxruntime's
    MatMulNBitsQuantizer writes them (examples/int4_mlp.py)."""
    example = runpy.run_path(os.path.join(EXAMPLES, "int4_mlp.py"))
    return example["quantize_with_ort_kernel"](model, symmetric=False)


def int8_int4_static(model, directory: str):
    """`model` quantized by onnxruntime's `quantize_static` with int4 weights (QDQ: int8
    activations per tensor, int4 weights per output channel, no reduce_range: a 4-bit product
    cannot saturate), after its `quant_pre_process`, calibrated on four random inputs; only the
    weight matmuls where the model has any (a decoder), else onnxruntime's default op types."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.inputs = iter([random_inputs(model, seed) for seed in range(1, 5)])

        def get_next(self):
            return next(self.inputs, None)

    matmuls = weight_matmuls(model)
    only = dict(op_types_to_quantize=["MatMul"], nodes_to_quantize=matmuls) if matmuls else {}
    onnx.save(model, f"{directory}/float.onnx")
    quant_pre_process(f"{directory}/float.onnx", f"{directory}/pre.onnx")
    quantize_static(f"{directory}/pre.onnx", f"{directory}/int4.onnx", Calibration(), per_channel=True,
                    reduce_range=False, activation_type=QuantType.QInt8, weight_type=QuantType.QInt4, **only)
    return onnx.load(f"{directory}/int4.onnx")
