"""A ResNet quantized by onnxruntime with int16 activations and int8 weights (normalise/qdq16.py):
every conv and the Gemm run as 16x8 NPU kernels requantising to int16. onnxruntime (1.32) runs
these layers in float32 (DequantizeLinear, float Conv, QuantizeLinear), so its int16 results are
the exact integer layer's except where its float32 sum rounds to the neighbouring step: the
test holds each layer to one step on at most 1% of its outputs (measured: 2 of 4096 on the first
conv, fed the same input)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import tvm
from tvm import relax

import npu_backend
from qdq_models import onnxruntime_quantized, with_quantized_outputs


def test_an_int16_resnet_runs_its_convs_as_16x8_kernels_within_a_step_of_onnxruntime(tmp_path):
    from onnx_models import resnet

    model = onnxruntime_quantized(resnet(size=16), tmp_path, "QInt16", "QInt8", per_channel=True)
    model, names = with_quantized_outputs(model)
    mod = npu_backend.from_onnx(model)
    heavy = [p for p in npu_backend.explain(mod) if p.op in ("nn.conv2d", "matmul")]
    assert len(heavy) == 7 and all(p.kernel.split()[0].endswith("_requant") for p in heavy), \
        npu_backend.format_placements(heavy)
    vm = relax.VirtualMachine(tvm.compile(mod, target="cgra"), tvm.cpu())
    x = np.random.default_rng(3).normal(0, 1, (1, 3, 16, 16)).astype(np.float32)
    with npu_backend.profile() as prof:
        got = {name: t.numpy() for name, t in zip(names, vm["main"](tvm.runtime.tensor(x)))}
    theirs = dict(zip(names, ort.InferenceSession(model.SerializeToString()).run(None, {"input": x})))
    first = next(n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"
                 and any(m.op_type == "Conv" and m.output[0] == n.input[0] for m in model.graph.node))
    steps = np.abs(got[first].astype(np.int64) - theirs[first].astype(np.int64))  # the same input
    assert got[first].dtype == np.int16 and steps.max() <= 1 and np.count_nonzero(steps) <= steps.size // 100
    assert len(prof.kernels) >= 7
