"""The ELTWISE command in the simulator: numpy semantics, validation and timing.

Property tests lay two operands out in the scratchpad with arbitrary row and column strides (a
stride of 0 broadcasts the operand along that axis), run one ELTWISE through cgra_sim and compare
bit for bit with numpy on the same strided views (float32 too: one rounding per element either
way). The timing tests check the closed form of docs/simulator.md.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import CommandError, load_arch, preset_names, simulate, simulate_detailed
from cgra_sim.isa import DType, EltwiseFunc, Op, encode
from sim_records import dma_record, random_array

ARCH = load_arch("cgra-8x8")
PRESETS = [load_arch(name) for name in preset_names()]
NUMPY_FUNCS = {EltwiseFunc.ADD: np.add, EltwiseFunc.SUBTRACT: np.subtract,
               EltwiseFunc.MULTIPLY: np.multiply, EltwiseFunc.MAXIMUM: np.maximum,
               EltwiseFunc.MINIMUM: np.minimum}


def _operand(rng, rows, cols, row_stride, col_stride, dtype):
    """A flat host array holding an operand read at (row_stride, col_stride), and its view."""
    size = (rows - 1) * row_stride + (cols - 1) * col_stride + 1
    flat = random_array(rng, (size,), dtype)
    view = np.lib.stride_tricks.as_strided(flat, (rows, cols), (row_stride * flat.itemsize,
                                                                col_stride * flat.itemsize))
    return flat, view


def _eltwise_stream(func, dtype, rows, cols, a, b, out_stride, in_place=False):
    """Load both flat operands, one ELTWISE, store the (rows, cols) output."""
    (a_flat, a_rs, a_cs), (b_flat, b_rs, b_cs) = a, b
    itemsize = np.dtype(dtype).itemsize
    b_addr = -(-a_flat.nbytes // 64) * 64
    out_addr = 0 if in_place else b_addr + -(-b_flat.nbytes // 64) * 64
    return [dma_record(Op.DMA_LOAD, 0, 0, [(a_flat.size, 0, 1, 1)]),
            dma_record(Op.DMA_LOAD, 1, b_addr, [(b_flat.size, 0, 1, 1)]),
            encode(Op.ELTWISE, func=func, dtype=DType.from_name(dtype), rows=rows, cols=cols,
                   a_addr=0, a_row_stride=a_rs, a_col_stride=a_cs, b_addr=b_addr,
                   b_row_stride=b_rs, b_col_stride=b_cs, out_addr=out_addr, out_stride=out_stride),
            dma_record(Op.DMA_STORE, 2, out_addr, [(rows, 0, 1, out_stride), (cols, 1, 1, 1)])], itemsize


strides = st.sampled_from([0, 1, 2, 3, 7])


@given(func=st.sampled_from(list(EltwiseFunc)), dtype=st.sampled_from(["int8", "int32", "float32"]),
       rows=st.integers(1, 9), cols=st.integers(1, 12), a_strides=st.tuples(strides, strides),
       b_strides=st.tuples(strides, strides), gap=st.integers(0, 3), seed=st.integers(0, 2**32 - 1))
def test_eltwise_matches_numpy_on_strided_and_broadcast_operands(func, dtype, rows, cols, a_strides,
                                                                 b_strides, gap, seed):
    """Any strides, 0 included (broadcast), any dtype: numpy's result bit for bit (ints wrap)."""
    rng = np.random.default_rng(seed)
    (a_rs, a_cs), (b_rs, b_cs) = a_strides, b_strides
    a_flat, a_view = _operand(rng, rows, cols, a_rs, a_cs, dtype)
    b_flat, b_view = _operand(rng, rows, cols, b_rs, b_cs, dtype)
    out = np.zeros((rows, cols), dtype)
    records, _ = _eltwise_stream(func, dtype, rows, cols, (a_flat, a_rs, a_cs), (b_flat, b_rs, b_cs),
                                 cols + gap)
    stats = simulate(ARCH, np.array(records), [a_flat, b_flat, out])
    with np.errstate(over="ignore"):
        expected = NUMPY_FUNCS[func](a_view, b_view, dtype=dtype)
    np.testing.assert_array_equal(out, expected)
    assert stats.op_counts["ELTWISE"] == 1 and stats.macs == 0


def test_eltwise_may_write_over_its_first_operand():
    """Every operand is read before the output is written, so an in-place add is well defined."""
    a = np.arange(12, dtype=np.int32)
    b = np.array([100, 200, 300], np.int32)
    out = np.zeros((4, 3), np.int32)
    records, _ = _eltwise_stream(EltwiseFunc.ADD, "int32", 4, 3, (a, 3, 1), (b, 0, 1), 3, in_place=True)
    simulate(ARCH, np.array(records), [a, b, out])
    np.testing.assert_array_equal(out, a.reshape(4, 3) + b)


def test_int8_and_int32_results_wrap_like_twos_complement():
    a = np.array([127, -128, 100, 2**31 - 1], np.int64)
    for dtype, values in (("int8", a[:3]), ("int32", a[[0, 1, 3]])):
        x, y = values.astype(dtype), np.ones(3, dtype)
        for func, wrapped in ((EltwiseFunc.ADD, values + 1), (EltwiseFunc.SUBTRACT, values - 1),
                              (EltwiseFunc.MULTIPLY, values * 1)):
            out = np.zeros((1, 3), dtype)
            records, _ = _eltwise_stream(func, dtype, 1, 3, (x, 0, 1), (y, 0, 1), 3)
            simulate(ARCH, np.array(records), [x, y, out])
            np.testing.assert_array_equal(out[0], wrapped.astype(dtype))


BAD = {
    "unknown func": (dict(func=6), ["func 6", "ADD=1"]),
    "no func": (dict(func=0), ["func 0"]),
    "flags": (dict(flags=1), ["unknown bits 0x1"]),
    "negative stride": (dict(a_col_stride=-1), ["a_col_stride", "-1"]),
    "rows overlap": (dict(out_stride=2), ["overlap"]),
    "operand beyond the scratchpad": (dict(b_addr=ARCH.spad_bytes - 8), ["B", "-byte scratchpad"]),
    "zero rows": (dict(rows=0), ["rows must be >= 1"]),
    "unknown dtype": (dict(dtype=9), ["dtype code 9"]),
}


@pytest.mark.parametrize("change, words", BAD.values(), ids=BAD.keys())
def test_invalid_eltwise_is_refused_naming_the_command(change, words):
    fields = dict(func=EltwiseFunc.ADD, dtype=DType.INT32, rows=2, cols=4, a_addr=0, a_row_stride=4,
                  a_col_stride=1, b_addr=64, b_row_stride=0, b_col_stride=1, out_addr=128, out_stride=4)
    fields.update(change)
    fills = [encode(Op.FILL, dtype=DType.INT32, addr=addr, rows=2, cols=4, stride=4) for addr in (0, 64)]
    with pytest.raises(CommandError) as info:
        simulate(ARCH, np.array(fills + [encode(Op.ELTWISE, **fields)]), [])
    assert str(info.value).startswith("command 2 (ELTWISE): ")
    for word in words:
        assert word in str(info.value)


# ---------------------------------------------------------------- timing

def _timed(arch, rows, cols, a_strides, b_strides):
    fills = [encode(Op.FILL, dtype=DType.FLOAT32, addr=addr, rows=rows, cols=cols, stride=cols)
             for addr in (0, 16384)]
    record = encode(Op.ELTWISE, func=EltwiseFunc.MULTIPLY, dtype=DType.FLOAT32, rows=rows, cols=cols,
                    a_addr=0, a_row_stride=a_strides[0], a_col_stride=a_strides[1], b_addr=16384,
                    b_row_stride=b_strides[0], b_col_stride=b_strides[1], out_addr=32768,
                    out_stride=cols)
    result = simulate_detailed(arch, np.array(fills + [record], dtype=np.int64), [])
    return int(result.timeline.ends[2] - result.timeline.starts[2])


@given(arch=st.sampled_from(PRESETS), rows=st.integers(1, 60), cols=st.integers(1, 60),
       b_form=st.sampled_from(["full", "row", "column", "scalar"]))
def test_eltwise_takes_the_slower_of_lanes_and_operand_reads(arch, rows, cols, b_form):
    """Two full operands stream 2 * rows * cols elements through the read port; a broadcast
    operand is read once along its zero-stride axis (held in registers)."""
    b_strides, b_reads = {"full": ((cols, 1), rows * cols), "row": ((0, 1), cols),
                          "column": ((1, 0), rows), "scalar": ((0, 0), 1)}[b_form]
    expected = -(-max(rows * cols, rows * cols + b_reads) // arch.vector_lanes) + 2
    assert _timed(arch, rows, cols, (cols, 1), b_strides) == expected


def test_two_full_operands_take_twice_the_lanes_time_of_one():
    arch = load_arch("cgra-8x8")
    assert _timed(arch, 32, 64, (64, 1), (64, 1)) == 2 * 32 * 64 // 8 + 2
    assert _timed(arch, 32, 64, (64, 1), (0, 0)) == 32 * 64 // 8 + 1 + 2
