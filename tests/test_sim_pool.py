"""The POOL command in the simulator: numpy semantics, validation and timing.

The reference here walks every output and tap with Python loops and the rules of isa.py (a tap
counts if its window position lies in the valid rectangle; the average divides by the taps in
the count rectangle), independently of the simulator's vectorised numpy.
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import CommandError, load_arch, preset_names, simulate, simulate_detailed
from cgra_sim.isa import POOL_AVERAGE, DType, Op, encode

ARCH = load_arch("cgra-8x8")
PRESETS = [load_arch(name) for name in preset_names()]


def window_load(slot, addr, shape):
    """A DMA_LOAD of a compact 3-D array (rows, columns, channels) into the scratchpad at `addr`."""
    rows, cols, pitch = shape
    fields = {"slot": slot, "spad_addr": addr, "extent3": 1}
    for loop, (extent, stride) in enumerate(((rows, cols * pitch), (cols, pitch), (pitch, 1))):
        fields.update({f"extent{loop}": extent, f"tdim{loop}": loop, f"tstep{loop}": 1, f"sstride{loop}": stride})
    return encode(Op.DMA_LOAD, **fields)


def window_store(slot, addr, shape):
    record = window_load(slot, addr, shape)
    record[0] = int(Op.DMA_STORE)
    return record


def pool_record(case, a_addr, out_addr):
    words = {name: case[name] for name in ("oh", "ow", "n", "kh", "kw", "stride_y", "stride_x", "dilation_y",
                                             "dilation_x")}
    valid, count = case["valid"], case["count"]
    words.update(valid_y_lo=valid[0], valid_y_hi=valid[1], valid_x_lo=valid[2], valid_x_hi=valid[3])
    if case["average"]:
        words.update(count_y_lo=count[0], count_y_hi=count[1], count_x_lo=count[2], count_x_hi=count[3])
    pitch = case["n"] + case["gap"]
    return encode(Op.POOL, flags=POOL_AVERAGE if case["average"] else 0, dtype=DType.from_name(case["dtype"]),
                  a_addr=a_addr, a_row_stride=case["in_w"] * pitch, a_col_stride=pitch, out_addr=out_addr,
                  out_y_stride=case["ow"] * case["n"], out_x_stride=case["n"], **words)


@st.composite
def pool_cases(draw):
    average = draw(st.booleans())
    dtype = "float32" if average else draw(st.sampled_from(["int8", "int32", "float32"]))
    case = dict(average=average, dtype=dtype, oh=draw(st.integers(1, 5)), ow=draw(st.integers(1, 6)),
                n=draw(st.integers(1, 9)), kh=draw(st.integers(1, 4)), kw=draw(st.integers(1, 4)),
                stride_y=draw(st.integers(1, 3)), stride_x=draw(st.integers(1, 3)),
                dilation_y=draw(st.integers(1, 2)), dilation_x=draw(st.integers(1, 2)),
                gap=draw(st.integers(0, 2)), seed=draw(st.integers(0, 2**32 - 1)))
    case["in_h"] = (case["oh"] - 1) * case["stride_y"] + (case["kh"] - 1) * case["dilation_y"] + 1
    case["in_w"] = (case["ow"] - 1) * case["stride_x"] + (case["kw"] - 1) * case["dilation_x"] + 1

    def rectangle():
        y_lo, x_lo = draw(st.integers(0, case["in_h"])), draw(st.integers(0, case["in_w"]))
        return (y_lo, draw(st.integers(y_lo, case["in_h"] + 2)), x_lo, draw(st.integers(x_lo, case["in_w"] + 2)))

    case["valid"], case["count"] = rectangle(), rectangle()
    return case


def reference(case, window):
    """out[y, x, c] by loops over outputs and taps (float64 sums for the average)."""
    out = np.zeros((case["oh"], case["ow"], case["n"]), np.float64)
    y_lo, y_hi, x_lo, x_hi = case["valid"]
    cy_lo, cy_hi, cx_lo, cx_hi = case["count"]
    lowest = -np.inf if case["dtype"] == "float32" else np.iinfo(case["dtype"]).min
    for y in range(case["oh"]):
        for x in range(case["ow"]):
            rows = [y * case["stride_y"] + ry * case["dilation_y"] for ry in range(case["kh"])]
            cols = [x * case["stride_x"] + rx * case["dilation_x"] for rx in range(case["kw"])]
            taps = [window[py, px, :case["n"]].astype(np.float64) for py in rows for px in cols
                    if y_lo <= py < y_hi and x_lo <= px < x_hi]
            if not case["average"]:
                out[y, x] = np.max(taps, axis=0) if taps else lowest
                continue
            count = sum(cy_lo <= py < cy_hi for py in rows) * sum(cx_lo <= px < cx_hi for px in cols)
            out[y, x] = (np.sum(taps, axis=0) if taps else 0) / max(count, 1)
    return out


def run_pool(case, arch=ARCH):
    rng = np.random.default_rng(case["seed"])
    pitch = case["n"] + case["gap"]
    shape = (case["in_h"], case["in_w"], pitch)
    if case["dtype"] == "float32":
        window = rng.standard_normal(shape).astype(np.float32)
    else:
        info = np.iinfo(case["dtype"])
        window = rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=case["dtype"])
    out = np.zeros((case["oh"], case["ow"], case["n"]), case["dtype"])
    out_addr = -(-window.nbytes // 64) * 64
    records = [window_load(0, 0, shape), pool_record(case, 0, out_addr), window_store(1, out_addr, out.shape)]
    result = simulate_detailed(arch, np.array(records), [window, out])
    return window, out, result


@given(pool_cases())
def test_pool_matches_a_pointwise_reference(case):
    window, out, _ = run_pool(case)
    expected = reference(case, window)
    if case["average"]:
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(out, expected.astype(case["dtype"]))


def test_max_pool_skips_padding_taps_even_where_the_scratchpad_holds_larger_values():
    """The padding is not a value in the scratchpad: a tap outside the valid rectangle never wins."""
    case = dict(average=False, dtype="float32", oh=1, ow=1, n=1, kh=2, kw=2, stride_y=1, stride_x=1,
                dilation_y=1, dilation_x=1, gap=0, in_h=2, in_w=2, valid=(1, 2, 1, 2), count=(0, 0, 0, 0), seed=0)
    window = -np.arange(1, 5, dtype=np.float32).reshape(2, 2, 1)  # -1, -2, -3, -4; only -4 is valid
    out = np.zeros((1, 1, 1), np.float32)
    records = [window_load(0, 0, (2, 2, 1)), pool_record(case, 0, 64), window_store(1, 64, (1, 1, 1))]
    simulate(ARCH, np.array(records), [window, out])
    assert out[0, 0, 0] == -4


def test_average_divides_by_the_count_rectangle_not_the_valid_one():
    """count_include_pad: the sum of the valid taps over every tap of the padded image."""
    case = dict(average=True, dtype="float32", oh=1, ow=1, n=1, kh=3, kw=3, stride_y=1, stride_x=1,
                dilation_y=1, dilation_x=1, gap=0, in_h=3, in_w=3, valid=(1, 3, 1, 3), count=(0, 3, 0, 3), seed=0)
    window = np.ones((3, 3, 1), np.float32)
    out = np.zeros((1, 1, 1), np.float32)
    records = [window_load(0, 0, (3, 3, 1)), pool_record(case, 0, 64), window_store(1, 64, (1, 1, 1))]
    simulate(ARCH, np.array(records), [window, out])
    assert out[0, 0, 0] == np.float32(4) / np.float32(9)


BAD = {
    "average of int8": (dict(flags=POOL_AVERAGE, dtype=int(DType.INT8)), "dtype code 1 is not allowed"),
    "unknown flag": (dict(flags=2), "unknown bits 0x2"),
    "zero stride": (dict(stride_y=0), "stride_y must be >= 1"),
    "negative row stride": (dict(a_row_stride=-4), "strides must be >= 0"),
    "overlapping output": (dict(out_x_stride=1), "out strides (y 8, x 1) overlap"),
    "inverted rectangle": (dict(valid_y_lo=3, valid_y_hi=2), "valid rectangle y range [3, 2)"),
    "count words without average": (dict(count_y_hi=4), "POOL_AVERAGE is off"),
    "window past the scratchpad": (dict(a_addr=ARCH.spad_bytes - 8), "exceed the"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_pool_records_are_refused_naming_the_command(name):
    words = dict(flags=0, dtype=int(DType.FLOAT32), oh=2, ow=2, n=4, kh=2, kw=2, a_addr=0, a_row_stride=12,
                 a_col_stride=4, stride_y=1, stride_x=1, dilation_y=1, dilation_x=1, out_addr=256,
                 out_y_stride=8, out_x_stride=4, valid_y_lo=0, valid_y_hi=3, valid_x_lo=0, valid_x_hi=3)
    changes, message = BAD[name]
    words.update(changes)
    with pytest.raises(CommandError, match=r"command 0 \(POOL\)") as err:
        simulate(ARCH, np.array([encode(Op.POOL, **words)]), [])
    assert message in str(err.value)


# ---------------------------------------------------------------- timing

@given(arch=st.sampled_from(PRESETS), case=pool_cases())
def test_pool_takes_taps_over_lanes_plus_two(arch, case):
    """Lanes-limited, like the vector unit's other commands: one tap of one output per lane per cycle."""
    _, _, result = run_pool(case, arch)
    taps = case["oh"] * case["ow"] * case["n"] * case["kh"] * case["kw"]
    timeline, stats = result.timeline, result.stats
    assert int(timeline.ends[1] - timeline.starts[1]) == -(-taps // arch.vector_lanes) + 2
    assert int(timeline.starts[1]) == int(timeline.ends[0])  # waits for its window, nothing else
    assert stats.busy_cycles["vector"] == -(-taps // arch.vector_lanes) + 2
    assert stats.macs == 0 and stats.op_counts["POOL"] == 1


@given(case=pool_cases(), lanes=st.sampled_from([2, 4]))
def test_more_vector_lanes_never_slow_a_pool(case, lanes):
    wider = dataclasses.replace(ARCH, vector_lanes=ARCH.vector_lanes * lanes)
    assert run_pool(case, wider)[2].stats.cycles <= run_pool(case, ARCH)[2].stats.cycles
