"""The schedule every GEMM-shaped kernel shares (matmul.py, conv2d.py), for the tiling gemm.py chose.

Stage: schedule. `schedule_gemm` computes the output tile by tile (tm x tn, anchored on the
epilogue's tile loops), loads operand tiles (a_pad, b_pad) and the bias into the scratchpad per
reduction step and the residual tile once per output tile (these copies become DMA, see
lower/dma.py; a static matmul whose reduction is one step loads A's row panel once per row tile,
before its column tiles, which all read it: holds_a_panel), runs each reduction step as one GEMM
over the tile (the PE array runs its folds), the accumulator's init as one FILL and the epilogue
as one EPILOGUE per tile, and stores the valid region of each tile by DMA. A tile finished in
pieces of rows (`Tiling.epilogue_rows`) gets an EPILOGUE and a store per piece, each piece its own
buffer (lower/hoist_allocs.py), its GEMMs in the same pieces (lower/gemm_rows.py), so that piece
i's EPILOGUE runs on the vector unit while piece i - 1 is stored; A's panel streamed in the first
column tile is lower/stream_panel.py's. A's rows, and the output tile's rows when the store reads
one element per row (NCHW), are padded with `storage_align` so the banks serve them without
conflicts (spad_layout.py). A normed linear's row norm (row_norm.py) and RoPE's tables
(rope_epilogue.py) are staged and tensorized here too.
"""

from __future__ import annotations

from tvm.s_tir.schedule.schedule import ScheduleError

from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ..common.dynamic import TILE_OF
from ..common.spad_layout import a_row_stride, align_output_rows, align_rows
from ..common.spec import GEMM_ROWS, HOIST_ALLOCS, PIECE_MAJOR, STREAM_PANEL, KernelSpec, Tiling
from ..intrinsics import SPAD, get_intrin
from .bias_acc import annotate_tile
from .channel_rows import channel_rows
from .epilogue import epilogue_intrin
from .gemm_copies import annotate_copies
from .gemm_estimate import holds_a_panel
from .gemm_pieces import epilogue_piece_rows
from .post_norm import holds_b, stage_post_norm, summed_spec, tensorize_post_norm
from .post_norm_tail import tail_steps
from .rope_epilogue import hold_rope_tables, mark_rotating_tiles, stage_rope_blocks, tensorize_rope_blocks
from .half_row_norm import lhs_dtype
from .row_norm import place_row_norm, tensorize_row_norm


def schedule_gemm(sch, spec: KernelSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """Tile, stage and tensorize a GEMM-shaped kernel (matmul, conv2d: rows, cols, reductions...)."""
    acc, epi_row, col_tile = _tile_output(sch, spec, tiling)
    tensorize_tile(sch, spec, tiling, arch, acc, epi_row, col_tile)


def _tile_output(sch, spec: KernelSpec, tiling: Tiling):
    """Tile the epilogue's (row, col) loops, output rows outer, and pull acc, the channel rows,
    the residual and the store under them. Returns (acc, the epilogue's row loop in the tile,
    the tile loop)."""
    if spec.pixel_order == "blocks":
        return _tile_output_blocks(sch, spec, tiling)
    *_, row, col = sch.get_loops(sch.get_sblock("epi"))
    row_outer, row_inner = sch.split(row, [None, tiling.tm])
    col_outer, col_inner = sch.split(col, [None, tiling.tn // 2 if spec.gated else tiling.tn])
    sch.reorder(row_outer, col_outer, row_inner, col_inner)
    acc = stage_output_tile(sch, spec, col_outer)
    if spec.pixel_order == "xy" and spec.output_shape[2] > 1 and not (spec.patch_channels and spec.out_layout == "NHWC"):
        # Tile rows run down output columns: the store walks them (y) innermost, so that a DMA
        # beat reads consecutive rows of the tile as it does for rows along x (spad_layout.py).
        # (One output row: nothing to walk, and its unit loop may not be where reorder wants it.)
        *_, y, x = sch.get_loops(sch.get_sblock("out"))
        sch.reorder(x, y)
    if spec.op == "conv2d" and spec.out_layout.endswith("C") and spec.groups == 1 and not spec.patch_channels:
        # A channels-last output (nhwc_convs.py): its channels are the contiguous run in DRAM and
        # in the tile's rows, so the store walks them innermost; walked outermost, each beat read
        # elements a tile row apart from one scratchpad bank (ConvNeXt's 2 x 2 downsampling conv
        # on cgra-8x8 stored 8 KiB in 2,048 cycles instead of 512).
        # (Loops that form no chain keep their order; patchify.py orders its own NHWC store.)
        *_, f, y, x = sch.get_loops(sch.get_sblock("out"))
        try:
            sch.reorder(y, x, f) if spec.pixel_order != "xy" else sch.reorder(x, y, f)
        except ScheduleError:
            pass
    return acc, row_inner, col_outer


def _tile_output_blocks(sch, spec: KernelSpec, tiling: Tiling):
    """`_tile_output` for a conv2d in blocks of rows and columns (height and width symbolic,
    conv2d._blocks_compute): the store is the anchor, its (y, x) loops split into blocks and
    its channels into tiles, the epilogue's tile computed under them (TVM cannot infer which
    pixels of the image a block of GEMM rows holds the other way round)."""
    out = sch.get_sblock("out")
    _, f, y, x = sch.get_loops(out)
    block_y, y_in = sch.split(y, [None, tiling.tm // spec.row_step])
    block_x, x_in = sch.split(x, [None, spec.row_step])
    col_outer, col_inner = sch.split(f, [None, tiling.tn])
    sch.reorder(block_y, block_x, col_outer, col_inner, y_in, x_in)
    # The tile loops say what they tile (TVM may fold an output extent's division into the
    # loop's: ceildiv((h - 1) // 2 + 1, 8) reads (h - 1) // 16 + 1), so that lowering can cut
    # their last tiles (lower/ragged.py).
    sch.annotate(block_y, TILE_OF, ["out", 2, tiling.tm // spec.row_step])
    sch.annotate(block_x, TILE_OF, ["out", 3, spec.row_step])
    epi = sch.get_sblock("epi")
    sch.compute_at(epi, col_outer)
    acc = stage_output_tile(sch, spec, col_outer, store=False)
    *_, row_inner, _ = sch.get_loops(epi)
    return acc, row_inner, col_outer


def stage_output_tile(sch, spec: KernelSpec, tile_loop, store: bool = True):
    """Everything one output tile needs, under `tile_loop` (the innermost loop over output
    tiles): the accumulator, the per-channel rows (bias, scale), the residual tile, the store
    (unless `store` is False: the store is already there); the accumulator and the epilogue's
    output in the scratchpad. Returns the acc block."""
    acc, epi = sch.get_sblock("acc"), sch.get_sblock("epi")
    if spec.op == "matmul" and spec.rope_pattern:  # rope_epilogue.py's blocks, acc's readers
        stage_rope_blocks(sch, spec, tile_loop)
    if spec.post_norm:  # post_norm.py's sum and program, acc's readers
        stage_post_norm(sch, spec, tile_loop)
    sch.compute_at(acc, tile_loop)
    for name in channel_rows(spec):
        block = sch.get_sblock(name)
        sch.compute_at(block, tile_loop)
        sch.set_scope(block, 0, SPAD)
    stage_residual(sch, spec, tile_loop)
    if spec.multiplier_shape:  # one more output-sized tile, loaded like the residual
        block = sch.get_sblock("mul_pad")
        sch.compute_at(block, tile_loop)
        sch.set_scope(block, 0, SPAD)
    if store:
        sch.reverse_compute_at(sch.get_sblock("out"), tile_loop)
    sch.set_scope(acc, 0, SPAD)
    sch.set_scope(epi, 0, SPAD)
    return acc


def stage_residual(sch, spec: KernelSpec, col_outer) -> None:
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


def tensorize_tile(sch, spec: KernelSpec, tiling: Tiling, arch: HardwareDescription, acc, epi_row, col_tile):
    """Stage operand tiles per reduction step and tensorize the tile onto the NPU.

    One GEMM command covers a whole tm x tn x tk scratchpad tile: the PE array's sequencer runs
    its (tm / rows) x (tn / cols) folds back to back (the simulator times folds exactly as it
    would separate PE-sized passes), so the command stream stays short. compute_at drops
    unit-extent loops (a 1x1 kernel has no ry/rx loop), so acc's loops are found after the tile
    loop, not by count; the tiling keeps the row, column and depth extents above 1."""
    row, col, *reductions = loops_after(sch, acc, col_tile)
    *outer_reductions, depth = reductions
    depth_outer, depth_inner = sch.split(depth, [None, tiling.tk])
    sch.reorder(*outer_reductions, depth_outer, row, col, depth_inner)
    # With the whole reduction in one step the A tile is the same for every column tile of a
    # row tile: it is loaded once per row tile (before the column loop), not per tile.
    a_at = _enclosing_loop(sch, acc, col_tile) if holds_a_panel(spec, tiling) else depth_outer
    if tiling.stream_panel:  # loaded a step at a time by the first column tile (lower/stream_panel.py)
        sch.annotate(depth_outer, STREAM_PANEL, 1)
    if tiling.bias_in_acc:  # the bias in the accumulator, with the operand tiles' copies (bias_acc.py)
        annotate_tile(sch, tiling, col_tile)
    else:
        annotate_copies(sch, tiling, col_tile)
    place_row_norm(sch, spec, a_at)  # a pre-norm's program on the panel (row_norm.py)
    for name, at in (("a_pad", a_at), ("b_pad", depth_outer)):
        block = sch.get_sblock(name)
        if not (name == "b_pad" and holds_b(spec, tiling)):  # (held: loaded once, outside the tiles)
            sch.compute_at(block, at)
        sch.set_scope(block, 0, SPAD)
    # The PE array reads one element of each of A's rows a cycle: rows a multiple of the
    # banks' period apart would all sit in one bank.
    a_row = a_row_stride(tiling.tm, tiling.tk, DType.from_name(spec.dtype).itemsize, arch)
    a_dtype = lhs_dtype(spec)  # float32 rows a 16-bit norm's panel rounds (half_row_norm.py)
    align_rows(sch, sch.get_sblock("a_pad"), tiling.tk, a_row if a_dtype == spec.dtype else a_row_stride(
        tiling.tm, tiling.tk, DType.from_name(a_dtype).itemsize, arch), a_dtype, arch)
    tensorize_row_norm(sch, spec, tiling, lambda block: align_rows(sch, block, tiling.tk, a_row, spec.dtype, arch))
    if spec.row_step > 1:
        # The operand copy walks output pixels p = y * OW + ox; split p into (y, ox) so the
        # gather is a DMA box (the DMA pass simplifies p // OW, p % OW on these loop bounds).
        pixel_loop = sch.get_loops(sch.get_sblock("a_pad"))[-2]
        sch.split(pixel_loop, [None, spec.row_step])
    if spec.patch_channels:  # a patch's depth (kernel column, channel): a box loop each
        for name in ("a_pad", "b_pad"):
            sch.split(sch.get_loops(sch.get_sblock(name))[-1 if name == "a_pad" else -2], [None, spec.patch_channels])
    first_reduction = outer_reductions[0] if outer_reductions else depth_outer
    init = sch.decompose_reduction(acc, first_reduction)
    sch.tensorize(row, get_intrin("gemm", tiling.tm, tiling.tn, tiling.tk, spec.dtype, spec.acc_dtype))
    sch.tensorize(sch.get_loops(init)[-2], get_intrin("fill", tiling.tm, tiling.tn, spec.acc_dtype))
    if spec.op == "matmul" and spec.rope_pattern:
        tensorize_rope_blocks(sch, spec, tiling)
        hold_rope_tables(sch, tiling, col_tile)  # compact tables: loaded in the first period only
        mark_rotating_tiles(sch, spec, tiling, col_tile)  # tiles that rotate nothing skip it (lower/rope_skips.py)
    piece = epilogue_piece_rows(tiling)
    if piece < tiling.tm:  # the epilogue and the store in pieces of rows (epilogue_piece_rows)
        piece_loop, epi_row = sch.split(epi_row, [None, piece])
        sch.annotate(piece_loop, HOIST_ALLOCS, 1)
        sch.annotate(col_tile, GEMM_ROWS, piece)  # its GEMMs in the same pieces (lower/gemm_rows.py)
        if tail_steps(spec, tiling, arch):  # a post-norm's last steps piece by piece (lower/piece_major.py)
            sch.annotate(depth_outer, PIECE_MAJOR, tail_steps(spec, tiling, arch))
        sch.reverse_compute_at(sch.get_sblock("out"), piece_loop)
    if spec.post_norm:  # the sum and the norm a piece at a time (post_norm.py)
        tensorize_post_norm(sch, spec, piece, piece_loop if piece < tiling.tm else None,
                            epilogue_intrin(summed_spec(spec), tiling, rows=piece))
    sch.tensorize(epi_row, epilogue_intrin(spec, tiling, rows=piece))
    if not spec.gated:  # (a matmul's store walks no rows: nothing to align)
        align_output_rows(sch, spec, tiling, arch)


def loops_after(sch, block, anchor) -> list:
    """The loops of `block` nested inside the loop `anchor`."""
    loops = sch.get_loops(block)
    start = [i for i, loop in enumerate(loops) if sch.get_sref(loop).same_as(sch.get_sref(anchor))][0]
    return loops[start + 1:]


def _enclosing_loop(sch, block, loop):
    """The loop of `block` directly outside `loop`."""
    loops = sch.get_loops(block)
    at = [i for i, each in enumerate(loops) if sch.get_sref(each).same_as(sch.get_sref(loop))][0]
    return loops[at - 1]
