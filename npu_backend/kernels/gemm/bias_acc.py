"""A linear's bias loaded into its accumulator, so that the activation reads the GEMM's sum.

Stage: tiling (`accumulates_bias`, which sets Tiling.bias_in_acc) and schedule (`annotate_tile`,
which asks lowering for the rewrite: lower/bias_accumulator.py). A linear with a bias and an
activation the vector unit runs as one VFUNC (GELU's erf and tanh forms, tanh, and on a chip whose
function unit has it SiLU or sigmoid: epilogue_tail.act_on_vector) finishes each output tile as

    GEMM acc = A @ B;  EPILOGUE out = acc + bias;  VFUNC out = act(out)

and on cgra-8x8 the VFUNC takes the function unit's one lane an element a cycle: the vector unit,
not the PE array, bounds the kernel (GPT-NeoX's and Bloom's normed GELU up-projections: 5,240 and
10,984 vector-busy cycles a layer against 4,280 and 8,600 on the PE array), and the EPILOGUE's
pass over the tile (an eighth of a cycle an element) is on that bound. Loaded by the DMA engine
into the accumulator, the bias row broadcast down the tile's rows (a box loop of tensor step 0),
it is the GEMM's starting value:

    DMA_LOAD acc = bias (each row);  GEMM acc += A @ B;  VFUNC out = act(acc)

The same bits: the simulator's accumulating float32 GEMM is (A @ B) + acc, one rounded add, and
the EPILOGUE's acc + bias[j] is that add with its operands swapped (IEEE addition commutes). The
load engine streams the tile's rows of bias (a quarter of a cycle an element on cgra-8x8 against
the VFUNC's one) and the accumulator stays live until the VFUNC has read it, so it takes a third
copy (two would make tile t + 1's load wait for tile t - 1's VFUNC); taken only where that copy
fits the scratchpad.
"""

from __future__ import annotations

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ..common.spad_layout import a_row_stride
from ..common.spec import BIAS_IN_ACC, BUFFER_COPIES, KernelSpec, Tiling, aligned
from ..intrinsics.epilogue_tail import VFUNC_ACTS
from .gemm_estimate import gemm_footprint, holds_a_panel
from .row_norm import panel_bytes

#: Copies of the accumulator tile (the VFUNC reads it: tile t + 1's bias load waits for tile
#: t - 2's VFUNC, not t - 1's) and of B's tile (the bias load queues behind B's on the load
#: engine: B's of tile t + 2, waiting for tile t's GEMM, made every other GEMM wait 16 cycles
#: and pay its fill on cgra-8x8, 12,024 -> 11,326 cycles for Bloom's up-projection without it)
ACC_COPIES = 3


def accumulates_bias(spec: KernelSpec, tiling: Tiling, arch: HardwareDescription) -> bool:
    """Whether the kernel's bias goes into its accumulator (module doc): a static float32 2-D
    matmul, its reduction one step, finished whole tiles at a time, whose epilogue is the bias and
    then a VFUNC (nothing else added, clipped, scaled or multiplied), where that pays and the
    accumulator's third copy fits."""
    vfunc = spec.act in VFUNC_ACTS or (spec.act is not None and tiling.act_on_vector)
    plain = spec.op == "matmul" and spec.compute_name == "matmul" and spec.dtype == "float32" and \
        spec.acc_dtype == "float32" and spec.out_dtype == "float32" and not spec.symbols and spec.batch <= 1
    epilogue = bool(spec.bias_shape) and vfunc and not (
        spec.relu or spec.clip or spec.residual_shape or spec.multiplier_shape or spec.channel_scale_shape
        or spec.gated or spec.rope_pattern or spec.post_norm or spec.fabric_body or spec.scale_shape
        or spec.half_out or spec.half_via or spec.requant_zero_point is not None)
    # One reduction step: with more, the bias would enter the first step's sum, not the last (a
    # different rounding; and BERT's streamed GELU up-projection gained 58 of 5,698 cycles).
    tiles = tiling.tk == tiling.kp and not tiling.stream_panel and not 0 < tiling.epilogue_rows < tiling.tm
    return plain and epilogue and tiles and _pays(spec, tiling, arch) and _fits(spec, tiling, arch)


def _pays(spec: KernelSpec, tiling: Tiling, arch: HardwareDescription) -> bool:
    """Whether a tile's busiest unit, in the steady state of the tile loop, is no busier with the
    bias in the accumulator: the load engine streams tm rows of bias instead of one (BERT's
    pooler, one token in a tile of eight rows whose tanh takes 10 cycles, is load-bound: 1,456 ->
    1,567 cycles with it), the vector unit skips the EPILOGUE. A tile loads B's tile and the
    bias, and A's tile unless its panel is held (gemm_estimate.holds_a_panel)."""
    tm, tn, tk = tiling.tm, tiling.tn, tiling.tk
    rows = min(spec.gemm_extents[0], tm)  # (the VFUNC runs on the valid rows: lower/padded_rows.py)
    size = DType.FLOAT32.itemsize
    a_tile = 0 if holds_a_panel(spec, tiling) else tm * tk * size  # (one column tile: A's per tile)
    load = cost.dma_transfer_cycles(arch, tk * tn * size + a_tile)
    pe = cost.gemm_steady_cycles(arch, tm, tn, tk, "float32")
    vfunc = cost.vfunc_issue_cycles(arch, rows * tn, spec.act)
    before = max(load + cost.dma_transfer_cycles(arch, tn * size), pe, vfunc + cost.vector_cycles(arch, rows, tn))
    after = max(load + cost.dma_transfer_cycles(arch, tm * tn * size), pe, vfunc)
    return after <= before


def _fits(spec: KernelSpec, tiling: Tiling, arch: HardwareDescription) -> bool:
    """Whether the accumulator's third copy fits beside the tiling's buffers (gemm_footprint, the
    operand tiles' third copies and a pre-norm's panel program counted)."""
    size = DType.FLOAT32.itemsize
    a_row = a_row_stride(tiling.tm, tiling.tk, size, arch)
    footprint = gemm_footprint(tiling.tm, tiling.tn, tiling.tk, size, size, True, a_row=a_row)
    if tiling.operand_copies > 2:
        footprint += aligned(tiling.tm * a_row * size)
    footprint += aligned(tiling.tk * tiling.tn * size)  # B's third copy (held or asked)
    footprint += panel_bytes(spec, tiling.tm) + aligned(tiling.tm * tiling.tn * size)
    return footprint <= arch.spad_bytes


def annotate_tile(sch, tiling: Tiling, tile_loop) -> None:
    """Ask lowering to load the bias into the accumulator tiles allocated under `tile_loop` (the
    innermost loop over output tiles), three copies of them and of B's tiles
    (lower/bias_accumulator.py), and A's tiles' copies (instead of gemm_copies.annotate_copies: a
    loop keeps the first BUFFER_COPIES annotation it gets)."""
    copies = {"a_pad": tiling.operand_copies} if tiling.operand_copies > 2 else {}
    sch.annotate(tile_loop, BUFFER_COPIES, {**copies, "b_pad": ACC_COPIES, "acc": ACC_COPIES})
    sch.annotate(tile_loop, BIAS_IN_ACC, 1)
