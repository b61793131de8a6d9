"""EPILOGUE requantisation (flag REQUANTISE) in the simulator, against a reference written here.

The reference follows onnxruntime's requantisation (MlasRequantizeOutput, used by QLinearConv,
QLinearMatMul and QGemm) element by element in plain Python: f = float32(float32(x) * scale),
Python's round (half to even), + zero point, saturated to int8. The simulator clamps before it
rounds instead of after (see functional.requantise); the two agree for every finite product.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import CommandError, load_arch, simulate
from cgra_sim.isa import (EPILOGUE_BIAS, EPILOGUE_CLIP, EPILOGUE_RELU, EPILOGUE_REQUANTISE,
                          EPILOGUE_RESIDUAL, DType, Op, encode)

from test_sim_functional import dma_record, matrix_load, matrix_store, value_bits, wrap_int32

ARCH = load_arch("cgra-8x8")


def reference_requantise(x, scale, zero_point):
    """int32 (m, n) x float32 (n,) -> int8, one element at a time."""
    out = np.empty(x.shape, np.int8)
    for (i, j), value in np.ndenumerate(x):
        product = np.float32(np.float32(value) * np.float32(scale[j]))
        out[i, j] = min(max(round(float(product)) + zero_point, -128), 127)
    return out


#: Scales that make ties (powers of two) and scales of real models (products of small floats).
def _f32(value: float) -> float:
    return float(np.float32(value))


SCALES = st.one_of(st.sampled_from([2.0 ** -e for e in range(0, 12)]),
                   st.floats(_f32(1e-6), 2.0, width=32), st.floats(_f32(1e-9), _f32(1e-3), width=32))


@st.composite
def accumulators(draw, m, n):
    """int32 tiles: small values (ties and saturation around zero) or the whole int32 range
    (where float32(x) itself rounds)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    bound = draw(st.sampled_from([300, 2**20, 2**31 - 1]))
    return rng.integers(-bound, bound, (m, n), endpoint=True, dtype=np.int64).astype(np.int32)


@given(data=st.data(), m=st.integers(1, 12), n=st.integers(1, 12), bias=st.booleans(),
       relu=st.booleans(), residual=st.booleans(), clip=st.booleans(),
       zero_point=st.integers(-128, 127), in_place=st.booleans())
def test_requantising_epilogue_matches_onnxruntime_arithmetic(data, m, n, bias, relu, residual, clip,
                                                              zero_point, in_place):
    """out = requantise(clip(relu(acc + bias + residual))); the int8 output may overwrite acc."""
    acc = data.draw(accumulators(m, n))
    bias_row, res = data.draw(accumulators(1, n))[0], data.draw(accumulators(m, n))
    scale = np.array([data.draw(SCALES) for _ in range(n)], np.float32)
    lo, hi = sorted(data.draw(st.integers(-2**31, 2**31 - 1)) for _ in range(2))
    acc_addr, bias_addr, res_addr = 0, 4 * m * n, 4 * m * n + 4 * n
    scale_addr = res_addr + 4 * m * n
    out_addr = acc_addr if in_place else scale_addr + 4 * n
    flags = EPILOGUE_REQUANTISE | (EPILOGUE_BIAS if bias else 0) | (EPILOGUE_RELU if relu else 0) | \
        (EPILOGUE_RESIDUAL if residual else 0) | (EPILOGUE_CLIP if clip else 0)
    out = np.zeros((m, n), np.int8)
    records = [matrix_load(0, acc_addr, m, n, n), dma_record(Op.DMA_LOAD, 1, bias_addr, [(n, 0, 1, 1)]),
               matrix_load(2, res_addr, m, n, n), dma_record(Op.DMA_LOAD, 3, scale_addr, [(n, 0, 1, 1)]),
               encode(Op.EPILOGUE, flags=flags, acc_dtype=DType.INT32, out_dtype=DType.INT8, m=m, n=n,
                      acc_addr=acc_addr, acc_stride=n, bias_addr=bias_addr if bias else 0,
                      out_addr=out_addr, out_stride=n, residual_addr=res_addr if residual else 0,
                      residual_stride=n if residual else 0,
                      clip_lo_bits=value_bits(lo, "int32") if clip else 0,
                      clip_hi_bits=value_bits(hi, "int32") if clip else 0,
                      scale_addr=scale_addr, out_zero_point=zero_point),
               matrix_store(4, out_addr, m, n, n)]
    simulate(ARCH, np.array(records), [acc, bias_row, res, scale, out])

    x = wrap_int32(acc.astype(np.int64) + (bias_row if bias else 0) + (res if residual else 0))
    if relu:
        x = np.maximum(x, 0)
    if clip:
        x = np.clip(x, lo, hi)
    np.testing.assert_array_equal(out, reference_requantise(x, scale, zero_point))


def test_ties_round_to_even_and_saturate():
    """x * 0.5 lands on every .5 between -4 and 4; rne, not half away from zero; then saturation."""
    x = np.array([[-7, -5, -3, -1, 1, 3, 5, 7, 2**31 - 1, -2**31]], np.int32)
    scale = np.full(x.shape[1], 0.5, np.float32)
    out = np.zeros(x.shape, np.int8)
    n = x.shape[1]
    records = [matrix_load(0, 0, 1, n, n), dma_record(Op.DMA_LOAD, 1, 64, [(n, 0, 1, 1)]),
               encode(Op.EPILOGUE, flags=EPILOGUE_REQUANTISE, acc_dtype=DType.INT32,
                      out_dtype=DType.INT8, m=1, n=n, acc_addr=0, acc_stride=n, out_addr=128,
                      out_stride=n, scale_addr=64, out_zero_point=3),
               matrix_store(2, 128, 1, n, n)]
    simulate(ARCH, np.array(records), [x, scale, out])
    # -3.5 -2.5 -1.5 -0.5 0.5 1.5 2.5 3.5 -> -4 -2 -2 0 0 2 2 4 (half away from zero: -4 -3 -2 -1 1 2 3 4)
    assert out.tolist() == [[-1, 1, 1, 3, 3, 5, 5, 7, 127, -128]]


def _requant(**fields):
    base = dict(flags=EPILOGUE_REQUANTISE, acc_dtype=DType.INT32, out_dtype=DType.INT8, m=1, n=4,
                acc_addr=0, acc_stride=4, out_addr=64, out_stride=4, scale_addr=128)
    return encode(Op.EPILOGUE, **{**base, **fields})


@pytest.mark.parametrize("record, words", [
    (_requant(out_dtype=DType.INT32), ["out_dtype code 2", "INT8=1"]),
    # (a float32 accumulator quantises to int8, stream v12; to int16 it does not)
    (_requant(acc_dtype=DType.FLOAT32, out_dtype=DType.INT16), [f"out_dtype code {int(DType.INT16)}", "INT8=1"]),
    (_requant(out_zero_point=128), ["out_zero_point 128 does not fit int8"]),
    (_requant(scale_addr=ARCH.spad_bytes - 8), ["scale", f"{ARCH.spad_bytes}-byte scratchpad"]),
    (_requant(flags=0, out_dtype=DType.INT32, scale_addr=0, out_zero_point=5),
     ["out_zero_point is 5 but flag 0x10 is off"]),
    (_requant(flags=0, out_dtype=DType.INT8, scale_addr=0), ["out_dtype code 1", "INT32=2"]),
])
def test_bad_requantisation_is_refused(record, words):
    with pytest.raises(CommandError) as err:
        simulate(ARCH, np.array([record]), [])
    message = str(err.value)
    assert "command 0" in message and "EPILOGUE" in message
    for word in words:
        assert word in message, message
