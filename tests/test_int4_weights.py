"""4-bit weights (issue 37 item 3): UNPACK4 on the simulator, and onnxruntime's MatMulNBits on the NPU.

The simulator's UNPACK4 + GEMM against a numpy model written here from MatMulNBits' layout (not
cgra_sim's own), and an MLP of three MatMulNBits layers (quantized by onnxruntime's own C++
block quantizer, the one MatMulNBitsQuantizer calls) against onnxruntime.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st

from cgra_sim import CommandError, load_arch
from cgra_sim.isa import UNPACK4_ZERO_POINTS, DType, Op, encode
from three_ways import Stream

ARCH = load_arch("cgra-8x8")


def _pack(nibbles: np.ndarray) -> np.ndarray:
    """(cols, count) values 0..15 -> (cols, ceil(count / 2)) uint8, even index in the low nibble."""
    if nibbles.shape[1] % 2:
        nibbles = np.pad(nibbles, ((0, 0), (0, 1)))
    return (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).astype(np.uint8)


def _reference_weights(q, s, z, block):
    """W[k, n] = float32(q[n, k] - z[n, k // block]) * s[n, k // block], element by element."""
    n, k = q.shape
    w = np.empty((k, n), np.float32)
    for j in range(n):
        for r in range(k):
            zero = 8 if z is None else int(z[j, r // block])
            w[r, j] = np.float32(int(q[j, r]) - zero) * s[j, r // block]
    return w


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 6), k=st.integers(1, 130), n=st.integers(1, 24), block=st.sampled_from([16, 32, 64, 128]),
       zero_points=st.booleans(), seed=st.integers(0, 2**16))
def test_unpack4_then_gemm_equals_numpy(m, k, n, block, zero_points, seed):
    rng = np.random.default_rng(seed)
    groups = -(-k // block)
    q = rng.integers(0, 16, (n, groups * block), dtype=np.uint8)  # MatMulNBits pads K to whole blocks
    z = rng.integers(0, 16, (n, groups), dtype=np.uint8) if zero_points else None
    s = (rng.standard_normal((n, groups)) * 0.1).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    packed, zeros = _pack(q).view(np.int8), (_pack(z).view(np.int8) if zero_points else None)
    arrays = [packed, s, x, np.zeros((k, n), np.float32), np.zeros((m, n), np.float32)] + \
        ([zeros] if zero_points else [])
    stream = Stream(arrays)
    stream.load(0, 1, 2, *([5] if zero_points else []))
    flags = UNPACK4_ZERO_POINTS if zero_points else 0
    zero = dict(zero_addr=stream.addr[5], zero_col_stride=zeros.shape[1]) if zero_points else {}
    stream.commands.append(encode(Op.UNPACK4, flags=flags, rows=k, cols=n, group=block, a_addr=stream.addr[0],
                                  a_col_stride=packed.shape[1], scale_addr=stream.addr[1], scale_col_stride=groups,
                                  out_addr=stream.addr[3], out_stride=n, **zero))
    stream.commands.append(encode(Op.GEMM, dtype=int(DType.FLOAT32), m=m, n=n, k=k, a_addr=stream.addr[2],
                                  a_stride=k, b_addr=stream.addr[3], b_stride=n, acc_addr=stream.addr[4],
                                  acc_stride=n))
    stream.store(3, 4)
    out = stream.run()
    w = _reference_weights(q[:, :k], s, z, block)
    np.testing.assert_array_equal(out[3], w)  # the unpack is exact: one rounding, as numpy's
    np.testing.assert_allclose(out[4], x @ w, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(x @ w).max())))


def test_unpack4_refuses_zero_point_words_without_the_flag():
    stream = Stream([np.zeros((4, 16), np.int8), np.ones((4, 1), np.float32), np.zeros((32, 4), np.float32)])
    stream.load(0, 1)
    stream.commands.append(encode(Op.UNPACK4, rows=32, cols=4, group=32, a_addr=stream.addr[0], a_col_stride=16,
                                  scale_addr=stream.addr[1], scale_col_stride=1, zero_addr=64, out_addr=stream.addr[2],
                                  out_stride=4))
    with pytest.raises(CommandError, match="UNPACK4_ZERO_POINTS is off"):
        stream.run()


def test_unpack4_costs_a_nibble_a_lane_a_cycle():
    from cgra_sim import cost
    assert cost.unpack4_cycles(ARCH, 64 * 64) == -(-64 * 64 // ARCH.vector_lanes) + cost.VECTOR_OVERHEAD_CYCLES


def _quantized_mlp(rng, sizes, m, block, symmetric):
    """A float MLP (MatMul -> Relu -> ...) whose MatMuls are MatMulNBits nodes, weights quantized by
    onnxruntime's C++ block quantizer (what MatMulNBitsQuantizer runs), laid out as it writes them."""
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    nodes, inits, value = [], [], "x"
    for layer, (k, n) in enumerate(zip(sizes, sizes[1:])):
        w = (rng.standard_normal((k, n)) * 0.2).astype(np.float32)
        groups = -(-k // block)
        packed = np.zeros((n, groups, block // 2), np.uint8)
        scales = np.zeros((n, groups), np.float32)
        zeros = np.zeros((n, (groups + 1) // 2), np.uint8)
        quantize_matmul_4bits(packed, np.pad(w, ((0, groups * block - k), (0, 0))), scales, zeros, block, n, k,
                              symmetric)
        names = [f"w{layer}_q4", f"w{layer}_scales"] + ([] if symmetric else [f"w{layer}_zp"])
        inits += [numpy_helper.from_array(packed, names[0]), numpy_helper.from_array(scales.reshape(-1), names[1])]
        if not symmetric:
            inits.append(numpy_helper.from_array(zeros.reshape(-1), names[2]))
        nodes.append(helper.make_node("MatMulNBits", [value] + names, [f"h{layer}"], name=f"fc{layer}",
                                      domain="com.microsoft", K=k, N=n, bits=4, block_size=block))
        value = f"h{layer}"
        if layer < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [value], [f"r{layer}"], name=f"relu{layer}"))
            value = f"r{layer}"
    graph = helper.make_graph(nodes, "mlp_q4", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, sizes[0]])],
                              [helper.make_tensor_value_info(value, TensorProto.FLOAT, [m, sizes[-1]])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("symmetric", [False, True])
def test_matmul_nbits_stack_runs_on_the_npu_equal_to_onnxruntime(symmetric):
    import onnxruntime as ort
    from tvm import relax

    import npu_backend

    rng = np.random.default_rng(1)
    sizes, m, block = (72, 96, 64, 40), 4, 32  # K = 72: a last block padded, as the quantizer pads it
    model = _quantized_mlp(rng, sizes, m, block, symmetric)
    x = rng.standard_normal((m, sizes[0])).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    mod = npu_backend.from_onnx(model)
    placements = [p for p in npu_backend.explain(mod, ARCH) if p.op.startswith("call_tir")]
    assert [p.where for p in placements] == ["npu"] * 3
    assert [p.macs for p in placements] == [m * k * n for k, n in zip(sizes, sizes[1:])]  # every MAC on the NPU
    with npu_backend.profile() as prof:
        out = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    # measured: equal to onnxruntime 1.32 bit for bit here (its MLAS float32 path dequantizes
    # (q - z) * s the same way); allow float32 summation-order rounding
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5 * float(np.abs(expected).max()))
    kernels = [k for k in prof.kernels if k.name.startswith("cgra_tir_fc")]
    assert len(kernels) == 3
    first = kernels[0].to_dict()
    k, n = sizes[0], sizes[1]
    groups = -(-k // block)
    weight_bytes = n * (groups * block // 2 + 4 * groups + (0 if symmetric else (groups + 1) // 2))
    assert first["dma_load_bytes"] == weight_bytes + 4 * m * k  # packed weights, scales, zero points, x


def test_verify_matmul_with_int4_weights_passes(capsys):
    from cgra_cli.cli import main

    assert main(["verify", "--op", "matmul", "--shape", "3,40,72", "--weight-dtype", "int4", "--arch", "cgra-4x4"]) == 0
    assert capsys.readouterr().out.startswith("PASS matmul 3x40x72 float32 x int4 weights (block 32) on cgra-4x4")


def test_verify_refuses_int4_weights_outside_matmul_and_conv2d(capsys):
    from cgra_cli.cli import main

    assert main(["verify", "--op", "pool", "--shape", "1,3,8,8", "--window", "2,2", "--weight-dtype", "int4"]) == 2
    assert "--weight-dtype int4 is for --op matmul and conv2d" in capsys.readouterr().err
    assert main(["verify", "--op", "conv2d", "--shape", "1,4,8,8,4,3,3", "--groups", "2", "--weight-dtype", "int4"]) == 2
    assert "NCHW data, OIHW weights, --groups 1" in capsys.readouterr().err


def test_the_int4_mlp_example_runs_equal_to_onnxruntime(capsys):
    import pathlib
    import runpy

    example = runpy.run_path(str(pathlib.Path(__file__).parent.parent / "examples" / "int4_mlp.py"))
    result = example["main"](["--arch", "cgra-4x4", "--rows", "2"])
    assert result["max_abs_diff"] < 1e-5
    assert capsys.readouterr().out.count("cgra_tir_") == 3


def test_matmul_nbits_of_a_sequence_with_a_bias_equals_onnxruntime():
    """A (1, tokens, K) activation (flattened to rows and back), no g_idx, a bias (input 5)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits
    from tvm import relax

    import npu_backend

    rng = np.random.default_rng(3)
    k, n, block, groups = 64, 48, 32, 2
    packed, scales = np.zeros((n, groups, block // 2), np.uint8), np.zeros((n, groups), np.float32)
    zeros = np.zeros((n, 1), np.uint8)
    quantize_matmul_4bits(packed, rng.standard_normal((k, n)).astype(np.float32), scales, zeros, block, n, k, False)
    inits = [numpy_helper.from_array(a, name) for a, name in ((packed, "q"), (scales.reshape(-1), "s"),
                                                              (zeros.reshape(-1), "z"),
                                                              (rng.standard_normal(n).astype(np.float32), "b"))]
    node = helper.make_node("MatMulNBits", ["x", "q", "s", "z", "", "b"], ["y"], name="proj", domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=block)
    graph = helper.make_graph([node], "proj", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    x = rng.standard_normal((1, 6, k)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    mod = npu_backend.from_onnx(model)
    assert [p.where for p in npu_backend.explain(mod, ARCH) if p.op == "call_tir proj"] == ["npu"]
    out = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5 * float(np.abs(expected).max()))


def test_matmul_nbits_with_other_bits_is_refused_naming_the_node():
    from onnx import TensorProto, helper, numpy_helper

    import npu_backend
    from npu_backend.errors import UnsupportedOperator

    inits = [numpy_helper.from_array(np.zeros((8, 1, 32), np.uint8), "q"),
             numpy_helper.from_array(np.ones(8, np.float32), "s")]
    node = helper.make_node("MatMulNBits", ["x", "q", "s"], ["y"], name="fc8", domain="com.microsoft", K=32, N=8,
                            bits=8, block_size=32)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(UnsupportedOperator, match="MatMulNBits 'fc8': bits=8"):
        npu_backend.from_onnx(model)


def test_a_long_k_is_split_into_accumulated_tiles_and_still_passes(capsys):
    """K = 2048 on cgra-4x4 (64 KiB): whole-K tiles would leave the PE array's columns idle, so K is
    split in tiles of whole byte-aligned blocks whose GEMMs accumulate in the scratchpad."""
    from npu_backend.kernels.gemm.int4_matmul import Int4Layer, choose_tiles
    from npu_backend.tools.cli import main

    arch = load_arch("cgra-4x4")
    tiles = choose_tiles(Int4Layer(2, 2048, 64, 32, True), arch)
    assert tiles.kt < 2048 and tiles.kt % 64 == 0 and tiles.nt >= arch.cols
    assert main(["verify", "--op", "matmul", "--shape", "2,64,2048", "--weight-dtype", "int4", "--arch", "cgra-4x4"]) == 0
    assert capsys.readouterr().out.startswith("PASS")
