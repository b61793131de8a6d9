"""int8 x int4 (issue 37 items 1 and 6): QDQ models' 4-bit weights packed two per byte in DRAM.

UNPACK4_INT8 + an int8 GEMM on the simulator against numpy's integer matmul of the same signed
int4 values (written here from ONNX's INT4 layout: even row in the low nibble, two's complement).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cgra_sim import CommandError, load_arch
from cgra_sim.isa import UNPACK4_INT8, UNPACK4_ZERO_POINTS, DType, Op, encode
from cgra_sim.unpack4 import pack_signed, signed_nibbles
from three_ways import Stream

ARCH = load_arch("cgra-8x8")


def _pack_by_hand(w: np.ndarray) -> np.ndarray:
    """(rows, cols) int4 values -> (cols, ceil(rows / 2)) bytes, one byte at a time."""
    rows, cols = w.shape
    out = np.zeros((cols, -(-rows // 2)), np.uint8)
    for j in range(cols):
        for i in range(rows):
            out[j, i // 2] |= (int(w[i, j]) & 0xF) << (4 * (i % 2))
    return out.view(np.int8)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_pack_signed_is_the_int4_layout_and_signed_nibbles_its_inverse(rows, cols, seed):
    w = np.random.default_rng(seed).integers(-8, 8, (rows, cols))
    packed = pack_signed(w)
    np.testing.assert_array_equal(packed, _pack_by_hand(w))
    np.testing.assert_array_equal(signed_nibbles(packed.view(np.uint8), rows), w.astype(np.int8))


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 6), k=st.integers(1, 70), n=st.integers(1, 20), seed=st.integers(0, 2**16))
def test_unpack4_int8_then_int8_gemm_equals_numpy(m, k, n, seed):
    rng = np.random.default_rng(seed)
    w = rng.integers(-8, 8, (k, n))
    x = rng.integers(-128, 128, (m, k)).astype(np.int8)
    packed = pack_signed(w)
    stream = Stream([packed, x, np.zeros((k, n), np.int8), np.zeros((m, n), np.int32)])
    stream.load(0, 1)
    stream.commands.append(encode(Op.UNPACK4, flags=UNPACK4_INT8, rows=k, cols=n, group=1, a_addr=stream.addr[0],
                                  a_col_stride=packed.shape[1], out_addr=stream.addr[2], out_stride=n))
    stream.commands.append(encode(Op.GEMM, dtype=int(DType.INT8), m=m, n=n, k=k, a_addr=stream.addr[1], a_stride=k,
                                  b_addr=stream.addr[2], b_stride=n, acc_addr=stream.addr[3], acc_stride=n))
    stream.store(2, 3)
    out = stream.run()
    np.testing.assert_array_equal(out[2], w.astype(np.int8))
    np.testing.assert_array_equal(out[3], x.astype(np.int64) @ w)


@pytest.mark.parametrize("words, match", [
    (dict(flags=UNPACK4_INT8 | UNPACK4_ZERO_POINTS, zero_addr=0, zero_col_stride=1), "takes no zero points"),
    (dict(flags=UNPACK4_INT8, zero_col_stride=1), "takes no zero points"),
    (dict(flags=4), "flag"),
])
def test_unpack4_int8_refuses_zero_point_words(words, match):
    stream = Stream([np.zeros((4, 16), np.int8), np.zeros((32, 4), np.int8)])
    stream.load(0)
    stream.commands.append(encode(Op.UNPACK4, rows=32, cols=4, group=32, a_addr=stream.addr[0], a_col_stride=16,
                                  out_addr=stream.addr[1], out_stride=4, **words))
    with pytest.raises(CommandError, match=match):
        stream.run()


def test_verify_int8_matmul_with_int4_weights_passes(capsys):
    from cgra_cli.cli import main

    assert main(["verify", "--op", "matmul", "--shape", "5,24,37", "--dtype", "int8", "--weight-dtype", "int4",
                 "--arch", "cgra-4x4"]) == 0
    assert capsys.readouterr().out.startswith("PASS matmul 5x24x37 int8 x int4 weights on cgra-4x4")


@settings(max_examples=8, deadline=None)
@given(m=st.integers(1, 9), k=st.integers(1, 40), n=st.integers(1, 12), zp=st.integers(-128, 127),
       seed=st.integers(0, 2**16))
def test_a_packed_qdq_matmul_equals_the_int8_chain_it_replaces(m, k, n, zp, seed):
    """qdq_int4.py's host PrimFunc (what a chip whose tiles do not fit runs) against numpy's int32
    sum and rne(clamp(float32(acc) * M)) + zp, the int8 chain's arithmetic (qdq.py)."""
    import tvm

    from npu_backend.normalise.qdq_int4 import QInt4Layer, host_prim_func

    rng = np.random.default_rng(seed)
    w, x = rng.integers(-8, 8, (k, n)), rng.integers(-128, 128, (m, k)).astype(np.int8)
    bias = rng.integers(-3000, 3000, n).astype(np.int32)
    scale = rng.uniform(1e-4, 0.05, n).astype(np.float32)
    lib = tvm.compile(tvm.IRModule({"main": host_prim_func(QInt4Layer(m, k, n, zp)).with_attr("global_symbol", "main")}),
                      target="llvm")
    args = [x, pack_signed(w), bias, scale, np.zeros((m, n), np.int8)]
    tensors = [tvm.runtime.tensor(a) for a in args]
    lib["main"](*tensors)
    acc = x.astype(np.int64) @ w + bias
    want = (np.rint(np.clip(acc.astype(np.float32) * scale, -128 - zp, 127 - zp)) + zp).astype(np.int8)
    np.testing.assert_array_equal(tensors[-1].numpy(), want)
