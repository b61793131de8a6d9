"""Scratchpad row strides that the banks can serve: how far to pad a tile's rows.

Stage: schedule (the schedules call `align_rows` before tensorize; the tile searches budget the
padding). In: a tile's row length in elements, its itemsize, how it is read, and the hardware
description. Out: the padded row stride (elements), and the s_tir `storage_align` that gives it
((factor, offset) with stride % factor == offset).

Why: the scratchpad is `spad_banks` (N) banks of `bank_width_bytes` (W), word-interleaved
(docs/simulator.md, "Scratchpad banks"). A compact tile whose row size is a multiple of N * W
puts the first element of every row in one bank, and two readers take one element per row:
- the PE array reads a column of A, one element of each of min(tm, rows) rows a cycle;
- the store of an NCHW output walks pixels innermost, so each DMA beat reads one element of
  several rows of the epilogue's output tile.
Padding each row by a word spreads the rows over the banks. The stride is chosen with the
simulator's own bank rule (`cgra_sim.banks`), so compiler and model agree; and because the rule
depends only on the stride modulo N * W, `factor` = N * W in elements expresses it exactly.
"""

from __future__ import annotations

import functools
from fractions import Fraction

from cgra_sim.arch import HardwareDescription
from cgra_sim.banks import beat_slowdown, operand_slowdown
from cgra_sim.isa import DType


def _period(arch: HardwareDescription, itemsize: int) -> int | None:
    """N * W in elements: the stride residue the banks see; None if an element straddles it."""
    period = arch.spad_banks * arch.bank_width_bytes
    return period // itemsize if period % itemsize == 0 else None


def operand_rows_conflict_free(stride: int, itemsize: int, lanes: int, arch: HardwareDescription) -> bool:
    """Whether the PE array streams `lanes` rows `stride` elements apart at full speed."""
    return operand_slowdown(lanes, stride * itemsize, 0, itemsize, arch.spad_banks,
                            arch.bank_width_bytes) == 1


def beat_rows_conflict_free(stride: int, itemsize: int, rows: int, arch: HardwareDescription) -> bool:
    """Whether a DMA beat reading one element of each of up to `rows` rows, `stride` elements
    apart, takes no more cycles than the scratchpad's bandwidth demands."""
    beat, width = arch.dma_bytes_per_cycle, arch.spad_banks * arch.bank_width_bytes
    slowdown = beat_slowdown(beat, (rows,), (stride * itemsize,), itemsize, 0, arch.spad_banks,
                             arch.bank_width_bytes)
    return slowdown <= max(Fraction(1), Fraction(beat, width))


def padded_row_stride(row: int, itemsize: int, arch: HardwareDescription, conflict_free) -> int:
    """The smallest stride >= `row` (elements) for which `conflict_free(stride)` holds; `row`
    itself when no stride within one bank period does (padding could not help)."""
    period = _period(arch, itemsize)
    if period is None:
        return row
    for stride in range(row, row + period):
        if conflict_free(stride):
            return stride
    return row


# The tile searches ask for the same strides thousands of times (DenseNet-121: 0.4 s); each
# answer depends only on these arguments.
@functools.lru_cache(maxsize=8192)
def operand_row_stride(row: int, itemsize: int, lanes: int, arch: HardwareDescription) -> int:
    """Row stride (elements) of a GEMM's A tile of `row`-element rows read `lanes` rows at once."""
    return padded_row_stride(row, itemsize, arch,
                             lambda s: operand_rows_conflict_free(s, itemsize, lanes, arch))


def beat_rows_slowdown(stride: int, itemsize: int, rows: int, arch: HardwareDescription) -> Fraction:
    """How much slower than one beat a cycle a DMA beat reading one element of each of up to
    `rows` rows, `stride` elements apart, runs (>= 1; 1 when the scratchpad's bandwidth allows)."""
    slowdown = beat_slowdown(arch.dma_bytes_per_cycle, (rows,), (stride * itemsize,), itemsize, 0,
                             arch.spad_banks, arch.bank_width_bytes)
    return slowdown / max(Fraction(1), Fraction(arch.dma_bytes_per_cycle, arch.spad_banks * arch.bank_width_bytes))


@functools.lru_cache(maxsize=8192)
def store_row_stride(row: int, itemsize: int, rows: int, arch: HardwareDescription) -> int:
    """Row stride (elements) of an output tile whose store reads one element per row: the
    smallest with the least slowdown within one bank period. Conflict-free when some stride
    is; an int8 tile never is when a beat reads more rows than there are banks (16 one-byte
    rows over 8 banks: 2 words a bank at best), and then the least conflicted stride (rows a
    word apart) still halves or quarters its store against the compact tile's one bank."""
    period = _period(arch, itemsize)
    if period is None:
        return row
    return min(range(row, row + period), key=lambda s: (beat_rows_slowdown(s, itemsize, rows, arch), s))


def storage_align_args(row: int, stride: int, itemsize: int, arch: HardwareDescription):
    """(factor, offset) for `sch.storage_align` turning a `row`-element row into `stride`
    elements, or None when no padding is needed."""
    period = _period(arch, itemsize)
    if stride == row or period is None:
        return None
    return period, stride % period


def a_row_stride(tm: int, tk: int, itemsize: int, arch: HardwareDescription) -> int:
    """Row stride (elements) of a GEMM's tm x tk A tile: the PE array reads min(tm, rows) of
    its rows at once."""
    return operand_row_stride(tk, itemsize, min(tm, arch.rows), arch)


def store_walks_rows(spec) -> int:
    """How many rows of the output tile one store beat can walk (output pixels, for a conv2d
    or depthwise kernel whose output layout keeps pixels innermost, e.g. NCHW), or 0 when the
    store reads whole rows of the tile (matmul, channels-last outputs): no padding then."""
    if spec.op in ("conv2d", "depthwise") and spec.out_layout[-1] == "W":
        # Pixels in a row (in a column for a symbolic width: kernels/gemm/gemm.py's store walks
        # columns then; in a block's row when height and width are) are consecutive tile rows.
        # One output row in the "xy" order (a conv1d, one pixel high): the store walks x, which
        # is the tile's consecutive rows then (gemm._tile_output reorders only taller outputs).
        order, (_, _, height, width) = spec.pixel_order, spec.output_shape
        return spec.row_step if order == "blocks" else height if order == "xy" and height > 1 else width
    return 0


def out_row_stride(tn: int, itemsize: int, store_rows: int, arch: HardwareDescription) -> int:
    """Row stride (elements) of the epilogue's output tile of tn-element rows."""
    return store_row_stride(tn, itemsize, store_rows, arch) if store_rows else tn


def window_pixel_stride(tn: int, itemsize: int, step: int, ow: int, arch: HardwareDescription) -> int:
    """Pixel stride (elements) of a depthwise input window of `tn` channels: DEPTHWISE streams
    the window at the scratchpad's full width, output pixels `step` (the conv's x stride) input
    pixels apart, so a strided conv can put one beat's pixels in the same banks."""
    beat, size = arch.spad_banks * arch.bank_width_bytes, itemsize

    def conflict_free(stride):
        return beat_slowdown(beat, (ow, tn), (step * stride * size, size), size, 0, arch.spad_banks,
                             arch.bank_width_bytes) == 1
    return padded_row_stride(tn, itemsize, arch, conflict_free)


def align_rows(sch, block, row: int, stride: int, dtype: str, arch: HardwareDescription) -> None:
    """Pad the rows (the second-to-last axis) of the scratchpad buffer `block` writes from `row`
    to `stride` elements with s_tir's storage_align: the allocation, DMA boxes and intrinsic
    strides all follow the buffer's strides."""
    args = storage_align_args(row, stride, DType.from_name(dtype).itemsize, arch)
    if args is None:
        return
    ndim = len(sch.get(block).writes[0].region)
    sch.storage_align(block, 0, ndim - 2, *args)


def align_output_rows(sch, spec, tiling, arch: HardwareDescription) -> None:
    """Pad the epilogue's output tile when its store reads one element per row (NCHW output):
    rows a multiple of the banks' period apart would put each DMA beat in one bank. Called
    after tensorize, which blockizes "epi" into "epi_o" and would drop an annotation made
    before: "epi_o" writes the tile then."""
    block = sch.get_sblock("epi_o")
    dtype = str(sch.get(block).writes[0].source.dtype)  # int8 when the epilogue requantises
    stride = out_row_stride(tiling.tn, DType.from_name(dtype).itemsize, store_walks_rows(spec), arch)
    align_rows(sch, block, tiling.tn, stride, dtype, arch)
