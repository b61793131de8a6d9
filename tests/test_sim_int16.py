"""int16 activations times int8 weights (16x8) on the simulator: GEMM into int64 and the
requantising EPILOGUE to int16, bit for bit against numpy, and the format's timing and energy.

The model (cgra_sim/int16.py): products and sums exact in int64; the EPILOGUE adds an int64 bias
and residual, relu, then rne(clamp(float32(x) * scale[j])) + zp to int16, each float32 step
rounded to nearest even (int8's requantisation with int16's bounds).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import CommandError, load_arch, preset_names, simulate
from cgra_sim.isa import (EPILOGUE_BIAS, EPILOGUE_RELU, EPILOGUE_REQUANTISE, EPILOGUE_RESIDUAL, GEMM_ACCUMULATE,
                          DType, Op, encode)
from cgra_sim.streams import dma, matrix_dma


def _stream(m, n, k, flags, accumulate, zero_point):
    """Slots 0 A (m, k) int16, 1 B (k, n) int8, 2 acc0 (m, n) int64, 3 bias (n,) int64, 4 residual
    (m, n) int64, 5 scale (n,) float32, 6 out (m, n) int16."""
    addrs, end = [], 0
    for size in (2 * m * k, k * n, 8 * m * n, 8 * n, 8 * m * n, 4 * n, 2 * m * n):
        addrs.append(end)
        end += -(-size // 64) * 64
    a, b, acc, bias, res, scale, out = addrs
    records = [matrix_dma(Op.DMA_LOAD, 0, a, 0, 0, m, k, k), matrix_dma(Op.DMA_LOAD, 1, b, 0, 0, k, n, n)]
    if accumulate:
        records.append(matrix_dma(Op.DMA_LOAD, 2, acc, 0, 0, m, n, n))
    records.append(encode(Op.GEMM, flags=GEMM_ACCUMULATE if accumulate else 0, dtype=DType.INT16, m=m, n=n, k=k,
                          a_addr=a, a_stride=k, b_addr=b, b_stride=n, acc_addr=acc, acc_stride=n))
    records += [dma(Op.DMA_LOAD, 3, bias, [(n, 0, 1, 1)]), matrix_dma(Op.DMA_LOAD, 4, res, 0, 0, m, n, n),
                dma(Op.DMA_LOAD, 5, scale, [(n, 0, 1, 1)])]
    records.append(encode(Op.EPILOGUE, flags=flags | EPILOGUE_REQUANTISE, acc_dtype=DType.INT64,
                          out_dtype=DType.INT16, m=m, n=n, acc_addr=acc, acc_stride=n,
                          bias_addr=bias if flags & EPILOGUE_BIAS else 0, out_addr=out, out_stride=n,
                          residual_addr=res if flags & EPILOGUE_RESIDUAL else 0,
                          residual_stride=n if flags & EPILOGUE_RESIDUAL else 0, scale_addr=scale,
                          out_zero_point=zero_point))
    records.append(matrix_dma(Op.DMA_STORE, 6, out, 0, 0, m, n, n))
    return np.array(records, dtype=np.int64)


def model(acc, bias, residual, relu, scale, zero_point):
    """The numpy model of the EPILOGUE from an int64 accumulator to int16 (docstring above)."""
    x = acc + (0 if bias is None else bias) + (0 if residual is None else residual)
    x = np.maximum(x, 0) if relu else x
    f = np.clip(x.astype(np.float32) * scale, np.float32(-32768 - zero_point), np.float32(32767 - zero_point))
    return (np.rint(f) + np.float32(zero_point)).astype(np.int16)


@given(m=st.integers(1, 20), n=st.integers(1, 20), k=st.integers(1, 300),
       flags=st.sets(st.sampled_from([EPILOGUE_BIAS, EPILOGUE_RESIDUAL, EPILOGUE_RELU])),
       accumulate=st.booleans(), zero_point=st.integers(-32768, 32767), seed=st.integers(0, 2**32 - 1))
def test_gemm16x8_and_requantise_are_bit_exact_to_numpy(m, n, k, flags, accumulate, zero_point, seed):
    rng = np.random.default_rng(seed)
    flags = sum(flags)
    a = rng.integers(-32768, 32768, (m, k), dtype=np.int16)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    acc0 = rng.integers(-2**40, 2**40, (m, n), dtype=np.int64)
    bias = rng.integers(-2**35, 2**35, (n,), dtype=np.int64)
    residual = rng.integers(-2**35, 2**35, (m, n), dtype=np.int64)
    # scales that put the results around int16's range, some saturating
    scale = (rng.uniform(0.2, 2.0, n) * 32768 / (128 * 32768 * np.sqrt(k) + 2**40 * accumulate)).astype(np.float32)
    out = np.zeros((m, n), np.int16)
    stats = simulate("cgra-8x8", _stream(m, n, k, flags, accumulate, zero_point),
                     [a, b, acc0, bias, residual, scale, out])
    acc = a.astype(np.int64) @ b.astype(np.int64) + (acc0 if accumulate else 0)
    expected = model(acc, bias if flags & EPILOGUE_BIAS else None, residual if flags & EPILOGUE_RESIDUAL else None,
                     bool(flags & EPILOGUE_RELU), scale, zero_point)
    np.testing.assert_array_equal(out, expected)
    assert stats.macs == m * n * k
    assert stats.dma_store_bytes == 2 * m * n


def _gemm(arch, dtype, m, n, k):
    """One GEMM of `dtype` inputs (int16 x int8, or int8 x int8) and its statistics."""
    a_size = DType.from_name(dtype).itemsize
    b_addr = m * k * a_size
    records = [matrix_dma(Op.DMA_LOAD, 0, 0, 0, 0, m, k, k), matrix_dma(Op.DMA_LOAD, 1, b_addr, 0, 0, k, n, n),
               encode(Op.GEMM, dtype=DType.from_name(dtype), m=m, n=n, k=k, a_addr=0, a_stride=k, b_addr=b_addr,
                      b_stride=n, acc_addr=b_addr + k * n + 64, acc_stride=n)]
    rng = np.random.default_rng(0)
    tensors = [rng.integers(-100, 100, (m, k)).astype(dtype), rng.integers(-100, 100, (k, n)).astype(np.int8)]
    return simulate(arch, np.array(records, dtype=np.int64), tensors)


@pytest.mark.parametrize("arch_name", preset_names())
def test_a_16x8_gemm_moves_twice_the_activation_bytes_and_prices_its_macs(arch_name):
    arch = load_arch(arch_name)
    m, n, k = arch.rows, arch.cols, 128
    int8, int16 = _gemm(arch, "int8", m, n, k), _gemm(arch, "int16", m, n, k)
    assert int16.dma_load_bytes == int8.dma_load_bytes + m * k  # A at two bytes, B at one
    assert int16.energy_breakdown["mac"] == pytest.approx(m * n * k * arch.energy["mac"]["int16"])
    assert arch.energy["mac"]["int8"] < arch.energy["mac"]["int16"] < arch.energy["mac"]["float32"]
    assert int16.busy_cycles["compute"] * arch.macs_per_pe["int16"] >= \
        int8.busy_cycles["compute"] * arch.macs_per_pe["int8"]


def test_int16_is_refused_where_the_hardware_has_no_16x8_mode():
    arch = load_arch("cgra-8x8")
    no_int16 = arch.__class__.from_dict({**arch.to_dict(), "macs_per_pe": {"float32": 1, "int8": 1},
                                         "energy": None, "area": None})
    with pytest.raises(CommandError, match="has no int16 MACs"):
        _gemm(no_int16, "int16", 4, 4, 4)
    fill = encode(Op.FILL, dtype=DType.INT16, addr=0, rows=1, cols=4, stride=4)
    with pytest.raises(CommandError, match="dtype code 6 is not allowed"):
        simulate(arch, np.array([fill]), [])
    depthwise = encode(Op.DEPTHWISE, dtype=DType.INT16, oh=1, ow=1, n=1, kh=1, kw=1)
    with pytest.raises(CommandError, match="DEPTHWISE has no int16 mode"):
        simulate(arch, np.array([depthwise]), [])
    wrong = encode(Op.EPILOGUE, flags=EPILOGUE_REQUANTISE, acc_dtype=DType.INT64, out_dtype=DType.INT8, m=1, n=1,
                   out_stride=1, acc_stride=1, scale_addr=64)
    with pytest.raises(CommandError, match="out_dtype code 1 is not allowed"):
        simulate(arch, np.array([wrong]), [])
