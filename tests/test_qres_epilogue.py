"""A QDQ residual add in the second conv's epilogue (kernels/gemm/qadd_epilogue.py, issue 37 item 0),
compiled with fuse_chains (the fusion's switch; without it the add is its own kernel, test 1 checks).

1. A residual block (two convs, Add [, Relu]) at random scales, zero points, shapes and operand
   orders: the add runs inside a conv kernel (no kernel of its own), and the output is the numpy
   model of onnxruntime's fixed-point QLinearAdd (normalise/qlinear.py) applied to onnxruntime's
   integer conv outputs, bit for bit; against onnxruntime's integer session at most one step where
   its AVX2 float32 QLinearAdd rounds a near-tie the other way.
2. Where both convs' int8 outputs are also read elsewhere the add stays a kernel of its own.
3. ResNet-18 quantized by onnxruntime: every residual add in a conv kernel, the output onnxruntime's
   integer kernels' bit for bit.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.qlinear import qlinear_add_parameters, qlinear_add_reference
from qdq_models import QdqGraph, with_quantized_outputs

ARCH = "cgra-4x4"


def _block(seed, channels, size, scales, zeros, relu_out, swap, reuse=False):
    """x -> conv a (QDQ sa, za) and relu(conv b) (QDQ sb, zb) -> Add(a, b) or Add(b, a) [-> Relu]
    -> QDQ (sy, zy). `reuse`: a and b are the model's outputs too (read outside the add)."""
    (sa, sb, sy), (za, zb, zy) = scales, zeros
    g = QdqGraph(seed)
    x = g.qdq("input", 0.0431, -128)
    a = g.qdq(g.conv(x, 0.0431, 3, channels), sa, za)
    b = g.qdq(g.node("Relu", [g.conv(x, 0.0431, 3, channels)]), sb, zb)
    total = g.node("Add", [b, a] if swap else [a, b])
    y = g.qdq(g.node("Relu", [total]) if relu_out else total, sy, zy)
    model = g.model("input", [1, 3, size, size], y, [1, channels, size, size])
    for name in (a, b) if reuse else ():
        model.graph.output.append(model.graph.output[0])
        model.graph.output[-1].name = name
    return model


def _integer_session(model):
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdqisint8allowed", "1")  # QLinearConv, QLinearAdd
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _run(model, x, fuse_chains=True):
    executable = npu_backend.compile(npu_backend.from_onnx(model), ARCH, fuse_chains=fuse_chains)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    with npu_backend.profile() as prof:
        got = vm["main"](tvm.runtime.tensor(x))
    return (got.numpy() if hasattr(got, "numpy") else got[0].numpy()), prof


def _add_kernels(prof) -> list:
    """The launches whose ops are the fixed-point add alone (the qlinear family's kernel)."""
    return [k for k in prof.kernels if k.source_ops[:3] == ("astype", "subtract", "multiply")]


def _fused(prof) -> list:
    """The conv kernels that end in the add (its right shift)."""
    return [k for k in prof.kernels if "nn.conv2d" in k.source_ops and "right_shift" in k.source_ops]


@settings(max_examples=10, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(channels=st.integers(2, 12), size=st.integers(3, 9),
       scales=st.tuples(*(st.floats(0.01, 0.2).map(lambda v: float(np.float32(v))) for _ in range(3))),
       zeros=st.tuples(st.integers(-128, 127), st.integers(-128, 0)), relu_out=st.booleans(), swap=st.booleans(),
       y_zero=st.integers(-128, 127), seed=st.integers(0, 2**16))
def test_a_residual_add_in_the_conv_epilogue_is_qlinear_adds_fixed_point_bit_for_bit(
        channels, size, scales, zeros, relu_out, swap, y_zero, seed):
    y_zero = -128 if relu_out else y_zero  # a relu stays an integer add only when it is the saturation
    parameters = qlinear_add_parameters(*scales)
    assume(parameters is not None)
    model = _block(seed, channels, size, scales, (*zeros, y_zero), relu_out, swap)
    x = np.random.default_rng(seed).normal(0, 1.5, (1, 3, size, size)).astype(np.float32)
    got, prof = _run(model, x)
    assert _add_kernels(prof) == [] and len(_fused(prof)) == 1
    # The numpy model of the add on onnxruntime's integer conv outputs (QuantizeLinear results).
    probe, names = with_quantized_outputs(model)
    outputs = dict(zip(names, _integer_session(probe).run(None, {"input": x})))
    quantized = [n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    a, b = outputs[quantized[1]], outputs[quantized[2]]  # conv a's, relu(conv b)'s
    shift, ma, mb = parameters
    c = qlinear_add_reference(a, zeros[0], b, zeros[1], y_zero, shift, ma, mb)
    expected = (c.astype(np.int32) - y_zero).astype(np.float32) * np.float32(scales[2])
    np.testing.assert_array_equal(got, expected)
    steps = np.rint(np.abs(got - outputs[names[0]]) / np.float32(scales[2]))
    assert steps.max() <= 1 and np.count_nonzero(steps) <= max(1, got.size // 100)


def test_without_fuse_chains_the_add_is_its_own_kernel_with_the_same_result():
    model = _block(2, 8, 6, (0.0713, 0.0387, 0.0617), (-3, -128, -128), True, False)
    x = np.random.default_rng(0).normal(0, 1.5, (1, 3, 6, 6)).astype(np.float32)
    (fused, with_chains), (alone, without) = _run(model, x), _run(model, x, fuse_chains=False)
    assert len(_fused(with_chains)) == 1 and _add_kernels(with_chains) == []
    assert _fused(without) == [] and len(_add_kernels(without)) == 1
    np.testing.assert_array_equal(fused, alone)


def test_the_add_stays_its_own_kernel_where_the_conv_outputs_are_read_elsewhere():
    scales, zeros = (0.0713, 0.0387, 0.0617), (-3, -128, -128)
    model = _block(2, 8, 6, scales, zeros, True, False, reuse=True)
    x = np.random.default_rng(0).normal(0, 1.5, (1, 3, 6, 6)).astype(np.float32)
    executable = npu_backend.compile(npu_backend.from_onnx(model), ARCH, fuse_chains=True)
    with npu_backend.profile() as prof:
        got = [t.numpy() for t in relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x))]
    assert len(_add_kernels(prof)) == 1
    session = _integer_session(model)
    for mine, theirs, scale in zip(got, session.run(None, {"input": x}), (0.0617, 0.0713, 0.0387)):
        assert np.rint(np.abs(mine - theirs) / np.float32(scale)).max() <= 1


@pytest.mark.slow
def test_resnet18_adds_run_in_conv_epilogues_bit_exact_to_onnxruntime(tmp_path):
    import onnx_models
    from qdq_models import onnxruntime_quantized

    model = onnxruntime_quantized(onnx_models.resnet18(size=32, classes=10), str(tmp_path), "QInt8", "QInt8",
                                  per_channel=True)
    x = np.random.default_rng(1).normal(0, 1, (1, 3, 32, 32)).astype(np.float32)
    got, prof = _run(model, x)
    assert _add_kernels(prof) == []
    assert len(_fused(prof)) == 8
    np.testing.assert_array_equal(got, _integer_session(model).run(None, {"input": x})[0])
