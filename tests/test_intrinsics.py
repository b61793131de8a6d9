"""Every registered intrinsic, checked three ways against each other.

1. Its TVMScript description, built for the host by TVM's llvm backend: the TIR semantics.
2. Its ISA command, run by the simulator's functional core: the hardware semantics.
3. Its implementation's extern call, which the code generator lowers to the runtime function
   that records that ISA opcode.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cgra_codegen import DEVICE_CALLS
from cgra_sim import load_arch, simulate
from cgra_sim import special
from cgra_sim.isa import VFUNC_FLOAT32_IN, VFUNC_FLOAT32_OUT, VFUNC_OFFSET, VFUNC_SCALE, DType, EltwiseFunc, Op, ReduceFunc, VFunc, encode
from cgra_sim.mapping import body as bodies
from cgra_sim.mapping import sigmoid as smooth
from npu_backend.kernels.common.chains import folded
from npu_backend.kernels.intrinsics import INTRINSICS, SPAD, get_intrin, intrin_name
from npu_backend.kernels.intrinsics.fabric import FabricBody
from npu_backend.kernels.intrinsics.vector_unit import PoolWindow
from cgra_sim.mapping.sigmoid import passes as smooth_bodies
from test_sim_fabric import random_bodies

ARCH = load_arch("cgra-8x8")


def _tir_reference(desc, arrays):
    """Run the description (host scope) on copies of `arrays`; returns them after the call."""
    func = desc.with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    tensors = [tvm.runtime.tensor(a.copy()) for a in arrays]
    lib["main"](*tensors)
    return [t.numpy() for t in tensors]


class _Stream:
    """Lays 2-D host arrays out in the scratchpad and builds the command stream around one op."""

    def __init__(self, arrays):
        self.arrays, self.commands, self.addr, self.next = arrays, [], {}, 0
        for slot, array in enumerate(arrays):
            self.addr[slot] = self.next
            self.next += -(-array.nbytes // 64) * 64

    def box(self, slot):
        array = self.arrays[slot]
        rows, cols = array.shape if array.ndim == 2 else (1, array.shape[0])
        last = array.ndim - 1
        loops = dict(extent0=rows, tdim0=0, tstep0=1 if array.ndim == 2 else 0, sstride0=cols,
                     extent1=cols, tdim1=last, tstep1=1, sstride1=1, extent2=1, extent3=1)
        return dict(slot=slot, spad_addr=self.addr[slot], **loops)

    def load(self, *slots):
        self.commands += [encode(Op.DMA_LOAD, **self.box(slot)) for slot in slots]

    def store(self, *slots):
        self.commands += [encode(Op.DMA_STORE, **self.box(slot)) for slot in slots]

    def run(self):
        arrays = [a.copy() for a in self.arrays]
        simulate(ARCH, np.array(self.commands, dtype=np.int64), arrays)
        return arrays


def _random(rng, shape, dtype):
    if dtype == "int8":
        return rng.integers(-128, 128, shape).astype(dtype)
    if dtype == "int32":
        return rng.integers(-10000, 10000, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _extern_name(impl) -> str:
    """The device call the implementation makes (the one DEVICE_CALLS entry its text names)."""
    text = impl.script()
    names = [name for name in DEVICE_CALLS if f'"{name}"' in text]
    assert len(names) == 1, names
    return names[0]


def test_every_intrinsic_is_checked_here():
    assert set(INTRINSICS) == {"gemm", "depthwise", "fill", "epilogue", "eltwise", "pool", "accumulate", "fabric",
                               "smooth", "reduce", "vfunc", "lookup", "rope_rotate", "rope_combine"}


@given(rows=st.integers(1, 8), cols=st.integers(1, 8), depth=st.integers(1, 40),
       dtype=st.sampled_from(["int8", "float32"]), seed=st.integers(0, 2**16))
def test_gemm_three_ways(rows, cols, depth, dtype, seed):
    acc = {"int8": "int32", "float32": "float32"}[dtype]
    rng = np.random.default_rng(seed)
    a, b, c = _random(rng, (rows, depth), dtype), _random(rng, (depth, cols), dtype), _random(rng, (rows, cols), acc)
    desc, impl = INTRINSICS["gemm"].factory(rows, cols, depth, dtype, acc, scope="global")
    tir_c = _tir_reference(desc, [a, b, c])[2]
    stream = _Stream([a, b, c])
    stream.load(0, 1, 2)
    stream.commands.append(encode(Op.GEMM, flags=1, dtype=int(DType.from_name(dtype)), m=rows, n=cols, k=depth,
                                  a_addr=stream.addr[0], a_stride=depth, b_addr=stream.addr[1], b_stride=cols,
                                  acc_addr=stream.addr[2], acc_stride=cols))
    stream.store(2)
    sim_c = stream.run()[2]
    np.testing.assert_allclose(sim_c, tir_c, rtol=1e-5, atol=1e-4) if dtype == "float32" else \
        np.testing.assert_array_equal(sim_c, tir_c)
    assert _extern_name(INTRINSICS["gemm"].factory(rows, cols, depth, dtype, acc)[1]) == "cgra_" + Op.GEMM.name.lower()


@given(oh=st.integers(1, 5), ow=st.integers(1, 6), cols=st.integers(1, 9), kh=st.integers(1, 3),
       kw=st.integers(1, 3), sh=st.integers(1, 2), sw=st.integers(1, 2), dh=st.integers(1, 2),
       dw=st.integers(1, 2), dtype=st.sampled_from(["int8", "float32"]), seed=st.integers(0, 2**16))
def test_depthwise_three_ways(oh, ow, cols, kh, kw, sh, sw, dh, dw, dtype, seed):
    acc = {"int8": "int32", "float32": "float32"}[dtype]
    window = (kh, kw, sh, sw, dh, dw)
    in_h, in_w = (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1
    rng = np.random.default_rng(seed)
    a, b = _random(rng, (in_h, in_w, cols), dtype), _random(rng, (kh, kw, cols), dtype)
    c = np.zeros((oh, ow, cols), acc)
    desc, impl = INTRINSICS["depthwise"].factory(oh, ow, cols, window, dtype, acc, scope="global")
    tir_c = _tir_reference(desc, [a, b, c])[2]
    # The stream helper lays out 2-D arrays: the same bytes, as (rows, channels).
    stream = _Stream([a.reshape(-1, cols), b.reshape(-1, cols), c.reshape(-1, cols)])
    stream.load(0, 1)
    stream.commands.append(encode(
        Op.DEPTHWISE, dtype=int(DType.from_name(dtype)), oh=oh, ow=ow, n=cols, kh=kh, kw=kw,
        a_addr=stream.addr[0], a_y_stride=sh * in_w * cols, a_x_stride=sw * cols,
        a_ry_stride=dh * in_w * cols, a_rx_stride=dw * cols, b_addr=stream.addr[1],
        b_ry_stride=kw * cols, b_rx_stride=cols, acc_addr=stream.addr[2], acc_y_stride=ow * cols,
        acc_x_stride=cols))
    stream.store(2)
    sim_c = stream.run()[2].reshape(oh, ow, cols)
    np.testing.assert_allclose(sim_c, tir_c, rtol=1e-5, atol=1e-5) if dtype == "float32" else \
        np.testing.assert_array_equal(sim_c, tir_c)
    assert _extern_name(impl) == "cgra_" + Op.DEPTHWISE.name.lower()


@given(rows=st.integers(1, 16), cols=st.integers(1, 16), dtype=st.sampled_from(["int32", "float32"]),
       value=st.one_of(st.none(), st.integers(-1000, 1000)), seed=st.integers(0, 2**16))
def test_fill_three_ways(rows, cols, dtype, value, seed):
    """Zero (a reduction's init) or a value; the value's bits go in the record as cgra_fill's."""
    c = _random(np.random.default_rng(seed), (rows, cols), dtype)
    constant = None if value is None else tvm.tirx.const(value / 8 if dtype == "float32" else value, dtype)
    desc, impl = INTRINSICS["fill"].factory(rows, cols, dtype, value=constant, scope="global")
    tir_c = _tir_reference(desc, [c])[0]
    stream = _Stream([c])
    stream.load(0)
    bits = 0 if value is None else _bits(value / 8 if dtype == "float32" else value, dtype)
    stream.commands.append(encode(Op.FILL, dtype=int(DType.from_name(dtype)), addr=0, rows=rows, cols=cols,
                                  stride=cols, value_bits=bits))
    stream.store(0)
    np.testing.assert_array_equal(stream.run()[0], tir_c)
    assert _extern_name(impl) == "cgra_" + Op.FILL.name.lower()


@given(rows=st.integers(1, 9), cols=st.integers(1, 9), dtype=st.sampled_from(["int8", "int32", "float32"]),
       seed=st.integers(0, 2**16))
def test_accumulate_three_ways(rows, cols, dtype, seed):
    """Out += B: an ELTWISE add whose first operand is its output (a global pool's block sums)."""
    rng = np.random.default_rng(seed)
    b, out = _random(rng, (rows, cols), dtype), _random(rng, (rows, cols), dtype)
    desc, impl = INTRINSICS["accumulate"].factory(rows, cols, dtype, scope="global")
    tir_out = _tir_reference(desc, [b, out])[1]
    stream = _Stream([b, out])
    stream.load(0, 1)
    stream.commands.append(encode(
        Op.ELTWISE, func=EltwiseFunc.ADD, dtype=int(DType.from_name(dtype)), rows=rows, cols=cols,
        a_addr=stream.addr[1], a_row_stride=cols, a_col_stride=1, b_addr=stream.addr[0], b_row_stride=cols,
        b_col_stride=1, out_addr=stream.addr[1], out_stride=cols))
    stream.store(1)
    np.testing.assert_array_equal(stream.run()[1], tir_out)
    assert _extern_name(impl) == "cgra_" + Op.ELTWISE.name.lower()


def _bits(value, dtype) -> int:
    """A clip bound as record bits: the integer, or the float32 bit pattern."""
    return int(np.array([value], dtype).view(np.uint32)[0]) if dtype == "float32" else int(value)


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
    acc, row, res = (_random(rng, shape, dtype) for shape in ((rows, cols), (cols,), (rows, cols)))
    out = np.zeros((rows, cols), dtype)
    desc, impl = INTRINSICS["epilogue"].factory(rows, cols, dtype, bias=bias, relu=relu, residual=residual,
                                                clip=clip, scope="global")
    operands = [acc] + ([row] if bias else []) + ([res] if residual else []) + [out]
    tir_out = _tir_reference(desc, operands)[-1]
    stream = _Stream(operands)
    stream.load(*range(len(operands) - 1))
    code = int(DType.from_name(dtype))
    flags = (1 if bias else 0) | (2 if relu else 0) | (4 if residual else 0) | (8 if clip else 0)
    stream.commands.append(encode(
        Op.EPILOGUE, flags=flags, acc_dtype=code, out_dtype=code, m=rows, n=cols, acc_addr=0,
        acc_stride=cols, bias_addr=stream.addr[1] if bias else 0,
        residual_addr=stream.addr[len(operands) - 2] if residual else 0,
        residual_stride=cols if residual else 0,
        clip_lo_bits=_bits(clip[0], dtype) if clip else 0, clip_hi_bits=_bits(clip[1], dtype) if clip else 0,
        out_addr=stream.addr[len(operands) - 1], out_stride=cols))
    stream.store(len(operands) - 1)
    np.testing.assert_array_equal(stream.run()[-1], tir_out)
    assert _extern_name(impl) == "cgra_" + Op.EPILOGUE.name.lower()


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
    tir_out = _tir_reference(desc, operands)[-1]
    stream = _Stream(operands)
    stream.load(*range(len(operands) - 1))
    flags = (1 if bias else 0) | (2 if relu else 0) | (4 if residual else 0) | (8 if clip else 0)
    stream.commands.append(encode(
        Op.EPILOGUE, flags=flags, acc_dtype=int(DType.FLOAT32), out_dtype=int(DType.from_name(out_dtype)), m=rows,
        n=cols, acc_addr=0, acc_stride=cols, bias_addr=stream.addr[1] if bias else 0,
        residual_addr=stream.addr[len(operands) - 2] if residual else 0, residual_stride=cols if residual else 0,
        clip_lo_bits=_bits(clip[0], "float32") if clip else 0, clip_hi_bits=_bits(clip[1], "float32") if clip else 0,
        out_addr=stream.addr[len(operands) - 1], out_stride=cols))
    stream.store(len(operands) - 1)
    simulated = stream.run()[-1]
    np.testing.assert_array_equal(simulated.view(np.uint16), np.asarray(tir_out).view(np.uint16))
    assert _extern_name(impl) == "cgra_" + Op.EPILOGUE.name.lower()


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
    tir_out = _tir_reference(desc, [acc, out])[-1]
    stream = _Stream([acc, out])
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
    assert _extern_name(impl) == "cgra_" + Op.EPILOGUE.name.lower()


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
    a = _random(np.random.default_rng(seed), (in_h, in_w, cols), dtype)
    out = np.zeros((oh, ow, cols), dtype)
    desc, impl = INTRINSICS["pool"].factory(oh, ow, cols, window, dtype, scope="global")
    tir_out = _tir_reference(desc, [a, out])[1]
    stream = _Stream([a.reshape(-1, cols), out.reshape(-1, cols)])
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
    assert _extern_name(impl) == "cgra_" + Op.POOL.name.lower()
@given(rows=st.integers(1, 9), cols=st.integers(1, 9), func=st.sampled_from([f.name.lower() for f in EltwiseFunc]),
       dtype=st.sampled_from(["int8", "int32", "float32"]), a_full=st.tuples(st.booleans(), st.booleans()),
       b_full=st.tuples(st.booleans(), st.booleans()), seed=st.integers(0, 2**16))
def test_eltwise_three_ways(rows, cols, func, dtype, a_full, b_full, seed):
    """Each operand walks rows and columns or is broadcast along them (tile extent 1, stride 0)."""
    rng = np.random.default_rng(seed)
    shapes = [(rows if full[0] else 1, cols if full[1] else 1) for full in (a_full, b_full)]
    a, b = (_random(rng, shape, dtype) for shape in shapes)
    out = np.zeros((rows, cols), dtype)
    desc, impl = INTRINSICS["eltwise"].factory(rows, cols, func, dtype, a_full=a_full, b_full=b_full, scope="global")
    tir_out = _tir_reference(desc, [a, b, out])[2]
    stream = _Stream([a, b, out])
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
    assert _extern_name(impl) == "cgra_" + Op.ELTWISE.name.lower()


@settings(max_examples=40, deadline=None)
@given(case=random_bodies(two_inputs=False, max_nodes=5), rows=st.integers(1, 9), cols=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_fabric_three_ways(case, rows, cols, seed):
    """A random one-input body (every op, immediates, any earlier node): the TIR description on the
    host, the FABRIC command on the simulator, and the body's numpy meaning agree (float32 within
    rounding: LLVM may contract a multiply and an add on the host)."""
    dtype, nodes = case
    assume(not folded(nodes, dtype))  # the compiler keeps such chains off the fabric
    rng = np.random.default_rng(seed)
    a, out = _random(rng, (rows, cols), dtype), np.zeros((rows, cols), dtype)
    desc, impl = INTRINSICS["fabric"].factory(rows, cols, FabricBody(nodes, dtype), scope="global")
    tir_out = _tir_reference(desc, [a, out])[1]
    stream = _Stream([a, out])
    stream.load(0)
    words = bodies.encode(nodes, dtype)
    stream.commands.append(encode(Op.FABRIC, dtype=int(DType.from_name(dtype)), rows=rows, cols=cols,
                                  a_addr=stream.addr[0], a_row_stride=cols, a_col_stride=1, out_addr=stream.addr[1],
                                  out_stride=cols, nodes=len(words), **{f"node{i}": w for i, w in enumerate(words)}))
    stream.store(1)
    sim_out = stream.run()[1]
    np.testing.assert_array_equal(sim_out, bodies.evaluate(nodes, dtype, a))
    if dtype == "int32":
        np.testing.assert_array_equal(sim_out, tir_out)
    else:
        np.testing.assert_allclose(sim_out, tir_out, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(tir_out).max())))
    assert _extern_name(impl) == "cgra_" + Op.FABRIC.name.lower()


@settings(max_examples=12, deadline=None)
@given(kind=st.sampled_from(["sigmoid", "silu", "gelu_tanh"]), rows=st.integers(1, 9), cols=st.integers(1, 9),
       scale=st.sampled_from([1.0, 8.0, 60.0]), seed=st.integers(0, 2**16))
def test_smooth_three_ways(kind, rows, cols, scale, seed):
    """Sigmoid, SiLU and GELU's tanh form: the description's TIR on the host (LLVM's exp), the
    FABRIC passes (and ELTWISE multiply) the implementation records, on the simulator, and the numpy
    model of the fabric's arithmetic: the simulator bit-exact to the model, within 3e-5 relative
    of the host's sigmoid."""
    rng = np.random.default_rng(seed)
    a, out = (rng.standard_normal((rows, cols)) * scale).astype("float32"), np.zeros((rows, cols), "float32")
    desc, impl = INTRINSICS["smooth"].factory(rows, cols, kind, scope="global")
    tir_out = _tir_reference(desc, [a, out])[1]
    stream = _Stream([a, out])
    stream.load(0)
    x, tile = stream.addr[0], stream.addr[1]
    for index, nodes in enumerate(smooth_bodies(kind)):
        logistic = index == len(smooth_bodies(kind)) - 1
        source = x if index == 0 or logistic else tile
        words = bodies.encode(nodes, "float32")
        stream.commands.append(encode(
            Op.FABRIC, flags=1 if logistic else 0, dtype=int(DType.FLOAT32), rows=rows, cols=cols, a_addr=source,
            a_row_stride=cols, a_col_stride=1, b_addr=tile if logistic else 0, b_row_stride=cols if logistic else 0,
            b_col_stride=1 if logistic else 0, out_addr=tile, out_stride=cols, nodes=len(words),
            **{f"node{i}": w for i, w in enumerate(words)}))
    if kind != "sigmoid":
        stream.commands.append(encode(
            Op.ELTWISE, func=EltwiseFunc.MULTIPLY, dtype=int(DType.FLOAT32), rows=rows, cols=cols, a_addr=x,
            a_row_stride=cols, a_col_stride=1, b_addr=tile, b_row_stride=cols, b_col_stride=1, out_addr=tile,
            out_stride=cols))
    stream.store(1)
    sim_out = stream.run()[1]
    np.testing.assert_array_equal(sim_out, {"sigmoid": smooth.sigmoid, "silu": smooth.silu,
                                            "gelu_tanh": smooth.gelu_tanh}[kind](a))
    np.testing.assert_allclose(sim_out, tir_out, rtol=3e-5, atol=1e-30)
    text = impl.script()
    assert '"cgra_fabric"' in text and ('"cgra_eltwise"' in text) == (kind != "sigmoid")


@given(data=st.data(), rows=st.integers(1, 16), cols=st.integers(1, 16), bias=st.booleans(), relu=st.booleans(),
       residual=st.booleans(), zero_point=st.integers(-128, 127), ties=st.booleans(), seed=st.integers(0, 2**16))
def test_requantising_epilogue_three_ways(data, rows, cols, bias, relu, residual, zero_point, ties, seed):
    """int32 (+ bias) (+ residual) (relu) (clip) -> int8: TIR (nearbyint on the host) against the
    simulator; with `ties` the scales are powers of two, so many products end in .5. The
    kernels fuse bias and relu before a requantisation today; the intrinsic takes every step."""
    clip = data.draw(_clips("int32"))
    rng = np.random.default_rng(seed)
    acc, row, res = (_random(rng, shape, "int32") for shape in ((rows, cols), (cols,), (rows, cols)))
    if ties:
        scale = (2.0 ** -rng.integers(1, 8, cols)).astype(np.float32)
    else:
        scale = rng.uniform(1e-4, 0.05, cols).astype(np.float32)
    out = np.zeros((rows, cols), "int8")
    desc, impl = INTRINSICS["epilogue"].factory(rows, cols, "int32", bias=bias, relu=relu, residual=residual,
                                                clip=clip, zero_point=zero_point, scope="global")
    operands = [acc] + ([row] if bias else []) + ([res] if residual else []) + [scale, out]
    tir_out = _tir_reference(desc, operands)[-1]
    stream = _Stream(operands)
    stream.load(*range(len(operands) - 1))
    flags = 16 | (1 if bias else 0) | (2 if relu else 0) | (4 if residual else 0) | (8 if clip else 0)
    stream.commands.append(encode(
        Op.EPILOGUE, flags=flags, acc_dtype=int(DType.INT32), out_dtype=int(DType.INT8), m=rows, n=cols,
        acc_addr=0, acc_stride=cols, bias_addr=stream.addr[1] if bias else 0,
        residual_addr=stream.addr[len(operands) - 3] if residual else 0, residual_stride=cols if residual else 0,
        clip_lo_bits=_bits(clip[0], "int32") if clip else 0, clip_hi_bits=_bits(clip[1], "int32") if clip else 0,
        scale_addr=stream.addr[len(operands) - 2], out_zero_point=zero_point,
        out_addr=stream.addr[len(operands) - 1], out_stride=cols))
    stream.store(len(operands) - 1)
    np.testing.assert_array_equal(stream.run()[-1], tir_out)
    assert _extern_name(impl) == "cgra_" + Op.EPILOGUE.name.lower()


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
    tir_out = _tir_reference(desc, [acc, scale, out])[-1]
    stream = _Stream([acc, scale, out])
    stream.load(0, 1)
    stream.commands.append(encode(
        Op.EPILOGUE, flags=16, acc_dtype=int(DType.FLOAT32), out_dtype=int(DType.INT8), m=rows, n=cols, acc_addr=0,
        acc_stride=cols, scale_addr=stream.addr[1], out_zero_point=zero_point, out_addr=stream.addr[2],
        out_stride=cols))
    stream.store(2)
    np.testing.assert_array_equal(stream.run()[-1], tir_out)
    assert _extern_name(impl) == "cgra_" + Op.EPILOGUE.name.lower()


def test_intrinsics_compute_in_the_scratchpad():
    for kind, params, flags in [
            ("gemm", (8, 8, 4, "int8", "int32"), {}), ("depthwise", (2, 8, 8, (3, 3, 1, 1, 1, 1), "int8", "int32"), {}),
            ("fill", (8, 8, "int32"), {}), ("accumulate", (1, 8, "float32"), {}),
            ("epilogue", (8, 8, "int32"), {"bias": True, "relu": True}),
            ("epilogue", (8, 8, "int32"), {"bias": True, "relu": True, "residual": True, "clip": (0, 100), "zero_point": -3}),
            ("eltwise", (8, 8, "add", "float32"), {"a_full": (True, True), "b_full": (False, True)}),
            ("pool", (2, 2, 8, PoolWindow("max", (3, 3), valid=(1, 4, 1, 4)), "float32"), {}),
            ("fabric", (4, 8, FabricBody((("max", "a", 0.0),), "float32")), {}), ("smooth", (4, 8, "silu"), {}),
            ("reduce", (4, 8, "max"), {}), ("vfunc", (4, 8, "exp"), {"scale": 0.5, "offset": 1.0})]:
        desc, impl = INTRINSICS[kind].factory(*params, **flags)
        assert SPAD in desc.script() and SPAD in impl.script()


def test_flags_are_keywords_and_name_the_intrinsic_as_before():
    """An intrinsic's flags are keyword-only (a positional True could be any of five); the name
    it is registered under lists the parameters in the factory's order, as positional calls
    named it (snapshots and schedules refer to these names)."""
    assert intrin_name("epilogue", 4, 8, "float32", bias=False, relu=True, residual=False, clip=None,
                       zero_point=None) == "cgra.epilogue.4.8.float32.False.True.False.None.None"
    assert intrin_name("epilogue", 4, 8, "int32", relu=True, bias=True) == "cgra.epilogue.4.8.int32.True.True"
    assert intrin_name("eltwise", 2, 8, "add", "int8", a_full=(True, True), b_full=(False, True)) == \
        "cgra.eltwise.2.8.add.int8.full_True_True.full_False_True"
    assert intrin_name("fill", 4, 4, "int32") == "cgra.fill.4.4.int32"
    with pytest.raises(TypeError, match="epilogue"):
        get_intrin("epilogue", 4, 8, "float32", False, True)
    with pytest.raises(TypeError, match="eltwise"):
        intrin_name("eltwise", 2, 8, "add", "int8", a_full=(True, True))


@given(rows=st.integers(1, 9), cols=st.integers(1, 40), func=st.sampled_from(["sum", "max", "sum_squares"]),
       seed=st.integers(0, 2**16))
def test_reduce_three_ways(rows, cols, func, seed):
    """REDUCE folds each row into its column element, left to right: the TIR description's
    sequential update on the host and the simulator agree bit for bit (a sum of squares within
    rounding: LLVM may contract its multiply and add)."""
    rng = np.random.default_rng(seed)
    a, out = _random(rng, (rows, cols), "float32"), _random(rng, (rows, 1), "float32")
    desc, impl = INTRINSICS["reduce"].factory(rows, cols, func, scope="global")
    tir_out = _tir_reference(desc, [a, out])[1]
    stream = _Stream([a, out])
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
    assert _extern_name(impl) == "cgra_" + Op.REDUCE.name.lower()


@given(rows=st.integers(1, 9), cols=st.integers(1, 9), func=st.sampled_from([f.name.lower() for f in VFunc]),
       scale=st.sampled_from([None, 0.5, -1.75]), offset=st.sampled_from([None, 0.25, 3.0]), seed=st.integers(0, 2**16))
def test_vfunc_three_ways(rows, cols, func, scale, offset, seed):
    """VFUNC: the simulator computes special.py's specified float32 sequence bit for bit; the TIR
    description (the C library's exp, tanh, erf on the host) agrees within the functions' error
    bounds (a few ulps)."""
    rng = np.random.default_rng(seed)
    a = _random(rng, (rows, cols), "float32") * 2
    if func in ("rsqrt",):
        a = np.abs(a) + np.float32(0.5)
    out = np.zeros((rows, cols), np.float32)
    desc, impl = INTRINSICS["vfunc"].factory(rows, cols, func, scale=scale, offset=offset, scope="global")
    tir_out = _tir_reference(desc, [a, out])[1]
    stream = _Stream([a, out])
    stream.load(0)
    flags = (VFUNC_SCALE if scale is not None else 0) | (VFUNC_OFFSET if offset is not None else 0)
    stream.commands.append(encode(
        Op.VFUNC, flags=flags, func=VFunc[func.upper()], dtype=int(DType.FLOAT32), rows=rows, cols=cols,
        a_addr=stream.addr[0], a_row_stride=cols, a_col_stride=1, out_addr=stream.addr[1], out_stride=cols,
        scale_bits=_bits(scale, "float32") if scale is not None else 0,
        offset_bits=_bits(offset, "float32") if offset is not None else 0))
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
    assert _extern_name(impl) == "cgra_" + Op.VFUNC.name.lower()


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
    a = _random(rng, (rows, cols), "float32") * 2
    if func == "rsqrt":
        a = np.abs(a) + np.float32(0.5)
    a = a if float32_in else a.astype(fmt)
    out = np.zeros((rows, cols), np.float32 if float32_out else fmt)
    desc, impl = INTRINSICS["vfunc"].factory(rows, cols, func, scale=scale, half=half, float32_in=float32_in,
                                             float32_out=float32_out, scope="global")
    tir_out = _tir_reference(desc, [a, out])[1]
    stream = _Stream([a, out])
    stream.load(0)
    flags = (VFUNC_SCALE if scale is not None else 0) | (VFUNC_FLOAT32_IN if float32_in else 0) \
        | (VFUNC_FLOAT32_OUT if float32_out else 0)
    stream.commands.append(encode(
        Op.VFUNC, flags=flags, func=VFunc[func.upper()], dtype=int(DType.from_name(half)), rows=rows, cols=cols,
        a_addr=stream.addr[0], a_row_stride=cols, a_col_stride=1, out_addr=stream.addr[1], out_stride=cols,
        scale_bits=_bits(scale, "float32") if scale is not None else 0))
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
    assert _extern_name(impl) == "cgra_" + Op.VFUNC.name.lower()


def test_a_float32_vfunc_refuses_the_half_flags():
    """VFUNC_FLOAT32_IN / _OUT keep an operand float32 beside a 16-bit dtype: a float32 VFUNC
    naming them, or a VFUNC of an integer dtype, is refused before anything runs."""
    from cgra_sim.errors import CommandError

    a = np.ones((2, 2), np.float32)
    for dtype, flags in ((DType.FLOAT32, VFUNC_FLOAT32_IN), (DType.FLOAT32, VFUNC_FLOAT32_OUT), (DType.INT8, 0)):
        stream = _Stream([a, a.copy()])
        stream.load(0)
        stream.commands.append(encode(Op.VFUNC, flags=flags, func=VFunc.EXP, dtype=int(dtype), rows=2, cols=2,
                                      a_addr=stream.addr[0], a_row_stride=2, a_col_stride=1,
                                      out_addr=stream.addr[1], out_stride=2))
        with pytest.raises(CommandError, match="VFUNC_FLOAT32|dtype"):
            stream.run()


@given(rows=st.integers(1, 9), cols=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_lookup_three_ways(rows, cols, seed):
    """LOOKUP: the TIR description, the simulator and the device call agree bit for bit: every
    int8 input indexes its table entry (table[x + 128])."""
    rng = np.random.default_rng(seed)
    a = _random(rng, (rows, cols), "int8")
    table = _random(rng, (256,), "int8")
    out = np.zeros((rows, cols), np.int8)
    desc, impl = INTRINSICS["lookup"].factory(rows, cols, scope="global")
    tir_out = _tir_reference(desc, [table, a, out])[2]  # Out's initial values are all overwritten
    stream = _Stream([a, table, out])
    stream.load(0, 1)
    stream.commands.append(encode(Op.LOOKUP, rows=rows, cols=cols, a_addr=stream.addr[0], a_stride=cols,
                                  table_addr=stream.addr[1], out_addr=stream.addr[2], out_stride=cols))
    stream.store(2)
    sim_out = stream.run()[2]
    np.testing.assert_array_equal(sim_out, table[a.astype(np.int32) + 128])
    np.testing.assert_array_equal(tir_out, sim_out)
    assert _extern_name(impl) == "cgra_" + Op.LOOKUP.name.lower()
