"""The simulator's validation and the decoder's fast paths: every bad command or host tensor is
refused before anything runs, with a message naming the command's index and kind; a halo box's
in-bounds sub-box is exactly its in-bounds points; a repeated record is decoded once."""

import numpy as np
import pytest
from hypothesis import given

from cgra_sim import CommandError, LaunchError, load_arch, run_functional, simulate
from cgra_sim.isa import (EPILOGUE_BIAS, EPILOGUE_CLIP, EPILOGUE_RESIDUAL, GEMM_ACCUMULATE, RECORD_WORDS,
                          DType, Op, encode)

from sim_records import boxes, dma_record

ARCH = load_arch("cgra-8x8")


def _two_loads_and_a_bad_one(bad_record):
    good = dma_record(Op.DMA_LOAD, 0, 0, [(4, 0, 1, 1)])
    return np.array([good, good, bad_record])


@pytest.mark.parametrize("bad_record, op_name, words", [
    (dma_record(Op.DMA_LOAD, 0, ARCH.spad_bytes - 8, [(4, 0, 1, 1)]), "DMA_LOAD",
     [f"[{ARCH.spad_bytes - 8}, {ARCH.spad_bytes + 8})", f"{ARCH.spad_bytes}-byte scratchpad"]),
    (encode(Op.FILL, dtype=DType.INT32, addr=-4, rows=1, cols=2, stride=2), "FILL", ["[-4, 4)", "below"]),
    (dma_record(Op.DMA_LOAD, 0, 0, [(4, 0, 1, 1)], origin=(-2,), pad_lo=(1,)), "DMA_LOAD",
     ["coordinates [-2, 2)", "[-1, 4)"]),
    (dma_record(Op.DMA_LOAD, 0, 0, [(6, 0, 1, 1)], pad_hi=(1,)), "DMA_LOAD", ["[0, 6)", "[0, 5)"]),
    (dma_record(Op.DMA_LOAD, 5, 0, [(4, 0, 1, 1)]), "DMA_LOAD", ["slot 5", "binds 2 tensors"]),
    (encode(Op.GEMM, dtype=DType.INT8, m=2, n=2, k=2, a_addr=0, a_stride=2, b_addr=4096, b_stride=2,
            acc_addr=0, acc_stride=2), "GEMM", ["[4096, 4100)", "never written", "B"]),
    (encode(Op.EPILOGUE, acc_dtype=DType.INT32, out_dtype=DType.INT32, m=1, n=4, acc_addr=0,
            acc_stride=4, out_addr=64, out_stride=4, bias_addr=32, flags=EPILOGUE_BIAS),
     "EPILOGUE", ["bias", "[32, 48)"]),
    ([99] + [0] * (RECORD_WORDS - 1), "opcode 99", ["unknown opcode 99"]),
    (encode(Op.GEMM, dtype=DType.INT32, m=1, n=1, k=1), "GEMM", ["dtype code 2"]),
    (encode(Op.EPILOGUE, acc_dtype=DType.INT32, out_dtype=DType.FLOAT32, m=1, n=1), "EPILOGUE",
     ["out_dtype code 3"]),
    (dma_record(Op.DMA_LOAD, 0, 0, [(0, 0, 1, 1)]), "DMA_LOAD", ["extent0 must be >= 1"]),
    (dma_record(Op.DMA_LOAD, 0, 0, [(4, 1, 1, 1)]), "DMA_LOAD", ["tdim0 = 1", "rank 1"]),
    (dma_record(Op.DMA_LOAD, 0, 0, [(4, 0, 1, 0)]), "DMA_LOAD", ["alias"]),
    (dma_record(Op.DMA_STORE, 1, 0, [(2, 0, 0, 1)]), "DMA_STORE", ["revisits"]),
    (dma_record(Op.DMA_STORE, 1, 0, [(1 << 23, 0, 1, 0)], pad_hi=(1 << 23,)), "DMA_STORE",
     ["8388608 points", "limit"]),
    (encode(Op.FILL, dtype=DType.INT8, rows=2, cols=4, stride=2, value_bits=1), "FILL", ["overlap"]),
    (encode(Op.FILL, dtype=DType.INT8, rows=1, cols=4, stride=4, value_bits=300), "FILL", ["300"]),
    (encode(Op.GEMM, flags=4, dtype=DType.INT8, m=1, n=1, k=1), "GEMM", ["unknown bits 0x4"]),
    (encode(Op.FILL, dtype=DType.INT8, rows=1, cols=1) [:-1] + [1], "FILL", ["word 31"]),
    (encode(Op.EPILOGUE, flags=EPILOGUE_RESIDUAL, acc_dtype=DType.INT32, out_dtype=DType.INT32, m=1,
            n=4, acc_addr=0, acc_stride=4, out_addr=0, out_stride=4, residual_addr=ARCH.spad_bytes - 8,
            residual_stride=4), "EPILOGUE", ["residual", f"{ARCH.spad_bytes}-byte scratchpad"]),
    (encode(Op.EPILOGUE, acc_dtype=DType.INT32, out_dtype=DType.INT32, m=1, n=4, acc_addr=0,
            acc_stride=4, out_addr=0, out_stride=4, residual_stride=3), "EPILOGUE",
     ["residual_stride is 3", "flag 0x4 is off"]),
    (encode(Op.EPILOGUE, flags=EPILOGUE_CLIP, acc_dtype=DType.INT32, out_dtype=DType.INT32, m=1, n=4,
            acc_addr=0, acc_stride=4, out_addr=0, out_stride=4, clip_lo_bits=5, clip_hi_bits=2),
     "EPILOGUE", ["clip bounds [5, 2]", "lo <= hi"]),
    (encode(Op.EPILOGUE, flags=EPILOGUE_CLIP, acc_dtype=DType.FLOAT32, out_dtype=DType.FLOAT32, m=1,
            n=4, acc_addr=0, acc_stride=4, out_addr=0, out_stride=4, clip_lo_bits=0x7FC00000),
     "EPILOGUE", ["nan", "NaN"]),
    (encode(Op.EPILOGUE, flags=EPILOGUE_CLIP, acc_dtype=DType.INT32, out_dtype=DType.INT32, m=1, n=4,
            acc_addr=0, acc_stride=4, out_addr=0, out_stride=4, clip_hi_bits=2**31), "EPILOGUE",
     ["2147483648 does not fit int32"]),
    (encode(Op.EPILOGUE, flags=64, acc_dtype=DType.INT32, out_dtype=DType.INT32, m=1, n=1),
     "EPILOGUE", ["unknown bits 0x40"]),
])
def test_invalid_command_is_refused_before_anything_runs(bad_record, op_name, words):
    source = np.arange(4, dtype=np.int32)
    target = np.full(4, -1, dtype=np.int32)
    records = _two_loads_and_a_bad_one(bad_record)
    records = np.insert(records, 2, dma_record(Op.DMA_STORE, 1, 0, [(4, 0, 1, 1)]), axis=0)
    with pytest.raises(CommandError) as info:
        simulate(ARCH, records, [source, target])
    message = str(info.value)
    assert message.startswith(f"command 3 ({op_name}): ")
    assert info.value.index == 3
    for word in words:
        assert word in message
    np.testing.assert_array_equal(target, -1)  # the store before the bad command did not run


def test_store_from_halo_does_not_count_as_reading_unwritten_bytes():
    target = np.zeros(4, dtype=np.int32)
    records = [encode(Op.FILL, dtype=DType.INT32, addr=4, rows=1, cols=4, stride=4, value_bits=5),
               dma_record(Op.DMA_STORE, 0, 0, [(6, 0, 1, 1)], origin=(-1,), pad_lo=(1,), pad_hi=(1,))]
    simulate(ARCH, np.array(records), [target])
    np.testing.assert_array_equal(target, 5)


@pytest.mark.parametrize("tensors, words", [
    ([np.zeros(4, np.uint32)], "dtype uint32"),
    ([np.zeros((1,) * 5, np.int8)], "rank 5"),
    ([np.zeros((4, 4), np.int8)[:, ::2]], "C-contiguous"),
    ([[1, 2, 3]], "numpy array"),
])
def test_bad_host_tensor_is_refused(tensors, words):
    with pytest.raises(LaunchError, match=words):
        simulate(ARCH, np.zeros((0, RECORD_WORDS), np.int64), tensors)


def test_malformed_command_buffer_is_refused():
    with pytest.raises(LaunchError, match="whole number"):
        simulate(ARCH, b"\0" * 100, [])
    with pytest.raises(LaunchError, match="shape"):
        simulate(ARCH, np.zeros((2, 5), np.int64), [])


@given(boxes(for_store=False))
def test_inbounds_ranges_are_the_inbounds_mask_when_given(case):
    """The closed-form sub-box a halo load or store moves in one copy is exactly the in-bounds
    points (box.inbounds_mask); None only when two loops walk one dimension."""
    from cgra_sim.box import DmaBox

    box = DmaBox(dma_record(Op.DMA_LOAD, 0, 0, case["loops"], case["origin"]))
    ranges = box.inbounds_ranges(case["shape"])
    walked = [tdim for extent, tdim, _, _ in case["loops"] if extent > 1]
    assert (ranges is None) == (len(walked) != len(set(walked)))
    if ranges is not None:
        expected = np.zeros(box.extents, dtype=bool)
        expected[tuple(slice(start, stop) for start, stop in ranges)] = True
        np.testing.assert_array_equal(box.inbounds_mask(case["shape"]), expected)


def test_store_from_halo_names_the_unwritten_byte_inside_the_tensor():
    target = np.zeros((3, 3), dtype=np.int8)
    # 4x4 box at (-1, -1): rows 1..3, cols 1..3 of the box land in the tensor; the fill leaves
    # box element (3, 3) (scratchpad byte 15) unwritten.
    records = [encode(Op.FILL, dtype=DType.INT8, addr=0, rows=1, cols=15, stride=15, value_bits=1),
               dma_record(Op.DMA_STORE, 0, 0, [(4, 0, 1, 4), (4, 1, 1, 1)], origin=(-1, -1),
                          pad_lo=(1, 1), pad_hi=(0, 0))]
    with pytest.raises(CommandError, match=r"command 1 \(DMA_STORE\).*byte 15 was never written"):
        simulate(ARCH, np.array(records), [target])


def test_a_repeated_record_is_decoded_once_and_keeps_its_own_index():
    from cgra_sim.validate import validate_stream

    load = dma_record(Op.DMA_LOAD, 0, 0, [(4, 0, 1, 1)])
    gemm = encode(Op.GEMM, flags=GEMM_ACCUMULATE, dtype=DType.INT8, m=1, n=1, k=4, a_addr=0,
                  a_stride=4, b_addr=0, b_stride=1, acc_addr=64, acc_stride=1)
    fill = encode(Op.FILL, dtype=DType.INT32, addr=64, rows=1, cols=1, stride=1)
    source = np.arange(4, dtype=np.int8)
    decoded = validate_stream(ARCH, np.array([load, fill, gemm, load, gemm, gemm]), [source])
    assert [c.index for c in decoded] == list(range(6))
    assert [c.repeat_of for c in decoded] == [-1, -1, -1, 0, 2, 2]
    assert decoded[4].acc is decoded[2].acc  # shared, not decoded again
    spad = run_functional(ARCH, np.array([load, fill, gemm, load, gemm, gemm]), [source])
    assert spad[64:68].view(np.int32)[0] == 3 * int(source.astype(np.int32) @ source)
