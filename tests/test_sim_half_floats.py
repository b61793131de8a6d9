"""bfloat16 and float16 on the simulator: the conversions, GEMM and EPILOGUE bit for bit against
numpy, and their timing, DMA bytes and energy per format.

The model (cgra_sim/half_floats.py): inputs widened exactly to float32, products summed in
float32 (np.matmul on the widened arrays, as the functional core computes one GEMM), the EPILOGUE's
bias and residual in the output's 16-bit format, widened, and the result rounded to nearest even
when stored. ml_dtypes (the bfloat16 numpy type JAX and TVM use) checks the rounding.
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import CommandError, cost, load_arch, preset_names, simulate
from cgra_sim.half_floats import narrow, widen
from cgra_sim.isa import (EPILOGUE_BIAS, EPILOGUE_CLIP, EPILOGUE_RELU, EPILOGUE_RESIDUAL, GEMM_ACCUMULATE, DType,
                          Op, encode)
from cgra_sim.streams import dma, matrix_dma

HALVES = ["bfloat16", "float16"]


def half_array(rng, shape, dtype, scale=1.0):
    """Random values of `dtype` as the scratchpad holds them (bfloat16: uint16 bits)."""
    return narrow(rng.standard_normal(shape).astype(np.float32) * np.float32(scale), dtype)


@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=50))
def test_bfloat16_rounds_to_nearest_even_as_ml_dtypes_does(values):
    x = np.array(values, dtype=np.float32)
    ours, theirs = narrow(x, "bfloat16"), x.astype(ml_dtypes.bfloat16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(ours[~nan], theirs.view(np.uint16)[~nan])
    assert np.isnan(widen(ours[nan], "bfloat16")).all()
    np.testing.assert_array_equal(widen(ours, "bfloat16")[~nan], theirs.astype(np.float32)[~nan])


def test_the_rounding_cases():
    one = 0x3F800000
    ties = np.array([one + 0x8000, one + 0x18000, one + 0x8001, one + 0x7FFF], np.uint32).view(np.float32)
    assert list(narrow(ties, "bfloat16")) == [0x3F80, 0x3F82, 0x3F81, 0x3F80]  # even, even, up, down
    big = np.array([3.4e38, -3.4e38], np.float32)
    assert list(narrow(big, "bfloat16")) == [0x7F80, 0xFF80]  # overflow to infinity
    assert np.isinf(narrow(np.float32(70000.0), "float16"))


def _gemm_epilogue_stream(dtype, m, n, k, flags, accumulate, clip):
    """Slots 0 A, 1 B, 2 acc0 (float32), 3 bias (n,), 4 residual (m, n), 5 out (m, n) in `dtype`."""
    code, size = DType.from_name(dtype), 2
    a, b, acc = 0, 4096, 8192
    bias, res, out = acc + 4 * m * n, acc + 4 * m * n + 2 * n + 64, 16384 * 4
    records = [matrix_dma(Op.DMA_LOAD, 0, a, 0, 0, m, k, k), matrix_dma(Op.DMA_LOAD, 1, b, 0, 0, k, n, n)]
    if accumulate:
        records.append(matrix_dma(Op.DMA_LOAD, 2, acc, 0, 0, m, n, n))
    records.append(encode(Op.GEMM, flags=GEMM_ACCUMULATE if accumulate else 0, dtype=code, m=m, n=n, k=k,
                          a_addr=a, a_stride=k, b_addr=b, b_stride=n, acc_addr=acc, acc_stride=n))
    records.append(dma(Op.DMA_LOAD, 3, bias, [(n, 0, 1, 1)]))
    records.append(matrix_dma(Op.DMA_LOAD, 4, res, 0, 0, m, n, n))
    lo, hi = (int(np.float32(v).view(np.uint32)) for v in clip)
    records.append(encode(Op.EPILOGUE, flags=flags, acc_dtype=DType.FLOAT32, out_dtype=code, m=m, n=n,
                          acc_addr=acc, acc_stride=n, bias_addr=bias if flags & EPILOGUE_BIAS else 0,
                          out_addr=out, out_stride=n, residual_addr=res if flags & EPILOGUE_RESIDUAL else 0,
                          residual_stride=n if flags & EPILOGUE_RESIDUAL else 0,
                          clip_lo_bits=lo if flags & EPILOGUE_CLIP else 0,
                          clip_hi_bits=hi if flags & EPILOGUE_CLIP else 0))
    records.append(matrix_dma(Op.DMA_STORE, 5, out, 0, 0, m, n, n))
    return np.array(records, dtype=np.int64)


@given(dtype=st.sampled_from(HALVES), m=st.integers(1, 24), n=st.integers(1, 24), k=st.integers(1, 64),
       flags=st.sets(st.sampled_from([EPILOGUE_BIAS, EPILOGUE_RESIDUAL, EPILOGUE_RELU, EPILOGUE_CLIP])),
       accumulate=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_gemm_and_epilogue_are_bit_exact_to_the_model(dtype, m, n, k, flags, accumulate, seed):
    rng = np.random.default_rng(seed)
    flags = sum(flags)
    a, b = half_array(rng, (m, k), dtype), half_array(rng, (k, n), dtype)
    acc0 = rng.standard_normal((m, n)).astype(np.float32)
    bias, residual = half_array(rng, (n,), dtype), half_array(rng, (m, n), dtype)
    storage = np.uint16 if dtype == "bfloat16" else np.float16
    out = np.zeros((m, n), storage)
    clip = (-1.5, 2.0)
    stats = simulate("cgra-8x8", _gemm_epilogue_stream(dtype, m, n, k, flags, accumulate, clip),
                     [a, b, acc0, bias, residual, out])

    expected = np.matmul(widen(a, dtype), widen(b, dtype), dtype=np.float32)
    expected = expected + acc0 if accumulate else expected
    if flags & EPILOGUE_BIAS:
        expected = expected + widen(bias, dtype)
    if flags & EPILOGUE_RESIDUAL:
        expected = expected + widen(residual, dtype)
    if flags & EPILOGUE_RELU:
        expected = np.maximum(expected, np.float32(0))
    if flags & EPILOGUE_CLIP:
        expected = np.minimum(np.maximum(expected, np.float32(clip[0])), np.float32(clip[1]))
    np.testing.assert_array_equal(out, narrow(expected, dtype))
    assert stats.macs == m * n * k
    assert stats.dma_store_bytes == 2 * m * n  # two bytes an element


def _gemm_cycles(arch, dtype, m, n, k):
    size = DType.from_name(dtype).itemsize
    records = [matrix_dma(Op.DMA_LOAD, 0, 0, 0, 0, m, k, k), matrix_dma(Op.DMA_LOAD, 1, m * k * size, 0, 0, k, n, n),
               encode(Op.GEMM, dtype=DType.from_name(dtype), m=m, n=n, k=k, a_addr=0, a_stride=k,
                      b_addr=m * k * size, b_stride=n, acc_addr=(m + n) * k * size, acc_stride=n)]
    rng = np.random.default_rng(0)
    tensors = [half_array(rng, (m, k), dtype), half_array(rng, (k, n), dtype)] if dtype in HALVES else \
        [rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)]
    return simulate(arch, np.array(records, dtype=np.int64), tensors)


@pytest.mark.parametrize("arch_name", preset_names())
def test_a_16_bit_gemm_takes_the_cycles_its_macs_per_pe_say_and_half_the_bytes(arch_name):
    arch = load_arch(arch_name)
    m, n, k = arch.rows, arch.cols, 256
    f32 = _gemm_cycles(arch, "float32", m, n, k)
    for dtype in HALVES:
        half = _gemm_cycles(arch, dtype, m, n, k)
        assert half.dma_load_bytes * 2 == f32.dma_load_bytes
        steady = {d: cost.gemm_steady_cycles(arch, m, n, k, d) for d in ("float32", dtype)}
        assert steady[dtype] * arch.macs_per_pe[dtype] == steady["float32"] * arch.macs_per_pe["float32"]
        assert half.busy_cycles["compute"] < f32.busy_cycles["compute"]
        assert half.energy_breakdown["mac"] == pytest.approx(m * n * k * arch.energy["mac"][dtype])
        assert half.energy_breakdown["mac"] < f32.energy_breakdown["mac"]


def test_a_chip_without_the_format_and_the_vector_unit_refuse_it():
    arch = load_arch("cgra-8x8")
    no_bf16 = arch.__class__.from_dict({**arch.to_dict(), "macs_per_pe": {"float32": 1, "int8": 1},
                                        "energy": None, "area": None})
    with pytest.raises(CommandError, match="has no bfloat16 MACs"):
        _gemm_cycles(no_bf16, "bfloat16", 4, 4, 4)
    fill = encode(Op.FILL, dtype=DType.BFLOAT16, addr=0, rows=1, cols=4, stride=4)
    with pytest.raises(CommandError, match="dtype code 4 is not allowed"):
        simulate(arch, np.array([fill]), [])
    bad = encode(Op.EPILOGUE, acc_dtype=DType.INT32, out_dtype=DType.BFLOAT16, m=1, n=1)
    with pytest.raises(CommandError, match="out_dtype code 4 is not allowed"):
        simulate(arch, np.array([bad]), [])
