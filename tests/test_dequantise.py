"""The dequantising EPILOGUE (stream v13, EPILOGUE_DEQUANTISE): int32 -> requantised int8 q ->
float32(q - zp) * dscale[j], a quantized model's last QuantizeLinear -> DequantizeLinear on the NPU.

Three ways (the intrinsic registry's rule, tests/test_intrinsics.py): the intrinsic's TIR run on the
host, the command on the simulator, and numpy's model of onnxruntime's DequantizeLinear, all bit
for bit; and the decoder's refusals of a DEQUANTISE without its requantisation.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import CommandError, functional
from cgra_sim.isa import (EPILOGUE_BIAS, EPILOGUE_DEQUANTISE, EPILOGUE_RELU, EPILOGUE_REQUANTISE, STREAM_VERSION,
                          DType, Op, encode)
from npu_backend.kernels.intrinsics import INTRINSICS
from three_ways import extern_name, Stream, tir_reference


def _operands(rng, rows, cols, ties, per_tensor):
    acc = rng.integers(-40000, 40000, (rows, cols)).astype(np.int32)
    bias = rng.integers(-5000, 5000, cols).astype(np.int32)
    multiplier = (2.0 ** -rng.integers(6, 10, cols) if ties else rng.uniform(1e-4, 5e-3, cols)).astype(np.float32)
    dscale = np.full(cols, rng.uniform(1e-3, 0.2), np.float32) if per_tensor else \
        rng.uniform(1e-3, 0.2, cols).astype(np.float32)
    return acc, bias, multiplier, dscale


def _onnxruntime_model(acc, bias, multiplier, dscale, zero_point, relu):
    """QLinearMatMul / QLinearConv's requantisation, then DequantizeLinear: numpy, step by step."""
    total = acc + bias
    if relu:
        total = np.maximum(total, 0)
    q = functional.requantise(total, multiplier[None, :], zero_point)
    return (q.astype(np.int32) - np.int32(zero_point)).astype(np.float32) * dscale[None, :]


@given(rows=st.integers(1, 16), cols=st.integers(1, 16), zero_point=st.integers(-128, 127), relu=st.booleans(),
       ties=st.booleans(), per_tensor=st.booleans(), seed=st.integers(0, 2**16))
def test_dequantising_epilogue_three_ways(rows, cols, zero_point, relu, ties, per_tensor, seed):
    rng = np.random.default_rng(seed)
    acc, bias, multiplier, dscale = _operands(rng, rows, cols, ties, per_tensor)
    scale = np.stack([multiplier, dscale], axis=1).reshape(-1)  # per channel (multiplier, scale)
    out = np.zeros((rows, cols), np.float32)
    desc, impl = INTRINSICS["epilogue"].factory(rows, cols, "int32", bias=True, relu=relu, zero_point=zero_point,
                                                dequantise=True, scope="global")
    operands = [acc, bias, scale, out]
    tir_out = tir_reference(desc, operands)[-1]
    stream = Stream(operands)
    stream.load(0, 1, 2)
    flags = EPILOGUE_BIAS | EPILOGUE_REQUANTISE | EPILOGUE_DEQUANTISE | (EPILOGUE_RELU if relu else 0)
    stream.commands.append(encode(
        Op.EPILOGUE, flags=flags, acc_dtype=int(DType.INT32), out_dtype=int(DType.FLOAT32), m=rows, n=cols,
        acc_addr=0, acc_stride=cols, bias_addr=stream.addr[1], scale_addr=stream.addr[2],
        out_zero_point=zero_point, out_addr=stream.addr[3], out_stride=cols))
    stream.store(3)
    sim_out = stream.run()[-1]
    expected = _onnxruntime_model(acc, bias, multiplier, dscale, zero_point, relu)
    np.testing.assert_array_equal(sim_out.view(np.int32), expected.view(np.int32))
    np.testing.assert_array_equal(tir_out.view(np.int32), expected.view(np.int32))
    assert extern_name(impl) == "cgra_" + Op.EPILOGUE.name.lower()


def _stream_with(flags, acc_dtype, out_dtype):
    acc, scale, out = np.zeros((2, 4), np.int32), np.ones(8, np.float32), np.zeros((2, 4), np.float32)
    stream = Stream([acc, scale, out])
    stream.load(0, 1)
    stream.commands.append(encode(
        Op.EPILOGUE, flags=flags, acc_dtype=int(acc_dtype), out_dtype=int(out_dtype), m=2, n=4, acc_addr=0,
        acc_stride=4, scale_addr=stream.addr[1], out_addr=stream.addr[2], out_stride=4))
    stream.store(2)
    return stream


@pytest.mark.parametrize("flags, acc_dtype, out_dtype, message", [
    (EPILOGUE_DEQUANTISE, DType.INT32, DType.FLOAT32, "needs EPILOGUE_REQUANTISE"),     # no requantisation
    (EPILOGUE_REQUANTISE | EPILOGUE_DEQUANTISE, DType.FLOAT32, DType.FLOAT32, "needs"),  # a float32 accumulator
    (EPILOGUE_REQUANTISE | EPILOGUE_DEQUANTISE, DType.INT32, DType.INT8, "out_dtype"),   # not a float32 output
])
def test_dequantise_needs_a_requantised_int32(flags, acc_dtype, out_dtype, message):
    with pytest.raises(CommandError, match=message):
        _stream_with(flags, acc_dtype, out_dtype).run()


def test_the_stream_version_names_the_flag():
    assert STREAM_VERSION >= 13 and EPILOGUE_DEQUANTISE == 32  # (v14: VFUNC's 16-bit dtypes)


def test_the_intrinsic_refuses_a_dequantise_without_requantisation():
    with pytest.raises(ValueError, match="dequantises"):
        INTRINSICS["epilogue"].factory(4, 4, "int32", bias=False, relu=False, dequantise=True, scope="global")
