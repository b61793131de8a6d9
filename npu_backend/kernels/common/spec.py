"""What one offloaded kernel computes (`KernelSpec`) and the tiles it is cut into (`Tiling`).

Stage: kernel definition and tiling. A family's `spec_from_match` (matmul.py, conv2d.py, pool.py)
reads a `KernelSpec` off the Relax subgraph a pattern matched, independent of the hardware; its
tile search turns spec and hardware description into a `Tiling`; the TE compute and the schedule
read only these two. Shapes are logical (NCHW data, OIHW weights); layouts say how each tensor is
stored. The standalone elementwise family has its own spec (eltwise.py).
"""

from __future__ import annotations

import dataclasses

from cgra_codegen.spad import SPAD_ALIGN as ALIGN  # the code generator's buffer placement

#: Output columns of a block of a conv2d whose height and width are both symbolic: its tiles
#: are blocks of tm / BLOCK_COLUMNS rows by this many columns.
BLOCK_COLUMNS = 8
#: The layouts the NCHW conv2d compute reads and writes: (data, weight, output).
CONV2D_LAYOUTS = ("NCHW", "OIHW", "NCHW")
#: The most channels a conv2d over patches takes a kernel row's depth per GEMM for
#: (patchify.py): a tap's GEMM of depth C is mostly its command's fill and drain below this
#: (on cgra-8x8, 3 channels 20.3 k -> 13.0 k cycles, 8 channels 3.7 k -> 3.5 k), not above it
#: (16-64 channels of 2 x 2 patches: 2-9% slower).
PATCH_CHANNELS = 8
#: The output layouts such a conv2d stores: NCHW, or NHWC (a ViT's patches as tokens: its GEMM's
#: rows are the pixels, a stored row each; normalise/patch_embeddings.py).
PATCH_OUT_LAYOUTS = ("NCHW", "NHWC")
#: PrimFunc attribute: the blocks whose scratchpad buffers lowering keeps one copy of
#: (lower/double_buffer.py), because the kernel's own order of commands already keeps their
#: writes and reads apart (inverted_residual.py); the tile search counts them once.
SINGLE_BUFFERED = "cgra.single_buffered"
#: A loop annotation: the scratchpad buffers allocated in the loop's body are allocated before it,
#: with the enclosing tile's (lower/hoist_allocs.py; gemm.py's epilogue pieces)
HOIST_ALLOCS = "cgra.hoist_allocs"
#: A loop annotation: the reduction-step loop of a tile whose A panel is loaded a step at a time in
#: the first column tile and held for the others (lower/stream_panel.py; Tiling.stream_panel)
STREAM_PANEL = "cgra.stream_panel"
#: A loop annotation: the reduction-step loop of a post-norm tile finished in pieces whose last that
#: many steps run piece by piece (lower/piece_major.py; kernels/gemm/post_norm_tail.py)
PIECE_MAJOR = "cgra.piece_major"
#: A column tile loop whose RoPE tables repeat every that many tiles (lower/held_tables.py)
HOLD_TABLES = "cgra.hold_tables"
#: A column tile loop of RoPE in a GEMM's epilogue whose tables pass some tiles through:
#: [p, first, last, ...]: tile c rotates where c mod p lies in one of the [first, last) ranges
#: (lower/rope_skips.py)
ROPE_ROTATES = "cgra.rope_rotates"
#: A loop annotation: {buffer name: copies} for scratchpad buffers allocated inside the loop that
#: lowering gives more than two copies (lower/double_buffer.py; Tiling.operand_copies)
BUFFER_COPIES = "cgra.buffer_copies"
#: A loop annotation: the GEMMs inside run in pieces of that many rows (lower/gemm_rows.py; a
#: matmul's output tiles finished in pieces, Tiling.epilogue_rows)
GEMM_ROWS = "cgra.gemm_rows"
#: The loop iterations up to which lowering holds a padded window's halo in its buffer copies
#: (lower/held_halos.py checks the offsets at each; a longer loop nest loads every halo), and
#: the estimates that price it (kernels/gemm/depthwise.py, kernels/pool/pool_tiles.py)
HELD_HALO_TRIPS = 4096
#: PrimFunc attribute [valid rows, tile rows, piece rows]: a static matmul of one row tile padded
#: past its rows (17 tokens in a tile of 24); its epilogue's vector commands run on the valid rows
#: only (lower/padded_rows.py)
VALID_ROWS = "cgra.valid_rows"
#: A loop annotation: the accumulator tiles allocated inside start from the bias, loaded by DMA,
#: and the activation reads them (lower/bias_accumulator.py; Tiling.bias_in_acc)
BIAS_IN_ACC = "cgra.bias_in_acc"


@dataclasses.dataclass(frozen=True)
class PoolAttrs:
    """A pooling kernel's own attributes (the spec's strides, padding, dilation and layouts hold
    the rest): "max" or "avg", the window (kh, kw), and how the output size and the average's
    divisor treat the padding (as relax.nn.avg_pool2d / PyTorch define them)."""

    kind: str
    size: tuple
    ceil_mode: bool = False
    count_include_pad: bool = False
    whole: bool = False  # a global average: the window is the image, whatever its size

    def output_extent(self, extent: int, axis: int, strides, padding, dilation) -> int:
        """Outputs along `axis` (0: H, 1: W); in ceil mode the last window must start inside
        the image or its leading padding."""
        lo, hi = padding[axis], padding[axis + 2]
        span = extent + lo + hi - dilation[axis] * (self.size[axis] - 1) - 1
        out = (-(-span // strides[axis]) if self.ceil_mode else span // strides[axis]) + 1
        if self.ceil_mode and (out - 1) * strides[axis] >= extent + lo:
            out -= 1
        return out


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """What one offloaded kernel computes, independent of the hardware."""

    op: str  # "matmul", "conv2d", "depthwise" (a conv2d with groups == C == F) or "pool"
    dtype: str  # input dtype: "int8" or "float32"
    acc_dtype: str  # "int32" or "float32"
    lhs_shape: tuple  # matmul: (M, K); conv2d, depthwise: (N, C, H, W)
    rhs_shape: tuple  # matmul: (K, N), or (N, K) when rhs_transposed; conv2d: (F, C / groups, KH, KW)
    bias_shape: tuple | None = None  # broadcastable to the output along its channel / column axis
    relu: bool = False
    rhs_transposed: bool = False  # matmul: the right operand is stored (N, K) (PyTorch Linear)
    strides: tuple = (1, 1)
    padding: tuple = (0, 0, 0, 0)  # top, left, bottom, right
    dilation: tuple = (1, 1)
    groups: int = 1  # conv2d: channel groups (depthwise: groups == input channels)
    source_ops: tuple = ()  # names of the model operators fused into this kernel
    param_roles: tuple = ()  # role ("lhs", "rhs", "bias", "residual") of each parameter, in call order
    residual_shape: tuple | None = None  # the output's shape: a tensor added after the bias
    residual_is_lhs: bool = False  # the residual is the left operand itself (x @ W + x): no parameter of its own
    clip: tuple | None = None  # (lo, hi) in the acc dtype, applied last (after relu)
    # A chain of elementwise ops after the epilogue (a leaky relu, a hard-swish): the nodes of a
    # FABRIC body (cgra_sim/mapping/body.py) each output tile runs through in place (chains.py).
    fabric_body: tuple = ()
    # After those, float32 only (kernels/gemm/epilogue_tail.py): an activation the EPILOGUE lacks
    # ("sigmoid", "silu", "gelu_tanh", "gelu"), then a multiply by a tensor of the output's shape
    # (role "multiplier": SwiGLU's gate times the up projection).
    act: str | None = None
    multiplier_shape: tuple | None = None
    # matmul: a gated linear unit (gemm/gated.py): the output is act(acc[:, 0::2]) * acc[:, 1::2],
    # (M, N / 2), the weights' rows the gate's and the up projection's interleaved.
    gated: bool = False
    # A gated unit whose activation is rounded to this 16-bit float and widened back before the
    # multiply (a bfloat16 model's SwiGLU: gemm/gated.py), else None.
    gated_via: str | None = None
    # matmul: RoPE in the epilogue (gemm/rope_epilogue.py): out = x * cos + x[:, partner] * sin, x the
    # linear's output [+ bias], cos and sin (M, N) tables (roles "cos", "sin"), the partners by this
    # RotaryPattern of periods of columns (the constant indices of the match's take).
    rope_pattern: object = None
    # The fewest columns, a whole number of the pattern's periods dividing N, after which the cos and
    # sin tables repeat (GPT-NeoX's q / k / v of a head: 48 of 192); N when they do not.
    rope_table_period: int = 0
    # The columns of the tables (their W columns when compact, else N) where C = 1 and S = 0 on
    # every row: ((first column, columns), ...) runs where the epilogue rotates nothing (GPT-NeoX's
    # unrotated dims and v heads; lower/rope_skips.py skips them on tiles wholly inside).
    rope_pass_columns: tuple = ()
    # Before the relu / clip / activation, float32: a multiply by a constant per output channel
    # (roles "ch_scale", "ch_shift"), then an add of one: a batch norm written as Mul + Add.
    channel_scale_shape: tuple | None = None
    channel_shift_shape: tuple | None = None
    # matmul, float32: (kind, eps): the left operand is the input x of a plain RMSNorm or layer
    # norm ("rms_norm", "layer_norm": gamma and beta folded into the weights and bias,
    # normalise/norm_folds.py), which the kernel normalises in its A panel (kernels/gemm/row_norm.py).
    row_norm: tuple | None = None
    # matmul, float32: (eps, affine, kind): the output is the layer norm ("layer_norm"), the RMSNorm
    # ("rms_norm") or the RMSNorm + beta ("rms_norm_beta") of the epilogue's sum over its
    # rows (a post-norm, LayerNorm(x + proj(h)): kernels/gemm/post_norm.py), gamma and beta
    # (roles "norm_gamma", "norm_beta") applied when `affine`, else all ones and zeros.
    post_norm: tuple | None = None
    # conv2d: how each tensor is stored. lhs_shape, rhs_shape and output_shape stay logical
    # (N, C, H, W) / (O, I, H, W); a layout is a permutation of those axes, e.g. "NHWC", "HWIO".
    data_layout: str = "NCHW"
    kernel_layout: str = "OIHW"
    out_layout: str = "NCHW"
    # matmul: images of a batched matmul, one right operand each (lhs (B, M, K) or a shared
    # (M, K); rhs (B, K, N) or (B, N, K)). 1 for a 2-D GEMM, shared weights included.
    batch: int = 1
    # ((role, shape), ...): arguments the caller passes in another shape than the kernel reads
    # them (compact views, e.g. a (B, S, K) input read as (B * S, K)); see operands.prim_func.
    caller_shapes: tuple = ()
    pool: PoolAttrs | None = None  # op "pool": max or average pooling (pool.py); lhs_shape NCHW
    # Requantisation to int8 after the epilogue (int8 x int8 -> int32 kernels): the output zero
    # point, and the shape of the float32 scale parameter (one value per output channel, shaped
    # like a bias). None: the kernel writes its accumulator dtype.
    requant_zero_point: int | None = None
    scale_shape: tuple | None = None
    # ... then dequantized to float32 (EPILOGUE_DEQUANTISE, kernels/gemm/dequant_epilogue.py): the
    # scale parameter a flat row of 2n, channel j's multiplier and dequantisation scale at 2j, 2j + 1.
    dequantise: bool = False
    # ... then one operand of a fixed-point QLinearAdd (kernels/gemm/qadd_epilogue.py): the int32 FABRIC_INT8
    # body run on the requantised tile and the other operand (role "residual", int8), A the other's when swapped.
    qadd_body: tuple = ()
    qadd_swapped: bool = False
    # conv2d, depthwise: the image's padding holds the dtype's lowest value instead of 0 (the
    # DMA's DMA_FILL_LOWEST halo): an int8 activation whose zero point is -128 padded with it,
    # the real value 0 (a QDQ layer after a relu: normalise/qdq.py), read from conv2d(pad(x)).
    pad_lowest: bool = False
    # Symbolic axes (kernels/common/dynamic.py): ((role, axis, variable name), ...) of the shapes the
    # caller passes (caller_shapes, else the shapes above), which hold them at their bound.
    symbols: tuple = ()
    # Positions among the call's arguments of shape values Relax passes beside the tensors
    # (tir_vars, when a tensor's size is an expression of a variable no tensor holds alone); the
    # kernel skips them (operands.kernel_prim_func, attribute cgra.shape_args).
    shape_args: tuple = ()
    # matmul with a symbolic right operand: the right operand is the first rows of a buffer
    # this many rows long (a KV cache preallocated for its bound, read to the step's length:
    # symbolic_matmul.py); 0: the operand is its own tensor.
    rhs_capacity: int = 0
    # bfloat16 / float16 inputs stored in their format: the float32 sum rounded to nearest even on
    # store, the bias and residual in that format (None: the accumulator dtype is stored).
    half_out: str | None = None
    # A float32 output rounded to this 16-bit float and widened straight back on store
    # (half_bias.py), the bias in that format (None: no rounding).
    half_via: str | None = None
    # matmul, at partition only: the left operand is astype(x, dtype) of an x of this dtype left to a
    # cast kernel (a 16-bit RMS post-norm's GEMM not rounding its panel: half_post_norm.py), priced
    # with it (post_norm_cost.check_post_norm). None in the composite, whose operand is a parameter.
    lhs_cast_from: str | None = None

    @property
    def image_fill(self) -> int:
        """What the image's padding holds in the kernel's tiles: 0, or the int8 lowest value
        (pad_lowest). Tile padding past the channels holds it too: the weights' padding is 0
        there, and rows past the output are never stored."""
        return -128 if self.pad_lowest else 0

    def symbolic(self, role: str) -> dict:
        """{axis: variable name} of `role`'s symbolic axes (role "out": the output's)."""
        return {axis: name for r, axis, name in self.symbols if r == role}

    @property
    def roles(self) -> tuple:
        return self.param_roles or (("lhs", "rhs") + (("bias",) if self.bias_shape else ())
                                    + (("cos", "sin") if self.rope_pattern else ())
                                    + (("residual",) if self.residual_shape and not self.residual_is_lhs else ())
                                    + (("multiplier",) if self.multiplier_shape else ())
                                    + (("ch_scale",) if self.channel_scale_shape else ())
                                    + (("ch_shift",) if self.channel_shift_shape else ())
                                    + (("scale",) if self.scale_shape else ()))

    @property
    def out_dtype(self) -> str:
        """What the kernel stores: int8 when it requantises, a 16-bit float input's own dtype
        (its float32 sum rounded to nearest even), else the accumulator dtype."""
        if self.dequantise:
            return "float32"
        if self.requant_zero_point is not None:
            return "int16" if self.acc_dtype == "int64" else "int8"
        return self.half_out or self.acc_dtype

    @property
    def rhs_dtype(self) -> str:
        """The weights' dtype: int8 under int16 activations (the 16x8 mode), else the input dtype."""
        return "int8" if self.dtype == "int16" else self.dtype

    @property
    def operand_dtype(self) -> str:
        """The dtype of the epilogue's bias and residual: the output's for a 16-bit float kernel
        (widened exactly into the float32 sum), else the accumulator's."""
        return self.half_out or self.half_via or self.acc_dtype

    @property
    def gemm_extents(self) -> tuple[int, int, int]:
        """(rows, columns, reduction) of the GEMM: the extents the tiles are chosen for."""
        if self.op == "matmul":
            m, k = self.lhs_shape[-2:]
            n = self.rhs_shape[-2] if self.rhs_transposed else self.rhs_shape[-1]
            return m, n, k
        f, c, _, kw = self.rhs_shape  # c: input channels per group
        _, _, oh, ow = self.output_shape
        return oh * ow, f // self.groups, c * kw if self.patch_channels else c

    @property
    def patch_channels(self) -> int:
        """A conv2d over non-overlapping patches of few channels (a ViT's patch embedding, a
        ConvNeXt stem: kernel == stride, wider than 1, no padding, dilation 1, no groups, NCHW /
        OIHW, an NCHW or NHWC output, static, C <= PATCH_CHANNELS): its channels C, whose GEMM reduces over a kernel row's
        (column, channel) pairs at once (kernels/gemm/patchify.py); 0 for any other kernel."""
        if self.op != "conv2d" or self.groups != 1 or (self.data_layout, self.kernel_layout) != CONV2D_LAYOUTS[:2] \
                or self.out_layout not in PATCH_OUT_LAYOUTS or self.symbolic("lhs") or self.symbolic("out"):
            return 0
        _, c, kh, kw = self.rhs_shape
        patch = tuple(self.strides) == (kh, kw) and kw > 1 and not any(self.padding) and \
            tuple(self.dilation) == (1, 1)
        return c if patch and c <= PATCH_CHANNELS else 0

    @property
    def grouped(self) -> bool:
        """A conv2d run as the GEMM kernel over N * G images, one group each (see grouped_shapes)."""
        return self.op == "conv2d" and self.groups > 1

    @property
    def row_step(self) -> int:
        """Rows of a tile come in multiples of this: a conv2d tile holds whole output rows (whole
        output columns in the "xy" pixel order)."""
        if self.op != "conv2d":
            return 1
        order = self.pixel_order
        return BLOCK_COLUMNS if order == "blocks" else self.output_shape[2] if order == "xy" else self.output_shape[3]

    @property
    def symbolic_image(self) -> bool:
        """A conv2d, depthwise conv2d or pool whose input height or width is symbolic
        (kernels/gemm/conv2d.py, depthwise.py, pool.py)."""
        names = self.symbolic("lhs")
        return self.op in ("conv2d", "depthwise", "pool") and \
            any(self.data_layout.index(axis) in names for axis in "HW")

    @property
    def pixel_order(self) -> str:
        """The order of a conv2d's output pixels along its GEMM rows: "yx" (p = y * OW + x), "xy"
        (p = x * OH + y) when its width is symbolic, or static and larger than its height (NCHW:
        a tile is whole columns then, the shorter side: a 32 x 640 text line's tiles are 32-pixel
        steps, not 640, and fit a small scratchpad), "blocks" (blocks of BLOCK_COLUMNS columns,
        rows of a block after one another) when its height and width both are (kernels/gemm/conv2d.py)."""
        names = self.symbolic("lhs")
        if self.op != "conv2d":
            return "yx"
        if self.data_layout.index("W") in names:
            return "blocks" if self.data_layout.index("H") in names else "xy"
        _, _, oh, ow = self.output_shape
        nchw = (self.data_layout, self.kernel_layout, self.out_layout) == CONV2D_LAYOUTS
        return "xy" if nchw and self.data_layout.index("H") not in names and ow > oh else "yx"

    @property
    def output_shape(self) -> tuple:
        if self.op == "pool":
            n, c, h, w = self.lhs_shape
            return (n, c) + tuple(self.pool.output_extent(extent, axis, self.strides, self.padding, self.dilation)
                                  for axis, extent in enumerate((h, w)))
        if self.op == "matmul":
            m, n, _ = self.gemm_extents
            n = n // 2 if self.gated else n
            return (self.batch, m, n) if self.batch > 1 else (m, n)
        n, _, h, w = self.lhs_shape
        f, _, kh, kw = self.rhs_shape
        top, left, bottom, right = self.padding
        (sh, sw), (dh, dw) = self.strides, self.dilation
        oh = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1
        ow = (w + left + right - dw * (kw - 1) - 1) // sw + 1
        return (n, f, oh, ow)

    @property
    def grouped_shapes(self) -> tuple:
        """conv2d: (data, output) as the kernel reads them, one image per (n, group):
        (N * G, C / G, H, W) and (N * G, F / G, OH, OW), views of the compact tensors."""
        n, c, h, w = self.lhs_shape
        _, f, oh, ow = self.output_shape
        g = self.groups
        return (n * g, c // g, h, w), (n * g, f // g, oh, ow)

    @property
    def compute_name(self) -> str:
        """The form of the kernel its family builds: the op, or its layout / batched form."""
        if self.op == "conv2d" and (self.data_layout, self.kernel_layout, self.out_layout) != CONV2D_LAYOUTS \
                and not self.patch_channels:  # (patchify.py stores NHWC itself, its epilogue whole)
            return "conv2d_layout"
        if self.op == "matmul" and self.batch > 1:
            return "batch_matmul"
        return self.op

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the model operator (no padding; a pool has none)."""
        if self.op == "pool":
            return 0
        if self.op == "matmul":
            m, n, k = self.gemm_extents
            return self.batch * m * n * k
        n, f, oh, ow = self.output_shape
        _, c, kh, kw = self.rhs_shape
        return n * f * oh * ow * c * kh * kw


@dataclasses.dataclass(frozen=True)
class Tiling:
    """Scratchpad tile sizes and the padded extents a kernel iterates over (whole tiles, so that
    every inner tile can be tensorized). What they mean per family, and how each searches them
    against the hardware and the cost model, is in that family's module (gemm.py for matmul and
    conv2d, depthwise.py, pool.py, eltwise.py)."""

    tm: int  # rows of a scratchpad tile (PE-array folds of it run back to back)
    tn: int  # columns of a scratchpad tile (a multiple of the PE array's columns)
    tk: int  # reduction depth of a scratchpad tile
    mp: int  # padded extents: whole tiles
    np: int
    kp: int
    tw: int = 0  # depthwise with a symbolic width, pool with a symbolic height and width: output columns of a tile (0: the whole width); attention: 1 if its mask is held whole
    #: GEMM-shaped kernels: the epilogue's smooth activation (sigmoid, SiLU, GELU's tanh form) runs as
    #: one VFUNC through the chip's function unit instead of FABRIC bodies (gemm/epilogue_tail.py)
    act_on_vector: bool = False
    #: GEMM-shaped kernels: rows of the EPILOGUE commands and stores an output tile is finished in
    #: (0: the whole tile at once; gemm.py's epilogue pieces)
    epilogue_rows: int = 0
    #: GEMM-shaped kernels: A's row panel (tm x the whole depth) is loaded one reduction step at a
    #: time during the first column tile and held for the others (lower/stream_panel.py)
    stream_panel: bool = False
    #: GEMM-shaped kernels: copies of the operand tiles loaded per reduction step (A's, unless its
    #: panel is held or streamed, and B's): two (double buffered) or three, so that a load whose
    #: round trip is longer than two steps' GEMMs does not wait for the GEMM two steps back
    #: (gemm_copies.py)
    operand_copies: int = 2
    #: GEMM-shaped kernels: the bias is loaded into each accumulator tile before its GEMM and the
    #: activation's VFUNC reads the sum, no EPILOGUE between them (gemm/bias_acc.py)
    bias_in_acc: bool = False
    #: RoPE in a GEMM's epilogue (gemm/rope_epilogue.py): the columns of compact cos / sin tables
    #: (they repeat every that many), loaded once per row tile (lower/held_tables.py); 0: full
    #: tables, a tile of each per output tile
    table_cols: int = 0
    #: GEMM-shaped kernels: rows of each output tile whose GELU (erf form) runs as FABRIC passes on
    #: the PE array, the VFUNC taking the others (gemm/fabric_gelu.py); 0: the VFUNC takes them all
    fabric_gelu_rows: int = 0


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def aligned(nbytes: int) -> int:
    """Bytes a scratchpad buffer of `nbytes` takes, with the code generator's alignment."""
    return round_up(nbytes, ALIGN)
