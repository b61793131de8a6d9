"""Tests of the scratchpad layout against bank conflicts (npu_backend.spad_layout, the schedule's
storage_align): the padded strides are conflict-free by the simulator's own bank rule, the
compiled kernels' commands carry no conflict, and the results stay exact."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import given
from hypothesis import strategies as st

import npu_backend
from cgra_codegen import device_call_positions
from cgra_sim.banks import beat_slowdown, operand_slowdown
from cgra_sim.decode import DepthwiseCommand, DmaCommand, FillCommand, GemmCommand, decode_stream
from cgra_sim.stream_file import load_launch
from npu_backend.kernels import KernelSpec, registry
from npu_backend.kernels.gemm import gemm as gemm_search
from npu_backend.kernels.common.spad_layout import (a_row_stride, beat_rows_conflict_free, operand_rows_conflict_free,
                                             out_row_stride, storage_align_args)
from npu_backend.options import CompileOptions
from npu_backend.kernels.stage import Kernel
from npu_backend.pipeline import KERNEL_STAGES
from npu_backend.tools.workloads import conv2d_model, matmul_model, mismatch, run

ARCHS = {name: npu_backend.load_arch(name) for name in npu_backend.preset_names()}
ITEMSIZE = {"int8": 1, "float32": 4, "int32": 4}


def storage_align_stride(stride: int, factor: int, offset: int) -> int:
    """The stride s_tir's storage_align gives a compact `stride` (CompactBufferAllocation's rule)."""
    return stride + (factor + offset - stride % factor) % factor


@given(st.sampled_from(sorted(ARCHS)), st.sampled_from(["int8", "float32"]),
       st.integers(1, 64), st.integers(1, 600))
def test_a_row_stride_is_the_smallest_conflict_free_one_and_storage_align_gives_it(name, dtype, tm, tk):
    arch, size = ARCHS[name], ITEMSIZE[dtype]
    lanes = min(tm, arch.rows)
    stride = a_row_stride(tm, tk, size, arch)
    assert operand_rows_conflict_free(stride, size, lanes, arch)
    assert all(not operand_rows_conflict_free(s, size, lanes, arch) for s in range(tk, stride))
    args = storage_align_args(tk, stride, size, arch)
    assert (args is None) == (stride == tk)
    if args is not None:
        assert storage_align_stride(tk, *args) == stride


@given(st.sampled_from(sorted(ARCHS)), st.integers(1, 600), st.integers(2, 64))
def test_out_row_stride_makes_one_element_per_row_beats_conflict_free(name, tn, rows):
    arch = ARCHS[name]
    stride = out_row_stride(tn, 4, rows, arch)
    assert tn <= stride < tn + arch.spad_banks * arch.bank_width_bytes // 4
    assert beat_rows_conflict_free(stride, 4, rows, arch)
    assert out_row_stride(tn, 4, 0, arch) == tn  # a store of whole rows needs no padding


def test_compact_rows_a_bank_period_long_conflict_and_get_padded():
    """The two conflicts the bank model found (docs/simulator.md): float32 A rows of 16 on
    cgra-8x8 (64 bytes = 8 banks x 8 bytes) and int8 rows of 256 on cgra-16x16."""
    arch8, arch16 = ARCHS["cgra-8x8"], ARCHS["cgra-16x16"]
    assert not operand_rows_conflict_free(16, 4, 8, arch8)
    assert a_row_stride(64, 16, 4, arch8) > 16
    assert not operand_rows_conflict_free(256, 1, 16, arch16)
    assert a_row_stride(64, 256, 1, arch16) > 256
    assert not beat_rows_conflict_free(16, 4, 16, arch8)
    assert out_row_stride(16, 4, 16, arch8) > 16


def _extern_calls(func, name):
    calls = []

    def visit(call):
        if getattr(call.op, "name", "") == "tirx.call_extern" and str(call.args[0].value) == name:
            calls.append(call)
    tvm_ffi.structural_walk(func.body, [(tvm.ir.Call, visit)])
    return calls


def test_golden_a_row_stride_of_a_float32_gemm_tile_is_padded(monkeypatch):
    """matmul 64x64x64 float32 on cgra-8x8: tiles 32 x 16 x 64, A's rows 256 bytes (4 bank
    periods) padded to 65 elements; the DMA box writes A with that stride, and the doubled
    allocation (one A panel per row tile, held across its column tiles) holds two padded tiles.
    (The tile search as without epilogue pieces, which streams 16-deep steps here instead.)"""
    monkeypatch.setattr(gemm_search, "finishes_in_pieces", lambda spec, arch: False)
    monkeypatch.setattr(gemm_search, "_TILINGS", {})
    monkeypatch.setattr(registry, "_TILINGS", {})
    arch = ARCHS["cgra-8x8"]
    spec = KernelSpec("matmul", "float32", "float32", (64, 64), (64, 64))
    kernel = Kernel("k", spec, {})
    for _, stage in KERNEL_STAGES:
        kernel = stage(kernel, arch, CompileOptions())
    assert (kernel.tiling.tm, kernel.tiling.tn, kernel.tiling.tk) == (32, 16, 64)
    lowered = kernel.func
    gemm, = _extern_calls(lowered, "cgra_gemm")
    assert [int(gemm.args[i]) for i in (3, 4, 5, 8, 11, 14)] == [32, 16, 64, 65, 16, 16]  # m n k sa sb sc
    load_a = _extern_calls(lowered, "cgra_dma_load")[0]
    box = device_call_positions("cgra_dma_load")["box"]
    loops = [int(load_a.args[i]) for i in box[12:20]]  # (extent, dim, step, spad stride) of the box's loops 0, 1
    assert loops == [32, 0, 1, 65, 64, 1, 1, 1]
    sizes = {}

    def visit(stmt):
        sizes[stmt.buffer.name] = int(stmt.buffer.shape[0])
    tvm_ffi.structural_walk(lowered.body, [(tvm.tirx.AllocBuffer, visit)])
    assert sizes["a_pad_global.cgra_spad_x2"] == 2 * 32 * 65


def _conflicts(arch, cmd) -> list[str]:
    """The command's scratchpad streams that conflict in the banks, by the rule timing.py applies
    (a slowdown beyond the bandwidth bound)."""
    banks, width = arch.spad_banks, arch.bank_width_bytes

    def beat_conflict(beat, region, shape=None, strides=None):
        slowdown = beat_slowdown(beat, shape or region.shape, strides or region.strides,
                                 region.dtype.itemsize, region.addr, banks, width)
        return slowdown > max(Fraction(1), Fraction(beat, banks * width))
    if isinstance(cmd, GemmCommand):
        lanes = min(cmd.m, arch.rows)
        slow = operand_slowdown(lanes, cmd.a.strides[0], cmd.a.addr, cmd.dtype.itemsize, banks, width)
        return ["A"] if slow > 1 else []
    if isinstance(cmd, DmaCommand):
        return [cmd.op.name] if beat_conflict(arch.dma_bytes_per_cycle, cmd.region) else []
    if isinstance(cmd, DepthwiseCommand):
        size = cmd.dtype.itemsize
        return ["window"] if beat_conflict(banks * width, cmd.a, (cmd.ow, cmd.n), (cmd.a.strides[1], size)) else []
    tiles = (cmd.region,) if isinstance(cmd, FillCommand) else (cmd.acc, cmd.residual, cmd.out)
    return [cmd.op.name for tile in tiles
            if tile is not None and beat_conflict(arch.vector_lanes * tile.dtype.itemsize, tile)]


CASES = {
    "matmul f32": lambda: matmul_model(64, 48, 64, "float32"),
    "matmul int8 tk=256": lambda: matmul_model(32, 32, 256, "int8", bias=False, relu=False),
    "conv2d NCHW f32": lambda: conv2d_model(1, 16, 16, 16, 32, 3, 3, (1, 1), (1, 1, 1, 1), "float32"),
    "conv2d NCHW int8 residual": lambda: conv2d_model(1, 16, 8, 8, 16, 3, 3, (1, 1), (1, 1, 1, 1), "int8",
                                                      residual=True),
    "depthwise NCHW f32": lambda: conv2d_model(1, 16, 12, 12, 16, 3, 3, (1, 1), (1, 1, 1, 1), "float32",
                                               groups=16),
    "depthwise stride 2 f32": lambda: conv2d_model(1, 32, 16, 16, 32, 3, 3, (2, 2), (1, 1, 1, 1), "float32",
                                                   groups=32),
}


@pytest.mark.parametrize("arch_name", ["cgra-8x8", "cgra-16x16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_kernels_are_bank_conflict_free_and_exact(case, arch_name, tmp_path):
    arch = ARCHS[arch_name]
    mod, inputs, ref = CASES[case]()
    ex = npu_backend.compile(mod, arch)
    with npu_backend.profile(record_dir=tmp_path):
        out = run(ex, inputs)
    assert mismatch(out, ref, "int8" if "int8" in case else "float32") is None
    for path in sorted(tmp_path.iterdir()):
        launch = load_launch(path)
        commands = decode_stream(arch, launch.commands, launch.fresh_tensors())
        conflicted = [(cmd.index, name) for cmd in commands for name in _conflicts(arch, cmd)]
        assert conflicted == [], f"{launch.kernel}: {conflicted[:5]}"


def test_padding_is_exact_against_numpy_on_a_conv_whose_tiles_are_padded():
    """int8 NCHW conv2d on cgra-8x8 whose A rows (tk = 64 int8) and output rows (tn = 16 int32)
    are both a bank period long: the padded kernel is bit for bit numpy."""
    arch = ARCHS["cgra-8x8"]
    mod, inputs, ref = conv2d_model(2, 64, 10, 10, 16, 3, 3, (1, 1), (1, 1, 1, 1), "int8", relu=True)
    out = run(npu_backend.compile(mod, arch), inputs)
    np.testing.assert_array_equal(out, ref)
