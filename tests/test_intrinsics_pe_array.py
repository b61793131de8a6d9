"""The PE array's intrinsics (kernels/intrinsics/pe_array.py): GEMM and DEPTHWISE.

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
from three_ways import Stream, extern_name, random_array, tir_reference


@given(rows=st.integers(1, 8), cols=st.integers(1, 8), depth=st.integers(1, 40),
       dtype=st.sampled_from(["int8", "float32"]), seed=st.integers(0, 2**16))
def test_gemm_three_ways(rows, cols, depth, dtype, seed):
    acc = {"int8": "int32", "float32": "float32"}[dtype]
    rng = np.random.default_rng(seed)
    a, b, c = random_array(rng, (rows, depth), dtype), random_array(rng, (depth, cols), dtype), random_array(rng, (rows, cols), acc)
    desc, impl = INTRINSICS["gemm"].factory(rows, cols, depth, dtype, acc, scope="global")
    tir_c = tir_reference(desc, [a, b, c])[2]
    stream = Stream([a, b, c])
    stream.load(0, 1, 2)
    stream.commands.append(encode(Op.GEMM, flags=1, dtype=int(DType.from_name(dtype)), m=rows, n=cols, k=depth,
                                  a_addr=stream.addr[0], a_stride=depth, b_addr=stream.addr[1], b_stride=cols,
                                  acc_addr=stream.addr[2], acc_stride=cols))
    stream.store(2)
    sim_c = stream.run()[2]
    np.testing.assert_allclose(sim_c, tir_c, rtol=1e-5, atol=1e-4) if dtype == "float32" else \
        np.testing.assert_array_equal(sim_c, tir_c)
    assert extern_name(INTRINSICS["gemm"].factory(rows, cols, depth, dtype, acc)[1]) == "cgra_" + Op.GEMM.name.lower()


@given(oh=st.integers(1, 5), ow=st.integers(1, 6), cols=st.integers(1, 9), kh=st.integers(1, 3),
       kw=st.integers(1, 3), sh=st.integers(1, 2), sw=st.integers(1, 2), dh=st.integers(1, 2),
       dw=st.integers(1, 2), dtype=st.sampled_from(["int8", "float32"]), seed=st.integers(0, 2**16))
def test_depthwise_three_ways(oh, ow, cols, kh, kw, sh, sw, dh, dw, dtype, seed):
    acc = {"int8": "int32", "float32": "float32"}[dtype]
    window = (kh, kw, sh, sw, dh, dw)
    in_h, in_w = (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1
    rng = np.random.default_rng(seed)
    a, b = random_array(rng, (in_h, in_w, cols), dtype), random_array(rng, (kh, kw, cols), dtype)
    c = np.zeros((oh, ow, cols), acc)
    desc, impl = INTRINSICS["depthwise"].factory(oh, ow, cols, window, dtype, acc, scope="global")
    tir_c = tir_reference(desc, [a, b, c])[2]
    # The stream helper lays out 2-D arrays: the same bytes, as (rows, channels).
    stream = Stream([a.reshape(-1, cols), b.reshape(-1, cols), c.reshape(-1, cols)])
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
    assert extern_name(impl) == "cgra_" + Op.DEPTHWISE.name.lower()
