"""The vector unit's row intrinsics (kernels/intrinsics/row_ops.py): REDUCE and VFUNC, float32
and 16-bit.

Each intrinsic is checked three ways against each other (tests/three_ways.py):
1. Its TVMScript description, built for the host by TVM's llvm backend: the TIR semantics.
2. Its ISA command, run by the simulator's functional core: the hardware semantics.
3. Its implementation's extern call, which the code generator lowers to the runtime function
   that records that ISA opcode.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim import special
from cgra_sim.isa import VFUNC_FLOAT32_IN, VFUNC_FLOAT32_OUT, VFUNC_OFFSET, VFUNC_SCALE, DType, Op, ReduceFunc, VFunc, encode
from npu_backend.kernels.intrinsics import INTRINSICS
from three_ways import Stream, extern_name, random_array, record_bits, tir_reference


@given(rows=st.integers(1, 9), cols=st.integers(1, 40), func=st.sampled_from(["sum", "max", "sum_squares"]),
       seed=st.integers(0, 2**16))
def test_reduce_three_ways(rows, cols, func, seed):
    """REDUCE folds each row into its column element, left to right: the TIR description's
    sequential update on the host and the simulator agree bit for bit (a sum of squares within
    rounding: LLVM may contract its multiply and add)."""
    rng = np.random.default_rng(seed)
    a, out = random_array(rng, (rows, cols), "float32"), random_array(rng, (rows, 1), "float32")
    desc, impl = INTRINSICS["reduce"].factory(rows, cols, func, scope="global")
    tir_out = tir_reference(desc, [a, out])[1]
    stream = Stream([a, out])
    stream.load(0, 1)
    stream.commands.append(encode(Op.REDUCE, func=ReduceFunc[func.upper()], dtype=int(DType.FLOAT32), rows=rows,
                                  cols=cols, a_addr=stream.addr[0], a_row_stride=cols, a_col_stride=1,
                                  out_addr=stream.addr[1], out_stride=1))
    stream.store(1)
    sim_out = stream.run()[1]
    if func == "sum_squares":
        np.testing.assert_allclose(sim_out, tir_out, rtol=1e-6)
    else:
        np.testing.assert_array_equal(sim_out, tir_out)
    assert extern_name(impl) == "cgra_" + Op.REDUCE.name.lower()


@given(rows=st.integers(1, 9), cols=st.integers(1, 9), func=st.sampled_from([f.name.lower() for f in VFunc]),
       scale=st.sampled_from([None, 0.5, -1.75]), offset=st.sampled_from([None, 0.25, 3.0]), seed=st.integers(0, 2**16))
def test_vfunc_three_ways(rows, cols, func, scale, offset, seed):
    """VFUNC: the simulator computes special.py's specified float32 sequence bit for bit; the TIR
    description (the C library's exp, tanh, erf on the host) agrees within the functions' error
    bounds (a few ulps)."""
    rng = np.random.default_rng(seed)
    a = random_array(rng, (rows, cols), "float32") * 2
    if func in ("rsqrt",):
        a = np.abs(a) + np.float32(0.5)
    out = np.zeros((rows, cols), np.float32)
    desc, impl = INTRINSICS["vfunc"].factory(rows, cols, func, scale=scale, offset=offset, scope="global")
    tir_out = tir_reference(desc, [a, out])[1]
    stream = Stream([a, out])
    stream.load(0)
    flags = (VFUNC_SCALE if scale is not None else 0) | (VFUNC_OFFSET if offset is not None else 0)
    stream.commands.append(encode(
        Op.VFUNC, flags=flags, func=VFunc[func.upper()], dtype=int(DType.FLOAT32), rows=rows, cols=cols,
        a_addr=stream.addr[0], a_row_stride=cols, a_col_stride=1, out_addr=stream.addr[1], out_stride=cols,
        scale_bits=record_bits(scale, "float32") if scale is not None else 0,
        offset_bits=record_bits(offset, "float32") if offset is not None else 0))
    stream.store(1)
    sim_out = stream.run()[1]
    t = a * np.float32(scale) if scale is not None else a
    t = t + np.float32(offset) if offset is not None else t
    np.testing.assert_array_equal(sim_out, special.FUNCTIONS[func](t))
    # GELU's TIR form, x (1 + erf(x / sqrt 2)) / 2, cancels for x << 0: compared absolutely there;
    # TVM builds the host's tanh as a rational approximation (6e-6 relative near 0, where ours is
    # within 1.5 ulp of float64: tests/test_special.py).
    np.testing.assert_allclose(sim_out, tir_out, rtol=1e-5 if func == "tanh" else 2e-6,
                               atol=1e-6 if func == "gelu" else 1e-37)
    assert extern_name(impl) == "cgra_" + Op.VFUNC.name.lower()


@given(rows=st.integers(1, 9), cols=st.integers(1, 9), func=st.sampled_from([f.name.lower() for f in VFunc]),
       half=st.sampled_from(["bfloat16", "float16"]), float32_in=st.booleans(), float32_out=st.booleans(),
       scale=st.sampled_from([None, 0.5, -1.75]), seed=st.integers(0, 2**16))
def test_half_vfunc_three_ways(rows, cols, func, half, float32_in, float32_out, scale, seed):
    """A VFUNC of a 16-bit dtype (stream v14): A widened exactly (float32 with VFUNC_FLOAT32_IN),
    special.py's float32 sequence, the result rounded to nearest even (widened back with
    VFUNC_FLOAT32_OUT). The simulator is ml_dtypes' rounding of that float32 sequence bit for bit;
    the TIR description (TVM's casts, the host's C library functions) within one of the format's
    ulps; the device call is cgra_vfunc."""
    import ml_dtypes

    fmt = ml_dtypes.bfloat16 if half == "bfloat16" else np.float16
    rng = np.random.default_rng(seed)
    a = random_array(rng, (rows, cols), "float32") * 2
    if func == "rsqrt":
        a = np.abs(a) + np.float32(0.5)
    a = a if float32_in else a.astype(fmt)
    out = np.zeros((rows, cols), np.float32 if float32_out else fmt)
    desc, impl = INTRINSICS["vfunc"].factory(rows, cols, func, scale=scale, half=half, float32_in=float32_in,
                                             float32_out=float32_out, scope="global")
    tir_out = tir_reference(desc, [a, out])[1]
    stream = Stream([a, out])
    stream.load(0)
    flags = (VFUNC_SCALE if scale is not None else 0) | (VFUNC_FLOAT32_IN if float32_in else 0) \
        | (VFUNC_FLOAT32_OUT if float32_out else 0)
    stream.commands.append(encode(
        Op.VFUNC, flags=flags, func=VFunc[func.upper()], dtype=int(DType.from_name(half)), rows=rows, cols=cols,
        a_addr=stream.addr[0], a_row_stride=cols, a_col_stride=1, out_addr=stream.addr[1], out_stride=cols,
        scale_bits=record_bits(scale, "float32") if scale is not None else 0))
    stream.store(1)
    sim_out = stream.run()[1]
    t = a.astype(np.float32)
    t = t * np.float32(scale) if scale is not None else t
    expected = special.FUNCTIONS[func](t).astype(fmt)  # ml_dtypes' / numpy's round to nearest even
    expected = expected.astype(np.float32) if float32_out else expected
    assert sim_out.dtype == expected.dtype
    np.testing.assert_array_equal(np.isnan(sim_out.astype(np.float32)), np.isnan(expected.astype(np.float32)))
    keep = ~np.isnan(expected.astype(np.float32))
    np.testing.assert_array_equal(sim_out.view(np.uint32 if float32_out else np.uint16)[keep],
                                  expected.view(np.uint32 if float32_out else np.uint16)[keep])
    ulp = 2.0 ** (1 - {"bfloat16": 8, "float16": 11}[half])
    np.testing.assert_allclose(np.asarray(tir_out, np.float64), np.asarray(sim_out, np.float64), rtol=ulp,
                               atol=1e-6 if func == "gelu" else 2.0 ** -24)
    assert extern_name(impl) == "cgra_" + Op.VFUNC.name.lower()


def test_a_float32_vfunc_refuses_the_half_flags():
    """VFUNC_FLOAT32_IN / _OUT keep an operand float32 beside a 16-bit dtype: a float32 VFUNC
    naming them, or a VFUNC of an integer dtype, is refused before anything runs."""
    from cgra_sim.errors import CommandError

    a = np.ones((2, 2), np.float32)
    for dtype, flags in ((DType.FLOAT32, VFUNC_FLOAT32_IN), (DType.FLOAT32, VFUNC_FLOAT32_OUT), (DType.INT8, 0)):
        stream = Stream([a, a.copy()])
        stream.load(0)
        stream.commands.append(encode(Op.VFUNC, flags=flags, func=VFunc.EXP, dtype=int(dtype), rows=2, cols=2,
                                      a_addr=stream.addr[0], a_row_stride=2, a_col_stride=1,
                                      out_addr=stream.addr[1], out_stride=2))
        with pytest.raises(CommandError, match="VFUNC_FLOAT32|dtype"):
            stream.run()
