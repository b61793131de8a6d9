"""The separable family: a depthwise conv2d and the 1x1 conv2d that consumes it, as one kernel.

Stage: partition (the pair's patterns and its spec), kernel definition and schedule; the tile
search is separable_tiles.py. MobileNet-style blocks run a depthwise conv2d [+ bias] [relu |
clip] into a pointwise (1x1) conv2d [+ bias] [+ residual] [relu | clip]. As two kernels the
depthwise output, the block's widest feature map, goes to DRAM and comes back, and the
depthwise kernel waits on the DMA (its PE array is mostly idle). Fused, the depthwise output
tile never leaves the scratchpad: per tile of `tm` output rows the kernel loads, for each block
of `tk` input channels, the input rows with the depthwise halo and the weights, runs one
DEPTHWISE and its EPILOGUE (bias, relu / clip) into a scratchpad buffer, then per output row one
GEMM of that buffer against the pointwise weights (the whole padded output channels, `tn`),
accumulating over the channel blocks; the pointwise EPILOGUE and the store end the tile.

The pair is fused only when the chip can run it: float32 (an int8 depthwise output would need
requantising before the pointwise GEMM, which this kernel does not do), NCHW / OIHW layouts,
static shapes, a 1x1 pointwise conv2d with stride 1, no padding and no groups, and a tile whose
working set fits the scratchpad (separable_tiles.py). Otherwise the check gives the reason and
the two convs stay two kernels, as they were.
"""

from __future__ import annotations

import dataclasses

from tvm import te
from tvm.relax.dpl import is_op, wildcard

from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of
from ..gemm.conv2d import conv2d_spec
from ..gemm.channel_rows import channel_axis
from ..gemm.epilogue import Root, chain_pattern_graphs, epilogue_compute, epilogue_intrin, epilogue_operands
from ..family import OpFamily
from ..gemm.gemm_schedule import loops_after
from ..intrinsics import SPAD, get_intrin
from ..intrinsics.pe_array import window_extent, window_sum
from ..intrinsics.vector_unit import activation
from ..common.operands import padded, prim_func
from .separable_tiles import (choose_separable_tiling, dw_row_stride, out_pixel_stride, padded_columns,
                              window_shortcut, window_stride)
from ..common.spad_layout import align_rows
from ..common.spec import CONV2D_LAYOUTS, KernelSpec, Tiling


@dataclasses.dataclass(frozen=True)
class SeparableSpec:
    """A depthwise conv2d with its epilogue, then a 1x1 conv2d with its own, as one kernel."""

    depthwise: KernelSpec  # op "depthwise": data, weights, [bias], [relu | clip]
    pointwise: KernelSpec  # op "conv2d", 1x1: its data is the depthwise's output
    shortcut: bool = False  # the residual the pointwise epilogue adds is the data (x + f(x))
    source_ops: tuple = ()
    param_roles: tuple = ()  # lhs, dw_rhs, [dw_bias], rhs, [bias], [residual], in call order
    op = "separable"
    compute_name = "separable"
    symbolic_image = False
    dtype = property(lambda self: self.depthwise.dtype)
    acc_dtype = property(lambda self: self.depthwise.acc_dtype)
    output_shape = property(lambda self: self.pointwise.output_shape)
    macs = property(lambda self: self.depthwise.macs + self.pointwise.macs)

    @property
    def roles(self) -> tuple:
        return self.param_roles or (("lhs", "dw_rhs") + (("dw_bias",) if self.depthwise.bias_shape else ())
                                    + ("rhs",) + (("bias",) if self.pointwise.bias_shape else ())
                                    + (("residual",) if self.pointwise.residual_shape and not self.shortcut else ()))


# ------------------------------------------------------------------ partition

def _pairs() -> list:
    """The pair's patterns (`pair_patterns`) over any data tensor: the depthwise's input is the
    block's input, the shortcut's x."""
    data = wildcard()
    return pair_patterns("separable", data, data, {"lhs": data})


def pair_patterns(name: str, lhs, data, roles: dict) -> list:
    """(name, pattern, roles): conv2d(data, dw_w) [+ dw_bias] [relu | clip] feeding conv2d(., w)
    with every float32 epilogue chain of epilogue.py after it (no requantisation, no
    elementwise tail), and first the chains whose residual is `lhs`, the block's input
    (`shortcut`: x + pointwise(depthwise(x)), or with an expansion before the depthwise,
    inverted_residual.py). The depthwise's optional ops are alternatives inside one pattern, so
    a chain of the pointwise conv2d is one pattern, not six. `roles`: those of `lhs` and `data`'s
    own pattern."""
    dw_weights, dw_bias, weights = wildcard(), wildcard(), wildcard()
    conv = is_op("relax.nn.conv2d")(data, dw_weights)
    value = conv | is_op("relax.add")(conv, dw_bias)
    relu = is_op("relax.nn.relu")(value)
    clip = is_op("relax.clip")(value, wildcard(), wildcard())
    pointwise = is_op("relax.nn.conv2d")(relu | clip | value, weights)
    roles = {**roles, "dw_rhs": dw_weights, "dw_bias": dw_bias, "dw_root": conv, "dw_relu": relu,
             "dw_clip": clip, "rhs": weights}
    chains = [(pattern_name, pattern, annotations)
              for pattern_name, pattern, annotations, _ in chain_pattern_graphs([Root(name, pointwise, roles)])
              if "requant" not in annotations and not any(role.startswith("n") for role in annotations)]
    return _shortcut_pairs(name, pointwise, lhs, roles) + chains


def _shortcut_pairs(name: str, pointwise, lhs, roles: dict) -> list:
    """The chains pointwise [+ bias] + x [relu | clip], x = `lhs` (role "shortcut": the add),
    the add's operands in either order under one name."""
    bias = wildcard()
    pairs = []
    for suffix, summed, extra in (("_bias", is_op("relax.add")(pointwise, bias), {"bias": bias}),
                                  ("", pointwise, {})):
        for add in (is_op("relax.add")(lhs, summed), is_op("relax.add")(summed, lhs)):
            for act, pattern in (("_relu", is_op("relax.nn.relu")(add)),
                                 ("_clip", is_op("relax.clip")(add, wildcard(), wildcard())), ("", add)):
                activation_role = {act[1:]: pattern} if act else {}
                pairs.append((f"cgra.{name}{suffix}_shortcut{act}", pattern,
                              {"root": pointwise, **roles, **extra, "shortcut": add, **activation_role}))
    return pairs


def separable_spec(name: str, annotated: dict) -> SeparableSpec:
    """The kernel a matched depthwise -> 1x1 conv2d pair becomes; raises UnsupportedOperator
    with the reason the pair stays two kernels."""
    del name
    dtype = dtype_of(annotated["lhs"])
    if dtype != "float32":
        raise UnsupportedOperator(f"a {dtype} depthwise conv2d and the conv2d after it stay two kernels (the "
                                  "depthwise's accumulator would need requantising before the GEMM); float32 "
                                  "pairs fuse")
    depthwise, pointwise = read_pair(annotated, annotated["lhs"])
    return SeparableSpec(depthwise, pointwise, shortcut="shortcut" in annotated)


def read_pair(annotated: dict, data) -> tuple:
    """(depthwise, pointwise) KernelSpecs of a matched pair whose depthwise reads `data`; the
    pointwise's residual is the block's input (role "lhs") when the match has a shortcut.
    Raises UnsupportedOperator for what the fused kernel does not compute."""
    if int(annotated["dw_root"].attrs.groups) == 1:  # before building two specs: most matches are plain convs
        raise UnsupportedOperator("the first conv2d is not depthwise (groups == 1); only a depthwise conv2d fuses "
                                  "with the 1x1 conv2d after it")
    if "residual" in annotated and annotated["residual"].same_as(annotated["lhs"]):
        raise UnsupportedOperator("the residual is the block's input, which the kernel takes as its data: one "
                                  "parameter in two roles (the shortcut patterns fuse that add)")
    renamed = {"dw_root": "root", "dw_rhs": "rhs", "dw_bias": "bias", "dw_relu": "relu", "dw_clip": "clip"}
    depthwise = conv2d_spec("cgra.depthwise", {"lhs": data, **{ours: annotated[role] for role, ours in
                                                              renamed.items() if role in annotated}})
    pointwise_roles = {role: annotated[role] for role in ("root", "rhs", "bias", "residual", "relu", "clip")
                       if role in annotated}
    if "shortcut" in annotated:  # the residual is the block's input
        pointwise_roles["residual"] = annotated["lhs"]
    pointwise = conv2d_spec("cgra.conv2d", {**pointwise_roles, "lhs": annotated["root"].args[0]})
    _check_pair(depthwise, pointwise)
    return depthwise, pointwise


def _check_pair(depthwise: KernelSpec, pointwise: KernelSpec) -> None:
    """What the fused kernel computes: refuse the rest with the reason (they stay two kernels)."""
    what = f"conv2d {depthwise.rhs_shape} on {depthwise.lhs_shape} -> conv2d {pointwise.rhs_shape}"
    if depthwise.op != "depthwise":
        raise UnsupportedOperator(f"{what}: the first conv2d is not depthwise (groups == channels); "
                                  "only a depthwise conv2d fuses with the 1x1 conv2d after it")
    _, _, kh, kw = pointwise.rhs_shape
    if (kh, kw) != (1, 1) or pointwise.groups != 1 or pointwise.strides != (1, 1) or \
            any(pointwise.padding) or pointwise.op != "conv2d":
        raise UnsupportedOperator(f"{what}: the second conv2d is not pointwise (1x1, stride 1, no padding, "
                                  "no groups); the two stay separate kernels")
    for spec in (depthwise, pointwise):
        if (spec.data_layout, spec.kernel_layout, spec.out_layout) != CONV2D_LAYOUTS:
            raise UnsupportedOperator(f"{what}: layouts {spec.data_layout}/{spec.kernel_layout}/"
                                      f"{spec.out_layout}; the fused kernel takes NCHW/OIHW only")
        if spec.symbols:
            raise UnsupportedOperator(f"{what}: a symbolic size; the fused kernel takes static shapes "
                                      "(the two convs run as their own kernels)")
        if spec.fabric_body or spec.scale_shape:
            raise UnsupportedOperator(f"{what}: an elementwise chain or a requantisation after a conv2d")
    if depthwise.residual_shape:
        raise UnsupportedOperator(f"{what}: a residual add between the two convs")


# ------------------------------------------------------------------ kernel definition

def separable_compute(spec: SeparableSpec, tiling: Tiling):
    """out[b, f, y, x] = epilogue(sum over c of dw_epi[b, y, x, c] * w[f, c]), dw_epi being the
    depthwise's epilogued window sum, over whole tiles: tiling.mp output rows, the output width
    in whole tiles of tiling.tw columns, tiling.kp input channels and tiling.np output channels
    (zero beyond C and F)."""
    dw = spec.depthwise
    top, left, _, _ = dw.padding
    x = te.placeholder(dw.lhs_shape, dw.dtype, name="data")
    in_h, in_w = window_shape(dw, tiling)
    a_pad = te.compute((dw.lhs_shape[0], in_h, in_w, tiling.kp), lambda b_, iy, ix, c: padded(
        x, dw.lhs_shape, (b_, c, iy - top, ix - left)), name="dw_a_pad")
    shortcut = (lambda b_, y, ox, f: a_pad[b_, y + top, ox + left, f]) if window_shortcut(spec, tiling) else \
        x if spec.shortcut else None
    out, inputs = depthwise_pointwise(spec, tiling, lambda b_, y, iy, ix, c: a_pad[b_, iy, ix, c], shortcut)
    return prim_func(spec.roles, {"lhs": x, **inputs}, out)


def window_shape(dw: KernelSpec, tiling: Tiling) -> tuple:
    """(rows, columns) of the depthwise's input window over every tile: the padded output rows
    and columns with the window's halo."""
    kh, kw = dw.rhs_shape[2:]
    return (window_extent(tiling.mp, kh, dw.strides[0], dw.dilation[0]),
            window_extent(padded_columns(dw, tiling), kw, dw.strides[1], dw.dilation[1]))


def depthwise_pointwise(spec: SeparableSpec, tiling: Tiling, window, shortcut=None):
    """(out, {role: placeholder}) of the depthwise over its input window, its epilogue, the 1x1
    conv2d and its epilogue, whose residual is `shortcut` when given (the block's input): its
    tensor, or `shortcut(b, y, x, f)` reading it from a scratchpad tile the kernel holds (block
    res_pad, which the schedule inlines). `window(b, y, iy, ix, c)`: the input at padded row iy
    and column ix (zero in the padding), channel c (tiling.kp of them), as output row y reads it."""
    dw, pw = spec.depthwise, spec.pointwise
    n = dw.lhs_shape[0]
    kh, kw = dw.rhs_shape[2:]
    sum_window = (kh, kw, *dw.strides, *dw.dilation)
    rows, width = tiling.mp, padded_columns(dw, tiling)
    dw_w = te.placeholder(dw.rhs_shape, dw.dtype, name="dw_weight")
    w = te.placeholder(pw.rhs_shape, pw.dtype, name="weight")
    b_pad = te.compute((kh, kw, tiling.kp), lambda ry, rx, c: padded(dw_w, dw.rhs_shape, (c, 0, ry, rx)),
                       name="dw_b_pad")
    dw_acc = te.compute((n, rows, width, tiling.kp), lambda b_, y, ox, c: window_sum(
        lambda iy, ix, ch: window(b_, y, iy, ix, ch), lambda ry, rx, ch: b_pad[ry, rx, ch], y, ox, c,
        sum_window, dw.acc_dtype), name="dw_acc")
    dw_bias = te.placeholder(dw.bias_shape, dw.acc_dtype, name="dw_bias") if dw.bias_shape else None
    bias_pad = channel_bias_row(dw, dw_bias, tiling.kp, "dw_bias_pad")
    dw_epi = te.compute(dw_acc.shape, lambda b_, y, ox, c: channel_epilogue(dw, dw_acc[b_, y, ox, c], bias_pad, c),
                        name="dw_epi")
    pw_b = te.compute((tiling.kp, tiling.np), lambda c, f: padded(w, pw.rhs_shape, (f, c, 0, 0)), name="b_pad")
    rc = te.reduce_axis((0, tiling.kp), name="rc")
    acc = te.compute((n, rows, width, tiling.np), lambda b_, y, ox, f: te.sum(
        dw_epi[b_, y, ox, rc] * pw_b[rc, f], axis=[rc]), name="acc")
    operands = epilogue_operands(pw, pw.output_shape)
    in_place = callable(shortcut) and not isinstance(shortcut, te.Tensor)
    if shortcut is not None and not in_place:
        operands["residual"] = shortcut
    epi = epilogue_compute(pw, acc, tiling, operands, out_index=lambda b_, y, ox, f: (b_, f, y, ox),
                           residual_tile=te.compute(acc.shape, shortcut, name="res_pad") if in_place else None)
    out = te.compute(pw.output_shape, lambda b_, f, y, ox: epi[b_, y, ox, f], name="out")
    return out, {"dw_rhs": dw_w, "dw_bias": dw_bias, "rhs": w, **operands}


def channel_bias_row(spec: KernelSpec, bias, channels: int, name: str):
    """The scratchpad row of `channels` a per-channel bias is staged as (block `name`), or None
    without a bias."""
    if bias is None:
        return None
    carrier = channel_axis(spec.bias_shape)
    return te.compute((channels,), lambda c: padded(bias, spec.bias_shape, [
        c if axis == carrier else 0 for axis in range(len(spec.bias_shape))]), name=name)


def channel_epilogue(spec: KernelSpec, total, bias_pad, c):
    """clip(relu(total + bias[c])): the EPILOGUE intrinsic's expression for channel c."""
    total = total + bias_pad[c] if bias_pad is not None else total
    return activation(total, spec.acc_dtype, spec.relu, spec.clip)


# ------------------------------------------------------------------ schedule

def schedule_separable(sch, spec: SeparableSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """Tiles of `tm` output rows x `tw` columns x every output channel. Per tile: the bias row,
    the residual tile, one FILL per row of the accumulator; per block of `tk` input channels the window, the
    depthwise weights and bias and the pointwise weights loaded, one DEPTHWISE and one EPILOGUE
    per row into dw_epi, one GEMM per row; then one EPILOGUE per row and the store."""
    dw = spec.depthwise
    in_window = window_shortcut(spec, tiling)
    if in_window:  # the EPILOGUE reads the residual from the window: once per tile, beside the one block
        sch.compute_inline(sch.get_sblock("res_pad"))
    tile, block_outer, acc = stage_pair(sch, spec, tiling, ("dw_a_pad",), one_block=in_window)
    # One block: the accumulator's FILL per output row, beside its GEMM, which fold_init makes
    # overwrite it (else a FILL per row before the block loop).
    init = sch.decompose_reduction(acc, loops_after(sch, acc, tile)[1] if in_window else block_outer)
    align_rows(sch, sch.get_sblock("dw_a_pad"), tiling.tk, window_stride(dw, tiling.tk, tiling.tw, arch), dw.dtype,
               arch)
    tensorize_pair(sch, spec, tiling, arch, acc, init)


def stage_pair(sch, spec: SeparableSpec, tiling: Tiling, window: tuple, one_block: bool = False) -> tuple:
    """Split the output into tiles and the channels into blocks, and stage the pair's buffers in
    the scratchpad: per tile the accumulator, bias row and residual tile (and the store after
    them), per block the `window` blocks (the depthwise's input, in the order to compute_at
    them), the depthwise's weights, bias, accumulator and output, and the pointwise weights.
    `one_block`: the channels are one block (tiling.tk == tiling.kp), not split; everything is
    per tile. Returns (the tile loop, the block loop (the tile's with one block), the
    accumulator block)."""
    dw, pw = spec.depthwise, spec.pointwise
    epi, acc = sch.get_sblock("epi"), sch.get_sblock("acc")
    _, rows, columns, _ = sch.get_loops(epi)
    row_outer, row_inner = sch.split(rows, [None, tiling.tm])
    column_outer, column_inner = sch.split(columns, [None, tiling.tw])
    sch.reorder(row_outer, column_outer, row_inner, column_inner)
    tile = column_outer
    sch.compute_at(acc, tile)
    staged = (("bias_pad",) if pw.bias_shape else ()) + (("res_pad",) if _has_block(sch, "res_pad") else ())
    for name in staged:
        block = sch.get_sblock(name)
        sch.compute_at(block, tile)
        sch.set_scope(block, 0, SPAD)
    sch.reverse_compute_at(sch.get_sblock("out"), tile)
    block_outer = tile
    if not one_block:
        row, pixel, channel, depth = loops_after(sch, acc, tile)
        block_outer, block_inner = sch.split(depth, [None, tiling.tk])
        sch.reorder(block_outer, row, pixel, channel, block_inner)
    staged = ("dw_epi", "dw_acc") + window + ("dw_b_pad", "b_pad") + (("dw_bias_pad",) if dw.bias_shape else ())
    for name in staged:
        block = sch.get_sblock(name)
        sch.compute_at(block, block_outer)
        sch.set_scope(block, 0, SPAD)
    for block in (acc, epi):
        sch.set_scope(block, 0, SPAD)
    return tile, block_outer, acc


def _has_block(sch, name: str) -> bool:
    try:
        sch.get_sblock(name)
    except Exception:  # noqa: BLE001 (TVM's ScheduleError): inlined, or never there
        return False
    return True


def tensorize_pair(sch, spec: SeparableSpec, tiling: Tiling, arch: HardwareDescription, acc, init) -> None:
    """Each block of the pair onto its command, row by row where a tile's rows are not one
    matrix (the GEMM's rows are one output row's pixels), and the buffers' pixels padded against
    bank conflicts (spad_layout.py)."""
    dw, pw = spec.depthwise, spec.pointwise
    width = tiling.tw
    window = (*dw.rhs_shape[2:], *dw.strides, *dw.dilation)
    sch.tensorize(sch.get_loops(sch.get_sblock("dw_acc"))[-3],
                  get_intrin("depthwise", tiling.tm, width, tiling.tk, window, dw.dtype, dw.acc_dtype))
    sch.tensorize(sch.get_loops(sch.get_sblock("dw_epi"))[-2],
                  get_intrin("epilogue", width, tiling.tk, dw.acc_dtype, bias=bool(dw.bias_shape), relu=dw.relu,
                             residual=False, clip=dw.clip, zero_point=None, body=None))
    sch.tensorize(sch.get_loops(acc)[-3],
                  get_intrin("gemm", width, tiling.np, tiling.tk, pw.dtype, pw.acc_dtype))
    sch.tensorize(sch.get_loops(init)[-2], get_intrin("fill", width, tiling.np, pw.acc_dtype))
    sch.tensorize(sch.get_loops(sch.get_sblock("epi"))[-2], epilogue_intrin(pw, tiling, rows=width))
    # After tensorize, which blockizes a block X into X_o and would drop an earlier annotation.
    itemsize = DType.from_name(dw.acc_dtype).itemsize
    align_rows(sch, sch.get_sblock("dw_epi_o"), tiling.tk, dw_row_stride(width, tiling.tk, itemsize, arch),
               dw.acc_dtype, arch)
    align_rows(sch, sch.get_sblock("epi_o"), tiling.np, out_pixel_stride(pw, tiling.np, arch), pw.acc_dtype, arch)


SEPARABLE = OpFamily(
    name="separable", ops=("separable",), pairs=_pairs, spec_from_match=separable_spec,
    choose_tiling=choose_separable_tiling, compute=separable_compute, schedule=schedule_separable,
    checks_pe_dtype=True)
