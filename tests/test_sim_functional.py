"""The simulator's functional core, against numpy formulations written here.

Property tests build small streams record by record (isa.encode), run them through cgra_sim and
compare bit for bit with a reference computed in this file: DMA boxes point by point, GEMM and
EPILOGUE with numpy int64 arithmetic wrapped to int32 (float32: np.matmul, rtol 1e-5).
Validation (bad commands refused) and the decoder's fast paths: test_sim_validation.py; the
helpers: tests/sim_records.py.
"""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import load_arch, preset_names, run_functional, simulate, streams
from cgra_sim.isa import (DMA_FILL_LOWEST, EPILOGUE_BIAS, EPILOGUE_CLIP, EPILOGUE_RELU, EPILOGUE_RESIDUAL,
                          GEMM_ACCUMULATE, DType, Op, encode)

from sim_records import (DTYPES, dma_record, box_points, inside, random_array, wrap_int32, boxes,
                         matrix_load, matrix_store)

ARCH = load_arch("cgra-8x8")


@given(boxes(for_store=False), st.booleans())
def test_dma_load_matches_pointwise_reference(case, lowest):
    """The halo holds 0, or with DMA_FILL_LOWEST the dtype's lowest value (-inf, -128, INT32_MIN)."""
    rng = np.random.default_rng(case["seed"])
    tensor = random_array(rng, case["shape"], case["dtype"])
    record = dma_record(Op.DMA_LOAD, 0, case["spad_addr"], case["loops"], case["origin"],
                        case["pad_lo"], case["pad_hi"], flags=DMA_FILL_LOWEST if lowest else 0)
    spad = run_functional(ARCH, np.array([record]), [tensor])

    expected = np.zeros(ARCH.spad_bytes, dtype=np.uint8)
    size = tensor.itemsize
    fill = (-np.inf if tensor.dtype == np.float32 else np.iinfo(tensor.dtype).min) if lowest else 0
    for coord, offset in box_points(case["loops"], case["origin"], tensor.ndim):
        value = tensor[coord] if inside(coord, tensor.shape) else tensor.dtype.type(fill)
        addr = case["spad_addr"] + size * offset
        expected[addr:addr + size] = np.array([value], dtype=tensor.dtype).view(np.uint8)
    np.testing.assert_array_equal(spad, expected)


@given(boxes(for_store=True))
def test_dma_store_matches_pointwise_reference(case):
    rng = np.random.default_rng(case["seed"])
    size = np.dtype(case["dtype"]).itemsize
    offsets = [offset for _, offset in box_points(case["loops"], case["origin"], len(case["shape"]))]
    first = case["spad_addr"] + size * min(offsets)
    count = max(offsets) - min(offsets) + 1
    source = random_array(rng, (count,), case["dtype"])  # fills the scratchpad under the box
    target = random_array(rng, case["shape"], case["dtype"])
    expected = target.copy()
    records = [dma_record(Op.DMA_LOAD, 0, first, [(count, 0, 1, 1)]),
               dma_record(Op.DMA_STORE, 1, case["spad_addr"], case["loops"], case["origin"],
                          case["pad_lo"], case["pad_hi"])]
    simulate(ARCH, np.array(records), [source, target])

    for coord, offset in box_points(case["loops"], case["origin"], target.ndim):
        if inside(coord, target.shape):
            expected[coord] = source[offset - min(offsets)]
    np.testing.assert_array_equal(target.view(np.uint8), expected.view(np.uint8))


def test_commands_may_come_as_bytes():
    tensor = np.arange(12, dtype=np.int32).reshape(3, 4)
    out = np.zeros_like(tensor)
    records = np.array([dma_record(Op.DMA_LOAD, 0, 0, [(3, 0, 1, 4), (4, 1, 1, 1)]),
                        dma_record(Op.DMA_STORE, 1, 0, [(3, 0, 1, 4), (4, 1, 1, 1)])], dtype="<i8")
    stats = simulate(ARCH, records.tobytes(), [tensor, out])
    np.testing.assert_array_equal(out, tensor)
    assert stats.dma_load_bytes == stats.dma_store_bytes == 48


@given(m=st.integers(1, 64), n=st.integers(1, 64), k=st.integers(1, 64),
       dtype=st.sampled_from(["int8", "float32"]), accumulate=st.booleans(),
       gaps=st.tuples(*[st.integers(0, 3)] * 3), seed=st.integers(0, 2**32 - 1))
def test_gemm_matches_numpy(m, n, k, dtype, accumulate, gaps, seed):
    rng = np.random.default_rng(seed)
    acc_dtype = "int32" if dtype == "int8" else "float32"
    a, b = random_array(rng, (m, k), dtype), random_array(rng, (k, n), dtype)
    acc0, out = random_array(rng, (m, n), acc_dtype), np.zeros((m, n), acc_dtype)
    a_stride, b_stride, acc_stride = k + gaps[0], n + gaps[1], n + gaps[2]
    size = np.dtype(dtype).itemsize
    a_addr, b_addr = 3, 3 + m * a_stride * size  # unaligned on purpose
    acc_addr = 4096 * 16
    records = [matrix_load(0, a_addr, m, k, a_stride), matrix_load(1, b_addr, k, n, b_stride)]
    if accumulate:
        records.append(matrix_load(2, acc_addr, m, n, acc_stride))
    records.append(encode(Op.GEMM, flags=GEMM_ACCUMULATE if accumulate else 0,
                          dtype=DType.from_name(dtype), m=m, n=n, k=k, a_addr=a_addr,
                          a_stride=a_stride, b_addr=b_addr, b_stride=b_stride, acc_addr=acc_addr,
                          acc_stride=acc_stride))
    records.append(matrix_store(3, acc_addr, m, n, acc_stride))
    stats = simulate(ARCH, np.array(records), [a, b, acc0, out])

    assert stats.macs == m * n * k
    if dtype == "int8":
        expected = a.astype(np.int64) @ b.astype(np.int64) + (acc0 if accumulate else 0)
        np.testing.assert_array_equal(out, wrap_int32(expected))
    else:
        expected = np.matmul(a, b, dtype=np.float32) + (acc0 if accumulate else np.float32(0))
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@given(dtype=st.sampled_from(DTYPES), rows=st.integers(1, 20), cols=st.integers(1, 20),
       gap=st.integers(0, 3), addr=st.integers(0, 100), seed=st.integers(0, 2**32 - 1))
def test_fill_writes_the_constant_and_nothing_else(dtype, rows, cols, gap, addr, seed):
    rng = np.random.default_rng(seed)
    value = random_array(rng, (1,), dtype)
    bits = int(value.view(np.uint32)[0]) if dtype == "float32" else int(value[0])
    record = encode(Op.FILL, dtype=DType.from_name(dtype), addr=addr, rows=rows, cols=cols,
                    stride=cols + gap, value_bits=bits)
    spad = run_functional(ARCH, np.array([record]), [])

    expected = np.zeros(ARCH.spad_bytes, dtype=np.uint8)
    size = value.itemsize
    for r in range(rows):
        start = addr + r * (cols + gap) * size
        expected[start:start + cols * size] = np.tile(value.view(np.uint8), cols)
    np.testing.assert_array_equal(spad, expected)


@given(dtype=st.sampled_from(["int32", "float32"]), m=st.integers(1, 24), n=st.integers(1, 24),
       bias=st.booleans(), relu=st.booleans(), in_place=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_epilogue_matches_numpy(dtype, m, n, bias, relu, in_place, seed):
    rng = np.random.default_rng(seed)
    acc, bias_row = random_array(rng, (m, n), dtype), random_array(rng, (n,), dtype)
    out = np.zeros((m, n), dtype)
    acc_addr, bias_addr = 0, 4 * m * n
    out_addr = acc_addr if in_place else bias_addr + 4 * n + 4
    flags = (EPILOGUE_BIAS if bias else 0) | (EPILOGUE_RELU if relu else 0)
    code = DType.from_name(dtype)
    records = [matrix_load(0, acc_addr, m, n, n), dma_record(Op.DMA_LOAD, 1, bias_addr, [(n, 0, 1, 1)]),
               encode(Op.EPILOGUE, flags=flags, acc_dtype=code, out_dtype=code, m=m, n=n,
                      acc_addr=acc_addr, acc_stride=n, bias_addr=bias_addr, out_addr=out_addr,
                      out_stride=n),
               matrix_store(2, out_addr, m, n, n)]
    simulate(ARCH, np.array(records), [acc, bias_row, out])

    expected = acc.astype(np.int64 if dtype == "int32" else np.float32)
    if bias:
        expected = expected + bias_row
    expected = wrap_int32(expected) if dtype == "int32" else expected.astype(np.float32)
    if relu:
        expected = np.where(expected > 0, expected, 0).astype(dtype)
    np.testing.assert_array_equal(out, expected)


def value_bits(value, dtype):
    """A FILL / clip bound as record bits: the integer, or the float32 bit pattern."""
    if dtype == "float32":
        return int(np.array([value], np.float32).view(np.uint32)[0])
    return int(value)


@st.composite
def clip_bounds(draw, dtype):
    """(lo, hi) with lo <= hi, in the range the random tiles take (and sometimes infinite)."""
    if dtype == "int32":
        lo, hi = sorted(draw(st.integers(-2**31, 2**31 - 1)) for _ in range(2))
        return lo, hi
    values = st.one_of(st.floats(-3, 3, width=32), st.sampled_from([-np.inf, np.inf, 0.0, 6.0]))
    lo, hi = sorted(draw(values) for _ in range(2))
    return lo, hi


@given(data=st.data(), dtype=st.sampled_from(["int32", "float32"]), m=st.integers(1, 20),
       n=st.integers(1, 20), gap=st.integers(0, 3), bias=st.booleans(), relu=st.booleans(),
       clip=st.booleans(), out_on=st.sampled_from(["own", "acc", "residual"]),
       seed=st.integers(0, 2**32 - 1))
def test_epilogue_with_residual_and_clip_matches_numpy(data, dtype, m, n, gap, bias, relu, clip,
                                                       out_on, seed):
    """out = clip(relu(acc + bias + residual)), the residual with its own row stride (n + gap);
    the output may overwrite the accumulator or the residual (operands are read first)."""
    rng = np.random.default_rng(seed)
    acc, bias_row = random_array(rng, (m, n), dtype), random_array(rng, (n,), dtype)
    residual = random_array(rng, (m, n), dtype)
    lo, hi = data.draw(clip_bounds(dtype)) if clip else (0, 0)
    stride = n + gap
    acc_addr, bias_addr = 0, 4 * m * n
    res_addr = bias_addr + 4 * n
    out_addr = {"own": res_addr + 4 * m * stride, "acc": acc_addr, "residual": res_addr}[out_on]
    out_stride = stride if out_on == "residual" else n
    flags = EPILOGUE_RESIDUAL | (EPILOGUE_BIAS if bias else 0) | (EPILOGUE_RELU if relu else 0) | \
        (EPILOGUE_CLIP if clip else 0)
    code = DType.from_name(dtype)
    out = np.zeros((m, n), dtype)
    records = [matrix_load(0, acc_addr, m, n, n), dma_record(Op.DMA_LOAD, 1, bias_addr, [(n, 0, 1, 1)]),
               matrix_load(2, res_addr, m, n, stride),
               encode(Op.EPILOGUE, flags=flags, acc_dtype=code, out_dtype=code, m=m, n=n,
                      acc_addr=acc_addr, acc_stride=n, bias_addr=bias_addr, out_addr=out_addr,
                      out_stride=out_stride, residual_addr=res_addr, residual_stride=stride,
                      clip_lo_bits=value_bits(lo, dtype) if clip else 0,
                      clip_hi_bits=value_bits(hi, dtype) if clip else 0),
               matrix_store(3, out_addr, m, n, out_stride)]
    simulate(ARCH, np.array(records), [acc, bias_row, residual, out])

    if dtype == "int32":  # exact in int64, then wrapped once: the same as wrapping after each add
        expected = wrap_int32(acc.astype(np.int64) + (bias_row if bias else 0) + residual)
    else:  # float32 rounds after each add, in this order
        expected = acc + bias_row if bias else acc
        expected = expected + residual
    if relu:
        expected = np.where(expected > 0, expected, 0).astype(dtype)
    if clip:
        expected = np.clip(expected, np.array(lo, dtype), np.array(hi, dtype))
    np.testing.assert_array_equal(out, expected)


@st.composite
def gemm_tilings(draw):
    """Sizes up to 100 and tiles that fit every preset, at most 5 tiles along each dimension."""
    sizes = [draw(st.integers(1, 100)) for _ in range(3)]
    limits = (32, 32, 64)
    tile = tuple(draw(st.integers(min(limit, -(-size // 5)), limit)) for size, limit in zip(sizes, limits))
    return (*sizes, tile)


@given(shape=gemm_tilings(), dtype=st.sampled_from(["int8", "float32"]),
       arch_name=st.sampled_from(preset_names()),
       flags=st.sampled_from([0, EPILOGUE_BIAS, EPILOGUE_RELU, EPILOGUE_BIAS | EPILOGUE_RELU]),
       seed=st.integers(0, 2**32 - 1))
def test_tiled_gemm_stream_matches_numpy(shape, dtype, arch_name, flags, seed):
    m, n, k, tile = shape
    rng = np.random.default_rng(seed)
    arch = load_arch(arch_name)
    acc_dtype = "int32" if dtype == "int8" else "float32"
    a, b = random_array(rng, (m, k), dtype), random_array(rng, (k, n), dtype)
    bias = random_array(rng, (n,), acc_dtype) if dtype == "float32" else \
        rng.integers(-10**6, 10**6, n).astype(np.int32)
    out = np.zeros((m, n), acc_dtype)
    records = streams.tiled_gemm(arch, m, n, k, dtype, tile=tile, epilogue_flags=flags)
    stats = simulate(arch, records, [a, b, out, bias])

    wide = np.int64 if dtype == "int8" else np.float64
    expected = a.astype(wide) @ b.astype(wide) + (bias if flags & EPILOGUE_BIAS else 0)
    if flags & EPILOGUE_RELU:
        expected = np.maximum(expected, 0)
    if dtype == "int8":
        np.testing.assert_array_equal(out, expected)
    else:
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)
    assert stats.macs == m * n * k
    assert stats.dma_store_bytes == out.nbytes


def test_conv2d_stream_with_halo_matches_numpy():
    rng = np.random.default_rng(7)
    height, width, channels, filters = 6, 9, 5, 11
    x = random_array(rng, (height, width, channels), "int8")
    w = random_array(rng, (3, 3, channels, filters), "int8")
    y = np.zeros((height, width, filters), np.int32)
    stats = simulate(ARCH, streams.conv2d_3x3(ARCH, height, width, channels, filters), [x, w, y])

    padded = np.pad(x.astype(np.int64), ((1, 1), (1, 1), (0, 0)))
    expected = sum(padded[r:r + height, s:s + width] @ w[r, s].astype(np.int64)
                   for r in range(3) for s in range(3))
    np.testing.assert_array_equal(y, np.maximum(expected, 0))
    assert stats.dma_load_bytes < stats.dma_load_box_bytes  # halo zeros are not host traffic


@given(oh=st.integers(1, 6), ow=st.integers(1, 7), channels=st.integers(1, 20), kh=st.integers(1, 4),
       kw=st.integers(1, 4), stride=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)), dtype=st.sampled_from(["int8", "float32"]),
       accumulate=st.booleans(), channel_gap=st.integers(0, 3), seed=st.integers(0, 2**32 - 1))
def test_depthwise_matches_a_pointwise_reference(oh, ow, channels, kh, kw, stride, dilation, dtype, accumulate,
                                                 channel_gap, seed):
    """DEPTHWISE over an input window laid out (rows, columns, channels + gap), against loops."""
    rng = np.random.default_rng(seed)
    acc_dtype = "int32" if dtype == "int8" else "float32"
    (sh, sw), (dh, dw) = stride, dilation
    in_h, in_w = (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1
    pitch = channels + channel_gap  # elements between neighbouring pixels of the window
    window = random_array(rng, (in_h, in_w, pitch), dtype)
    weights, acc0 = random_array(rng, (kh, kw, channels), dtype), random_array(rng, (oh, ow, channels), acc_dtype)
    out = np.zeros((oh, ow, channels), acc_dtype)
    b_addr, acc_addr = window.nbytes + 5, 8192 * 4
    records = [dma_record(Op.DMA_LOAD, 0, 0, [(in_h, 0, 1, in_w * pitch), (in_w, 1, 1, pitch), (pitch, 2, 1, 1)]),
               dma_record(Op.DMA_LOAD, 1, b_addr, [(kh, 0, 1, kw * channels), (kw, 1, 1, channels),
                                                     (channels, 2, 1, 1)])]
    box = [(oh, 0, 1, ow * channels), (ow, 1, 1, channels), (channels, 2, 1, 1)]
    if accumulate:
        records.append(dma_record(Op.DMA_LOAD, 2, acc_addr, box))
    records.append(encode(
        Op.DEPTHWISE, flags=GEMM_ACCUMULATE if accumulate else 0, dtype=DType.from_name(dtype), oh=oh, ow=ow,
        n=channels, kh=kh, kw=kw, a_addr=0, a_y_stride=sh * in_w * pitch, a_x_stride=sw * pitch,
        a_ry_stride=dh * in_w * pitch, a_rx_stride=dw * pitch, b_addr=b_addr, b_ry_stride=kw * channels,
        b_rx_stride=channels, acc_addr=acc_addr, acc_y_stride=ow * channels, acc_x_stride=channels))
    records.append(dma_record(Op.DMA_STORE, 3, acc_addr, box))
    stats = simulate(ARCH, np.array(records), [window, weights, acc0, out])

    expected = np.zeros((oh, ow, channels), np.float64 if dtype == "float32" else np.int64)
    for y in range(oh):
        for x in range(ow):
            for ry in range(kh):
                for rx in range(kw):
                    pixel = window[y * sh + ry * dh, x * sw + rx * dw, :channels]
                    expected[y, x] += pixel.astype(expected.dtype) * weights[ry, rx]
    if accumulate:
        expected += acc0
    assert stats.macs == oh * ow * channels * kh * kw
    if dtype == "int8":
        np.testing.assert_array_equal(out, wrap_int32(expected))
    else:
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)
