"""cgra_sim.cost, the closed forms the compiler's tile searches price tiles with, against the
simulator: a lone command's simulated duration is exactly what cost.py says it costs, so the
compiler's estimates and the simulator cannot drift apart (one of four estimators once did)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import cost, load_arch, preset_names, simulate_detailed, streams
from cgra_sim.isa import EPILOGUE_RESIDUAL, POOL_AVERAGE, DType, EltwiseFunc, Op, encode

PRESETS = [load_arch(name) for name in preset_names()]
#: A chip whose scratchpad cannot feed its PE array (2 banks of 4 bytes for a 16 x 16 array):
#: every GEMM wider than 8 lanes is bandwidth-bound.
NARROW = dataclasses.replace(load_arch("cgra-16x16"), spad_banks=2, bank_width_bytes=4)


def _durations(arch, records, tensors=()):
    timeline = simulate_detailed(arch, np.array(records, dtype=np.int64), list(tensors)).timeline
    return list(timeline.ends - timeline.starts)


def _loaded(arch, commands, operands):
    """The durations of `commands` after DMA loads write their operands: (address, 2-D array)
    pairs, each array loaded from its own host tensor (the simulator refuses a read of
    scratchpad bytes nothing wrote)."""
    loads = [streams.matrix_dma(Op.DMA_LOAD, slot, addr, 0, 0, *array.shape, array.shape[1])
             for slot, (addr, array) in enumerate(operands)]
    return _durations(arch, loads + commands, [array for _, array in operands])[len(loads):]


@given(arch=st.sampled_from(PRESETS), rows=st.integers(1, 40), cols=st.integers(1, 40),
       dtype=st.sampled_from(["int8", "int32", "float32"]))
def test_a_dma_costs_its_latency_and_transfer(arch, rows, cols, dtype):
    tensor = np.ones((rows, cols), dtype)
    (duration,) = _durations(arch, [streams.matrix_dma(Op.DMA_LOAD, 0, 0, 0, 0, rows, cols, cols)], [tensor])
    assert duration == cost.dma_cycles(arch, tensor.nbytes)


@given(arch=st.sampled_from(PRESETS + [NARROW]), m=st.integers(1, 48), n=st.integers(1, 48),
       k=st.integers(1, 48), dtype=st.sampled_from(["int8", "float32"]))
def test_a_lone_gemm_costs_configuration_fill_and_steady_stream(arch, m, n, k, dtype):
    """Operands laid out one bank word per row start (strides a multiple of the banks' period
    plus one word), so the bank slowdown is the bandwidth term only."""
    size = np.dtype(dtype).itemsize
    gemm = encode(Op.GEMM, dtype=DType.from_name(dtype), m=m, n=n, k=k, a_addr=0, a_stride=k, b_addr=m * k * size,
                  b_stride=n, acc_addr=-(-(m * k + k * n) * size // 64) * 64, acc_stride=n)
    (duration,) = _loaded(arch, [gemm], [(0, np.ones((m, k), dtype)), (m * k * size, np.ones((k, n), dtype))])
    from cgra_sim.command_cycles import gemm_bank_slowdown
    from cgra_sim.decode import decode_stream
    (decoded,) = decode_stream(arch, np.array([gemm], dtype=np.int64), [])
    assert duration == arch.config_load_cycles + cost.gemm_fill_cycles(arch, m, n) + \
        cost.gemm_steady_cycles(arch, m, n, k, dtype, gemm_bank_slowdown(arch, decoded))


def test_the_tile_search_pays_a_narrow_scratchpads_bandwidth():
    """cost.gemm_steady_cycles of a tile's sizes alone (what the tile search calls) includes
    the bandwidth bound: (16 + 16) int8 operands a cycle from 8 bytes a cycle is 4x slower."""
    folds = math.ceil(64 / NARROW.macs_per_pe["int8"])
    assert cost.gemm_steady_cycles(NARROW, 16, 16, 64, "int8") == 4 * folds
    assert cost.gemm_steady_cycles(load_arch("cgra-16x16"), 16, 16, 64, "int8") == folds


def test_packed_int8_macs_take_a_quarter_of_the_steps_while_the_banks_keep_up():
    """Four int8 MACs a PE (docs/hardware-description.md, "What each number format costs"): a
    GEMM takes ceil(k / 4) steps a fold, its (rows + cols) x 4 int8 operands a cycle are the
    scratchpad's bytes a cycle on every preset; eight would need twice those and take twice."""
    for base in PRESETS:
        packed = dataclasses.replace(base, macs_per_pe={"float32": 1, "int8": 4})
        eight = dataclasses.replace(base, macs_per_pe={"float32": 1, "int8": 8})
        rows, cols = base.rows, base.cols
        assert cost.gemm_steady_cycles(packed, rows, cols, 66, "int8") == 17
        assert cost.gemm_steady_cycles(eight, rows, cols, 64, "int8") == 2 * 8
        assert cost.gemm_steady_cycles(packed, rows, cols, 66, "float32") == cost.gemm_steady_cycles(
            base, rows, cols, 66, "float32")
        assert cost.depthwise_compute_cycles(packed, rows, cols, 9, "int8") == 3


@given(arch=st.sampled_from(PRESETS), rows=st.integers(1, 50), cols=st.integers(1, 50), residual=st.booleans())
def test_fill_and_epilogue_cost_their_tiles_over_the_lanes(arch, rows, cols, residual):
    fill = encode(Op.FILL, dtype=DType.INT32, rows=rows, cols=cols, stride=cols, value_bits=3)
    epilogue = encode(Op.EPILOGUE, flags=EPILOGUE_RESIDUAL if residual else 0, acc_dtype=DType.INT32,
                      out_dtype=DType.INT32, m=rows, n=cols, acc_stride=cols, out_stride=cols,
                      residual_addr=rows * cols * 4 if residual else 0, residual_stride=cols if residual else 0)
    res = [(rows * cols * 4, np.ones((rows, cols), "int32"))] if residual else []
    durations = _loaded(arch, [fill, epilogue], res)
    assert durations == [cost.vector_cycles(arch, rows, cols), cost.vector_cycles(arch, rows, cols, 1 + residual)]


@given(arch=st.sampled_from(PRESETS), oh=st.integers(1, 5), ow=st.integers(1, 5), n=st.integers(1, 16),
       kh=st.integers(1, 3), kw=st.integers(1, 3), average=st.booleans())
def test_a_pool_costs_every_tap_over_the_lanes(arch, oh, ow, n, kh, kw, average):
    in_h, in_w = oh + kh - 1, ow + kw - 1
    pool = encode(Op.POOL, flags=POOL_AVERAGE if average else 0, dtype=DType.FLOAT32, oh=oh, ow=ow, n=n, kh=kh,
                  kw=kw, a_addr=0, a_row_stride=in_w * n, a_col_stride=n, stride_y=1, stride_x=1, dilation_y=1,
                  dilation_x=1, out_addr=-(-in_h * in_w * n * 4 // 64) * 64, out_y_stride=ow * n, out_x_stride=n,
                  valid_y_hi=in_h, valid_x_hi=in_w, **({"count_y_hi": in_h, "count_x_hi": in_w} if average else {}))
    window = np.ones((in_h * in_w, n), "float32")
    assert _loaded(arch, [pool], [(0, window)]) == [cost.pool_cycles(arch, oh * ow * n * kh * kw)]


@given(arch=st.sampled_from(PRESETS), rows=st.integers(1, 30), cols=st.integers(1, 30),
       a_full=st.tuples(st.booleans(), st.booleans()), b_full=st.tuples(st.booleans(), st.booleans()))
def test_an_eltwise_costs_the_larger_of_its_outputs_and_reads(arch, rows, cols, a_full, b_full):
    eltwise = encode(Op.ELTWISE, func=EltwiseFunc.ADD, dtype=DType.FLOAT32, rows=rows, cols=cols, a_addr=0,
                     a_row_stride=cols if a_full[0] else 0, a_col_stride=1 if a_full[1] else 0,
                     b_addr=rows * cols * 4, b_row_stride=cols if b_full[0] else 0,
                     b_col_stride=1 if b_full[1] else 0, out_addr=2 * rows * cols * 4, out_stride=cols)
    reads = cost.eltwise_operand_reads(rows, cols, *a_full) + cost.eltwise_operand_reads(rows, cols, *b_full)
    operands = [(0, np.ones((rows, cols), "float32")), (rows * cols * 4, np.ones((rows, cols), "float32"))]
    assert _loaded(arch, [eltwise], operands) == [cost.eltwise_cycles(arch, rows * cols, reads)]


def _time_one(arch, record):
    """(duration, busy cycles) of a stream of `record` alone, decoded and timed without the
    dataflow check (a lone command reads bytes nothing wrote; timing never looks at them)."""
    from cgra_sim.decode import as_records, check_tensors, decode_stream
    from cgra_sim.timing import time_commands

    timeline = time_commands(arch, decode_stream(arch, as_records([record]), check_tensors([])))
    return int(timeline.ends[0] - timeline.starts[0]), int(timeline.occupancy[0])


@given(arch=st.sampled_from(PRESETS + [NARROW]), dtype=st.sampled_from(["int8", "float32"]),
       oh=st.integers(1, 8), ow=st.integers(1, 8), n=st.integers(1, 24), kh=st.integers(1, 4),
       kw=st.integers(1, 4), stride=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       pixel_pad=st.integers(0, 3), accumulate=st.booleans(), gap=st.integers(0, 63))
def test_a_depthwise_costs_configuration_latency_and_its_traffic_or_folds(
        arch, dtype, oh, ow, n, kh, kw, stride, pixel_pad, accumulate, gap):
    """A window of input pixels `n + pixel_pad` elements apart (a pad can put one beat's pixels
    in one bank) at any byte alignment: the steady stream is the larger of the PE array's folds
    and the scratchpad traffic (the window's span once, stretched by its bank slowdown, the
    weights once, the accumulator written, and read when accumulating)."""
    from cgra_sim.banks import beat_slowdown
    from cgra_sim.isa import GEMM_ACCUMULATE

    size, (sy, sx), pixel = np.dtype(dtype).itemsize, stride, n + pixel_pad
    in_h, in_w = (oh - 1) * sy + kh, (ow - 1) * sx + kw
    a_y, a_x, a_ry, a_rx = sy * in_w * pixel, sx * pixel, in_w * pixel, pixel
    a = gap
    b = a + in_h * in_w * pixel * size
    acc = b + kh * kw * n * size
    record = encode(Op.DEPTHWISE, flags=GEMM_ACCUMULATE if accumulate else 0, dtype=DType.from_name(dtype),
                    oh=oh, ow=ow, n=n, kh=kh, kw=kw, a_addr=a, a_y_stride=a_y, a_x_stride=a_x,
                    a_ry_stride=a_ry, a_rx_stride=a_rx, b_addr=b, b_ry_stride=kw * n, b_rx_stride=n,
                    acc_addr=acc, acc_y_stride=ow * n, acc_x_stride=n)
    width = arch.spad_banks * arch.bank_width_bytes
    span = ((oh - 1) * a_y + (ow - 1) * a_x + (kh - 1) * a_ry + (kw - 1) * a_rx + n) * size
    window = span * beat_slowdown(width, (ow, n), (a_x * size, size), size, a, arch.spad_banks,
                                  arch.bank_width_bytes)
    acc_bytes = oh * ow * n * 4 * (2 if accumulate else 1)
    traffic = window + kh * kw * n * size + acc_bytes
    expected = arch.config_load_cycles + cost.depthwise_fill_cycles(arch, dtype) + \
        cost.depthwise_steady_cycles(arch, oh * ow, n, kh * kw, dtype, traffic)
    assert _time_one(arch, record) == (expected, expected)
    folds = cost.depthwise_compute_cycles(arch, oh * ow, n, kh * kw, dtype)
    assert expected - arch.config_load_cycles - cost.depthwise_fill_cycles(arch, dtype) >= folds
