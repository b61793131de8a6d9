"""Schedules: tile a GEMM-shaped kernel for the scratchpad and tensorize it onto the NPU.

Stage: schedule and tensorize. Input: the PrimFunc of `kernels.py` (blocks a_pad, b_pad,
bias_pad, acc, epi, out), its `KernelSpec` and `Tiling`, and the hardware description. Output:
the scheduled PrimFunc, in which

- the output is computed tile by tile (tm x tn), anchored on the epilogue's tile loops;
- operand tiles (a_pad, b_pad) and the bias live in the scratchpad and are loaded per reduction
  step, the residual tile (res_pad) once per output tile: these copies become DMA (`dma.py`);
- the accumulator's init is one FILL per tile, each reduction step one GEMM over the tile (the
  PE array runs its folds), and the epilogue (bias, residual, relu, clip) one vector-unit
  intrinsic per tile;
- the store of the valid region of each tile goes back to the host by DMA;
- A's rows, and the output tile's rows when the store reads one element per row (NCHW), are
  padded with `storage_align` so that the scratchpad banks serve them without conflicts (the
  stride comes from `spad_layout.py`; allocation, DMA boxes and intrinsic strides follow it).

A user may register their own schedule for a kernel kind with `register_schedule` (the seeds ask
for exactly this: attach a hand-written schedule to a graph-level operator).
"""

from __future__ import annotations

from typing import Callable

from tvm import s_tir

from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from .eltwise_kernel import schedule_eltwise
from .errors import ScheduleError
from .intrinsics import SPAD, get_intrin
from .kernels import KernelSpec
from .spad_layout import (a_row_stride, out_row_stride, storage_align_args, store_walks_rows,
                          window_pixel_stride)
from .tiling import Tiling

ScheduleFn = Callable[[s_tir.Schedule, KernelSpec, Tiling, HardwareDescription], None]

_SCHEDULES: dict[str, ScheduleFn] = {}


def register_schedule(op: str, fn: ScheduleFn | None = None):
    """Use `fn(sch, spec, tiling, arch)` to schedule every `op` kernel (usable as a decorator)."""
    def register(fn):
        _SCHEDULES[op] = fn
        return fn
    return register(fn) if fn is not None else register


def schedule_kernel(func, spec: KernelSpec, tiling: Tiling, arch: HardwareDescription):
    sch = s_tir.Schedule(func)
    try:
        _SCHEDULES[spec.op](sch, spec, tiling, arch)
    except s_tir.ScheduleError as err:
        raise ScheduleError(f"scheduling the {spec.op} kernel failed: {err}") from err
    return sch.mod["main"]


def _tile_output(sch, spec: KernelSpec, tiling: Tiling):
    """Tile the epilogue's (row, col) loops and pull acc, bias and the store under them."""
    epi = sch.get_sblock("epi")
    *batch_loops, row, col = sch.get_loops(epi)
    row_outer, row_inner = sch.split(row, [None, tiling.tm])
    col_outer, col_inner = sch.split(col, [None, tiling.tn])
    sch.reorder(row_outer, col_outer, row_inner, col_inner)
    acc = sch.get_sblock("acc")
    sch.compute_at(acc, col_outer)
    for name in _channel_rows(spec):
        row = sch.get_sblock(name)
        sch.compute_at(row, col_outer)
        sch.set_scope(row, 0, SPAD)
    stage_residual(sch, spec, col_outer)
    sch.reverse_compute_at(sch.get_sblock("out"), col_outer)
    sch.set_scope(acc, 0, SPAD)
    sch.set_scope(epi, 0, SPAD)
    return acc, epi, row_inner, col_outer


def align_rows(sch, block, row: int, stride: int, dtype: str, arch: HardwareDescription) -> None:
    """Pad the rows (the second-to-last axis) of the scratchpad buffer `block` writes from
    `row` to `stride` elements (spad_layout.py chose the stride), with s_tir's storage_align:
    the allocation, DMA boxes and intrinsic strides all follow the buffer's strides."""
    args = storage_align_args(row, stride, DType.from_name(dtype).itemsize, arch)
    if args is None:
        return
    ndim = len(sch.get(block).writes[0].region)
    sch.storage_align(block, 0, ndim - 2, *args)


def align_output_rows(sch, spec: KernelSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """Pad the epilogue's output tile when its store reads one element per row (NCHW output):
    rows a multiple of the banks' period apart would put each DMA beat in one bank. Called
    after tensorize, which blockizes "epi" into "epi_o" and would drop an annotation made
    before: "epi_o" writes the tile then."""
    stride = out_row_stride(tiling.tn, DType.from_name(spec.acc_dtype).itemsize, store_walks_rows(spec), arch)
    epi = sch.get_sblock("epi_o")  # tensorize blockizes "epi" into "epi_o"
    align_rows(sch, epi, tiling.tn, stride, spec.acc_dtype, arch)


def stage_residual(sch, spec: KernelSpec, col_outer):
    """The residual tile (block res_pad, if the kernel has one) in the scratchpad, loaded by one
    DMA per output tile under `col_outer`. Its pixel loop is split into whole output rows like
    the operand gather's, so that the copy reads as a box (y, ox, channel) of the NCHW tensor."""
    if not spec.residual_shape:
        return
    res = sch.get_sblock("res_pad")
    sch.compute_at(res, col_outer)
    sch.set_scope(res, 0, SPAD)
    if spec.row_step > 1:
        sch.split(sch.get_loops(res)[-2], [None, spec.row_step])


def _channel_rows(spec: KernelSpec) -> tuple:
    """The blocks of the per-channel rows the epilogue reads (bias, requantisation scale)."""
    return (("bias_pad",) if spec.bias_shape else ()) + (("scale_pad",) if spec.scale_shape else ())


def epilogue_intrin(spec: KernelSpec, tiling: Tiling, rows: int | None = None) -> str:
    """The vector-unit intrinsic for a tile (`rows` x tiling.tn, rows tiling.tm by default) of
    this kernel's epilogue (for `sch.tensorize`): the requantising one for an int8 output."""
    rows = tiling.tm if rows is None else rows
    if spec.requant_zero_point is not None:
        return get_intrin("epilogue_requant", rows, tiling.tn, bool(spec.bias_shape), spec.relu,
                          spec.requant_zero_point)
    return get_intrin("epilogue", rows, tiling.tn, spec.acc_dtype, bool(spec.bias_shape),
                      spec.relu, bool(spec.residual_shape), spec.clip)


def _acc_loops(sch, acc, col_outer):
    """(row, col, reductions) of acc under the tile loop. compute_at drops unit-extent loops
    (a 1x1 kernel has no ry/rx loop), so they are found after the tile loop, not by count;
    the tiling keeps the row, column and depth extents above 1."""
    row, col, *reductions = _loops_after(sch, acc, col_outer)
    return row, col, reductions


def _tensorize_tile(sch, spec, tiling, arch, acc, epi, epi_row, col_tile):
    """Stage operand tiles per reduction step and tensorize the tile onto the NPU.

    One GEMM command covers a whole tm x tn x tk scratchpad tile: the PE array's sequencer runs
    its (tm / rows) x (tn / cols) folds back to back (the simulator times folds exactly as it
    would separate PE-sized passes), so the command stream stays short."""
    row, col, reductions = _acc_loops(sch, acc, col_tile)
    *outer_reductions, depth = reductions
    depth_outer, depth_inner = sch.split(depth, [None, tiling.tk])
    sch.reorder(*outer_reductions, depth_outer, row, col, depth_inner)
    for name in ("a_pad", "b_pad"):
        block = sch.get_sblock(name)
        sch.compute_at(block, depth_outer)
        sch.set_scope(block, 0, SPAD)
    # The PE array reads one element of each of A's rows a cycle: rows a multiple of the
    # banks' period apart would all sit in one bank.
    align_rows(sch, sch.get_sblock("a_pad"), tiling.tk,
               a_row_stride(tiling.tm, tiling.tk, DType.from_name(spec.dtype).itemsize, arch), spec.dtype, arch)
    if spec.row_step > 1:
        # The operand copy walks output pixels p = y * OW + ox; split p into (y, ox) so the
        # gather is a DMA box (the DMA pass simplifies p // OW, p % OW on these loop bounds).
        pixel_loop = sch.get_loops(sch.get_sblock("a_pad"))[-2]
        sch.split(pixel_loop, [None, spec.row_step])
    first_reduction = outer_reductions[0] if outer_reductions else depth_outer
    init = sch.decompose_reduction(acc, first_reduction)
    sch.tensorize(row, get_intrin("gemm", tiling.tm, tiling.tn, tiling.tk, spec.dtype, spec.acc_dtype))
    sch.tensorize(sch.get_loops(init)[-2], get_intrin("fill", tiling.tm, tiling.tn, spec.acc_dtype))
    sch.tensorize(epi_row, epilogue_intrin(spec, tiling))
    align_output_rows(sch, spec, tiling, arch)


@register_schedule("matmul")
@register_schedule("conv2d")
def schedule_gemm_like(sch, spec: KernelSpec, tiling: Tiling, arch: HardwareDescription):
    """Both kernels are GEMMs over (rows, cols, reductions...): one schedule serves both."""
    acc, epi, epi_row, col_tile = _tile_output(sch, spec, tiling)
    _tensorize_tile(sch, spec, tiling, arch, acc, epi, epi_row, col_tile)


@register_schedule("depthwise")
def schedule_depthwise(sch, spec: KernelSpec, tiling: Tiling, arch: HardwareDescription):
    """Tiles of `tm` output rows x `tn` channels (whole output rows); per tile the input window
    and the weights are loaded into the scratchpad, one DEPTHWISE computes the tile on the PE
    array and one EPILOGUE per output row applies bias, residual, relu and clip on the vector unit."""
    epi = sch.get_sblock("epi")
    _, rows, width, channels = sch.get_loops(epi)
    row_outer, row_inner = sch.split(rows, [None, tiling.tm])
    col_outer, col_inner = sch.split(channels, [None, tiling.tn])
    sch.reorder(row_outer, col_outer, row_inner, width, col_inner)
    staged = ("acc", "a_pad", "b_pad") + _channel_rows(spec) + \
        (("res_pad",) if spec.residual_shape else ())
    for name in staged:
        block = sch.get_sblock(name)
        sch.compute_at(block, col_outer)
        sch.set_scope(block, 0, SPAD)
    sch.reverse_compute_at(sch.get_sblock("out"), col_outer)
    sch.set_scope(epi, 0, SPAD)
    kh, kw = spec.rhs_shape[2:]
    window = (kh, kw, *spec.strides, *spec.dilation)
    tile_rows = _loops_after(sch, sch.get_sblock("acc"), col_outer)[0]
    out_width = sch.get_loops(epi)[-2]
    # A strided window's output pixels are `sw` input pixels apart: pad its pixels if the
    # DEPTHWISE's full-width beats would find them in the same banks.
    align_rows(sch, sch.get_sblock("a_pad"), tiling.tn, window_pixel_stride(
        tiling.tn, DType.from_name(spec.dtype).itemsize, spec.strides[1], sch.get(out_width).extent.value, arch),
        spec.dtype, arch)
    sch.tensorize(tile_rows, get_intrin("depthwise", tiling.tm, sch.get(out_width).extent.value, tiling.tn,
                                        window, spec.dtype, spec.acc_dtype))
    sch.tensorize(out_width, epilogue_intrin(spec, tiling, rows=sch.get(out_width).extent.value))
    align_output_rows(sch, spec, tiling, arch)


def _loops_after(sch, block, anchor):
    """The loops of `block` nested inside the loop `anchor`."""
    loops = sch.get_loops(block)
    start = [i for i, loop in enumerate(loops) if sch.get_sref(loop).same_as(sch.get_sref(anchor))][0]
    return loops[start + 1:]


register_schedule("eltwise", schedule_eltwise)
