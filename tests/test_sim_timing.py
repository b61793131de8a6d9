"""The simulator's timing layer: closed forms, hazards, bounds, overlap and monotonicity.

The closed forms are derived here from the model in docs/simulator.md for stall-free cases; the
properties (cycles >= roofline bound, more bandwidth / PEs never slower, double buffering hides
loads) are checked on random tiled-GEMM streams.
"""

import dataclasses
import json
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import CycleLimitExceeded, load_arch, preset_names, simulate, simulate_detailed, streams
from cgra_sim.isa import EPILOGUE_CLIP, EPILOGUE_RELU, EPILOGUE_RESIDUAL, GEMM_ACCUMULATE, DType, Op, Unit, encode
from cgra_sim.scoreboard import Scoreboard

PRESETS = [load_arch(name) for name in preset_names()]
ACC = {"int8": "int32", "float32": "float32"}


def ceil_div(a, b):
    return -(-a // b)


def dma_cycles(arch, nbytes):
    return arch.dma_latency + transfer_cycles(arch, nbytes)


def transfer_cycles(arch, nbytes):
    """How long a DMA keeps its engine busy: the latency overlaps the next transfer."""
    return ceil_div(nbytes, arch.dma_bytes_per_cycle)


def gemm_cycles(arch, m, n, k, dtype, config=True, fill=True, a_stride=None):
    """config + fill + folds x k, the folds stretched when the banks cannot feed A's column
    (`a_stride` bytes between rows, default compact: k elements) or A and B together."""
    steady = ceil_div(m, arch.rows) * ceil_div(n, arch.cols) * ceil_div(k, arch.macs_per_pe[dtype])
    steady = ceil_div(steady * bank_slowdown_of_a(arch, m, n, dtype, a_stride or k * np.dtype(dtype).itemsize,
                                                  per_lane=Fraction(k, ceil_div(k, arch.macs_per_pe[dtype]))), 1)
    return (arch.config_load_cycles if config else 0) + \
        (min(m, arch.rows) + min(n, arch.cols) - 2 if fill else 0) + steady


def bank_slowdown_of_a(arch, m, n, dtype, a_stride, addr=0, per_lane=1):
    """The bank rule of docs/simulator.md by enumeration: the busiest bank's distinct words among
    the first words of A's min(m, rows) rows, over the W / itemsize cycles a word feeds a row;
    or A's and B's elements a cycle (`per_lane` of each row and column a step: k over its steps of MACs a PE) over
    the scratchpad's width."""
    size, width, banks = np.dtype(dtype).itemsize, arch.bank_width_bytes, arch.spad_banks
    lanes = min(m, arch.rows)
    words = {(addr + i * a_stride) // width for i in range(lanes)}
    busiest = max(sum(1 for w in words if w % banks == bank) for bank in range(banks))
    return max(Fraction(1), Fraction(busiest * size, width),
               Fraction((lanes + min(n, arch.cols)) * size * per_lane, banks * width))


def load(slot, addr, rows, cols):
    return streams.matrix_dma(Op.DMA_LOAD, slot, addr, 0, 0, rows, cols, cols)


def store(slot, addr, rows, cols):
    return streams.matrix_dma(Op.DMA_STORE, slot, addr, 0, 0, rows, cols, cols)


def gemm(dtype, m, n, k, a, b, acc, accumulate=False, b_stride=None):
    return encode(Op.GEMM, flags=GEMM_ACCUMULATE if accumulate else 0, dtype=DType.from_name(dtype),
                  m=m, n=n, k=k, a_addr=a, a_stride=k, b_addr=b, b_stride=b_stride or n,
                  acc_addr=acc, acc_stride=n)


def run(arch, records, tensors):
    result = simulate_detailed(arch, np.array(records, dtype=np.int64), tensors)
    return result.stats, result.timeline


def durations(timeline):
    return list(timeline.ends - timeline.starts)


# ---------------------------------------------------------------- closed forms

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


def _operands(dtype, m, n, k):
    """Records loading A and B, their tensors, and the addresses of A, B and two accumulators."""
    size = np.dtype(dtype).itemsize
    a_addr, b_addr = 0, m * k * size
    acc1 = (m * k + k * n) * size
    acc2 = acc1 + m * n * 4
    return ([load(0, a_addr, m, k), load(1, b_addr, k, n)],
            [np.ones((m, k), dtype), np.ones((k, n), dtype)], a_addr, b_addr, acc1, acc2)


@pytest.mark.parametrize("arch", PRESETS, ids=lambda a: a.name)
@pytest.mark.parametrize("accumulate", [False, True])
def test_back_to_back_gemms_pay_fill_and_config_once(arch, accumulate):
    m, n, k = 2 * arch.rows, arch.cols, 40
    records, tensors, a, b, acc1, acc2 = _operands("int8", m, n, k)
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
    int8_ops, int8_tensors, a8, b8, acc, _ = _operands("int8", m, n, k)
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
    records, tensors, a, b, acc1, acc2 = _operands("int8", m, n, k)
    b2 = 16384
    records += [gemm("int8", m, n, k, a, b, acc1), load(2, b2, k, 64 * n),  # long load
                gemm("int8", m, n, k, a, b2, acc2, b_stride=64 * n)]
    stats, timeline = run(arch, records, tensors + [np.ones((k, 64 * n), np.int8)])

    assert timeline.starts[4] == timeline.ends[3] > timeline.ends[2]
    assert durations(timeline)[4] == gemm_cycles(arch, m, n, k, "int8", config=False)


def test_operand_arriving_during_the_previous_drain_hides_part_of_the_fill():
    arch = load_arch("cgra-8x8")
    m, n, k1, k2 = 8, 8, 20, 16
    records, tensors, a, b, acc1, acc2 = _operands("int8", m, n, k1)
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


# ---------------------------------------------------------------- hazards

def test_scoreboard_orders_commands_across_queues():
    arch = load_arch("cgra-8x8")
    m, n, k = 8, 8, 64
    records, tensors, a, b, acc, _ = _operands("int8", m, n, k)
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


# ---------------------------------------------------------------- whole streams

@st.composite
def gemm_streams(draw, compute_bound=False):
    """(arch, records, tensor factory) of a random tiled GEMM.

    compute_bound: every GEMM has ceil(k / macs_per_pe) >= max(m, n), the regime where a larger
    PE array can only help (with little k a deeper array pipeline costs more than its folds save).
    """
    arch = draw(st.sampled_from(PRESETS))
    dtype = draw(st.sampled_from(["int8", "float32"]))
    m, n = draw(st.integers(1, 100)), draw(st.integers(1, 100))
    tm, tn = draw(st.integers(ceil_div(m, 5), 32)), draw(st.integers(ceil_div(n, 5), 32))
    if compute_bound:
        tk = draw(st.integers(max(tm, tn), 64))
        k = tk * draw(st.integers(1, 3))
    else:
        k = draw(st.integers(1, 100))
        tk = draw(st.integers(ceil_div(k, 5), 64))
    flags = draw(st.sampled_from([None, EPILOGUE_RELU]))
    records = streams.tiled_gemm(arch, m, n, k, dtype, tile=(tm, tn, tk), epilogue_flags=flags)

    def tensors():
        return [np.ones((m, k), dtype), np.ones((k, n), dtype), np.zeros((m, n), ACC[dtype])]
    return arch, records, tensors


@given(gemm_streams())
def test_cycles_never_beat_the_roofline_bound(case):
    arch, records, tensors = case
    stats = simulate(arch, records, tensors())
    assert stats.cycles >= stats.ideal_cycles > 0
    assert 0 < stats.utilisation <= 1
    assert all(busy <= stats.cycles for busy in stats.busy_cycles.values())


def test_double_buffering_overlaps_loads_with_compute():
    arch = load_arch("cgra-8x8")
    m, n, k = 64, 64, 256
    records = streams.tiled_gemm(arch, m, n, k, "int8", tile=(16, 16, 64))
    stats, timeline = run(arch, records, [np.ones((m, k), np.int8), np.ones((k, n), np.int8),
                                          np.zeros((m, n), np.int32)])
    assert stats.cycles < sum(durations(timeline))
    gemm_at = np.flatnonzero(timeline.ops == Op.GEMM)
    load_at = np.flatnonzero(timeline.ops == Op.DMA_LOAD)
    # Some load of a later tile runs while an earlier GEMM computes.
    assert any(timeline.starts[l] < timeline.ends[g] for g in gemm_at for l in load_at if l > g)


@given(gemm_streams(), st.integers(2, 4), st.booleans())
def test_more_dma_bandwidth_or_less_latency_is_never_slower(case, factor, latency):
    arch, records, tensors = case
    faster = dataclasses.replace(arch, dma_bytes_per_cycle=arch.dma_bytes_per_cycle * factor,
                                 dma_latency=arch.dma_latency // 2 if latency else arch.dma_latency)
    assert simulate(faster, records, tensors()).cycles <= simulate(arch, records, tensors()).cycles


@given(gemm_streams(compute_bound=True), st.sampled_from([(2, 1), (1, 2), (2, 2), (4, 4)]))
def test_more_pes_are_never_slower_on_compute_bound_gemms(case, scale):
    arch, records, tensors = case
    bigger = dataclasses.replace(arch, rows=arch.rows * scale[0], cols=arch.cols * scale[1])
    assert simulate(bigger, records, tensors()).cycles <= simulate(arch, records, tensors()).cycles


@given(gemm_streams(), st.integers(2, 4))
def test_more_macs_per_pe_are_never_slower(case, factor):
    arch, records, tensors = case
    faster = dataclasses.replace(arch, macs_per_pe={d: v * factor for d, v in arch.macs_per_pe.items()})
    assert simulate(faster, records, tensors()).cycles <= simulate(arch, records, tensors()).cycles


def test_a_larger_array_can_be_slower_on_latency_bound_gemms():
    # Documented limit of the model (docs/simulator.md): with k = 1 a 16-row GEMM costs
    # 2 folds + 8 + 8 - 2 cycles on 8x8 but 1 fold + 16 + 8 - 2 on 16x16.
    arch = load_arch("cgra-8x8")
    records, tensors, a, b, acc, _ = _operands("int8", 16, 8, 1)
    records.append(gemm("int8", 16, 8, 1, a, b, acc))
    small = run(arch, records, tensors)[1]
    big = run(dataclasses.replace(arch, rows=16), records, tensors)[1]
    assert durations(big)[2] - durations(small)[2] == (16 + 8 - 2) + 1 - (8 + 8 - 2) - 2


def test_stats_serialise_to_json():
    arch = load_arch("cgra-4x4")
    records = streams.tiled_gemm(arch, 8, 8, 8, "int8")
    stats = simulate(arch, records, [np.ones((8, 8), np.int8)] * 2 + [np.zeros((8, 8), np.int32)],
                     name="matmul", source_ops="matmul,relu")
    data = json.loads(stats.to_json())
    assert data == stats.to_dict()
    assert data["source_ops"] == ["matmul", "relu"] and data["arch"] == "cgra-4x4"
    assert data["op_counts"]["GEMM"] == 4 and data["num_commands"] == len(records)
    assert data["macs"] == 512 and data["dma_store_bytes"] == 256
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.cycles = 0


# ---------------------------------------------------------------- busy, stall and idle per unit

UNITS = ("load", "compute", "vector", "store")


@pytest.mark.parametrize("arch", PRESETS, ids=lambda a: a.name)
def test_gemm_stalls_for_its_operands_and_the_store_for_the_gemm(arch):
    m, n, k = arch.rows, arch.cols, 24
    operands = m * k + k * n  # A then B, int8, in one load
    records = [streams.dma(Op.DMA_LOAD, 0, 0, [(operands, 0, 1, 1)]),
               gemm("int8", m, n, k, 0, m * k, operands),
               store(1, operands, m, n)]
    out = np.zeros((m, n), np.int32)
    stats, timeline = run(arch, records, [np.ones(operands, np.int8), out])

    load_end = dma_cycles(arch, operands)  # the GEMM's operands are all in
    # The configuration loads while they arrive (the PE array is free): the GEMM starts that
    # much before load_end and its operands enter at load_end.
    config = arch.config_load_cycles
    gemm_end = max(load_end, config) + gemm_cycles(arch, m, n, k, "int8", config=False)
    total = gemm_end + dma_cycles(arch, out.nbytes)
    assert stats.cycles == total
    assert stats.busy_cycles == {"load": transfer_cycles(arch, operands), "vector": 0,
                                 "compute": gemm_cycles(arch, m, n, k, "int8"),
                                 "store": transfer_cycles(arch, out.nbytes)}
    # The PE array waits for the load's transfer and its latency; the store for the GEMM.
    assert stats.stall_cycles == {"load": 0, "compute": max(0, load_end - config), "vector": 0, "store": gemm_end}
    # After its last command: the load engine is free once it has streamed (its latency is idle
    # time), the PE array once the GEMM ends, the store engine during its own latency.
    assert stats.idle_cycles == {"load": total - transfer_cycles(arch, operands),
                                 "compute": total - gemm_end, "vector": total,
                                 "store": arch.dma_latency}
    assert list(timeline.waits_for) == [-1, 0 if load_end > config else -1, 1]
    np.testing.assert_array_equal(out, k)


def test_refilling_a_buffer_stalls_the_load_engine_for_the_previous_fills_latency():
    # Pipelined DMA: the engine frees after the first transfer, but the second load writes the
    # same bytes (write after write), so it waits for the first one's completion: dma_latency.
    arch = load_arch("cgra-8x8")
    rows, cols = 4, 64
    out = np.zeros((rows, cols), np.int8)
    records = [load(0, 0, rows, cols), load(1, 0, rows, cols), store(2, 0, rows, cols)]
    first, second = np.zeros((rows, cols), np.int8), np.ones((rows, cols), np.int8)
    stats, timeline = run(arch, records, [first, second, out])

    latency, transfer = arch.dma_latency, transfer_cycles(arch, rows * cols)
    second_end = 2 * (transfer + latency)  # the second load starts at the first one's end
    total = second_end + latency + transfer
    assert list(timeline.starts) == [0, transfer + latency, second_end]
    assert stats.busy_cycles["load"] == 2 * transfer and stats.stall_cycles["load"] == latency
    assert stats.idle_cycles["load"] == total - 2 * transfer - latency == 2 * latency + transfer
    assert stats.busy_cycles["store"] == transfer and stats.stall_cycles["store"] == second_end
    assert stats.idle_cycles["store"] == latency
    assert list(timeline.waits_for) == [-1, 0, 1]
    np.testing.assert_array_equal(out, 1)


def test_a_stall_free_queue_reports_no_stall():
    # Back-to-back accumulating GEMMs whose operands are all loaded first: the PE array stalls
    # only for those loads, then runs without a gap (partial sums stay in the array).
    arch = load_arch("cgra-8x8")
    m, n, k = 8, 8, 16
    records, tensors, a, b, acc, _ = _operands("int8", m, n, k)
    records += [gemm("int8", m, n, k, a, b, acc), gemm("int8", m, n, k, a, b, acc, accumulate=True)]
    stats, timeline = run(arch, records, tensors)
    loads_end = dma_cycles(arch, m * k) + transfer_cycles(arch, k * n)
    configured = loads_end - arch.config_load_cycles  # the configuration loads while they arrive
    assert stats.stall_cycles["compute"] == configured == timeline.starts[2]
    assert list(timeline.stalls()) == [0, 0, configured, 0]
    assert stats.idle_cycles["compute"] == 0 and stats.idle_cycles["vector"] == stats.cycles


def check_unit_cycles(stats, timeline, config: int = 0):
    """busy + stall + idle == cycles per unit, none negative, and every stall is a wait for a
    dependency: it ends exactly when an earlier command it depends on ends, or, for a PE-array
    command loading its configuration while it waits, `config` cycles (that load) before."""
    for unit in UNITS:
        parts = (stats.busy_cycles[unit], stats.stall_cycles[unit], stats.idle_cycles[unit])
        assert min(parts) >= 0 and sum(parts) == stats.cycles, unit
    stalls = timeline.stalls()
    assert (stalls >= 0).all()
    for index in np.flatnonzero(stalls > 0):
        blocker = timeline.waits_for[index]
        early = timeline.ends[blocker] - timeline.starts[index]
        assert 0 <= blocker < index and early in ((0, config) if timeline.units[index] == Unit.COMPUTE else (0,))
    assert (timeline.waits_for[stalls == 0] == -1).all()


@given(gemm_streams())
def test_busy_stall_and_idle_add_up_to_the_kernels_cycles(case):
    arch, records, tensors = case
    result = simulate_detailed(arch, records, tensors())
    check_unit_cycles(result.stats, result.timeline, arch.config_load_cycles)


@pytest.mark.parametrize("arch", PRESETS, ids=lambda a: a.name)
def test_busy_stall_and_idle_add_up_on_a_conv_with_halo_loads(arch):
    height, width, channels, filters = 6, 5, 3, 4
    records = streams.conv2d_3x3(arch, height, width, channels, filters, "int8")
    result = simulate_detailed(arch, records, [np.ones((height, width, channels), np.int8),
                                               np.ones((3, 3, channels, filters), np.int8),
                                               np.zeros((height, width, filters), np.int32)])
    check_unit_cycles(result.stats, result.timeline, arch.config_load_cycles)
    assert result.stats.stall_cycles["compute"] > 0  # the first GEMM waits for its loads


def test_stall_and_idle_cycles_serialise_to_json():
    arch = load_arch("cgra-4x4")
    records = streams.tiled_gemm(arch, 8, 8, 8, "int8")
    stats = simulate(arch, records, [np.ones((8, 8), np.int8)] * 2 + [np.zeros((8, 8), np.int32)])
    data = json.loads(stats.to_json())
    parts = [data["busy_cycles"], data["stall_cycles"], data["idle_cycles"]]
    assert all(set(part) == set(UNITS) for part in parts)
    assert all(sum(part[unit] for part in parts) == data["cycles"] for unit in UNITS)


# ---------------------------------------------------------------- DEPTHWISE
def depthwise(dtype, oh, ow, n, kh, kw, a, b, acc, accumulate=False):
    """A stride-1 DEPTHWISE over a compact (in_h, in_w, n) window at `a`."""
    in_w = ow + kw - 1
    return encode(Op.DEPTHWISE, flags=GEMM_ACCUMULATE if accumulate else 0, dtype=DType.from_name(dtype),
                  oh=oh, ow=ow, n=n, kh=kh, kw=kw, a_addr=a, a_y_stride=in_w * n, a_x_stride=n,
                  a_ry_stride=in_w * n, a_rx_stride=n, b_addr=b, b_ry_stride=kw * n, b_rx_stride=n,
                  acc_addr=acc, acc_y_stride=ow * n, acc_x_stride=n)


def depthwise_case(dtype, oh, ow, n, kh, kw):
    """Records loading the window and the weights, their tensors, and the three addresses."""
    in_h, in_w = oh + kh - 1, ow + kw - 1
    window, weights = np.ones((in_h * in_w, n), dtype), np.ones((kh * kw, n), dtype)
    b_addr = window.nbytes
    acc_addr = -(-(b_addr + weights.nbytes) // 64) * 64
    return [load(0, 0, in_h * in_w, n), load(1, b_addr, kh * kw, n)], [window, weights], 0, b_addr, acc_addr


def depthwise_cycles(arch, dtype, oh, ow, n, kh, kw):
    """config + latency + max(folds x taps, scratchpad traffic / bandwidth), from docs/simulator.md."""
    size = np.dtype(dtype).itemsize
    folds = ceil_div(oh * ow, arch.rows) * ceil_div(n, arch.cols)
    compute = folds * ceil_div(kh * kw, arch.macs_per_pe[dtype])
    traffic = (oh + kh - 1) * (ow + kw - 1) * n * size + kh * kw * n * size + oh * ow * n * 4
    return arch.config_load_cycles + 2 + max(compute, ceil_div(traffic, arch.spad_banks * arch.bank_width_bytes))


@given(arch=st.sampled_from(PRESETS), oh=st.integers(1, 12), ow=st.integers(1, 12), n=st.integers(1, 40),
       kh=st.integers(1, 5), kw=st.integers(1, 5), dtype=st.sampled_from(["int8", "float32"]))
def test_single_depthwise_pays_config_latency_and_the_slower_of_folds_and_bandwidth(arch, oh, ow, n, kh, kw,
                                                                                      dtype):
    records, tensors, a, b, acc = depthwise_case(dtype, oh, ow, n, kh, kw)
    stats, timeline = run(arch, records + [depthwise(dtype, oh, ow, n, kh, kw, a, b, acc)], tensors)
    assert durations(timeline)[2] == depthwise_cycles(arch, dtype, oh, ow, n, kh, kw)
    assert stats.macs == oh * ow * n * kh * kw
    assert stats.cycles >= stats.ideal_cycles


def test_int8_depthwise_is_compute_bound_and_float32_bandwidth_bound_on_the_presets():
    """What the model says about the presets: 3x3 int8 keeps the PEs busy; float32 moves 4x the
    bytes through the same scratchpad bandwidth and waits for it."""
    arch = load_arch("cgra-8x8")
    records, tensors, a, b, acc = depthwise_case("int8", 8, 16, 8, 3, 3)
    _, timeline = run(arch, records + [depthwise("int8", 8, 16, 8, 3, 3, a, b, acc)], tensors)
    assert durations(timeline)[2] == arch.config_load_cycles + 2 + 16 * 9  # 16 folds x 9 taps
    records, tensors, a, b, acc = depthwise_case("float32", 8, 16, 8, 3, 3)
    _, timeline = run(arch, records + [depthwise("float32", 8, 16, 8, 3, 3, a, b, acc)], tensors)
    assert durations(timeline)[2] > arch.config_load_cycles + 2 + 16 * 9


@pytest.mark.parametrize("contexts", [1, 32])
def test_switching_between_gemm_and_depthwise_reloads_the_configuration(contexts):
    arch = load_arch("cgra-8x8")
    arch = dataclasses.replace(arch, fabric={**arch.fabric, "context_depth": contexts})
    records, tensors, a, b, acc = depthwise_case("int8", 4, 8, 8, 3, 3)
    dw = depthwise("int8", 4, 8, 8, 3, 3, a, b, acc)
    gemm_on_window = gemm("int8", 8, 8, 8, a, a, acc + 4096)
    stats, timeline = run(arch, records + [dw, dw, gemm_on_window, dw], tensors)
    # DEPTHWISE, GEMM, and DEPTHWISE again when one context holds only one configuration; the
    # repeat reuses its own
    assert stats.config_loads == (3 if contexts == 1 else 2)
    assert durations(timeline)[3] == depthwise_cycles(arch, "int8", 4, 8, 8, 3, 3) - arch.config_load_cycles - 2


@given(arch=st.sampled_from(PRESETS), scale=st.sampled_from([(2, 1), (1, 2), (2, 2)]),
       bandwidth=st.sampled_from([1, 2, 4]), oh=st.integers(1, 12), ow=st.integers(1, 12), n=st.integers(1, 40),
       dtype=st.sampled_from(["int8", "float32"]))
def test_more_pes_or_scratchpad_bandwidth_never_slow_a_depthwise(arch, scale, bandwidth, oh, ow, n, dtype):
    records, tensors, a, b, acc = depthwise_case(dtype, oh, ow, n, 3, 3)
    records.append(depthwise(dtype, oh, ow, n, 3, 3, a, b, acc))
    bigger = dataclasses.replace(arch, rows=arch.rows * scale[0], cols=arch.cols * scale[1],
                                 spad_banks=arch.spad_banks * bandwidth)
    assert run(bigger, records, tensors)[0].cycles <= run(arch, records, tensors)[0].cycles


# ---------------------------------------------------------------- scratchpad banks
# The rule (docs/simulator.md, "Scratchpad banks"): byte a in bank (a // W) % N; a bank serves one
# W-byte word a cycle. Expected cycles below are derived by enumerating the words, not from
# cgra_sim.banks' closed form.

def period(arch):
    """Bytes after which the banks repeat: rows this far apart all start in one bank."""
    return arch.spad_banks * arch.bank_width_bytes


def gemm_with_a_stride(arch, dtype, m, n, k, a_stride):
    """Records loading A (rows `a_stride` elements apart) and compact B, then one GEMM; tensors."""
    size = np.dtype(dtype).itemsize
    b_addr = -(-m * a_stride * size // 64) * 64
    acc = -(-(b_addr + k * n * size) // 64) * 64
    records = [load(0, 0, m, k) if a_stride == k else streams.matrix_dma(Op.DMA_LOAD, 0, 0, 0, 0, m, k, a_stride),
               load(1, b_addr, k, n),
               encode(Op.GEMM, dtype=DType.from_name(dtype), m=m, n=n, k=k, a_addr=0, a_stride=a_stride,
                      b_addr=b_addr, b_stride=n, acc_addr=acc, acc_stride=n)]
    return records, [np.ones((m, k), dtype), np.ones((k, n), dtype)]


@pytest.mark.parametrize("arch", PRESETS, ids=lambda a: a.name)
@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_a_gemm_whose_rows_share_one_bank_slows_by_the_conflict_degree(arch, dtype):
    # Compact A with one bank period per row (the compiler's layout when tk * itemsize is a
    # multiple of N * W): all `rows` rows start in bank 0, and a word feeds a row W / itemsize
    # cycles, so the PE array waits max(1, rows * itemsize / W) times longer. Padding each row
    # by one bank word puts the rows in consecutive banks: the folds' cycles exactly.
    size, width = np.dtype(dtype).itemsize, arch.bank_width_bytes
    m, n, k = arch.rows, arch.cols, period(arch) // size
    fill = m + n - 2
    for a_stride, degree in ((k, arch.rows), (k + width // size, 1)):
        records, tensors = gemm_with_a_stride(arch, dtype, m, n, k, a_stride)
        _, timeline = run(arch, records, tensors)
        steady = ceil_div(k * max(Fraction(1), Fraction(degree * size, width)), 1)
        assert durations(timeline)[2] == arch.config_load_cycles + fill + steady, a_stride
        assert durations(timeline)[2] == gemm_cycles(arch, m, n, k, dtype, a_stride=a_stride * size)
    # int8: one word feeds a row 8 cycles, so up to 8 rows per bank cost nothing.
    if dtype == "int8" and arch.rows <= width:
        assert durations(timeline)[2] == gemm_cycles(arch, m, n, k, dtype, a_stride=period(arch) + width)


@pytest.mark.parametrize("arch", PRESETS, ids=lambda a: a.name)
def test_a_dma_scattering_one_element_per_bank_period_serialises_its_beats(arch):
    # An int32 column written `period` bytes apart: each beat's dma_bytes_per_cycle / 4 elements
    # fall in one bank and take a cycle each. One word apart they use consecutive banks.
    extent, beat = 64, arch.dma_bytes_per_cycle
    for sstride, degree in ((period(arch) // 4, beat // 4), (arch.bank_width_bytes // 4, 1)):
        records = [streams.dma(Op.DMA_LOAD, 0, 0, [(extent, 0, 1, sstride)])]
        stats, timeline = run(arch, records, [np.ones(extent, np.int32)])
        transfer = ceil_div(extent * 4, beat) * degree
        assert durations(timeline) == [arch.dma_latency + transfer]
        assert stats.busy_cycles["load"] == transfer


@pytest.mark.parametrize("arch", PRESETS, ids=lambda a: a.name)
def test_a_vector_command_on_a_column_waits_for_its_bank(arch):
    # A FILL of an int32 column whose elements are one bank period apart: vector_lanes elements a
    # cycle, all in one bank: min(rows, lanes) cycles per beat.
    rows = 3 * arch.vector_lanes + 1
    fill = encode(Op.FILL, dtype=DType.INT32, rows=rows, cols=1, stride=period(arch) // 4, value_bits=7)
    _, timeline = run(arch, [fill], [])
    assert durations(timeline) == [ceil_div(rows, arch.vector_lanes) * arch.vector_lanes + 2]


@given(lanes=st.integers(1, 64), words=st.integers(0, 200), addr=st.integers(0, 4096),
       banks=st.integers(1, 16), width=st.sampled_from([2, 4, 8, 16]), run_bytes=st.integers(1, 40))
def test_the_conflict_degree_matches_counting_the_words(lanes, words, addr, banks, width, run_bytes):
    from cgra_sim.banks import degree
    stride = words * width if words % 3 else words * width + words % 7  # word multiples and others
    touched = {word for i in range(lanes) for word in range((addr + i * stride) // width,
                                                            (addr + i * stride + run_bytes - 1) // width + 1)}
    busiest = max(sum(1 for w in touched if w % banks == bank) for bank in range(banks))
    expected = 1 if lanes == 1 or stride == 0 else busiest
    assert degree(lanes, stride, addr, banks, width, run_bytes) == expected


@st.composite
def strided_kernels(draw):
    """(arch, records, tensors) of one GEMM with any A row stride, or a DMA with any scratchpad
    stride, on a preset."""
    arch = draw(st.sampled_from(PRESETS))
    dtype = draw(st.sampled_from(["int8", "float32"]))
    m, n, k = draw(st.integers(1, 40)), draw(st.integers(1, 40)), draw(st.integers(1, 40))
    if draw(st.booleans()):
        records, tensors = gemm_with_a_stride(arch, dtype, m, n, k, k + draw(st.integers(0, 80)))
        return arch, records, tensors
    sstride = draw(st.integers(1, 10))  # the box stays inside the smallest scratchpad
    return arch, [streams.dma(Op.DMA_LOAD, 0, 0, [(m, 0, 1, sstride * k), (k, 1, 1, sstride)])], \
        [np.ones((m, k), dtype)]


@given(strided_kernels(), st.sampled_from([2, 4]))
def test_more_banks_never_slow_a_command(case, factor):
    """Multiplying the banks splits every bank's words among its new banks. (Merely adding banks
    can alias a stride: see the next test.)"""
    arch, records, tensors = case
    more = dataclasses.replace(arch, spad_banks=arch.spad_banks * factor)
    assert run(more, records, tensors)[0].cycles <= run(arch, records, tensors)[0].cycles


@given(gemm_streams(), st.sampled_from([2, 4]))
def test_more_banks_never_slow_a_tiled_gemm(case, factor):
    arch, records, tensors = case
    more = dataclasses.replace(arch, spad_banks=arch.spad_banks * factor)
    assert simulate(more, records, tensors()).cycles <= simulate(arch, records, tensors()).cycles


def test_five_banks_can_be_slower_than_four():
    # Rows 5 words apart: 4 banks see banks 0, 1, 2, 3; 5 banks see bank 0 four times. A float32
    # row needs a word every 2 cycles, so four rows on one bank halve the pace.
    four = dataclasses.replace(load_arch("cgra-4x4"), spad_bytes=40960)
    five = dataclasses.replace(four, spad_banks=5)
    records, tensors = gemm_with_a_stride(four, "float32", 4, 4, 10, 10)
    assert durations(run(four, records, tensors)[1])[2] == gemm_cycles(four, 4, 4, 10, "float32")
    assert durations(run(five, records, tensors)[1])[2] == gemm_cycles(four, 4, 4, 20, "float32")


@pytest.mark.parametrize("arch", PRESETS, ids=lambda a: a.name)
def test_busy_stall_and_idle_add_up_when_banks_conflict(arch):
    tk = period(arch) // 4  # float32 A tiles of one bank period per row: every row in bank 0
    m, n, k = 2 * arch.rows, 2 * arch.cols, 2 * tk
    records = streams.tiled_gemm(arch, m, n, k, "float32", tile=(arch.rows, arch.cols, tk),
                                 epilogue_flags=EPILOGUE_RELU)
    tensors = [np.ones((m, k), np.float32), np.ones((k, n), np.float32), np.zeros((m, n), np.float32)]
    result = simulate_detailed(arch, records, tensors)
    check_unit_cycles(result.stats, result.timeline, arch.config_load_cycles)
    spread = dataclasses.replace(arch, spad_banks=arch.spad_banks * 8)  # the rows' banks differ
    assert simulate(spread, records, tensors).cycles < result.stats.cycles
