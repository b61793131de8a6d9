"""The vector unit's tile intrinsics (kernels/intrinsics/vector_unit.py, lookup.py): FILL,
accumulate and ELTWISE, POOL, LOOKUP.

Each intrinsic is checked three ways against each other (tests/three_ways.py):
1. Its TVMScript description, built for the host by TVM's llvm backend: the TIR semantics.
2. Its ISA command, run by the simulator's functional core: the hardware semantics.
3. Its implementation's extern call, which the code generator lowers to the runtime function
   that records that ISA opcode.
"""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given
from hypothesis import strategies as st

from cgra_sim.isa import DType, EltwiseFunc, Op, encode
from npu_backend.kernels.intrinsics import INTRINSICS
from npu_backend.kernels.intrinsics.vector_unit import PoolWindow
from three_ways import Stream, extern_name, random_array, record_bits, tir_reference


@given(rows=st.integers(1, 16), cols=st.integers(1, 16), dtype=st.sampled_from(["int32", "float32"]),
       value=st.one_of(st.none(), st.integers(-1000, 1000)), seed=st.integers(0, 2**16))
def test_fill_three_ways(rows, cols, dtype, value, seed):
    """Zero (a reduction's init) or a value; the value's bits go in the record as cgra_fill's."""
    c = random_array(np.random.default_rng(seed), (rows, cols), dtype)
    constant = None if value is None else tvm.tirx.const(value / 8 if dtype == "float32" else value, dtype)
    desc, impl = INTRINSICS["fill"].factory(rows, cols, dtype, value=constant, scope="global")
    tir_c = tir_reference(desc, [c])[0]
    stream = Stream([c])
    stream.load(0)
    bits = 0 if value is None else record_bits(value / 8 if dtype == "float32" else value, dtype)
    stream.commands.append(encode(Op.FILL, dtype=int(DType.from_name(dtype)), addr=0, rows=rows, cols=cols,
                                  stride=cols, value_bits=bits))
    stream.store(0)
    np.testing.assert_array_equal(stream.run()[0], tir_c)
    assert extern_name(impl) == "cgra_" + Op.FILL.name.lower()


@given(rows=st.integers(1, 9), cols=st.integers(1, 9), dtype=st.sampled_from(["int8", "int32", "float32"]),
       seed=st.integers(0, 2**16))
def test_accumulate_three_ways(rows, cols, dtype, seed):
    """Out += B: an ELTWISE add whose first operand is its output (a global pool's block sums)."""
    rng = np.random.default_rng(seed)
    b, out = random_array(rng, (rows, cols), dtype), random_array(rng, (rows, cols), dtype)
    desc, impl = INTRINSICS["accumulate"].factory(rows, cols, dtype, scope="global")
    tir_out = tir_reference(desc, [b, out])[1]
    stream = Stream([b, out])
    stream.load(0, 1)
    stream.commands.append(encode(
        Op.ELTWISE, func=EltwiseFunc.ADD, dtype=int(DType.from_name(dtype)), rows=rows, cols=cols,
        a_addr=stream.addr[1], a_row_stride=cols, a_col_stride=1, b_addr=stream.addr[0], b_row_stride=cols,
        b_col_stride=1, out_addr=stream.addr[1], out_stride=cols))
    stream.store(1)
    np.testing.assert_array_equal(stream.run()[1], tir_out)
    assert extern_name(impl) == "cgra_" + Op.ELTWISE.name.lower()


@st.composite
def _pool_windows(draw):
    """(oh, ow, window): any kernel, strides, dilation, and rectangles inside, across or outside
    the window (the kernel's are the image and the padded image; these test the rule itself)."""
    oh, ow = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    strides = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    extents = [(o - 1) * s + (k - 1) * d + 1 for o, k, s, d in zip((oh, ow), kernel, strides, dilation)]

    def rectangle():
        y_lo, x_lo = draw(st.integers(0, extents[0])), draw(st.integers(0, extents[1]))
        return y_lo, draw(st.integers(y_lo, extents[0] + 1)), x_lo, draw(st.integers(x_lo, extents[1] + 1))

    kind = draw(st.sampled_from(["max", "avg"]))
    return oh, ow, PoolWindow(kind, kernel, strides, dilation, rectangle(), rectangle() if kind == "avg" else None)


@given(case=_pool_windows(), cols=st.integers(1, 6), int8=st.booleans(), seed=st.integers(0, 2**16))
def test_pool_three_ways(case, cols, int8, seed):
    oh, ow, window = case
    dtype = "int8" if int8 and window.kind == "max" else "float32"
    in_h, in_w = window.extent(oh, 0), window.extent(ow, 1)
    a = random_array(np.random.default_rng(seed), (in_h, in_w, cols), dtype)
    out = np.zeros((oh, ow, cols), dtype)
    desc, impl = INTRINSICS["pool"].factory(oh, ow, cols, window, dtype, scope="global")
    tir_out = tir_reference(desc, [a, out])[1]
    stream = Stream([a.reshape(-1, cols), out.reshape(-1, cols)])
    stream.load(0)
    valid, count = window.valid, window.count or (0, 0, 0, 0)
    stream.commands.append(encode(
        Op.POOL, flags=1 if window.kind == "avg" else 0, dtype=int(DType.from_name(dtype)), oh=oh, ow=ow, n=cols,
        kh=window.kernel[0], kw=window.kernel[1], a_addr=0, a_row_stride=in_w * cols, a_col_stride=cols,
        stride_y=window.strides[0], stride_x=window.strides[1], dilation_y=window.dilation[0],
        dilation_x=window.dilation[1], out_addr=stream.addr[1], out_y_stride=ow * cols, out_x_stride=cols,
        **dict(zip(("valid_y_lo", "valid_y_hi", "valid_x_lo", "valid_x_hi"), valid)),
        **dict(zip(("count_y_lo", "count_y_hi", "count_x_lo", "count_x_hi"), count))))
    stream.store(1)
    sim_out = stream.run()[1].reshape(oh, ow, cols)
    if dtype == "float32":
        np.testing.assert_allclose(sim_out, tir_out, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(sim_out, tir_out)
    assert extern_name(impl) == "cgra_" + Op.POOL.name.lower()


@given(rows=st.integers(1, 9), cols=st.integers(1, 9), func=st.sampled_from([f.name.lower() for f in EltwiseFunc]),
       dtype=st.sampled_from(["int8", "int32", "float32"]), a_full=st.tuples(st.booleans(), st.booleans()),
       b_full=st.tuples(st.booleans(), st.booleans()), seed=st.integers(0, 2**16))
def test_eltwise_three_ways(rows, cols, func, dtype, a_full, b_full, seed):
    """Each operand walks rows and columns or is broadcast along them (tile extent 1, stride 0)."""
    rng = np.random.default_rng(seed)
    shapes = [(rows if full[0] else 1, cols if full[1] else 1) for full in (a_full, b_full)]
    a, b = (random_array(rng, shape, dtype) for shape in shapes)
    out = np.zeros((rows, cols), dtype)
    desc, impl = INTRINSICS["eltwise"].factory(rows, cols, func, dtype, a_full=a_full, b_full=b_full, scope="global")
    tir_out = tir_reference(desc, [a, b, out])[2]
    stream = Stream([a, b, out])
    stream.load(0, 1)
    strides = [dict(row=shape[1] if full[0] else 0, col=1 if full[1] else 0)
               for shape, full in zip(shapes, (a_full, b_full))]
    stream.commands.append(encode(
        Op.ELTWISE, func=EltwiseFunc[func.upper()], dtype=int(DType.from_name(dtype)), rows=rows, cols=cols,
        a_addr=stream.addr[0], a_row_stride=strides[0]["row"], a_col_stride=strides[0]["col"],
        b_addr=stream.addr[1], b_row_stride=strides[1]["row"], b_col_stride=strides[1]["col"],
        out_addr=stream.addr[2], out_stride=cols))
    stream.store(2)
    np.testing.assert_array_equal(stream.run()[2], tir_out)
    assert extern_name(impl) == "cgra_" + Op.ELTWISE.name.lower()


@given(rows=st.integers(1, 9), cols=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_lookup_three_ways(rows, cols, seed):
    """LOOKUP: the TIR description, the simulator and the device call agree bit for bit: every
    int8 input indexes its table entry (table[x + 128])."""
    rng = np.random.default_rng(seed)
    a = random_array(rng, (rows, cols), "int8")
    table = random_array(rng, (256,), "int8")
    out = np.zeros((rows, cols), np.int8)
    desc, impl = INTRINSICS["lookup"].factory(rows, cols, scope="global")
    tir_out = tir_reference(desc, [table, a, out])[2]  # Out's initial values are all overwritten
    stream = Stream([a, table, out])
    stream.load(0, 1)
    stream.commands.append(encode(Op.LOOKUP, rows=rows, cols=cols, a_addr=stream.addr[0], a_stride=cols,
                                  table_addr=stream.addr[1], out_addr=stream.addr[2], out_stride=cols))
    stream.store(2)
    sim_out = stream.run()[2]
    np.testing.assert_array_equal(sim_out, table[a.astype(np.int32) + 128])
    np.testing.assert_array_equal(tir_out, sim_out)
    assert extern_name(impl) == "cgra_" + Op.LOOKUP.name.lower()
