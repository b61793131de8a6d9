"""The EPILOGUE intrinsic (kernels/intrinsics/epilogue_tail.py): bias, relu, residual and clip,
rounding to 16-bit floats, widening from them, requantising and quantising to int8.

Each intrinsic is checked three ways against each other (tests/three_ways.py):
1. Its TVMScript description, built for the host by TVM's llvm backend: the TIR semantics.
2. Its ISA command, run by the simulator's functional core: the hardware semantics.
3. Its implementation's extern call, which the code generator lowers to the runtime function
   that records that ISA opcode.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim.isa import DType, Op, encode
from npu_backend.kernels.intrinsics import INTRINSICS
from three_ways import Stream, extern_name, random_array, record_bits, tir_reference


@st.composite
def _clips(draw, dtype):
    """None, or ordered (lo, hi) bounds inside (or beyond) the range of the random tiles."""
    if not draw(st.booleans()):
        return None
    if dtype == "int32":
        values = st.integers(-20000, 20000)
    else:
        values = st.one_of(st.floats(-3, 3, width=32), st.sampled_from([0.0, 6.0, float("inf")]))
    lo, hi = sorted(draw(values) for _ in range(2))
    return lo, hi


@given(data=st.data(), rows=st.integers(1, 16), cols=st.integers(1, 16),
       dtype=st.sampled_from(["int32", "float32"]), bias=st.booleans(), relu=st.booleans(),
       residual=st.booleans(), seed=st.integers(0, 2**16))
def test_epilogue_three_ways(data, rows, cols, dtype, bias, relu, residual, seed):
    clip = data.draw(_clips(dtype))
    rng = np.random.default_rng(seed)
    acc, row, res = (random_array(rng, shape, dtype) for shape in ((rows, cols), (cols,), (rows, cols)))
    out = np.zeros((rows, cols), dtype)
    desc, impl = INTRINSICS["epilogue"].factory(rows, cols, dtype, bias=bias, relu=relu, residual=residual,
                                                clip=clip, scope="global")
    operands = [acc] + ([row] if bias else []) + ([res] if residual else []) + [out]
    tir_out = tir_reference(desc, operands)[-1]
    stream = Stream(operands)
    stream.load(*range(len(operands) - 1))
    code = int(DType.from_name(dtype))
    flags = (1 if bias else 0) | (2 if relu else 0) | (4 if residual else 0) | (8 if clip else 0)
    stream.commands.append(encode(
        Op.EPILOGUE, flags=flags, acc_dtype=code, out_dtype=code, m=rows, n=cols, acc_addr=0,
        acc_stride=cols, bias_addr=stream.addr[1] if bias else 0,
        residual_addr=stream.addr[len(operands) - 2] if residual else 0,
        residual_stride=cols if residual else 0,
        clip_lo_bits=record_bits(clip[0], dtype) if clip else 0, clip_hi_bits=record_bits(clip[1], dtype) if clip else 0,
        out_addr=stream.addr[len(operands) - 1], out_stride=cols))
    stream.store(len(operands) - 1)
    np.testing.assert_array_equal(stream.run()[-1], tir_out)
    assert extern_name(impl) == "cgra_" + Op.EPILOGUE.name.lower()


@given(data=st.data(), rows=st.integers(1, 16), cols=st.integers(1, 16), out_dtype=st.sampled_from(["bfloat16", "float16"]),
       bias=st.booleans(), relu=st.booleans(), residual=st.booleans(), seed=st.integers(0, 2**16))
def test_rounding_epilogue_three_ways(data, rows, cols, out_dtype, bias, relu, residual, seed):
    """float32 (+ bias) (+ residual) (relu) (clip) stored as bfloat16 / float16, the bias and
    residual in that format: TIR (TVM's own float32 -> 16-bit rounding on the host) against the
    simulator's, bit for bit."""
    import ml_dtypes

    clip = data.draw(_clips("float32"))
    half = ml_dtypes.bfloat16 if out_dtype == "bfloat16" else np.float16
    rng = np.random.default_rng(seed)
    acc = (rng.standard_normal((rows, cols)) * 100).astype(np.float32)
    row, res = (rng.standard_normal(shape).astype(np.float32).astype(half) for shape in ((cols,), (rows, cols)))
    out = np.zeros((rows, cols), half)
    desc, impl = INTRINSICS["epilogue"].factory(rows, cols, "float32", bias=bias, relu=relu, residual=residual,
                                                clip=clip, out_dtype=out_dtype, scope="global")
    operands = [acc] + ([row] if bias else []) + ([res] if residual else []) + [out]
    tir_out = tir_reference(desc, operands)[-1]
    stream = Stream(operands)
    stream.load(*range(len(operands) - 1))
    flags = (1 if bias else 0) | (2 if relu else 0) | (4 if residual else 0) | (8 if clip else 0)
    stream.commands.append(encode(
        Op.EPILOGUE, flags=flags, acc_dtype=int(DType.FLOAT32), out_dtype=int(DType.from_name(out_dtype)), m=rows,
        n=cols, acc_addr=0, acc_stride=cols, bias_addr=stream.addr[1] if bias else 0,
        residual_addr=stream.addr[len(operands) - 2] if residual else 0, residual_stride=cols if residual else 0,
        clip_lo_bits=record_bits(clip[0], "float32") if clip else 0, clip_hi_bits=record_bits(clip[1], "float32") if clip else 0,
        out_addr=stream.addr[len(operands) - 1], out_stride=cols))
    stream.store(len(operands) - 1)
    simulated = stream.run()[-1]
    np.testing.assert_array_equal(simulated.view(np.uint16), np.asarray(tir_out).view(np.uint16))
    assert extern_name(impl) == "cgra_" + Op.EPILOGUE.name.lower()


@given(rows=st.integers(1, 16), cols=st.integers(1, 16), dtype=st.sampled_from(["bfloat16", "float16"]),
       seed=st.integers(0, 2**16))
def test_widening_epilogue_three_ways(rows, cols, dtype, seed):
    """A bfloat16 / float16 accumulator stored as float32 (the cast kernel's widening): TIR (TVM's
    own widening on the host), the simulator and numpy's exact widening agree bit for bit, specials
    (infinities, NaN, subnormals, signed zeros) included."""
    import ml_dtypes

    half = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**16, (rows, cols)).astype(np.uint16)
    acc = bits.view(half)
    out = np.zeros((rows, cols), np.float32)
    desc, impl = INTRINSICS["epilogue"].factory(rows, cols, dtype, bias=False, relu=False, out_dtype="float32",
                                                scope="global")
    tir_out = tir_reference(desc, [acc, out])[-1]
    stream = Stream([acc, out])
    stream.load(0)
    stream.commands.append(encode(
        Op.EPILOGUE, flags=0, acc_dtype=int(DType.from_name(dtype)), out_dtype=int(DType.FLOAT32), m=rows, n=cols,
        acc_addr=0, acc_stride=cols, out_addr=stream.addr[1], out_stride=cols))
    stream.store(1)
    simulated = stream.run()[-1]
    expected = acc.astype(np.float32)
    for got in (simulated, tir_out):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
        keep = ~np.isnan(expected)
        np.testing.assert_array_equal(got.view(np.uint32)[keep], expected.view(np.uint32)[keep])
    assert extern_name(impl) == "cgra_" + Op.EPILOGUE.name.lower()


@given(data=st.data(), rows=st.integers(1, 16), cols=st.integers(1, 16), bias=st.booleans(), relu=st.booleans(),
       residual=st.booleans(), zero_point=st.integers(-128, 127), ties=st.booleans(), seed=st.integers(0, 2**16))
def test_requantising_epilogue_three_ways(data, rows, cols, bias, relu, residual, zero_point, ties, seed):
    """int32 (+ bias) (+ residual) (relu) (clip) -> int8: TIR (nearbyint on the host) against the
    simulator; with `ties` the scales are powers of two, so many products end in .5. The
    kernels fuse bias and relu before a requantisation today; the intrinsic takes every step."""
    clip = data.draw(_clips("int32"))
    rng = np.random.default_rng(seed)
    acc, row, res = (random_array(rng, shape, "int32") for shape in ((rows, cols), (cols,), (rows, cols)))
    if ties:
        scale = (2.0 ** -rng.integers(1, 8, cols)).astype(np.float32)
    else:
        scale = rng.uniform(1e-4, 0.05, cols).astype(np.float32)
    out = np.zeros((rows, cols), "int8")
    desc, impl = INTRINSICS["epilogue"].factory(rows, cols, "int32", bias=bias, relu=relu, residual=residual,
                                                clip=clip, zero_point=zero_point, scope="global")
    operands = [acc] + ([row] if bias else []) + ([res] if residual else []) + [scale, out]
    tir_out = tir_reference(desc, operands)[-1]
    stream = Stream(operands)
    stream.load(*range(len(operands) - 1))
    flags = 16 | (1 if bias else 0) | (2 if relu else 0) | (4 if residual else 0) | (8 if clip else 0)
    stream.commands.append(encode(
        Op.EPILOGUE, flags=flags, acc_dtype=int(DType.INT32), out_dtype=int(DType.INT8), m=rows, n=cols,
        acc_addr=0, acc_stride=cols, bias_addr=stream.addr[1] if bias else 0,
        residual_addr=stream.addr[len(operands) - 3] if residual else 0, residual_stride=cols if residual else 0,
        clip_lo_bits=record_bits(clip[0], "int32") if clip else 0, clip_hi_bits=record_bits(clip[1], "int32") if clip else 0,
        scale_addr=stream.addr[len(operands) - 2], out_zero_point=zero_point,
        out_addr=stream.addr[len(operands) - 1], out_stride=cols))
    stream.store(len(operands) - 1)
    np.testing.assert_array_equal(stream.run()[-1], tir_out)
    assert extern_name(impl) == "cgra_" + Op.EPILOGUE.name.lower()


@given(rows=st.integers(1, 16), cols=st.integers(1, 16), zero_point=st.integers(-128, 127), ties=st.booleans(),
       seed=st.integers(0, 2**16))
def test_quantising_epilogue_three_ways(rows, cols, zero_point, ties, seed):
    """float32 -> int8 (onnxruntime's QuantizeLinear, the quantize family's EPILOGUE): TIR (the
    host's fdiv and nearbyint) against the simulator; with `ties` the scales are powers of two and
    the values half steps of them, many quotients exactly .5; wide values saturate."""
    rng = np.random.default_rng(seed)
    scale = (2.0 ** -rng.integers(1, 8, cols) if ties else rng.uniform(1e-3, 0.1, cols)).astype(np.float32)
    acc = ((rng.integers(-200, 200, (rows, cols)) + 0.5) * scale).astype(np.float32)
    acc[rng.random((rows, cols)) < 0.3] *= np.float32(3.0)
    out = np.zeros((rows, cols), "int8")
    desc, impl = INTRINSICS["epilogue"].factory(rows, cols, "float32", bias=False, relu=False, zero_point=zero_point,
                                                scope="global")
    tir_out = tir_reference(desc, [acc, scale, out])[-1]
    stream = Stream([acc, scale, out])
    stream.load(0, 1)
    stream.commands.append(encode(
        Op.EPILOGUE, flags=16, acc_dtype=int(DType.FLOAT32), out_dtype=int(DType.INT8), m=rows, n=cols, acc_addr=0,
        acc_stride=cols, scale_addr=stream.addr[1], out_zero_point=zero_point, out_addr=stream.addr[2],
        out_stride=cols))
    stream.store(2)
    np.testing.assert_array_equal(stream.run()[-1], tir_out)
    assert extern_name(impl) == "cgra_" + Op.EPILOGUE.name.lower()
