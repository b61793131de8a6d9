"""int16 activations times int8 weights (16x8) through the compiler: matmul and conv2d kernels on
the PE array, accumulating in int64, exact against numpy; with the requantising epilogue the QDQ
layers end in (normalise/qdq16.py), bit for bit against the numpy model of cgra_sim/int16.py.

Hypothesis draws shapes, the epilogue and the PE array's size, so the tile search picks different
tiles and splits K into different steps (each split adds int64 partial sums in place).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from cgra_sim.int16 import requantise16
from npu_backend.tools.workloads import conv2d_model, matmul_model, mismatch, relax_module, run

PRESETS = npu_backend.preset_names()


@st.composite
def arrays(draw):
    """A preset, or a preset with another PE array (the tile search sizes tiles to it)."""
    arch = npu_backend.load_arch(draw(st.sampled_from(PRESETS)))
    if draw(st.booleans()):
        arch = dataclasses.replace(arch, name="int16-test", rows=draw(st.sampled_from([2, 4, 8])),
                                   cols=draw(st.sampled_from([4, 8, 16])))
    return arch


@settings(max_examples=6)  # a compile each: about 4 s
@given(m=st.integers(1, 70), n=st.integers(1, 70), k=st.integers(1, 300), arch=arrays(), bias=st.booleans(),
       relu=st.booleans(), residual=st.booleans(), transposed=st.booleans())
def test_matmul_16x8_is_exact(m, n, k, arch, bias, relu, residual, transposed):
    mod, inputs, ref = matmul_model(m, n, k, "int16", bias=bias, relu=relu, residual=residual, transposed=transposed)
    assert inputs[0].dtype == np.int16 and inputs[1].dtype == np.int8 and ref.dtype == np.int64
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    assert len(prof.kernels) == 1  # the whole chain on the NPU
    assert mismatch(out, ref, "int8") is None  # exact


@settings(max_examples=4)
@given(c=st.integers(1, 24), hw=st.integers(3, 12), f=st.integers(1, 24), kernel=st.sampled_from([1, 3]),
       stride=st.sampled_from([1, 2]), pad=st.integers(0, 1), arch=arrays(), residual=st.booleans())
def test_conv2d_16x8_is_exact(c, hw, f, kernel, stride, pad, arch, residual):
    mod, inputs, ref = conv2d_model(1, c, hw, hw, f, kernel, kernel, stride=(stride, stride), pad=(pad,) * 4,
                                    dtype="int16", residual=residual)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), inputs)
    assert len(prof.kernels) == 1
    assert mismatch(out, ref, "int8") is None


def _requantised_matmul(m, n, k, zero_point, seed):
    """int16 x @ int8 w -> int64, + bias, relu, then quantize(float32(acc) * scale, 1.0, zp) to
    int16: the form normalise/qdq16.py gives an int16 QDQ layer. (module, inputs, numpy model)."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    bias = rng.integers(-2**30, 2**30, (n,), dtype=np.int64)
    scale = (rng.uniform(0.5, 2.0, n) / (128 * 256 * np.sqrt(k))).astype(np.float32)

    def body(bb, x):
        acc = bb.emit(relax.op.matmul(x, relax.const(w), out_dtype="int64"))
        acc = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(acc, relax.const(bias, "int64")))))
        scaled = bb.emit(relax.op.multiply(relax.op.astype(acc, "float32"), relax.const(scale)))
        return bb.emit(relax.op.quantize(scaled, relax.const(1.0, "float32"), relax.const(zero_point, "int16"),
                                         axis=-1, out_dtype="int16"))

    x = rng.integers(-32768, 32768, (m, k), dtype=np.int16)
    acc = np.maximum(x.astype(np.int64) @ w.astype(np.int64) + bias, 0)
    return relax_module([("x", (m, k), "int16")], body), [x], requantise16(acc, scale, zero_point)


@settings(max_examples=4)
@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 200), zero_point=st.integers(-32768, 32767),
       seed=st.integers(0, 2**32 - 1))
def test_the_requantising_epilogue_is_bit_exact_on_the_npu_and_the_host(m, n, k, zero_point, seed):
    mod, inputs, ref = _requantised_matmul(m, n, k, zero_point, seed)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), inputs)
    assert len(prof.kernels) == 1 and out.dtype == np.int16
    np.testing.assert_array_equal(out, ref)
    import tvm  # the host's arithmetic (relax's quantize) is the same

    host = run(tvm.compile(mod, target="llvm"), inputs)
    np.testing.assert_array_equal(host, ref)


def test_a_16x8_gemm_moves_fewer_bytes_than_float32_and_what_stays_on_the_host():
    cycles = {}
    for dtype in ("float32", "int16"):
        mod, inputs, _ = matmul_model(64, 64, 256, dtype, bias=True, relu=True)
        with npu_backend.profile() as prof:
            run(npu_backend.compile(mod, "cgra-8x8"), inputs)
        cycles[dtype] = prof.kernels[0]
    assert cycles["int16"].dma_load_bytes < cycles["float32"].dma_load_bytes
    # a depthwise int16 conv2d has no 16x8 mode (DEPTHWISE is int8 / float only): the host runs it
    mod, inputs, ref = conv2d_model(1, 8, 6, 6, 8, 3, 3, pad=(1, 1, 1, 1), dtype="int16", groups=8)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), inputs)
    assert not prof.kernels
    np.testing.assert_array_equal(out, ref)
