"""The PE fabric's intrinsics (kernels/intrinsics/fabric.py, smooth.py): a dataflow body, and
sigmoid, SiLU and GELU's tanh form as several bodies.

Each intrinsic is checked three ways against each other (tests/three_ways.py):
1. Its TVMScript description, built for the host by TVM's llvm backend: the TIR semantics.
2. Its ISA command, run by the simulator's functional core: the hardware semantics.
3. Its implementation's extern call, which the code generator lowers to the runtime function
   that records that ISA opcode.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cgra_sim.isa import DType, EltwiseFunc, Op, encode
from cgra_sim.mapping import body as bodies
from cgra_sim.mapping import sigmoid as smooth
from cgra_sim.mapping.sigmoid import passes as smooth_bodies
from npu_backend.kernels.common.chains import folded
from npu_backend.kernels.intrinsics import INTRINSICS
from npu_backend.kernels.intrinsics.fabric import FabricBody
from test_sim_fabric import random_bodies
from three_ways import Stream, extern_name, random_array, tir_reference


@settings(max_examples=40, deadline=None)
@given(case=random_bodies(two_inputs=False, max_nodes=5), rows=st.integers(1, 9), cols=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_fabric_three_ways(case, rows, cols, seed):
    """A random one-input body (every op, immediates, any earlier node): the TIR description on the
    host, the FABRIC command on the simulator, and the body's numpy meaning agree (float32 within
    rounding: LLVM may contract a multiply and an add on the host)."""
    dtype, nodes = case
    assume(not folded(nodes, dtype))  # the compiler keeps such chains off the fabric
    rng = np.random.default_rng(seed)
    a, out = random_array(rng, (rows, cols), dtype), np.zeros((rows, cols), dtype)
    desc, impl = INTRINSICS["fabric"].factory(rows, cols, FabricBody(nodes, dtype), scope="global")
    tir_out = tir_reference(desc, [a, out])[1]
    stream = Stream([a, out])
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
    assert extern_name(impl) == "cgra_" + Op.FABRIC.name.lower()


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
    tir_out = tir_reference(desc, [a, out])[1]
    stream = Stream([a, out])
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
