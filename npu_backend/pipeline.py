"""The compile flow, in order: the graph stages, each kernel's stages, the lowering passes.

Stage: all of them; this file is their map and holds no stage's body (each lives in its stage's
folder, named on its line). `tvm.compile(mod, target="cgra")`, `npu_backend.compile`, `explain`
and the CLI run these same lists (target/relax_pipeline.py runs the graph stages, then TVM's CPU
pipeline for what stays on the host). Every stage is `(ir, arch, options) -> ir`: the graph
stages take and give a Relax IRModule, a kernel's stages a `Kernel` (kernels/stage.py: one
offloaded function on its way to plain TIR). With `CompileOptions.dump_dir` each stage's output
is written under its name: the graph's as `<n>_<stage>.py`, a kernel's as
`kernels/<symbol>/<n>_<stage>.py` (codegen adds the LLVM IR, target/relax_ext.py).
"""

from __future__ import annotations

from tvm import s_tir, tirx

from .kernels.common.dynamic import rebind_dimensions
from .kernels.stage import choose_tiling, define, schedule
from .lower.dma import lower_copies_to_dma
from .lower.double_buffer import double_buffer
from .lower.late_residual import late_residuals
from .lower.operands_first import operands_first
from .lower.held_halos import hold_halos
from .lower.gemm_rows import split_gemm_rows
from .lower.norm_rows import norm_in_rows
from .lower.hoist_allocs import hoist_allocations
from .lower.held_tables import hold_tables
from .lower.stream_panel import stream_panels
from .lower.piece_major import piece_major_tails
from .lower.fold_init import fold_accumulator_init
from .lower.bias_accumulator import accumulate_bias
from .lower.padded_rows import cut_padded_rows
from .lower.ragged import cut_ragged_tiles
from .lower.rope_skips import skip_pass_through
from .lower.skew_panels import skew_panels
from .lower.stage import func_pass, lower
from .lower.trim_fills import trim_overwritten_fills
from .normalise.stage import normalise
from .partition.stage import partition
from .target.stage import codegen

# ------------------------------------------------------------------ the graph: Relax in, Relax out

STAGES = [
    # The model's idioms in the forms the kernels match: QDQ layers as integer arithmetic, batch
    # norms and weight arithmetic folded with numpy, ONNX Clip as R.clip, transposed, 1-d and 3-d
    # convolutions as conv2d's, large pools split, a transformer's hand-written norms, GELUs and
    # safe softmaxes as one op each (normalise/stage.py: normalise_passes).
    ("normalise", normalise),
    # Every subgraph an op family's pattern matches and the chip can run becomes an offloaded
    # function; so does a user's PrimFunc called with R.call_tir that compiles through
    # KERNEL_STAGES; each names its model nodes (partition/stage.py).
    ("partition", lambda mod, arch, options: partition(mod, arch, options, KERNEL_STAGES)),
    # Each offloaded function compiled for the NPU (relax.ext.cgra: KERNEL_STAGES, then LLVM IR)
    # and called as a kernel; weights and host copies go to the runtime (target/stage.py).
    ("codegen", codegen),
]

# ------------------------------------------------------------------ one kernel: Kernel in, Kernel out

KERNEL_STAGES = [
    # Cut the kernel to the PE array and the scratchpad: tile sizes from its family's search.
    ("tiling", choose_tiling),
    # The kernel as schedulable TensorIR over padded tile grids (its family's compute), or the
    # kernel a user wrote for the pattern (register_kernel), checked against it.
    ("s_tir", define),
    # Tiles in the scratchpad, tensorized onto the PE array and the vector unit: the built-in
    # schedule, or the one a user registered for the pattern or the op (register_schedule).
    ("scheduled", schedule),
    # Plain TIR: copies become DMA, buffers are flattened; what the code generator walks
    # (lower/stage.py; the three above: kernels/stage.py, whose run_kernel_stages runs the list).
    ("lowered", lambda kernel, arch, options: lower(kernel, lowering_passes())),
]

# ------------------------------------------------------------------ lowering: s_tir in, plain TIR out


def lowering_passes() -> list:
    """Scheduled s_tir -> the plain TIR the code generator walks (loops, scratchpad allocations,
    `cgra_*` device calls, address arithmetic); each line says why the pass is there."""
    return [
        s_tir.transform.LowerInitBlock(),  # reduction inits are already FILLs; lower leftovers
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),  # allocate tiles inside their loops
        s_tir.transform.ConvertBlocksToOpaque(),  # block iter vars -> loop expressions
        s_tir.transform.CompactBufferAllocation(),  # scratchpad buffers shrink to one tile
        s_tir.transform.LowerMatchBuffer(),  # intrinsic operands -> base + elem_offset
        s_tir.transform.LowerOpaqueBlock(),  # blocks -> loops, predicates -> if
        # Host <-> scratchpad copies -> DMA boxes. Before any simplifier: it needs N-d buffers
        # and the guards as written (a simplifier may rewrite "2*ox + rx < 12" as "ox < 6",
        # which is equivalent on the loop's range but no longer reads as an in-bounds test).
        func_pass(lower_copies_to_dma, "cgra.LowerCopiesToDMA"),
        # The accumulator's zero-fill becomes the first reduction step's overwriting GEMM.
        func_pass(fold_accumulator_init, "cgra.FoldAccumulatorInit"),
        # A bias before a VFUNC starts the accumulator (DMA), not an EPILOGUE's pass over the tile.
        func_pass(accumulate_bias, "cgra.AccumulateBias"),
        # A FILL the EPILOGUE after it partly overwrites (a window's padding) fills only the rest.
        func_pass(trim_overwritten_fills, "cgra.TrimOverwrittenFills"),
        # The last tile of a symbolic axis moves and computes only the rows that exist.
        func_pass(cut_ragged_tiles, "cgra.CutRaggedTiles"),
        # A row panel streamed a step at a time by the first column tile, held by the others.
        func_pass(stream_panels, "cgra.StreamPanels"),
        # RoPE's compact tables: a slice loaded by each column tile of the first period, held by the rest.
        func_pass(hold_tables, "cgra.HoldTables"),
        # An output tile's epilogue pieces: one buffer each, allocated with the tile's.
        func_pass(hoist_allocations, "cgra.HoistAllocations"),
        # Such a tile's GEMMs in the same pieces of rows, so its first EPILOGUE starts early.
        func_pass(split_gemm_rows, "cgra.SplitGemmRows"),
        # Two copies of each scratchpad tile reused by a loop (three where a loop asks), so DMA overlaps compute.
        func_pass(double_buffer, "cgra.DoubleBuffer"),
        # A post-norm tile's last reduction steps piece by piece, so each piece's norm starts early.
        func_pass(piece_major_tails, "cgra.PieceMajorTails"),
        # A tile's residual loads, and its epilogue runs, in the next tile, where the load engine has room.
        func_pass(late_residuals, "cgra.LateResiduals"),
        # The loads a tile's GEMM reads ahead of those only its epilogue reads (RoPE's tables).
        func_pass(operands_first, "cgra.OperandsFirst"),
        # A padded window's halo loaded once per buffer copy; later tiles load only its inside.
        func_pass(hold_halos, "cgra.HoldHalos"),
        s_tir.transform.StmtSimplify(),  # fold the index arithmetic of the remaining calls
        tirx.transform.FlattenBuffer(),  # N-d buffers -> 1-d, for the code generator
        tirx.transform.StmtSimplify(),
        tirx.transform.RemoveNoOp(),
        # An intrinsic's copy of a symbolic dimension (tensorize copies implementations): bound.
        func_pass(rebind_dimensions, "cgra.RebindDimensions"),
        # A static matmul's padded rows (17 tokens in a tile of 24): its epilogue skips them.
        func_pass(cut_padded_rows, "cgra.CutPaddedRows"),
        # RoPE's column tiles whose tables are ones and zeros: no rotation, no tables, x stored.
        func_pass(skip_pass_through, "cgra.SkipPassThrough"),
        # A pre-norm's A panel loaded and normalised a few rows at a time, the first GEMM earlier.
        func_pass(norm_in_rows, "cgra.NormInRows"),
        # With several row tiles, tile t + 1's panel program issued before tile t's GEMMs.
        func_pass(skew_panels, "cgra.SkewPanels"),
    ]
