"""REDUCE and VFUNC in the simulator: numpy semantics, validation and timing.

REDUCE folds each row of a strided tile into a column element, left to right in float32 (a
numpy loop over the columns is the reference, bit for bit); VFUNC computes special.py's
function of a * scale + offset, bit for bit. The timing tests check cost.py's closed forms.
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import CommandError, function_unit, load_arch, preset_names, simulate, simulate_detailed, special
from cgra_sim.isa import VFUNC_OFFSET, VFUNC_SCALE, DType, Op, ReduceFunc, VFunc, encode
from sim_records import dma_record

ARCH = load_arch("cgra-8x8")
PRESETS = [load_arch(name) for name in preset_names()]


def _bits(value: float) -> int:
    return int(np.array([value], np.float32).view(np.uint32)[0])


def _run(records, arrays):
    simulate(ARCH, np.array(records, dtype=np.int64), arrays)
    return arrays


def _reference_fold(func, a, start):
    total = start.astype(np.float32).copy()
    for j in range(a.shape[1]):
        column = a[:, j]
        total = np.maximum(total, column) if func is ReduceFunc.MAX else \
            total + (column * column if func is ReduceFunc.SUM_SQUARES else column)
    return total


@given(func=st.sampled_from(list(ReduceFunc)), rows=st.integers(1, 9), cols=st.integers(1, 50),
       col_stride=st.sampled_from([1, 2, 0]), seed=st.integers(0, 2**32 - 1))
def test_reduce_folds_rows_left_to_right_into_the_column(func, rows, cols, col_stride, seed):
    rng = np.random.default_rng(seed)
    row_stride = max(cols * col_stride, 1)
    flat = (rng.standard_normal(rows * row_stride + 1) * 10).astype(np.float32)
    start = rng.standard_normal(rows).astype(np.float32)
    out = np.zeros(rows, np.float32)
    records = [dma_record(Op.DMA_LOAD, 0, 0, [(flat.size, 0, 1, 1)]),
               dma_record(Op.DMA_LOAD, 1, 8192, [(rows, 0, 1, 1)]),
               encode(Op.REDUCE, func=func, dtype=DType.FLOAT32, rows=rows, cols=cols, a_addr=0,
                      a_row_stride=row_stride, a_col_stride=col_stride, out_addr=8192, out_stride=1),
               dma_record(Op.DMA_STORE, 2, 8192, [(rows, 0, 1, 1)])]
    _run(records, [flat, start, out])
    view = np.lib.stride_tricks.as_strided(flat, (rows, cols), (row_stride * 4, col_stride * 4))
    np.testing.assert_array_equal(out, _reference_fold(func, view, start))


def test_a_max_of_masked_entries_ignores_minus_infinity_and_propagates_nan():
    a = np.array([[-np.inf, 1.0, -np.inf], [-np.inf, -np.inf, -np.inf], [np.nan, 0.0, 2.0]], np.float32)
    out = np.full(3, -np.inf, np.float32)
    records = [dma_record(Op.DMA_LOAD, 0, 0, [(3, 0, 1, 3), (3, 1, 1, 1)]),
               dma_record(Op.DMA_LOAD, 1, 64, [(3, 0, 1, 1)]),
               encode(Op.REDUCE, func=ReduceFunc.MAX, dtype=DType.FLOAT32, rows=3, cols=3, a_addr=0,
                      a_row_stride=3, a_col_stride=1, out_addr=64, out_stride=1),
               dma_record(Op.DMA_STORE, 1, 64, [(3, 0, 1, 1)])]
    _run(records, [a, out])
    assert out[0] == 1.0 and out[1] == -np.inf and np.isnan(out[2])


@given(func=st.sampled_from(list(VFunc)), rows=st.integers(1, 6), cols=st.integers(1, 12),
       scale=st.sampled_from([None, 0.5, -3.0]), offset=st.sampled_from([None, 1e-5, -2.0]),
       seed=st.integers(0, 2**32 - 1))
def test_vfunc_computes_the_specified_sequence(func, rows, cols, scale, offset, seed):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
    out = np.zeros((rows, cols), np.float32)
    flags = (VFUNC_SCALE if scale is not None else 0) | (VFUNC_OFFSET if offset is not None else 0)
    records = [dma_record(Op.DMA_LOAD, 0, 0, [(rows, 0, 1, cols), (cols, 1, 1, 1)]),
               encode(Op.VFUNC, flags=flags, func=func, dtype=DType.FLOAT32, rows=rows, cols=cols, a_addr=0,
                      a_row_stride=cols, a_col_stride=1, out_addr=4096, out_stride=cols,
                      scale_bits=_bits(scale) if scale is not None else 0,
                      offset_bits=_bits(offset) if offset is not None else 0),
               dma_record(Op.DMA_STORE, 1, 4096, [(rows, 0, 1, cols), (cols, 1, 1, 1)])]
    _run(records, [a, out])
    t = a * np.float32(scale) if scale is not None else a
    t = t + np.float32(offset) if offset is not None else t
    np.testing.assert_array_equal(out, special.FUNCTIONS[func.name.lower()](t))


BAD = {
    "reduce: unknown func": (Op.REDUCE, dict(func=4), ["func 4", "SUM=1"]),
    "reduce: int32": (Op.REDUCE, dict(dtype=DType.INT32), ["dtype code 2"]),
    "reduce: flags": (Op.REDUCE, dict(flags=1), ["unknown bits 0x1"]),
    "reduce: beyond the scratchpad": (Op.REDUCE, dict(a_addr=ARCH.spad_bytes - 8), ["A", "-byte scratchpad"]),
    "vfunc: unknown func": (Op.VFUNC, dict(func=11), ["func 11", "EXP=2"]),
    "vfunc: scale bits without the flag": (Op.VFUNC, dict(scale_bits=5), ["scale_bits is 5", "must be 0"]),
    "vfunc: rows overlap": (Op.VFUNC, dict(out_stride=2), ["overlap"]),
    "vfunc: negative stride": (Op.VFUNC, dict(a_col_stride=-1), ["strides must be >= 0"]),
}


@pytest.mark.parametrize("op, change, words", BAD.values(), ids=BAD.keys())
def test_invalid_row_commands_are_refused_naming_the_command(op, change, words):
    fields = dict(func=1 if op is Op.REDUCE else VFunc.EXP, dtype=DType.FLOAT32, rows=2, cols=4, a_addr=0,
                  a_row_stride=4, a_col_stride=1, out_addr=128, out_stride=1 if op is Op.REDUCE else 4)
    fields.update(change)
    fill = encode(Op.FILL, dtype=DType.FLOAT32, addr=0, rows=2, cols=4, stride=4)
    with pytest.raises(CommandError) as info:
        simulate(ARCH, np.array([fill, encode(op, **fields)]), [])
    assert str(info.value).startswith(f"command 1 ({op.name}): ")
    for word in words:
        assert word in str(info.value)


def _cycles(arch, record) -> int:
    fill = encode(Op.FILL, dtype=DType.FLOAT32, addr=0, rows=64, cols=64, stride=64)
    result = simulate_detailed(arch, np.array([fill, record], dtype=np.int64), [])
    return int(result.timeline.ends[1] - result.timeline.starts[1])


@given(arch=st.sampled_from(PRESETS), rows=st.integers(1, 40), cols=st.integers(1, 64))
def test_reduce_takes_a_lane_a_row_and_a_cycle_a_column(arch, rows, cols):
    record = encode(Op.REDUCE, func=ReduceFunc.SUM, dtype=DType.FLOAT32, rows=rows, cols=cols, a_addr=0,
                    a_row_stride=cols, a_col_stride=1, out_addr=12288, out_stride=1)
    assert _cycles(arch, record) == -(-rows // arch.vector_lanes) * cols + 2


WITHOUT_UNIT = [dataclasses.replace(arch, function_unit=None) for arch in PRESETS]


@given(arch=st.sampled_from(PRESETS + WITHOUT_UNIT), func=st.sampled_from(list(VFunc)), rows=st.integers(1, 20),
       cols=st.integers(1, 40), scaled=st.booleans())
def test_vfunc_takes_its_sequence_on_the_lanes_or_through_the_function_unit(arch, func, rows, cols, scaled):
    """On the lanes a sequence's operation a cycle; through a function unit that has the
    function an element a pipeline a cycle, plus the fill of its depth - 1, with the lanes'
    share beside it (function_unit.split: never later than either alone); whichever is sooner."""
    record = encode(Op.VFUNC, flags=VFUNC_SCALE if scaled else 0, func=func, dtype=DType.FLOAT32, rows=rows,
                    cols=cols, a_addr=0, a_row_stride=cols, a_col_stride=1, out_addr=32768, out_stride=cols,
                    scale_bits=_bits(0.5) if scaled else 0)
    ops = special.OPS[func.name.lower()] + scaled
    lanes = -(-rows * cols * ops // arch.vector_lanes)
    unit = arch.function_unit
    if unit is not None and func.name.lower() in unit["functions"]:
        shared = function_unit.split(unit, arch.vector_lanes, rows * cols, ops)[1]
        assert shared <= min(lanes, -(-rows * cols // unit["lanes"]) + ops - 1)
        lanes = shared
    assert _cycles(arch, record) == lanes + 2
