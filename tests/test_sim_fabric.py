"""The FABRIC command in the simulator: a dataflow body mapped onto the PE fabric.

Property tests build random bodies (every op, immediates, references to any earlier node, one or
two inputs, int32 and float32), run them through cgra_sim on strided and broadcast operands and
compare bit for bit with the same body evaluated node by node in numpy, and with the body's
dataflow graph run on the cycle-level array simulator (mapping/array_sim.py). The timing tests
check that a FABRIC's cycles are its mapping's: configuration, latency, (iterations - 1) x II.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cgra_sim import CommandError, load_arch, preset_names, simulate, simulate_detailed
from cgra_sim import cost
from cgra_sim.fabric import Fabric
from cgra_sim.isa import BODY_MAX_NODES, FABRIC_INPUT_B, DType, Op, body_word, BodyOp, encode
from cgra_sim.mapping import body as bodies
from cgra_sim.mapping.array_sim import run_array
from test_sim_eltwise import _operand
from test_sim_functional import dma_record

ARCH = load_arch("cgra-8x8")
SMALL = load_arch("cgra-4x4")  # random bodies map in milliseconds here, in up to seconds on 16x16
PRESETS = [load_arch(name) for name in preset_names()]
HARD_SWISH = (("add", "a", 3.0), ("max", "n0", 0.0), ("min", "n1", 6.0), ("mul", "n2", 1 / 6), ("mul", "a", "n3"))
LEAKY = (("mul", "a", 0.1), ("max", "a", "n0"))


@st.composite
def random_bodies(draw, dtype=None, two_inputs=None, max_nodes=8):
    dtype = dtype or draw(st.sampled_from(["int32", "float32"]))
    two = draw(st.booleans()) if two_inputs is None else two_inputs
    ops = ["add", "sub", "mul", "max", "min"] + (["shr", "shl"] if dtype == "int32" else [])
    number = st.integers(-1000, 1000) if dtype == "int32" else \
        st.floats(-8, 8, allow_nan=False, width=32)
    body = []
    for index in range(draw(st.integers(1, max_nodes))):
        refs = ["a"] + (["b"] if two else []) + [f"n{i}" for i in range(index)]
        op = draw(st.sampled_from(ops))
        first = draw(st.sampled_from(refs))
        second = draw(st.integers(0, 31)) if op in ("shr", "shl") else \
            draw(st.one_of(number, st.sampled_from(refs)))
        body.append((op, first, second))
    if two and not bodies.reads_b(body):
        body.append(("add", f"n{len(body) - 1}", "b"))
    return dtype, tuple(body)


def _stream(body, dtype, rows, cols, a, b, out_stride):
    (a_flat, a_rs, a_cs) = a
    words = bodies.encode(body, dtype)
    fields = dict(dtype=DType.from_name(dtype), rows=rows, cols=cols, a_addr=0, a_row_stride=a_rs,
                  a_col_stride=a_cs, out_addr=32768, out_stride=out_stride, nodes=len(words),
                  **{f"node{i}": w for i, w in enumerate(words)})
    records = [dma_record(Op.DMA_LOAD, 0, 0, [(a_flat.size, 0, 1, 1)])]
    if b is not None:
        b_flat, b_rs, b_cs = b
        records.append(dma_record(Op.DMA_LOAD, 1, 16384, [(b_flat.size, 0, 1, 1)]))
        fields.update(flags=FABRIC_INPUT_B, b_addr=16384, b_row_stride=b_rs, b_col_stride=b_cs)
    records += [encode(Op.FABRIC, **fields),
                dma_record(Op.DMA_STORE, 2 if b is not None else 1, 32768, [(rows, 0, 1, out_stride), (cols, 1, 1, 1)])]
    return np.array(records, dtype=np.int64)


strides = st.sampled_from([0, 1, 2, 5])


@settings(max_examples=60, deadline=None)
@given(case=random_bodies(), rows=st.integers(1, 7), cols=st.integers(1, 10),
       a_strides=st.tuples(strides, strides), b_strides=st.tuples(strides, strides), seed=st.integers(0, 2**32 - 1))
def test_fabric_matches_its_body_in_numpy(case, rows, cols, a_strides, b_strides, seed):
    dtype, body = case
    rng = np.random.default_rng(seed)
    a_flat, a_view = _operand(rng, rows, cols, *a_strides, dtype)
    two = bodies.reads_b(body)
    b_flat, b_view = _operand(rng, rows, cols, *b_strides, dtype) if two else (None, None)
    out = np.zeros((rows, cols), dtype)
    records = _stream(body, dtype, rows, cols, (a_flat, *a_strides), (b_flat, *b_strides) if two else None, cols)
    tensors = [a_flat] + ([b_flat] if two else []) + [out]
    stats = simulate(SMALL, records, tensors)
    expected = bodies.evaluate(body, dtype, a_view, b_view)
    np.testing.assert_array_equal(out, expected)
    assert stats.op_counts["FABRIC"] == 1


@settings(max_examples=25, deadline=None)
@given(case=random_bodies(), seed=st.integers(0, 2**32 - 1))
def test_body_on_the_cycle_level_array_is_its_numpy_meaning(case, seed):
    """The program the timing model charges is a real mapping: run on the array simulator, PE by
    PE, it computes the body bit for bit, in (iterations - 1) x II + latency cycles."""
    dtype, body = case
    program = bodies.program(body, dtype, Fabric.of(SMALL))
    rng = np.random.default_rng(seed)
    iterations, lanes = 5, program.lanes
    a = (rng.standard_normal(iterations * lanes) * 4).astype(dtype) if dtype == "float32" else \
        rng.integers(-2000, 2000, iterations * lanes).astype(dtype)
    b = a[::-1].copy()
    streams = {f"a{lane}": a[lane::lanes] for lane in range(lanes)}
    if bodies.reads_b(body):
        streams.update({f"b{lane}": b[lane::lanes] for lane in range(lanes)})
    outputs, cycles = run_array(program.mapping, streams, iterations)
    expected = bodies.evaluate(body, dtype, a, b if bodies.reads_b(body) else None)
    for lane in range(lanes):
        np.testing.assert_array_equal(outputs[f"out{lane}"], expected[lane::lanes])
    assert cycles == (iterations - 1) * program.ii + program.latency


def test_activation_bodies_map_at_their_bound_on_every_preset():
    """Hard-swish and leaky relu: lanes x II within the memory ports' bound (2 memory operations
    per element over the ports), so the fabric streams at least ports / 2 elements every 2 cycles."""
    for arch in PRESETS:
        fabric = Fabric.of(arch)
        for body in (HARD_SWISH, LEAKY):
            program = bodies.program(body, "float32", fabric)
            assert program.lanes / program.ii >= fabric.units("mem") / 2 / 2, (arch.name, body, program.lanes,
                                                                               program.ii)


@pytest.mark.parametrize("arch", PRESETS, ids=lambda a: a.name)
def test_fabric_cycles_come_from_the_mapping(arch):
    rows, cols = 16, 24
    a = np.arange(rows * cols, dtype=np.float32) - 100
    out = np.zeros((rows, cols), np.float32)
    records = _stream(HARD_SWISH, "float32", rows, cols, (a, cols, 1), None, cols)
    twice = np.concatenate([records[:2], records[1:2]])  # the same FABRIC again: no configuration load
    result = simulate_detailed(arch, twice, [a, out])
    program = bodies.program(HARD_SWISH, "float32", Fabric.of(arch))
    traffic = 2 * rows * cols * 4
    run = program.latency + cost.fabric_steady_cycles(arch, rows * cols, program.lanes, program.ii, traffic)
    config = cost.fabric_config_cycles(arch, program.config_bytes)
    durations = result.timeline.ends - result.timeline.starts
    assert durations[1] == config + run and durations[2] == run
    assert result.timeline.config_loads == 1
    assert run == program.latency + (math.ceil(rows * cols / program.lanes) - 1) * program.ii
    # The GEMM's one-slot configuration of every PE takes config_load_cycles; II slots take II times that.
    assert config == math.ceil(program.config_bytes * 8 * arch.config_load_cycles
                               / (arch.rows * arch.cols * arch.fabric["config_word_bits"]))
    # Its energy: II slots of every PE loaded once, each priced like the GEMM's one-slot load.
    assert result.timeline.config_slots == program.ii
    stats = simulate(arch, twice, [a, out.copy()])
    assert stats.energy_breakdown["config"] == pytest.approx(program.ii * arch.energy["config_load"])


def _record(**change):
    words = bodies.encode(LEAKY, "float32")
    fields = dict(dtype=DType.FLOAT32, rows=2, cols=4, a_addr=0, a_row_stride=4, a_col_stride=1, out_addr=128,
                  out_stride=4, nodes=len(words), **{f"node{i}": w for i, w in enumerate(words)})
    fields.update(change)
    return encode(Op.FABRIC, **fields)


BAD = {
    "unknown op": (dict(node0=body_word(BodyOp.ADD, 0, 255) | 0x40), ["op code 65"]),
    "later node": (dict(node0=body_word(BodyOp.ADD, 3, 0)), ["operand reference 3"]),
    "no nodes": (dict(nodes=0, node0=0, node1=0), ["nodes must be >= 1"]),
    "too many nodes": (dict(nodes=BODY_MAX_NODES + 1), [f"exceeds the {BODY_MAX_NODES} node words"]),
    "word past nodes": (dict(nodes=1), ["node words past nodes = 1 must be 0"]),
    "b without flag": (dict(node1=body_word(BodyOp.MAX, 1, 2)), ["the body reads input b but the command does not"]),
    "b words without flag": (dict(b_addr=64), ["FABRIC_INPUT_B is off"]),
    "float shift": (dict(node0=body_word(BodyOp.SHR, 0, 255, 3)), ["shifts take an int32"]),
    "int8": (dict(dtype=DType.INT8), ["dtype code 1"]),
    "out beyond the scratchpad": (dict(out_addr=ARCH.spad_bytes - 8), ["out", "-byte scratchpad"]),
    "immediate first": (dict(node0=body_word(BodyOp.MUL, 255, 0, 5)), ["immediate can only be the second"]),
}


@pytest.mark.parametrize("change, words", BAD.values(), ids=BAD.keys())
def test_invalid_fabric_is_refused_naming_the_command(change, words):
    fill = encode(Op.FILL, dtype=DType.FLOAT32, addr=0, rows=2, cols=4, stride=4)
    with pytest.raises(CommandError) as info:
        simulate(ARCH, np.array([fill, _record(**change)]), [])
    assert str(info.value).startswith("command 1 (FABRIC): ")
    for word in words:
        assert word in str(info.value)


def test_body_words_round_trip():
    for dtype, body in (("float32", HARD_SWISH), ("int32", (("shr", "a", 3), ("sub", "n0", -7), ("mul", "b", "n1")))):
        words = bodies.encode(body, dtype)
        assert bodies.decode(words, dtype, bodies.reads_b(body)) == tuple(
            (op, first, float(np.float32(second)) if dtype == "float32" and not isinstance(second, str) else second)
            for op, first, second in body)


@settings(max_examples=15, deadline=None)
@given(case=random_bodies(dtype="float32", two_inputs=False, max_nodes=5), rows=st.integers(1, 6),
       cols=st.integers(1, 12), seed=st.integers(0, 2**32 - 1))
def test_a_fabric_command_costs_what_its_mapping_takes_on_the_cycle_level_array(case, rows, cols, seed):
    """Issue 14's check that the fast model is honest, for FABRIC: the command's run cycles in the
    timeline (its configuration load aside) are the cycles the cycle-level array simulator takes to
    run the same elements through the mapping PE by PE, and both compute the same values."""
    dtype, body = case
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(rows * cols) * 4).astype(dtype)
    out = np.zeros((rows, cols), dtype)
    result = simulate_detailed(SMALL, _stream(body, dtype, rows, cols, (a, cols, 1), None, cols), [a, out])
    program = bodies.program(body, dtype, Fabric.of(SMALL))
    config = cost.fabric_config_cycles(SMALL, program.config_bytes)
    run = int(result.timeline.ends[1] - result.timeline.starts[1]) - config
    lanes, iterations = program.lanes, -(-rows * cols // program.lanes)
    padded = np.concatenate([a, np.zeros(iterations * lanes - a.size, dtype)])
    streams = {f"a{lane}": padded[lane::lanes] for lane in range(lanes)}
    outputs, cycles = run_array(program.mapping, streams, iterations)
    traffic_bound = -(-2 * rows * cols * 4 // (SMALL.spad_banks * SMALL.bank_width_bytes))
    assert run == max(cycles, program.latency + traffic_bound)  # the array's cycles, unless the banks are slower
    array_out = np.stack([outputs[f"out{lane}"] for lane in range(lanes)], axis=1).reshape(-1)[:rows * cols]
    np.testing.assert_array_equal(array_out.reshape(rows, cols), out)


@pytest.mark.parametrize("depth, loads", [(32, 2), (2, 4)])
def test_configurations_resident_in_the_context_memory_switch_for_free(depth, loads):
    """GEMM, FABRIC, GEMM, FABRIC: with 32 contexts per PE both configurations stay resident
    (GEMM 1 slot, the body II) and each loads once; with 2 the body evicts the GEMM's and back."""
    import dataclasses

    arch = dataclasses.replace(ARCH, fabric={**ARCH.fabric, "context_depth": depth})
    fills = [encode(Op.FILL, dtype=DType.FLOAT32, addr=addr, rows=8, cols=8, stride=8) for addr in (0, 4096)]
    gemm = encode(Op.GEMM, dtype=DType.FLOAT32, m=8, n=8, k=8, a_addr=0, a_stride=8, b_addr=4096, b_stride=8,
                  acc_addr=8192, acc_stride=8)
    words = bodies.encode(LEAKY, "float32")
    fabric = encode(Op.FABRIC, dtype=DType.FLOAT32, rows=8, cols=8, a_addr=8192, a_row_stride=8, a_col_stride=1,
                    out_addr=12288, out_stride=8, nodes=len(words), **{f"node{i}": w for i, w in enumerate(words)})
    result = simulate_detailed(arch, np.array(fills + [gemm, fabric, gemm, fabric], dtype=np.int64), [])
    assert result.timeline.config_loads == loads
    durations = result.timeline.ends - result.timeline.starts
    program = bodies.program(LEAKY, "float32", Fabric.of(arch))
    config = cost.fabric_config_cycles(arch, program.config_bytes)
    assert (durations[5] == durations[3] - config) == (depth == 32)  # the second FABRIC loads nothing
