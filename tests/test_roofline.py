"""The roofline (cgra_sim/roofline.py): compulsory DRAM bytes and the cycles no schedule beats.

Hand-computed kernels: a weight-bound GEMM (4 x 512 @ 512 x 128, float32: 264 KB of operands at
16 bytes a cycle), a compute-bound GEMM (64^3 MACs on 64 PEs), a 3x3 conv whose input rows load
three times each and reach into the halo (compulsory: each element once, no halo), and an
elementwise add through the compiler (no MACs: its bytes). Random tilings: the bound is never
above the measured cycles, compulsory bytes never above the bytes moved; a chain of launches with
weight prefetch is never above the chain's cycles.
"""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from cgra_sim import load_arch, simulate, simulate_detailed, streams
from cgra_sim.roofline import run_roofline

ACC = {"int8": np.int32, "float32": np.float32}


def _gemm(arch, m, n, k, dtype="float32", tile=None, seed=0):
    rng = np.random.default_rng(seed)
    tensors = [rng.integers(-5, 5, (m, k)).astype(dtype), rng.integers(-5, 5, (k, n)).astype(dtype),
               np.zeros((m, n), ACC[dtype])]
    return streams.tiled_gemm(arch, m, n, k, dtype, tile=tile), tensors


def test_a_weight_bound_gemm_is_bound_by_its_operand_bytes():
    arch = load_arch("cgra-8x8")
    stats = simulate(arch, *_gemm(arch, 4, 128, 512))
    load = (4 * 512 + 512 * 128) * 4  # A and B once each, float32
    assert stats.compulsory_load_bytes == load and stats.compulsory_store_bytes == 4 * 128 * 4
    assert stats.roofline_cycles == load // 16 + 80 == 16_976  # > 4 * 128 * 512 / 64 = 4,096 MAC cycles
    assert stats.roofline_load_cycles == 16_976 and stats.roofline_own_cycles == 16_976  # nothing constant
    assert stats.roofline_cycles <= stats.cycles


def test_a_compute_bound_gemm_is_bound_by_its_macs_and_reloads_are_not_compulsory():
    arch = load_arch("cgra-8x8")
    stats = simulate(arch, *_gemm(arch, 64, 64, 64))  # 8x8 output tiles: A and B reloaded 8 times
    assert stats.dma_load_bytes == 8 * 2 * 64 * 64 * 4
    assert stats.compulsory_load_bytes == 2 * 64 * 64 * 4  # 2,048 + 80 cycles of DMA
    assert stats.roofline_cycles == 64 ** 3 // 64 == 4_096 <= stats.cycles
    int8 = simulate(arch, *_gemm(arch, 64, 64, 64, "int8"))  # int8: more MACs a PE a cycle
    assert int8.roofline_cycles == max(64 ** 3 // (64 * arch.macs_per_pe["int8"]), 2 * 64 * 64 // 16 + 80)


def test_a_conv_with_halo_counts_each_input_element_once():
    arch = load_arch("cgra-8x8")
    h, w, c, f = 6, 8, 8, 16
    rng = np.random.default_rng(1)
    tensors = [rng.integers(-5, 5, (h, w, c)).astype("int8"), rng.integers(-5, 5, (3, 3, c, f)).astype("int8"),
               np.zeros((h, w, f), np.int32)]
    stats = simulate(arch, streams.conv2d_3x3(arch, h, w, c, f), tensors)
    assert stats.dma_load_bytes > h * w * c + 9 * c * f  # rows loaded three times
    assert stats.compulsory_load_bytes == h * w * c + 9 * c * f
    assert stats.compulsory_store_bytes == h * w * f * 4
    assert stats.roofline_cycles <= stats.cycles


def _add_module(shape):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    y = relax.Var("y", relax.TensorType(shape, "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.add(x, y)))
        bb.emit_func_output(out)
    return bb.get()


def test_an_elementwise_kernel_is_bound_by_its_bytes_and_the_profile_reports_it():
    shape = (1, 64, 64)
    x, y = (np.random.default_rng(s).standard_normal(shape).astype("float32") for s in (2, 3))
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(npu_backend.compile(_add_module(shape), "cgra-8x8"), tvm.cpu())["main"](
            tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy()
    np.testing.assert_array_equal(got, x + y)
    (kernel,) = prof.kernels
    assert kernel.macs == 0
    assert kernel.compulsory_load_bytes == 2 * 64 * 64 * 4 and kernel.compulsory_store_bytes == 64 * 64 * 4
    assert kernel.roofline_cycles == 2 * 64 * 64 * 4 // 16 + 80 <= kernel.cycles
    assert prof.roofline_cycles == kernel.roofline_cycles
    assert '"roofline_cycles": %d' % prof.roofline_cycles in prof.to_json()


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_the_bound_is_never_above_the_cycles_even_with_prefetch(data):
    arch = load_arch("cgra-8x8")
    launches, previous = [], None
    for _ in range(data.draw(st.integers(1, 3))):
        dtype = data.draw(st.sampled_from(["int8", "float32"]))
        m, n, k = (data.draw(st.integers(1, 80)) for _ in range(3))
        tile = (data.draw(st.integers(-(-m // 5), 32)), data.draw(st.integers(-(-n // 5), 32)),
                data.draw(st.integers(-(-k // 5), 64)))
        records, tensors = _gemm(arch, m, n, k, dtype, tile)
        result = simulate_detailed(arch, records, tensors, previous=previous, constant_slots=(1,))
        stats, previous = result.stats, result.tail
        assert stats.compulsory_load_bytes <= stats.dma_load_bytes
        assert stats.compulsory_store_bytes == stats.dma_store_bytes == m * n * 4
        assert stats.compulsory_constant_bytes == k * n * np.dtype(dtype).itemsize
        assert stats.roofline_own_cycles <= stats.cycles  # its constants may have loaded before
        if not result.prefetch.loads:
            assert stats.roofline_cycles <= stats.cycles
        launches.append(stats)
    assert run_roofline(launches) <= sum(s.cycles for s in launches)
    assert run_roofline(launches[:1]) == launches[0].roofline_cycles
