"""The inverted-residual family: MobileNetV2's block (1x1 expansion -> depthwise -> 1x1 projection) as one kernel.

Stage: partition (the block's patterns and its spec), kernel definition and schedule; the tile
search is inverted_residual_tiles.py, and the depthwise -> projection part is separable.py's. A
block runs an expansion 1x1 conv2d [+ bias] [relu | clip] to several times its input's
channels, a depthwise conv2d [+ bias] [relu | clip] and a projection 1x1 conv2d [+ bias]
[+ residual, or the block's input x] [relu | clip]. The separable kernel keeps the depthwise's
output in the scratchpad, but the expansion's output, the block's widest tensor, still goes to
DRAM and back. Here it never leaves the scratchpad: per tile of `tm` output rows (the whole
width) the kernel loads the input's window (the depthwise's halo rows, every input channel)
once, and per block of `tk` expanded channels runs, for each window row, a GEMM of the input row
against the expansion weights and its EPILOGUE into the depthwise's window, then the separable
kernel's DEPTHWISE, EPILOGUE and projection GEMMs, accumulating over the blocks; the
projection's EPILOGUE and the store end the tile. Neighbouring tiles recompute the expansion of
the halo rows (the tile search prices that).

The image border: the depthwise's zero padding must be 0 in the *expanded* tensor, where the
expansion's epilogue gives act(0 + bias). Columns: the window is `if_then_else(column inside
the image, epilogue, 0)`, which s_tir's decompose_padding splits into a FILL of each window row
and the EPILOGUE of its pixels inside the image (static with whole-width tiles);
lower/trim_fills.py cuts the FILL to the padding columns. Rows: whether a window row lies
outside depends on the tile as well (decompose_padding takes conditions on one iterator, and
tensorize needs each tile's window as its own, so that iterators stay bijective), so a row
outside reads its bias from the second row of the bias buffer, the dtype's lowest value (one
DMA, DMA_FILL_LOWEST), and the EPILOGUE's relu or clip at 0 makes it 0 (its GEMM reads the input
window's zero halo). An expansion with a bias must therefore end in relu or clip(0, hi) when the
depthwise pads rows, one without a bias have act(0) = 0; otherwise the check says why. No mask
operand (the EPILOGUE streams only its accumulator), no constant channel in the GEMM's depth.

Fused only for float32 NCHW / OIHW static shapes, an expansion that is a 1x1 conv2d with stride
1, no padding and no groups, and a tile that fits the scratchpad whose estimate beats the
expansion's own kernel plus the separable pair (inverted_residual_tiles.py); otherwise the check
gives the reason and the block runs as before.
"""

from __future__ import annotations

import dataclasses

from tvm import te, tirx
from tvm.relax.dpl import is_op, wildcard

from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of
from ..gemm.conv2d import conv2d_spec
from ..gemm.channel_rows import channel_axis
from ..family import OpFamily
from ..gemm.gemm_schedule import loops_after
from ..intrinsics import SPAD, get_intrin
from ..intrinsics.vector_unit import activation, lowest_value
from .inverted_residual_tiles import (SINGLE, choose_inverted_residual_tiling, column_padding, expand_depth,
                                      expanded_columns, pads_rows, window_rows)
from ..common.operands import in_bounds, padded, prim_func
from .separable import (SeparableSpec, channel_bias_row, depthwise_pointwise, pair_patterns, read_pair, stage_pair,
                        tensorize_pair, window_shape)
from .separable_tiles import window_stride
from ..common.spad_layout import a_row_stride, align_rows
from ..common.spec import CONV2D_LAYOUTS, SINGLE_BUFFERED, KernelSpec, Tiling


@dataclasses.dataclass(frozen=True)
class InvertedResidualSpec:
    """A 1x1 conv2d with its epilogue, then a depthwise conv2d and a 1x1 conv2d with theirs."""

    expand: KernelSpec  # op "conv2d", 1x1: data, weights, [bias], [relu | clip]
    pair: SeparableSpec  # the depthwise (its data: the expansion's output) and the projection
    shortcut: bool = False  # the projection's residual is the block's input (x + f(x))
    source_ops: tuple = ()
    param_roles: tuple = ()  # lhs, ex_rhs, [ex_bias], dw_rhs, [dw_bias], rhs, [bias], [residual]
    op = compute_name = "inverted_residual"
    symbolic_image = False
    dtype = property(lambda self: self.expand.dtype)
    acc_dtype = property(lambda self: self.expand.acc_dtype)
    output_shape = property(lambda self: self.pair.output_shape)
    macs = property(lambda self: self.expand.macs + self.pair.macs)

    @property
    def roles(self) -> tuple:
        pair = self.pair
        return self.param_roles or (("lhs", "ex_rhs") + (("ex_bias",) if self.expand.bias_shape else ())
                                    + ("dw_rhs",) + (("dw_bias",) if pair.depthwise.bias_shape else ())
                                    + ("rhs",) + (("bias",) if pair.pointwise.bias_shape else ())
                                    + (("residual",) if pair.pointwise.residual_shape and not self.shortcut
                                       else ()))


# ------------------------------------------------------------------ partition

def _triples() -> list:
    """(name, pattern, roles): conv2d(x, ex_w) [+ ex_bias] [relu | clip] feeding separable.py's
    pair patterns, whose shortcut is x (the expansion's optional ops are alternatives inside one
    pattern, as the depthwise's are)."""
    x, weights, bias = wildcard(), wildcard(), wildcard()
    conv = is_op("relax.nn.conv2d")(x, weights)
    value = conv | is_op("relax.add")(conv, bias)
    relu = is_op("relax.nn.relu")(value)
    clip = is_op("relax.clip")(value, wildcard(), wildcard())
    roles = {"lhs": x, "ex_rhs": weights, "ex_bias": bias, "ex_root": conv, "ex_relu": relu, "ex_clip": clip}
    return pair_patterns("inverted_residual", x, relu | clip | value, roles)


def inverted_residual_spec(name: str, annotated: dict) -> InvertedResidualSpec:
    """The kernel a matched expansion -> depthwise -> projection becomes; raises
    UnsupportedOperator with the reason the block stays the expansion's kernel and the pair."""
    del name
    dtype = dtype_of(annotated["lhs"])
    if dtype != "float32":
        raise UnsupportedOperator(f"a {dtype} inverted-residual block stays its convs' kernels (each "
                                  "accumulator would need requantising before the next conv); float32 blocks fuse")
    renamed = {"lhs": "lhs", "ex_root": "root", "ex_rhs": "rhs", "ex_bias": "bias", "ex_relu": "relu",
               "ex_clip": "clip"}
    expand = conv2d_spec("cgra.conv2d", {ours: annotated[role] for role, ours in renamed.items() if role in annotated})
    depthwise, pointwise = read_pair(annotated, annotated["dw_root"].args[0])
    _check_expand(expand, depthwise)
    return InvertedResidualSpec(expand, SeparableSpec(depthwise, pointwise), shortcut="shortcut" in annotated)


def _check_expand(expand: KernelSpec, depthwise: KernelSpec) -> None:
    """What the fused kernel computes of the expansion: refuse the rest with the reason."""
    what = f"conv2d {expand.rhs_shape} on {expand.lhs_shape} -> depthwise conv2d {depthwise.rhs_shape}"
    _, _, kh, kw = expand.rhs_shape
    if (kh, kw) != (1, 1) or expand.groups != 1 or expand.strides != (1, 1) or any(expand.padding) or \
            expand.op != "conv2d":
        raise UnsupportedOperator(f"{what}: the expansion is not a 1x1 conv2d (stride 1, no padding, no groups); "
                                  "it stays its own kernel")
    if (expand.data_layout, expand.kernel_layout, expand.out_layout) != CONV2D_LAYOUTS:
        raise UnsupportedOperator(f"{what}: layouts {expand.data_layout}/{expand.kernel_layout}/{expand.out_layout}; "
                                  "the fused kernel takes NCHW/OIHW only")
    if expand.symbols:
        raise UnsupportedOperator(f"{what}: a symbolic size; the fused kernel takes static shapes")
    if expand.fabric_body or expand.scale_shape or expand.residual_shape:
        raise UnsupportedOperator(f"{what}: an elementwise chain, a requantisation or a residual add after the "
                                  "expansion")
    border = _activate(float("-inf") if expand.bias_shape else 0.0, expand)
    if border != 0.0 and pads_rows(depthwise):
        reason = "a bias, and no relu or clip at 0 after it" if expand.bias_shape else \
            "an activation of 0 that is not 0"
        raise UnsupportedOperator(f"{what}: the expansion's epilogue has {reason}, so in the depthwise's padding "
                                  f"rows it would give {border}, not 0 (the kernel zeroes them through the "
                                  "epilogue's activation, with a bias of the dtype's lowest value there); the "
                                  "expansion stays its own kernel")


def _activate(value: float, spec: KernelSpec) -> float:
    """`spec`'s relu, then clip, of `value` (the EPILOGUE's activation, in Python floats)."""
    value = max(value, 0.0) if spec.relu else value
    return min(max(value, spec.clip[0]), spec.clip[1]) if spec.clip is not None else value


# ------------------------------------------------------------------ kernel definition

def inverted_residual_compute(spec: InvertedResidualSpec, tiling: Tiling):
    """out = the pair's (separable.depthwise_pointwise) over the window ex_epi[b, t, r, ix, e] of
    output-row tile t, the expansion's output in the depthwise's padded coordinates, zero in its
    padding: tiling.kp expanded channels (zero beyond E). Each tile has its own window (a tile
    axis; tiles overlap by the halo), so that every block's iterators stay bijective in the
    loops tensorize splits. Window row r is image row y = t * tm * sh + r - top:

        ex_epi = act(sum over c of x[b, c, y, ix - left] * ex_w[e, c] + ex_bias[e])   inside the image
                 act(0 + lowest) = 0                             in a row above or below the image
                 0                                                in a column left or right of it

    With a bias, when the depthwise pads rows, a row outside the image reads the second row of
    ex_bias_pad, the dtype's lowest value (its DMA's halo), so that the EPILOGUE's relu or clip
    at 0 makes it 0 (without a bias it is act(0) = 0: _check_expand); the columns outside are
    the if_then_else that schedule_inverted_residual decomposes into FILLs."""
    ex, dw = spec.expand, spec.pair.depthwise
    n, _, h, w = ex.lhs_shape
    depth = expand_depth(ex)
    top, left, _, _ = dw.padding
    step = tiling.tm * dw.strides[0]  # padded rows from one tile's window to the next
    tiles, rows = tiling.mp // tiling.tm, window_rows(spec, tiling.tm)
    x = te.placeholder(ex.lhs_shape, ex.dtype, name="data")
    ex_w = te.placeholder(ex.rhs_shape, ex.dtype, name="ex_weight")
    a_pad = te.compute((n, tiles, rows, w, depth), lambda b_, t, r, x_, c: padded(
        x, ex.lhs_shape, (b_, c, t * step + r - top, x_)), name="ex_a_pad")
    b_pad = te.compute((depth, tiling.kp), lambda c, e: padded(ex_w, ex.rhs_shape, (e, c, 0, 0)), name="ex_b_pad")
    rc = te.reduce_axis((0, depth), name="ex_rc")
    acc = te.compute((n, tiles, rows, w, tiling.kp), lambda b_, t, r, x_, e: te.sum(
        a_pad[b_, t, r, x_, rc] * b_pad[rc, e], axis=[rc]), name="ex_acc")
    ex_bias = te.placeholder(ex.bias_shape, ex.acc_dtype, name="ex_bias") if ex.bias_shape else None
    rows_outside = pads_rows(dw) and ex.bias_shape
    bias_pad = _bias_rows(ex, ex_bias, tiling.kp) if rows_outside else \
        channel_bias_row(ex, ex_bias, tiling.kp, "ex_bias_pad")
    guarded = column_padding(spec, tiling)

    def window_value(b_, t, r, ix, e):
        total = acc[b_, t, r, ix - left, e]
        if rows_outside:
            total = total + bias_pad[_outside(t * step + r - top, h), e]
        elif bias_pad is not None:
            total = total + bias_pad[e]
        value = activation(total, ex.acc_dtype, ex.relu, ex.clip)
        if not guarded:
            return value
        return tirx.if_then_else(in_bounds((ix - left,), (w,)), value, tirx.const(0, ex.acc_dtype))

    window = te.compute((n, tiles, rows, window_shape(dw, tiling)[1], tiling.kp), window_value, name="ex_epi")

    def read(b_, y, iy, ix, c):  # output row y reads padded row iy from its tile's window
        tile = y // tiling.tm
        return window[b_, tile, iy - tile * step, ix, c]

    out, inputs = depthwise_pointwise(spec.pair, tiling, read, x if spec.shortcut else None)
    func = prim_func(spec.roles, {"lhs": x, "ex_rhs": ex_w, "ex_bias": ex_bias, **inputs}, out)
    return func.with_attr(SINGLE_BUFFERED, list(SINGLE))


def _outside(y, h: int):
    """1 if image row y lies outside [0, h), else 0, in min / max: s_tir's region analysis keeps
    it one row of ex_bias_pad (an if_then_else would read as both rows, which the EPILOGUE's bias
    tile does not match)."""
    return tirx.min(1, tirx.max(0, -y)) + tirx.min(1, tirx.max(0, y - (h - 1)))


def _bias_rows(ex: KernelSpec, bias, channels: int):
    """ex_bias_pad[s, e]: row 0 the bias of expanded channel e, row 1 the dtype's lowest value:
    one DMA of the bias whose second row lies past the tensor, in the halo it fills with the
    lowest value (DMA_FILL_LOWEST). The channels past E are that value too, which the
    activation makes 0 (what the padding of a GEMM's depth must be)."""
    carrier, expanded = channel_axis(ex.bias_shape), ex.rhs_shape[0]
    return te.compute((2, channels), lambda s, e: padded(bias, ex.bias_shape, [
        e + s * expanded if axis == carrier else 0 for axis in range(len(ex.bias_shape))],
        fill=lowest_value(ex.acc_dtype)), name="ex_bias_pad")


# ------------------------------------------------------------------ schedule

def schedule_inverted_residual(sch, spec: InvertedResidualSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """The pair's tiles and blocks (separable.stage_pair), the window ex_epi computed per block:
    per window row a FILL of the row (where columns lie outside the image), the GEMM of its
    input row (ex_a_pad, loaded once per tile) against the block's expansion weights into a
    one-row accumulator (ex_acc) and its EPILOGUE into the window's pixels inside the image.
    Unit loops are kept (a one-pixel-wide image's GEMM still tensorizes along its loop)."""
    ex, dw = spec.expand, spec.pair.depthwise
    tile, block_outer, acc = stage_pair(sch, spec.pair, tiling, ())
    window = sch.get_sblock("ex_epi")
    sch.compute_at(window, block_outer, preserve_unit_loops=True)
    sch.set_scope(window, 0, SPAD)
    row, column, _ = loops_after(sch, window, block_outer)[-3:]
    fill = sch.decompose_padding(window, column) if column_padding(spec, tiling) else None
    ex_acc = sch.get_sblock("ex_acc")
    sch.compute_at(ex_acc, row, preserve_unit_loops=True)
    for name, anchor in (("ex_b_pad", block_outer), ("ex_a_pad", tile)):
        block = sch.get_sblock(name)
        sch.compute_at(block, anchor, preserve_unit_loops=True)
        sch.set_scope(block, 0, SPAD)
    sch.set_scope(ex_acc, 0, SPAD)
    if ex.bias_shape:  # loaded once: which of its rows a window row reads depends on the row
        sch.set_scope(sch.get_sblock("ex_bias_pad"), 0, SPAD)
    columns, depth = expanded_columns(spec, tiling), expand_depth(ex)
    ex_init = sch.decompose_reduction(ex_acc, loops_after(sch, ex_acc, row)[0])
    init = sch.decompose_reduction(acc, block_outer)
    itemsize = DType.from_name(ex.dtype).itemsize
    align_rows(sch, sch.get_sblock("ex_a_pad"), depth, a_row_stride(columns, depth, itemsize, arch), ex.dtype, arch)
    if fill is not None:
        sch.tensorize(sch.get_loops(fill)[-2], get_intrin("fill", window_shape(dw, tiling)[1], tiling.tk,
                                                          ex.acc_dtype))
    sch.tensorize(sch.get_loops(ex_init)[-2], get_intrin("fill", columns, tiling.tk, ex.acc_dtype))
    sch.tensorize(sch.get_loops(ex_acc)[-3], get_intrin("gemm", columns, tiling.tk, depth, ex.dtype, ex.acc_dtype))
    sch.tensorize(sch.get_loops(window)[-2], get_intrin("epilogue", columns, tiling.tk, ex.acc_dtype,
                                                        bias=bool(ex.bias_shape), relu=ex.relu, residual=False,
                                                        clip=ex.clip, zero_point=None, body=None))
    # After tensorize (it blockizes X into X_o, dropping an earlier annotation): the window's
    # pixels padded as the DEPTHWISE streams them.
    align_rows(sch, sch.get_sblock("ex_epi_pad_const_o" if fill is not None else "ex_epi_o"), tiling.tk,
               window_stride(dw, tiling.tk, tiling.tw, arch), dw.acc_dtype, arch)
    tensorize_pair(sch, spec.pair, tiling, arch, acc, init)


INVERTED_RESIDUAL = OpFamily(
    name="inverted_residual", ops=("inverted_residual",), pairs=_triples, spec_from_match=inverted_residual_spec,
    choose_tiling=choose_inverted_residual_tiling, compute=inverted_residual_compute,
    schedule=schedule_inverted_residual, checks_pe_dtype=True)
