"""The simulator's timing layer, one command and one queue at a time: closed forms for DMA, GEMM
and vector commands, configuration loads and pipeline fill, the scoreboard's ordering and the
cycle limit.

The closed forms are derived here from the model in docs/simulator.md for stall-free cases. The
rest of the timing tests: test_sim_timing_bounds.py (the roofline bound, overlap and
monotonicity on random tiled-GEMM streams), _stalls.py (busy, stall and idle per unit),
_depthwise.py, _banks.py (scratchpad bank conflicts); their helpers in tests/timing_cases.py.
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import CycleLimitExceeded, load_arch, simulate, streams
from cgra_sim.isa import EPILOGUE_CLIP, EPILOGUE_RELU, EPILOGUE_RESIDUAL, DType, Op, encode
from cgra_sim.scoreboard import Scoreboard
from timing_cases import (PRESETS, ceil_div, dma_cycles, durations, gemm, gemm_cycles, gemm_operands, load,
    run, store, transfer_cycles)


@given(arch=st.sampled_from(PRESETS), rows=st.integers(1, 40), cols=st.integers(1, 40),
       dtype=st.sampled_from(["int8", "int32", "float32"]), halo=st.booleans())
def test_single_dma_takes_latency_plus_transfer(arch, rows, cols, dtype, halo):
    tensor, out = np.ones((rows, cols), dtype), np.zeros((rows, cols), dtype)
    pad = int(halo)
    box = [(rows + 2 * pad, 0, 1, cols + 2 * pad), (cols + 2 * pad, 1, 1, 1)]
    interior = (pad * (cols + 2 * pad) + pad) * tensor.itemsize  # element (pad, pad) of the box
    records = [streams.dma(Op.DMA_LOAD, 0, 0, box, origin=(-pad, -pad), pad_lo=(pad, pad),
                           pad_hi=(pad, pad)),
               streams.matrix_dma(Op.DMA_STORE, 1, interior, 0, 0, rows, cols, cols + 2 * pad)]
    stats, timeline = run(arch, records, [tensor, out])

    box_bytes = (rows + 2 * pad) * (cols + 2 * pad) * tensor.itemsize
    load_end = dma_cycles(arch, box_bytes)
    assert list(timeline.starts) == [0, load_end]  # the store waits for the data (read after write)
    assert durations(timeline) == [load_end, dma_cycles(arch, tensor.nbytes)]
    assert stats.cycles == load_end + dma_cycles(arch, tensor.nbytes)
    assert (stats.dma_load_bytes, stats.dma_load_box_bytes) == (tensor.nbytes, box_bytes)
    np.testing.assert_array_equal(out, tensor)


@given(arch=st.sampled_from(PRESETS), m=st.integers(1, 64), n=st.integers(1, 64), k=st.integers(1, 64),
       dtype=st.sampled_from(["int8", "float32"]), macs_per_pe=st.integers(1, 4))
def test_single_gemm_pays_config_fill_and_folds(arch, m, n, k, dtype, macs_per_pe):
    arch = dataclasses.replace(arch, macs_per_pe={**arch.macs_per_pe, dtype: macs_per_pe})
    size = np.dtype(dtype).itemsize
    a, b = np.ones((m, k), dtype), np.ones((k, n), dtype)
    records = [load(0, 0, m, k), load(1, m * k * size, k, n),
               gemm(dtype, m, n, k, 0, m * k * size, (m * k + k * n) * size)]
    stats, timeline = run(arch, records, [a, b])

    # The second load starts when the first has streamed; both latencies overlap. The
    # configuration loads while they arrive: the operands enter when both are in.
    transfers = transfer_cycles(arch, a.nbytes) + transfer_cycles(arch, b.nbytes)
    loads_end = arch.dma_latency + transfers
    assert timeline.starts[2] == max(0, loads_end - arch.config_load_cycles)
    assert durations(timeline)[2] == gemm_cycles(arch, m, n, k, dtype)
    assert stats.cycles == max(loads_end, arch.config_load_cycles) + gemm_cycles(arch, m, n, k, dtype, config=False)
    assert stats.busy_cycles == {"load": transfers, "compute": gemm_cycles(arch, m, n, k, dtype),
                                 "store": 0, "vector": 0}
    assert stats.config_loads == 1


@pytest.mark.parametrize("arch", PRESETS, ids=lambda a: a.name)
@pytest.mark.parametrize("accumulate", [False, True])
def test_back_to_back_gemms_pay_fill_and_config_once(arch, accumulate):
    m, n, k = 2 * arch.rows, arch.cols, 40
    records, tensors, a, b, acc1, acc2 = gemm_operands("int8", m, n, k)
    second_acc = acc1 if accumulate else acc2
    records += [gemm("int8", m, n, k, a, b, acc1), gemm("int8", m, n, k, a, b, second_acc, accumulate)]
    stats, timeline = run(arch, records, tensors)

    assert timeline.starts[3] == timeline.ends[2]
    assert durations(timeline)[2:] == [gemm_cycles(arch, m, n, k, "int8"),
                                       gemm_cycles(arch, m, n, k, "int8", config=False, fill=False)]
    assert stats.config_loads == 1


@pytest.mark.parametrize("contexts", [1, 32])
def test_compute_queue_reloads_config_only_on_a_dtype_change(contexts):
    """A configuration loads once per dtype; back to an earlier one it is still in the context
    memory (32 contexts per PE, the presets'), unless one context holds only one (contexts=1)."""
    arch = load_arch("cgra-8x8")
    arch = dataclasses.replace(arch, fabric={**arch.fabric, "context_depth": contexts})
    m, n, k = 8, 8, 16
    int8_ops, int8_tensors, a8, b8, acc, _ = gemm_operands("int8", m, n, k)
    f32 = [streams.dma(Op.DMA_LOAD, 2, 8192, [(m * k + k * n, 0, 1, 1)])]  # A then B, float32
    a32, b32, acc32 = 8192, 8192 + 4 * m * k, 8192 + 4 * (m * k + k * n)
    records = f32 + int8_ops + [  # the first GEMM waits for every load
        gemm("int8", m, n, k, a8, b8, acc),
        encode(Op.EPILOGUE, flags=EPILOGUE_RELU, acc_dtype=DType.INT32, out_dtype=DType.INT32, m=m,
               n=n, acc_addr=acc, acc_stride=n, out_addr=acc, out_stride=n),
        gemm("int8", m, n, k, a8, b8, acc),  # after a vector op: fill again, same configuration
        gemm("float32", m, n, k, a32, b32, acc32),  # new dtype: configuration and fill
        gemm("int8", m, n, k, a8, b8, acc),  # and back
    ]
    stats, timeline = run(arch, records, int8_tensors + [np.ones(m * k + k * n, np.float32)])

    assert durations(timeline)[3:] == [
        gemm_cycles(arch, m, n, k, "int8"), ceil_div(m * n, arch.vector_lanes) + 2,
        gemm_cycles(arch, m, n, k, "int8", config=False), gemm_cycles(arch, m, n, k, "float32"),
        gemm_cycles(arch, m, n, k, "int8", config=contexts == 1)]
    assert list(timeline.starts[4:]) == list(timeline.ends[3:-1])  # no stalls on the queue
    assert stats.config_loads == (3 if contexts == 1 else 2)


def test_gemm_after_a_bubble_pays_fill_again():
    arch = load_arch("cgra-8x8")
    m, n, k = 8, 8, 8
    records, tensors, a, b, acc1, acc2 = gemm_operands("int8", m, n, k)
    b2 = 16384
    records += [gemm("int8", m, n, k, a, b, acc1), load(2, b2, k, 64 * n),  # long load
                gemm("int8", m, n, k, a, b2, acc2, b_stride=64 * n)]
    stats, timeline = run(arch, records, tensors + [np.ones((k, 64 * n), np.int8)])

    assert timeline.starts[4] == timeline.ends[3] > timeline.ends[2]
    assert durations(timeline)[4] == gemm_cycles(arch, m, n, k, "int8", config=False)


def test_operand_arriving_during_the_previous_drain_hides_part_of_the_fill():
    arch = load_arch("cgra-8x8")
    m, n, k1, k2 = 8, 8, 20, 16
    records, tensors, a, b, acc1, acc2 = gemm_operands("int8", m, n, k1)
    fill = m + n - 2
    # A filler load on the load queue delays B2 so that it lands in the middle of the drain.
    filler = (k1 + fill // 2 - transfer_cycles(arch, k2 * n)) * arch.dma_bytes_per_cycle
    b2, spare = 16384, 32768
    records += [gemm("int8", m, n, k1, a, b, acc1), streams.dma(Op.DMA_LOAD, 3, spare, [(filler, 0, 1, 1)]),
                load(2, b2, k2, n),
                encode(Op.GEMM, dtype=DType.INT8, m=m, n=n, k=k2, a_addr=a, a_stride=k1,
                       b_addr=b2, b_stride=n, acc_addr=acc2, acc_stride=n)]
    _, timeline = run(arch, records, tensors + [np.ones((k2, n), np.int8), np.ones(filler, np.int8)])

    stream_end = timeline.ends[2] - fill  # the first GEMM's operands are all in
    ready = timeline.ends[4]  # B2 arrives during the first GEMM's drain
    assert stream_end < ready < timeline.ends[2]
    assert timeline.starts[5] == timeline.ends[2]
    assert durations(timeline)[5] == k2 + fill - (timeline.ends[2] - ready)


def test_a_faster_gemm_never_delays_the_next_one():
    # Found by Hypothesis against a rule that skipped the fill only when a GEMM started on the
    # exact cycle the previous one ended: there, a faster first GEMM made the second pay its fill.
    arch = load_arch("cgra-16x16")
    records = streams.tiled_gemm(arch, 17, 17, 12, "int8", tile=(17, 17, 11))
    faster = dataclasses.replace(arch, macs_per_pe={"int8": 2, "float32": 2})

    def tensors():
        return [np.ones((17, 12), np.int8), np.ones((12, 17), np.int8), np.zeros((17, 17), np.int32)]
    assert simulate(faster, records, tensors()).cycles <= simulate(arch, records, tensors()).cycles


@given(arch=st.sampled_from(PRESETS), rows=st.integers(1, 50), cols=st.integers(1, 50),
       op=st.sampled_from(["fill", "epilogue"]))
def test_vector_unit_commands_take_elements_over_lanes_plus_two(arch, rows, cols, op):
    records = [encode(Op.FILL, dtype=DType.INT32, rows=rows, cols=cols, stride=cols, value_bits=3)]
    if op == "epilogue":
        records.append(encode(Op.EPILOGUE, acc_dtype=DType.INT32, out_dtype=DType.INT32, m=rows,
                              n=cols, acc_stride=cols, out_stride=cols))
    stats, timeline = run(arch, records, [])
    assert durations(timeline) == [ceil_div(rows * cols, arch.vector_lanes) + 2] * len(records)
    assert stats.cycles == sum(durations(timeline))


@given(arch=st.sampled_from(PRESETS), rows=st.integers(1, 50), cols=st.integers(1, 50),
       clip=st.booleans())
def test_a_residual_epilogue_streams_two_tiles_and_clip_is_free(arch, rows, cols, clip):
    """The residual tile goes through the vector unit's read port after the accumulator."""
    fill = encode(Op.FILL, dtype=DType.INT32, rows=rows, cols=cols, stride=cols, value_bits=3)
    epilogue = encode(Op.EPILOGUE, flags=EPILOGUE_RESIDUAL | (EPILOGUE_CLIP if clip else 0),
                      acc_dtype=DType.INT32, out_dtype=DType.INT32, m=rows, n=cols, acc_stride=cols,
                      out_stride=cols, residual_stride=cols, clip_hi_bits=6 if clip else 0)
    _, timeline = run(arch, [fill, epilogue], [])
    assert durations(timeline)[1] == ceil_div(2 * rows * cols, arch.vector_lanes) + 2


def test_scoreboard_orders_commands_across_queues():
    arch = load_arch("cgra-8x8")
    m, n, k = 8, 8, 64
    records, tensors, a, b, acc, _ = gemm_operands("int8", m, n, k)
    free = 32768
    out = np.zeros((m, n), np.int32)
    records += [gemm("int8", m, n, k, a, b, acc),
                load(0, free, m, k),  # 3: independent: overlaps the GEMM
                load(0, a, m, k),  # 4: overwrites A: waits for the GEMM to read it (WAR)
                store(2, acc, m, n),  # 5: reads the result: waits for the GEMM (RAW)
                streams.dma(Op.DMA_LOAD, 3, acc, [(m * n, 0, 1, 1)])]  # 6: overwrites acc (WAW, WAR)
    _, timeline = run(arch, records, tensors + [out, np.ones(m * n, np.int32)])
    starts, ends = timeline.starts, timeline.ends

    assert starts[3] == starts[1] + transfer_cycles(arch, k * n) < ends[2]
    assert starts[4] == ends[2]
    assert starts[5] == ends[2]
    # 6 waits for the store to read acc (WAR); the load queue itself frees once 4 has streamed.
    assert starts[6] == max(starts[4] + transfer_cycles(arch, m * k), ends[5])
    np.testing.assert_array_equal(out, k)


@given(st.lists(st.tuples(st.integers(0, 63), st.integers(1, 16), st.booleans(), st.integers(0, 50),
                          st.integers(0, 3)), max_size=40))
def test_scoreboard_matches_a_per_byte_reference(accesses):
    board = Scoreboard(64)
    write_end, writer, read_end = np.zeros(64, np.int64), np.full(64, -1), np.zeros(64, np.int64)
    for index, (lo, length, is_write, duration, forwarded) in enumerate(accesses):
        hi = min(64, lo + length)
        forward = (index - 1, forwarded) if forwarded else None  # the previous writer, early
        written = write_end[lo:hi].copy()
        if forward:
            written[writer[lo:hi] == index - 1] = forwarded
        if is_write:
            ready = board.write_ready(lo, hi, forward)
            assert ready == max(written.max(), read_end[lo:hi].max())
            board.record_write(lo, hi, ready + duration, index)
            write_end[lo:hi], writer[lo:hi], read_end[lo:hi] = ready + duration, index, 0
        else:
            ready = board.read_ready(lo, hi, forward)
            assert ready == written.max()
            board.record_read(lo, hi, ready + duration)
            read_end[lo:hi] = np.maximum(read_end[lo:hi], ready + duration)


def test_cycle_limit_names_the_command_and_leaves_tensors_alone():
    arch = load_arch("cgra-8x8")
    src, out = np.ones((1, 1024), np.int8), np.zeros((1, 1024), np.int8)
    records = np.array([load(0, 0, 1, 1024), store(1, 0, 1, 1024)])
    limit = dma_cycles(arch, 1024) + 10
    with pytest.raises(CycleLimitExceeded, match=r"command 1 \(DMA_STORE\)") as info:
        simulate(arch, records, [src, out], max_cycles=limit)
    assert info.value.index == 1 and info.value.limit == limit
    assert not out.any()
