"""The int8 YOLO against onnxruntime's two ways of running a QDQ model (issue 37 item 0).

bench_quantized.py showed the ORT-quantized yolo_v8n (int8 activations and weights, per channel)
2.6e-2 from onnxruntime on cgra, 0.0 on stock llvm. Not an op of ours: onnxruntime on x86 fuses QDQ
layers with int8 (not uint8) activations into its integer kernels (QLinearConv, QLinearAdd,
QLinearSigmoid, QLinearMul, QLinearConcat) only with the session option
`session.qdqisint8allowed` = 1 (or on Arm); by default it runs 29 of the 30 convs, every add,
sigmoid and multiply as float DequantizeLinear -> op -> QuantizeLinear, which is what stock llvm
computes too. The two differ by a rounding step here and there, and the steps grow through the
layers: 330 of the 576 outputs, by 1-3 output steps. The normalise stage writes the integer
kernels' arithmetic (its QLinearAdd too: dropping it, the lookups or the int8 layouts changes
nothing; computing the convs as float again gives 0.0), so the NPU's result is onnxruntime's
integer result bit for bit: this test keeps the input that showed the difference.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import tvm
from tvm import relax

import npu_backend
import zoo_models
from qdq_models import onnxruntime_quantized


def _integer_session(model):
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdqisint8allowed", "1")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def test_int8_yolo_is_onnxruntimes_integer_kernels_bit_for_bit(tmp_path):
    model = onnxruntime_quantized(zoo_models.yolo_v8n(size=64), tmp_path, "QInt8", "QInt8", per_channel=True)
    name = model.graph.input[0].name
    x = np.random.default_rng(1).normal(0, 1, (1, 3, 64, 64)).astype(np.float32)  # bench_quantized's input
    expected = _integer_session(model).run(None, {name: x})[0]
    vm = relax.VirtualMachine(npu_backend.compile(npu_backend.from_onnx(model), npu_backend.load_arch("cgra-8x8")),
                              tvm.cpu())
    with npu_backend.profile() as prof:
        got = vm["main"](tvm.runtime.tensor(x))
    np.testing.assert_array_equal(got.numpy() if hasattr(got, "numpy") else got[0].numpy(), expected)
    # its detect head's last convs dequantise in their EPILOGUE (qdq_outputs.py): no host operator
    assert prof.host_calls == [], [call.name for call in prof.host_calls]
