"""The normalise stage's body: the model's idioms rewritten into the forms the kernels match.

Stage: normalise (pipeline.STAGES' first). In and out: a Relax IRModule. As a stage's body it may
ask the kernels (attention_tiles.attention_fits: whether an attention fits the scratchpad;
int4_matmul: a MatMulNBits layer's kernel for the chip). Seven rewrites run
first, outside any TVM pass (the bounded shapes, the bool scans, three numpy folds on the weights as the importer
left them, the negative indices); then `normalise_passes`, one line each saying
why, on a module that calls their operators (rewrite.scans_shared). The list lives here, not in
pipeline.py, because it is a body: it runs inside that context and after the numpy rewrites.
"""

from __future__ import annotations

import tvm
from tvm import relax

from cgra_sim import function_unit

from ..kernels.attention.attention_tiles import attention_fits, causal_row_fits
from ..kernels.attention.flash_length import length_fits
from ..kernels.common.spec import PATCH_CHANNELS
from ..kernels.gemm.int4_matmul import Int4Layer, int4_matmul_kernel
from ..kernels.gemm.int4_conv import int4_conv_kernel
from ..kernels.gemm.int4_qmatmul import int4_qmatmul_kernel
from .attentions import attentions_pass
from .batch_norms import batch_norms_as_scale_shift
from .half_powers import half_powers_in_float32
from .bool_scans import bool_scans_as_counts_pass
from ..frontend.position_tables import scale_prefix_tables, tabulate_prefix
from .bounded_shapes import resolve_bounded_shapes
from .centred_streams import centred_streams_pass
from .centred_patches import centred_patches_pass
from .clips import canonicalize_clips_pass
from .constant_adds import constant_adds_pass
from .constant_indices import constant_indices_pass
from .conv1ds import conv1ds_as_conv2ds_pass
from .conv3ds import conv3ds_as_conv2ds_pass
from .conv_transposes import conv_transposes_as_convs_pass
from .dynamic_quant import dynamic_quant_pass
from .empty_operands import empty_operands_pass
from .fold_constants import fold_remaining_constants
from .fold_weights import fold_weights, restore_kept_transposes
from .gated_linears import gated_linears_pass
from .gelus import gelus_pass
from .head_qkv import head_qkv_pass
from .table_norms import table_norms_pass
from .half_casts import half_casts_pass, half_norm_ones_pass
from .half_linears import half_widened_linears
from .half_attention_outputs import half_attention_outputs_pass
from .int4_weights import int4_weight_kernels
from .index_casts import index_casts_pass
from .large_pools import split_large_pools_pass
from .length_lookups import length_lookups_pass
from .length_boxes import length_boxes_pass
from .length_masks import causal_masks_pass, open_masks_pass
from .mask_positions import mask_positions_pass
from .lookup_tables import lookup_tables_pass
from .masks import masks_pass
from .constant_rows import constant_rows_pass
from .alibi_rows import alibi_rows_pass
from .negative_indices import wrap_negative_indices
from .layer_scales import layer_scales_pass
from .norm_folds import norm_folds_pass
from .normed_linears import normed_linears_pass
from .half_normed_linears import half_normed_linears_pass
from .parallel_residuals import parallel_residuals_pass
from .patch_embeddings import patch_embeddings_pass
from .position_embeddings import position_embeddings_pass
from .quick_gelus import quick_gelus_pass
from .no_op_broadcasts import no_op_broadcasts_pass
from .no_op_pads import no_op_pads_pass
from .nhwc_convs import nhwc_convs_pass
from .padding_taps import padding_taps_pass
from .patch_merges import patch_merges_pass
from .take_boxes import take_boxes_pass
from .take_slices import take_slices_pass
from .token_means import token_means_pass
from .window_residuals import window_residuals_pass
from .window_sinks import window_sinks_pass
from .window_stems import window_stems_pass
from .permute_chains import permute_chains_pass
from .pool1ds import pool1ds_as_pool2ds_pass
from .pool_taps import pool_taps_pass
from .shared_sums import shared_sums_pass
from .split_slices import split_slices_pass
from .half_split_widens import half_split_widens_pass
from .qdq import canonicalize_qdq
from .qdq16 import canonicalize_qdq16
from .qlayouts import quantized_layouts_pass
from .qlayouts16 import quantized_layouts16_pass
from .qkv_merges import qkv_merges_pass
from .qlinear import integer_qlinear_adds_pass
from .qdq_outputs import dequantized_outputs_pass
from .qlookups import quantized_lookups_pass
from .qpools import quantized_pools_pass
from .query_scales import query_scales_pass
from .rewrite import scans_shared
from .rms_norms import rms_norms_pass
from .rope_epilogues import rope_epilogues_pass
from .rotary_pairs import rotary_pairs_pass
from .rotations import rotations_pass
from .scalars import scalar_operands_pass
from .shared_weights import shared_weights_pass
from .softmaxes import safe_softmaxes_pass
from .sums import sums_as_adds_pass
from .rewrite import as_pass
from .symbolic_rows import symbolic_rows_pass


def normalise(mod, arch, options):
    """`mod` with QDQ layers as integers, batch norms and weight arithmetic folded with numpy, then
    every pass of `normalise_passes` run."""
    # A slice to a symbolic length whose extent Relax left as min / max arithmetic (HF's
    # packed-sequence check, an encoder's position ids) is resolved with the length's bounds, so
    # the ops after it have shapes; outside the pass list, so that an undecided shape is refused
    # as UnsupportedOperator (bounded_shapes.py).
    mod = resolve_bounded_shapes(mod, dict(options.shape_bounds))
    # What a prefill computes from its length alone (RoPE's cos and sin of arange(s)) is the
    # prefix of a table computed for the bound: a view of it, no host cos / sin (position_tables.py).
    mod = tabulate_prefix(mod)
    # QDQ layers (dequantize -> conv2d / matmul -> quantize) become int8 x int8 -> int32 with
    # an int32 bias and a requantisation to int8, onnxruntime's arithmetic (qdq.py);
    # first, while the quantized weights are still int8 constants under their dequantize.
    mod = canonicalize_qdq(mod)
    # The same with int16 activations and int8 weights: 16x8 GEMMs into int64, requantised to
    # int16 (qdq16.py).
    mod = canonicalize_qdq16(mod)
    # MatMulNBits' host PrimFuncs (4-bit weights), and the QDQ matmuls and convs whose weights qdq.py
    # packed (qdq_int4.py, int4_convs.py), become the chip's unpack-and-GEMM kernels, which keep the weights packed in
    # DRAM (int4_weights.py).
    mod = int4_weight_kernels(mod, arch, lambda m, k, n, block, zeros, chip: int4_matmul_kernel(
        Int4Layer(m, k, n, block, zeros), chip), int4_qmatmul_kernel, int4_conv_kernel)
    # A bool cumsum counts, as PyTorch's does (bool_scans.py): as bool no target builds it, and
    # HF's causal mask, built from constants through one, would not fold.
    mod = bool_scans_as_counts_pass(mod)
    # A 16-bit linear whose weight TVM's importer widened to its float32 input: the 16-bit GEMM
    # PyTorch computes, the input rounded (half_linears.py); before fold_weights folds the widening.
    mod = half_widened_linears(mod)
    # Inference batch norm after a conv2d with constant weights becomes scaled weights and a
    # bias add, and the constant arithmetic importers leave around weights (bias reshapes,
    # transposed Gemm weights) is folded, with numpy in milliseconds (fold_weights.py).
    mod = fold_weights(mod)
    # A batch norm no conv2d took (after a pool or an add) becomes x * scale + shift with numpy
    # constants: two elementwise kernels instead of a host op (batch_norms.py).
    mod = batch_norms_as_scale_shift(mod)
    # A bfloat16 power (GPT-2's NewGELU) in float32, rounded once, as PyTorch computes it: TVM
    # cannot build one (half_powers.py).
    mod = half_powers_in_float32(mod)
    # Constant negative indices count from the end (TVM reads before the tensor), before
    # FoldConstant evaluates any such read; outside the pass list, so that an index out of range
    # is refused as UnsupportedOperator, not a RuntimeError (negative_indices.py).
    mod = wrap_negative_indices(mod)
    # The rewrites below run on a module that calls their operators (rewrite.py).
    with scans_shared():
        return tvm.transform.Sequential(normalise_passes(arch))(mod)


def normalise_passes(arch=None) -> list:
    """The Relax passes of the normalise stage, in order, each with the reason it is there
    (`arch`: the chip, whose scratchpad decides which attentions become the kernel's form)."""
    return [
        # TVM's FoldConstant, for what fold_weights has no numpy rule for, on those calls only (fold_constants.py).
        tvm.transform.module_pass(lambda m, _ctx: fold_remaining_constants(m), opt_level=0,
                                  name="cgra.FoldConstant"),
        # The weight transposes fold_weights kept from FoldConstant, back (the matmul kernel
        # reads them as stored).
        tvm.transform.module_pass(lambda m, _ctx: restore_kept_transposes(m), opt_level=0,
                                  name="cgra.RestoreTransposes"),
        relax.transform.CanonicalizeBindings(),
        # A bfloat16 / float16 model's casts the graph can do without, exactly: one to the dtype its
        # operand has, widened constant lookups and masks, matmul + astype as the GEMM's rounding
        # store; casts moved across an attention's head split and merge, so its kernel reads and
        # writes them (half_casts.py); the conversions left run as NPU cast kernels.
        half_casts_pass,
        # onnxruntime's dynamically quantized MatMulInteger (int32 operands minus zero points) as
        # the int8 x int8 -> int32 matmul the GEMM kernels compute, exactly (dynamic_quant.py).
        dynamic_quant_pass,
        # A transposed convolution becomes one conv2d per output phase and an interleave: the
        # NPU's GEMM kernels, and no multiplications by inserted zeros (conv_transposes.py).
        conv_transposes_as_convs_pass,
        # A conv1d as a conv2d one pixel high, a conv3d as conv2d's over frames (conv1ds.py, conv3ds.py).
        conv1ds_as_conv2ds_pass, conv3ds_as_conv2ds_pass,
        # ONNX Sum imports as a stack and a reduction: as adds, a residual add the conv2d kernel
        # fuses or elementwise adds (sums.py).
        sums_as_adds_pass,
        # An added lookup whose indices are one row for every length, from the length alone (an
        # encoder's token types given input_ids alone), as that constant row: no host gather
        # (length_lookups.py).
        length_lookups_pass,
        # An index_tensor of constant indices (HF's padding mask: mask[b_arange, kv_arange]) as
        # the reshape or row gather it is (constant_indices.py).
        constant_indices_pass,
        # An embedding lookup reads its int64 token ids as they are, not cast to int32 first: the
        # same rows for every index the lookup defines (index_casts.py).
        index_casts_pass,
        # What those left constant under a lookup (RoBERTa's token types) folded, and a constant
        # row added to a lookup (their embedding) added to its table instead (lookup_tables.py).
        lookup_tables_pass,
        # A layer norm of a lookup (Bloom's word_embeddings_layernorm) as a lookup of the table
        # normalised when compiling: no norm kernel (table_norms.py).
        table_norms_pass,
        # A fused q / k / v projection laid out per head (Bloom's), read by a take of each part,
        # with its columns in part order: each part a box the attention reads, no gather kernel
        # (head_qkv.py).
        head_qkv_pass,
        # Hand-written RMSNorm, GELU and PyTorch's safe softmax as the one op each computes
        # (rms_norms.py, gelus.py, softmaxes.py), before scalars become tensors.
        rms_norms_pass, gelus_pass, safe_softmaxes_pass,
        # A 16-bit float model's RMSNorm applies its weight after the cast: its float32 weight of
        # ones as R.ones, which the norm kernel's pattern reads and skips (half_casts.py).
        half_norm_ones_pass,
        # A linear's output times a constant per-channel vector (DINOv2's and ConvNeXt's layer scale) as the
        # linear with that vector in its weights and bias: the residual add after it joins the
        # GEMM's epilogue instead of running alone (layer_scales.py).
        layer_scales_pass,
        # (x + c1) + c2 as x + (c1 + c2): BERT's token-type and position embeddings, both
        # constants, added as one elementwise kernel instead of two (constant_adds.py).
        constant_adds_pass,
        # A ViT's position embedding added to [CLS; patches] as a constant for the CLS row and
        # the patch conv's residual add for the rest, exactly (position_embeddings.py).
        position_embeddings_pass,
        # Its patches' flatten and transpose as the patch conv's channels-last output: the conv
        # stores tokens, no transposing copy (patch_embeddings.py).
        patch_embeddings_pass(PATCH_CHANNELS),
        # A residual add after Swin's window reverse of its attention output, and the window partition
        # of its pre-attention norm, in window order: the add joins the output projection's
        # epilogue, the norm reads the partitioned residual (window_residuals.py).
        window_residuals_pass,
        # A pre-norm's gamma and beta folded into the linear layers that alone read it: the norm
        # kernel loses two of its full-tile steps, the GEMMs nothing (norm_folds.py).
        norm_folds_pass,
        # A residual stream read only by layer norms (GPT-J's, GPT-NeoX's, Falcon's) carried
        # centred, its table and the linears adding to it centred: its plain layer norms are
        # RMSNorms, whose program a GEMM runs on its A panel at a third of the cost (centred_streams.py).
        centred_streams_pass,
        # CLIP's quick GELU x * sigmoid(1.702 x) as silu(1.702 x), 1 / 1.702 in the next linear's
        # weights: the linear before it takes the scale and the SiLU in its epilogue (quick_gelus.py).
        quick_gelus_pass,
        # A causal mask computed from a symbolic length (HF's, given input_ids alone) proven
        # causal for every length and computed from one arange, once for all layers (length_masks.py).
        causal_masks_pass,
        # A mask computed from a symbolic length that keeps every key (an encoder's padding mask
        # given input_ids alone) proven so and dropped: x + where(true, 0, -inf) is x (length_masks.py).
        open_masks_pass,
        # A tensor of the length alone (T5's relative-position bias: arange, int64 arithmetic, log,
        # a lookup) as the top-left s x s box of its constant at the bound, which the symbolic
        # attention reads by DMA (length_boxes.py); after the masks above took theirs.
        length_boxes_pass,
        # An attention (SDPA's decomposition, HF's eager form, grouped- and multi-query K / V) as
        # one normal form the attention family takes whole (attentions.py), after the softmaxes;
        # only one whose K / V head and score rows fit the chip's scratchpad (the kernel's tile
        # search says), so a longer one keeps the matmul and softmax kernels it had.
        attentions_pass(lambda parts: arch is None or (attention_fits if parts.get("length") is None
                                                       else length_fits)(parts, arch)),
        # Its score scale, when no power of two (Swin's 8^-1/2), in the query projection's weights:
        # the kernel no longer scales every item's Q tile on the vector unit (query_scales.py).
        query_scales_pass,
        # A broadcast_to the shape its operand has (torch.export's expand before a batched
        # matmul) is its operand, not a host copy (no_op_broadcasts.py).
        no_op_broadcasts_pass,
        # A batched matmul of a constant repeating one matrix (torch.export's linear of a 3-D
        # input, its weight's broadcast folded) reads the matrix once: one GEMM, its residual add
        # in the epilogue (shared_weights.py).
        shared_weights_pass,
        # A pad of zero widths (Swin's to a multiple of a window that divides the map) is its
        # operand, not a copy (no_op_pads.py).
        no_op_pads_pass,
        # A conv2d between transposes to and from channels-last (ConvNeXt's) reads and writes
        # channels-last, a residual add of two transposed tensors is transposed once after it:
        # the transposes cancel (nhwc_convs.py).
        nhwc_convs_pass,
        # A conv2d's taps that only ever read padding (ConvNeXt's 7 x 7 depthwise conv on a 2 x 2
        # map: all but the middle 3 x 3) cut from its weights and padding (padding_taps.py).
        padding_taps_pass,
        # A conv read only by a layer norm over its channels (Swin's and ConvNeXt's patch
        # embeddings) computes its output centred, with centred weights: the norm is an RMSNorm
        # plus beta, half the vector work in the patch conv's epilogue (centred_patches.py).
        centred_patches_pass(None if arch is None else arch.cols, PATCH_CHANNELS),
        # A mean over the tokens of a transposed activation (Swin's pooler, ConvNeXt's NCHW output)
        # as the NPU's mean over the channels-last map: no transposing copy (token_means.py).
        token_means_pass,
        # A transpose of a transpose is one (the attention form's output: three in a row, two
        # cancelling), a transpose that moves nothing its operand (permute_chains.py).
        permute_chains_pass,
        # (after it: the head merge is one transpose) A 16-bit model's cast of an attention's output after the view to the next linear's rows,
        # on the attention's result: the kernel rounds on store, no cast kernel (half_attention_outputs.py).
        half_attention_outputs_pass,
        # Attention's q, k and v projections of one input as one linear over their weights side
        # by side, each part a slice of its view in heads (qkv_merges.py): one GEMM kernel, not three.
        qkv_merges_pass,
        # A take of constant consecutive indices (Falcon's key and value heads, qkv[:, :, [-2]])
        # as a slice (take_slices.py), merged by the next pass: a box RoPE's epilogue and the
        # attention read as views, no copy kernel.
        take_slices_pass,
        # A take of one index on the next-to-last axis at a symbolic length (Bloom's q / k / v of
        # its (B, s, H, 3, D) view) as a slice of a (.., N, M D) view: a box (take_boxes.py).
        take_boxes_pass,
        # A fused q / k / v projection's split as slices, each cut into heads after the slice:
        # the transposing copy or RoPE kernel after it reads its part (split_slices.py).
        split_slices_pass,
        # A 16-bit model's widening of each sliced part of a rounded projection (GPT-2's q / k / v)
        # moved before the slices: the GEMM rounds and widens on store (half_split_widens.py).
        half_split_widens_pass,
        # Swin's patch merging, a concat of every phase of a stride-2 slice (its slices merged
        # just above), as one transpose of a view: one layout kernel instead of four slices and a
        # concat (patch_merges.py).
        patch_merges_pass,
        # A window reverse before row-by-row work (Swin's MLP) moved after it and composed with
        # the copy that follows (its patch merging: window_sinks.py); a partition after row-by-row
        # work composed with the copy before that work (Swin's stem: window_stems.py). One copy
        # each instead of two.
        window_sinks_pass,
        window_stems_pass,
        # A gate and an up projection of one input (SwiGLU, GeGLU) as one linear over their
        # interleaved weights, the gated unit after it (gated_linears.py): one GEMM kernel, the
        # gate's activations never in DRAM; where the chip's function unit has the activation.
        gated_linears_pass(lambda act: arch is not None and function_unit.runs(arch.function_unit, act)),
        # A plain RMSNorm (its weight folded) read only by linears: each gets its own copy as its
        # left operand, which its GEMM normalises in the scratchpad (normed_linears.py).
        normed_linears_pass,
        # A 16-bit model's RMSNorm (rounded, times its gamma) the same: its GEMMs run it on their A
        # panels with both roundings (kernels/gemm/half_row_norm.py)
        half_normed_linears_pass,
        # A parallel block's (attn + mlp) + x as attn + (mlp + x): each add in a GEMM's epilogue,
        # none a kernel of its own (parallel_residuals.py).
        parallel_residuals_pass,
        # A concat's empty operands (HF's partial-rotary pass-through when the rotary dims are the
        # whole head) left out, and a concat of one operand that operand (empty_operands.py).
        empty_operands_pass,
        # RoPE's rotate_half / rotate_every_two negation folded into the constant sine it
        # multiplies, exactly (rotations.py): no negative left on the host.
        rotations_pass,
        # Integer arithmetic on an attention mask cast to float32 (Bloom's ALiBi positions:
        # cumsum, subtract, multiply, astype in int64) as exact float32 arithmetic on its {0, 1}
        # twin, under the mask's 0 / 1 contract (mask_positions.py); before masks.py builds the twin.
        mask_positions_pass,
        # A boolean mask's where(m, 0, -inf) and casts as float32 {0, 1} arithmetic, exactly
        # (masks.py): the mask is built on the NPU, once for every layer.
        masks_pass(None if arch is None else lambda *shapes: causal_row_fits(*shapes, arch)),
        # A constant causal mask plus constant ALiBi rows (a static Bloom without a padding mask)
        # as the kernel's triangle and a mask row, not a (1, H, s, s) add read whole by every
        # layer (constant_rows.py).
        constant_rows_pass(None if arch is None else lambda *shapes: causal_row_fits(*shapes, arch)),
        # Bloom's padding row plus ALiBi rows from the mask's twin as two GEMMs, not six kernels
        # on 1 x s rows (alibi_rows.py).
        alibi_rows_pass,
        # A reshape or add of the same operands as an earlier one is read from it: every layer of
        # Bloom adds its ALiBi rows to the padding mask in the attention form's own add
        # (attentions.py), the same (1, H, s, s) sum per layer; one add kernel instead of one a
        # layer (shared_sums.py; a general CSE broke symbolic attention and cache writes).
        shared_sums_pass,
        # x * 0.5: a scalar constant operand as a (1, ..., 1) tensor, an ELTWISE broadcast (scalars.py).
        scalar_operands_pass,
        # An elementwise op on a (1, s, C) activation on its (s, C) rows: the kernels' symbolic
        # axis 0 (symbolic_rows.py).
        symbolic_rows_pass,
        # A table prefix times a constant row (the sine's signs, rotations.py) is a view of the
        # product table (position_tables.scale_prefix_tables): no kernel for it.
        as_pass(scale_prefix_tables, "cgra.ScalePrefixTables", ops=("relax.memory.view",)),
        # ONNX Clip (relu6) imports as opaque maximum / minimum PrimFunc calls: make them R.clip
        # with constant bounds, as PyTorch's relu6 already is, so the epilogue can fuse them.
        canonicalize_clips_pass(),
        # A global average pool between quantized tensors is onnxruntime's integer one: an int8
        # GEMM of the map by a column of ones requantised in its EPILOGUE, one kernel (qpools.py),
        # before the float mean of a large map is split below.
        quantized_pools_pass,
        # A pool's window taps that only ever read padding cut from its window and padding (YOLO's
        # SPPF 5 x 5 max pools on a 2 x 2 map: 3 x 3), which the POOL kernel then takes (pool_taps.py).
        pool_taps_pass,
        # A pooling window of more than 256 taps becomes a row pass and a column pass: the POOL
        # command's window expression must not grow with the window (large_pools.py).
        split_large_pools_pass,
        # A concat, split, reshape or max pool between quantized tensors runs on the int8 tensors,
        # an operand of another scale requantised, exactly (qlayouts.py): no float copy between
        # the host's dequantizes and quantizes; the same on int16 tensors (qlayouts16.py).
        quantized_layouts_pass,
        quantized_layouts16_pass,
        # A max / avg pool1d as a pool2d one pixel high (pool1ds.py), after qlayouts.py moved a
        # quantized one onto int8: the POOL kernel takes it (text_cnn's max pool over its tokens).
        pool1ds_as_pool2ds_pass,
        # A function of one quantized tensor through a sigmoid or an inner requantisation
        # (QLinearSigmoid, a SiLU or hard-swish between quantized layers) as its 256-entry table,
        # exact (qlookups.py): one LOOKUP kernel instead of a float sigmoid between the host's
        # dequantize and quantize, or a chain kernel, and a multiply kernel.
        quantized_lookups_pass,
        # A residual add between quantized tensors (dequantize, add, quantize) is onnxruntime's
        # fixed-point QLinearAdd on int32, one FABRIC_INT8 kernel (qlinear.py); last, so that its
        # constants stay 0-d (immediates of the kernel's body).
        integer_qlinear_adds_pass,
        # A requantised layer's output dequantized to float32 with its multipliers and
        # dequantisation scale in one interleaved table: the GEMM's EPILOGUE dequantises (qdq_outputs.py).
        dequantized_outputs_pass,
        # The aliases rewrites leave (a broadcast_to that repeats nothing, a dropped softmax guard:
        # `lv53 = lv50`) gone, so that the patterns see their operands' calls (the KV cache's
        # slice under the matmul reading it).
        relax.transform.CanonicalizeBindings(),
        # GPT-J's interleaved rotary as GPT-NeoX's half rotary, the rotated dims of the q and k
        # heads reordered in the projection's weights (rotary_pairs.py): the RoPE kernel runs it;
        # on the bindings canonicalised (its match reads operands' calls through no aliases).
        rotary_pairs_pass,
        # RoPE of a projection's q and k heads as one op over its output, x * C + x[:, perm] * S
        # (rope_epilogues.py): the projection's GEMM runs it in its epilogue, the attention
        # reads the heads as boxes of its output; after every rewrite of the rotary's form.
        rope_epilogues_pass,
        # What folding left unused (PyTorch's max_pool2d returns a tuple with zeros_like
        # indices that FoldConstant turns into a constant nobody reads).
        relax.transform.DeadCodeElimination(),
    ]
