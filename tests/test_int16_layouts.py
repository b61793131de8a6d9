"""int16 max pools and flattens between QDQ tensors run on the int16 tensors (normalise/qlayouts16.py),
the pool on the NPU, bit-exact to onnxruntime (whose float path gives the same values: the
rewrite is exact)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

import npu_backend


def _model(same_scale: bool, padded: bool = False):
    """x -> Q -> DQ -> MaxPool 2x2 -> Q -> DQ -> Flatten -> Q (int16 all), every Q an output."""
    s0, z0 = 0.01, 3
    s1, z1 = (s0, z0) if same_scale else (0.013, -40)
    inits = [helper.make_tensor(n, TensorProto.FLOAT, [], [v]) for n, v in (("s0", s0), ("s1", s1))]
    inits += [helper.make_tensor(n, TensorProto.INT16, [], [v]) for n, v in (("z0", z0), ("z1", z1))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q0"]),
             helper.make_node("DequantizeLinear", ["q0", "s0", "z0"], ["d0"]),
             helper.make_node("MaxPool", ["d0"], ["p"], **(dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
                                                            if padded else dict(kernel_shape=[2, 2], strides=[2, 2]))),
             helper.make_node("QuantizeLinear", ["p", "s1", "z1"], ["q1"]),
             helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["d1"]),
             helper.make_node("Flatten", ["d1"], ["f"]),
             helper.make_node("QuantizeLinear", ["f", "s1", "z1"], ["q2"])]
    outputs = [helper.make_tensor_value_info("q1", TensorProto.INT16, None),
               helper.make_tensor_value_info("q2", TensorProto.INT16, None)]
    graph = helper.make_graph(nodes, "pool16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("same_scale, padded", [(True, False), (False, False), (True, True)])
def test_int16_max_pool_and_flatten_run_on_int16_equal_to_onnxruntime(same_scale, padded):
    """The max pool on the NPU (POOL takes int16 since stream v11; its padding int16's lowest value)."""
    model = _model(same_scale, padded)
    placements = npu_backend.explain(npu_backend.from_onnx(model))
    assert [p.where for p in placements if p.op == "nn.max_pool2d"] == ["npu"]
    mod = npu_backend.from_onnx(model)
    ops = [p.op for p in npu_backend.explain(mod)]
    # The pool and the flatten read the int16 tensor; another scale requantises the pooled one.
    assert ops[:2] == ["quantize", "nn.max_pool2d"] and ops.count("dequantize") == (0 if same_scale else 1), ops
    x = np.random.default_rng(1).normal(-200, 50, (1, 4, 8, 8)).astype(np.float32)  # mostly negative
    got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(x))
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for out, ref in zip(got, want):
        assert out.numpy().dtype == np.int16 and np.array_equal(out.numpy(), ref)
