"""The conv2d family: conv2d in any order of the axes, any stride, padding, dilation and groups.

Stage: partition (its root and its spec) and kernel definition (its TE computes); tiling and
schedule are the GEMM's (gemm.py, gemm_schedule.py). A conv2d is a GEMM per image: rows are output pixels
p = y * OW + ox (whole output rows per tile; whole columns, p = x * OH + y, for an NCHW image
wider than tall or of symbolic width: KernelSpec.pixel_order), columns output channels f, and the reduction runs
over (ry, rx, c), the left operand gathered by a strided DMA box. A grouped conv2d is the same
kernel over N * G images of C / G channels, a view of the data. NCHW / OIHW / NCHW kernels use
`conv2d_compute`; other layouts (NHWC data, HWIO or OHWI weights, ...) gather their operands from
where the layout keeps them and store the output through a layout transform
(`conv2d_layout_compute`). A depthwise conv2d (groups == C == F) becomes the DEPTHWISE family's
kernel (depthwise.py): its spec reader is this one.
"""

from __future__ import annotations

from tvm import s_tir, sym, te, tirx
from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of
from .residual_lhs import lhs_as_residual
from .epilogue import (HALF_FLOATS, Root, epilogue_compute, epilogue_fields, epilogue_operands, static_shape,
                       with_epilogue_tail)
from ..common.dynamic import GATHERS, BLOCKS, batch_extent, read_shape, spatial_extents, symbols_of, with_vars
from ..family import OpFamily
from .gemm import choose_gemm_tiling
from .gemm_schedule import schedule_gemm
from .patchify import patchify_compute
from ..common.operands import kernel_prim_func, logical, padded, stored
from ..common.spec import CONV2D_LAYOUTS, KernelSpec, Tiling


def _roots() -> list[Root]:
    lhs, rhs = wildcard(), wildcard()
    padded_lhs, padded_rhs = wildcard(), wildcard()
    pad = is_op("relax.nn.pad")(padded_lhs)
    return [Root("conv2d", is_op("relax.nn.conv2d")(lhs, rhs), {"lhs": lhs, "rhs": rhs}),
            Root("conv2d_pad", is_op("relax.nn.conv2d")(pad, padded_rhs),
                 {"lhs": padded_lhs, "rhs": padded_rhs, "pad": pad})]


def _explicit_padding(annotated: dict, padding: tuple) -> tuple:
    """(padding, pad_lowest) of a conv2d whose input an explicit pad of the int8 dtype's lowest
    value (-128) makes larger (conv2d(pad(x, -128)): a QDQ layer whose input zero point is -128,
    normalise/qdq.py): the DMA's halo holds that value instead (DMA_FILL_LOWEST). Without a pad,
    `padding` as it is."""
    if "pad" not in annotated:
        return padding, False
    attrs = annotated["pad"].attrs
    widths = [int(w) for w in attrs.pad_width]
    dtype = dtype_of(annotated["lhs"])
    if str(attrs.pad_mode) != "constant" or dtype != "int8" or float(attrs.pad_value) != -128.0 \
            or len(widths) != 8 or any(widths[:4]) or any(padding):
        raise UnsupportedOperator(f"conv2d of a pad ({attrs.pad_mode}, value {attrs.pad_value}, widths {widths}) of "
                                  f"{dtype}: the kernel pads an int8 image's height and width with -128 (its "
                                  "DMA's lowest-value halo) in a conv2d without padding of its own; the pad runs "
                                  "on the host")
    top, bottom, left, right = widths[4:]
    return (top, left, bottom, right), True


def conv2d_spec(name: str, annotated: dict) -> KernelSpec:
    """The kernel a matched conv2d chain becomes (op "depthwise" for one input channel per
    output channel); raises UnsupportedOperator with the reason it cannot run on the NPU."""
    common = epilogue_fields("conv2d", annotated)
    attrs = annotated["root"].attrs
    data_layout, kernel_layout, out_layout = _layouts(attrs)
    # The batch, and the height or the width, may be symbolic: one kernel for every size
    # (kernels/common/dynamic.py).
    stored_data, data_symbols = read_shape(annotated["lhs"], "data", expressions=True,
                                           symbolic_axes=tuple(data_layout.index(a) for a in "NHW"))
    # The output's symbolic axes as Relax writes them (a residual added to it has the same).
    _, out_symbols = read_shape(annotated["root"], "output", expressions=True,
                                symbolic_axes=tuple(out_layout.index(a) for a in "NHW"))
    data_shape = logical(stored_data, data_layout, "NCHW")
    weight_shape = logical(static_shape(annotated["rhs"], "weight"), kernel_layout, "OIHW")
    groups = int(attrs.groups)
    if data_shape[1] % groups or weight_shape[0] % groups or weight_shape[1] * groups != data_shape[1]:
        raise UnsupportedOperator(f"conv2d with groups={groups} on {data_shape[1]} input channels and weights "
                                  f"{weight_shape}: each group must take C / groups input channels")
    padding = tuple(int(p) for p in attrs.padding)
    padding, pad_lowest = _explicit_padding(annotated, padding * 2 if len(padding) == 2 else padding)
    # One input channel per output channel: the sliding-window DEPTHWISE kernel, not a GEMM
    # one column wide. (A channel multiplier > 1 runs as a grouped GEMM.)
    op = "depthwise" if 1 < groups == data_shape[1] == weight_shape[0] else "conv2d"
    if op == "depthwise" and common["dtype"] == "int16":
        raise UnsupportedOperator("an int16 depthwise conv2d runs on the host: the PE array's 16x8 mode is a "
                                  "GEMM's, DEPTHWISE has none")
    if op == "depthwise" and common["dtype"] in HALF_FLOATS:
        raise UnsupportedOperator(f"a {common['dtype']} depthwise conv2d runs on the host: the NPU's depthwise "
                                  "kernel computes float32 and int8")
    spec = KernelSpec(op, lhs_shape=data_shape, rhs_shape=weight_shape,
                      strides=tuple(int(s) for s in attrs.strides), padding=padding,
                      dilation=tuple(int(d) for d in attrs.dilation), groups=groups,
                      data_layout=data_layout, kernel_layout=kernel_layout, out_layout=out_layout,
                      pad_lowest=pad_lowest, symbols=symbols_of("lhs", data_symbols) + symbols_of("out", out_symbols), **common)
    _check_symbolic_image(spec)
    _check_bias(common["bias_shape"], weight_shape[0], out_layout)
    return with_epilogue_tail(spec, annotated, name)


def _check_symbolic_image(spec: KernelSpec) -> None:
    """A symbolic height and / or width, of an NCHW, ungrouped conv2d (its tiles are whole output
    rows, whole output columns when the width is symbolic, or blocks of rows and columns when both
    are, so the scratchpad footprint does not depend on the symbolic extents) or of a depthwise
    conv2d (tiles of rows by columns, depthwise.py)."""
    names = spec.symbolic("lhs")
    spatial = {axis: names[spec.data_layout.index(axis)] for axis in "HW" if spec.data_layout.index(axis) in names}
    if not spatial:
        return
    what = " and ".join(f"{axis} ({name})" for axis, name in spatial.items())
    if spec.op == "depthwise":
        return  # tiles of rows x columns x channels (depthwise.py), any layout
    if spec.groups > 1 or spec.compute_name != "conv2d":
        form = f"grouped (groups={spec.groups})" if spec.groups > 1 else f"{spec.data_layout}/{spec.kernel_layout}"
        raise UnsupportedOperator(f"{form} conv2d with a symbolic {what}: the NPU kernel takes a symbolic "
                                  "image size on NCHW/OIHW conv2d without groups and on depthwise conv2d (a "
                                  "symbolic batch works for every conv2d)")


def _check_bias(bias_shape, channels: int, out_layout: str) -> None:
    """A bias is one value per output channel, broadcast along the output's channel axis."""
    if bias_shape is None:
        return
    aligned = (1,) * (4 - len(bias_shape)) + tuple(bias_shape)
    axis = out_layout.index("C")
    expected = tuple(channels if a == axis else 1 for a in range(4))
    if len(bias_shape) > 4 or aligned != expected:
        raise UnsupportedOperator(f"the bias of shape {bias_shape} is not one value per output channel "
                                  f"(expected {expected} or {expected[axis:]} for {out_layout} output)")


def _layouts(attrs) -> tuple[str, str, str]:
    """(data, kernel, out) layouts of a conv2d, if the NPU kernels can gather and store them:
    any order of the four axes (NHWC, HWIO, OHWI, ...), not blocked layouts such as NCHW4c."""
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    for layout, axes, what in zip(layouts, ("NCHW", "OIHW", "NCHW"), ("data", "kernel", "out")):
        if sorted(layout) != sorted(axes):
            raise UnsupportedOperator(f"conv2d {what} layout {layout}: the NPU kernel takes an order of the axes "
                                      f"{axes} (e.g. NCHW or NHWC data, OIHW, HWIO or OHWI weights), not a "
                                      "blocked layout")
    if int(attrs.groups) > 1 and 0 in (layouts[0].index("C"), layouts[2].index("C")):
        raise UnsupportedOperator(f"grouped conv2d with layouts {layouts}: the NPU kernel reads one group's "
                                  "channels as a view and needs an axis stored before C (use NCHW or NHWC)")
    return layouts


def conv2d_compute(spec: KernelSpec, tiling: Tiling):
    """NCHW/OIHW conv2d as one GEMM per image (`conv2d_layout_compute` for other layouts).

    A grouped conv2d is the same kernel over N * G images of C / G channels (a view of the
    data), image b using the weights and bias of group b % G; the padding of the reduction then
    stays inside its group (it reads the view's zero halo, never the next group's channels)."""
    if spec.patch_channels:  # non-overlapping patches: a kernel row's depth per GEMM
        return patchify_compute(spec, tiling, _pixel_order)
    if (spec.data_layout, spec.kernel_layout, spec.out_layout) != CONV2D_LAYOUTS:
        return conv2d_layout_compute(spec, tiling)
    if spec.pixel_order == "blocks":
        return _blocks_compute(spec, tiling)
    _, _, kh, kw = spec.rhs_shape
    data_shape, out_shape = spec.grouped_shapes
    batch, g = batch_extent(spec), spec.groups
    oh, ow = spatial_extents(spec)
    data_shape = with_vars((batch * g,) + data_shape[1:], {a: n for a, n in spec.symbolic("lhs").items() if a})
    out_shape = (batch * g, out_shape[1], oh, ow)
    images, per_group = out_shape[:2]
    x = te.placeholder(data_shape, spec.dtype, name="data")
    w = te.placeholder(spec.rhs_shape, spec.rhs_dtype, name="weight")
    pixel, pixel_row = _pixel_order(spec, oh, ow)
    mp = _padded_rows(oh * ow, tiling) if spec.symbolic_image else tiling.mp
    a_pad = _gather(spec, tiling, lambda b_, c, y, x_: padded(x, data_shape, (b_, c, y, x_), spec.image_fill),
                    images, pixel, mp)
    if spec.groups > 1:
        b_pad = te.compute((images, kh, kw, tiling.kp, tiling.np), lambda b_, ry, rx, c, f: padded(
            w, spec.rhs_shape, (b_ % spec.groups * per_group + f, c, ry, rx)), name="b_pad")

        def weight(b_, ry, rx, rc, f):
            return b_pad[b_, ry, rx, rc, f]
    else:
        b_pad = te.compute((kh, kw, tiling.kp, tiling.np), lambda ry, rx, c, f: padded(
            w, spec.rhs_shape, (f, c, ry, rx)), name="b_pad")

        def weight(b_, ry, rx, rc, f):
            return b_pad[ry, rx, rc, f]
    acc = _accumulate(spec, tiling, a_pad, weight, images, mp)
    operands = lhs_as_residual(spec, epilogue_operands(spec, out_shape), x)  # relu(conv(x) + x): residual_lhs.py
    epi = epilogue_compute(spec, acc, tiling, operands, out_index=lambda b_, p, f: (b_, f, *pixel(p)))
    out = te.compute(out_shape, lambda b_, f, y, ox: epi[b_, pixel_row(y, ox), f], name="out")
    logical_out = (batch,) + tuple(spec.output_shape[1:])
    views = {"lhs": (batch,) + tuple(spec.lhs_shape[1:]), "out": logical_out, "residual": logical_out} \
        if spec.groups > 1 else {}
    func = kernel_prim_func(spec, {"lhs": x, "rhs": w, **operands}, out, views)
    if not spec.symbolic_image:
        return func
    axis = spec.data_layout.index("W" if spec.pixel_order == "xy" else "H")  # the symbolic one
    return func.with_attr(GATHERS, {"data": [[axis, 1, spec.row_step, 0]]})



def _blocks_compute(spec: KernelSpec, tiling: Tiling):
    """conv2d_compute for a symbolic height and width: the output in blocks of ty x tx pixels
    (tx = spec.row_step, ty = tm / tx), a GEMM tile per block. acc, epi: (image, block row,
    block column, pixel of the block, channel), so no index divides by a symbolic extent; the
    blocks past the image's last row or column are partly outside it: lowering cuts their
    commands and boxes to the pixels inside (lower/ragged.py)."""
    _, _, kh, kw = spec.rhs_shape
    _, channels, _, _ = spec.lhs_shape
    batch = batch_extent(spec)
    oh, ow = spatial_extents(spec)
    tx = spec.row_step
    ty = tiling.tm // tx
    blocks = tuple(sym.Analyzer().simplify(tirx.ceildiv(extent, step))
                   for extent, step in ((oh, ty), (ow, tx)))
    data_shape = with_vars((batch,) + tuple(spec.lhs_shape[1:]), {a: n for a, n in spec.symbolic("lhs").items() if a})
    out_shape = (batch, spec.output_shape[1], oh, ow)
    x = te.placeholder(data_shape, spec.dtype, name="data")
    w = te.placeholder(spec.rhs_shape, spec.rhs_dtype, name="weight")
    top, left, _, _ = spec.padding
    (sh, sw), (dh, dw) = spec.strides, spec.dilation
    a_pad = te.compute((batch, kh, kw, *blocks, tiling.tm, tiling.kp), lambda b_, ry, rx, by, bx, p, c: padded(
        x, data_shape, (b_, c, (by * ty + p // tx) * sh + ry * dh - top, (bx * tx + p % tx) * sw + rx * dw - left),
        spec.image_fill), name="a_pad")
    b_pad = te.compute((kh, kw, tiling.kp, tiling.np), lambda ry, rx, c, f: padded(
        w, spec.rhs_shape, (f, c, ry, rx)), name="b_pad")
    ry, rx = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, kw), name="rx")
    rc = te.reduce_axis((0, tiling.kp), name="rc")
    acc = te.compute((batch, *blocks, tiling.tm, tiling.np), lambda b_, by, bx, p, f: te.sum(
        a_pad[b_, ry, rx, by, bx, p, rc].astype(spec.acc_dtype) * b_pad[ry, rx, rc, f].astype(spec.acc_dtype),
        axis=[ry, rx, rc]), name="acc")
    operands = epilogue_operands(spec, out_shape)
    epi = epilogue_compute(spec, acc, tiling, operands, out_index=lambda b_, by, bx, p, f: (
        b_, f, by * ty + p // tx, bx * tx + p % tx))
    out = te.compute(out_shape, lambda b_, f, y, x_: epi[b_, y // ty, x_ // tx, y % ty * tx + x_ % tx, f], name="out")
    del channels
    func = kernel_prim_func(spec, {"lhs": x, "rhs": w, **operands}, out)
    # The blocks past the image's last row or column are cut to the pixels that exist: the
    # boxes moving the image (its height by the block-row loop, level 0, its width by the
    # block-column loop, level 1) and the commands' rows; lower/ragged.py packs a cut block's
    # pixels row by row, so they stay a prefix of the tile.
    cuts = [[2, 1, 1, 0, 0], [3, 1, 1, 0, 1]]
    return func.with_attr(GATHERS, {"data": cuts, "residual": cuts, "out": cuts}).with_attr(BLOCKS, tx)


def _padded_rows(rows, tiling: Tiling):
    """Whole row tiles covering a symbolic number of GEMM rows, at least one tile: max(.., 1)
    tells TVM's analyzer what it cannot know of a variable (a tensor the kernel runs on is not
    empty), and the regions of the output store then simplify to whole tiles."""
    return sym.Analyzer().simplify(tirx.ceildiv(tirx.max(rows, 1), tiling.tm) * tiling.tm)


def _pixel_order(spec: KernelSpec, oh, ow):
    """(pixel(p) -> (y, x), row(y, x) -> p): which output pixel GEMM row p computes. Rows run
    along output rows (p = y * OW + x), or along output columns (p = x * OH + y) when the width
    is symbolic (a tile of whole columns has the same size whatever the width) or larger than
    the height (a tile steps by the shorter side)."""
    if spec.pixel_order == "xy":
        return (lambda p: (p % oh, p // oh)), (lambda y, x: x * oh + y)
    return (lambda p: (p // ow, p % ow)), (lambda y, x: y * ow + x)


def _gather(spec: KernelSpec, tiling: Tiling, data, images: int, pixel, mp=None):
    """a_pad: the left operand for one (image, ry, rx): row p gathers output pixel `pixel(p)`
    through `data(image, channel, y, x)` (zero outside the image)."""
    _, _, kh, kw = spec.rhs_shape
    top, left, _, _ = spec.padding
    (sh, sw), (dh, dw) = spec.strides, spec.dilation

    def value(b_, ry, rx, p, c):
        y, x_ = pixel(p)
        return data(b_, c, y * sh + ry * dh - top, x_ * sw + rx * dw - left)
    return te.compute((images, kh, kw, tiling.mp if mp is None else mp, tiling.kp), value, name="a_pad")


def _accumulate(spec: KernelSpec, tiling: Tiling, a_pad, weight, images: int, mp=None):
    """acc[b, p, f] = sum over (ry, rx, c) of a_pad * weight, in the accumulator dtype."""
    _, _, kh, kw = spec.rhs_shape
    ry, rx = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, kw), name="rx")
    rc = te.reduce_axis((0, tiling.kp), name="rc")
    return te.compute((images, tiling.mp if mp is None else mp, tiling.np), lambda b_, p, f: te.sum(
        a_pad[b_, ry, rx, p, rc].astype(spec.acc_dtype) * weight(b_, ry, rx, rc, f).astype(spec.acc_dtype),
        axis=[ry, rx, rc]), name="acc")


def group_view(logical_values, layout: str, groups: int, group=None) -> tuple:
    """An (N, C, H, W) shape (group None) or index stored in `layout`, each group's channels a
    tensor of their own: the group joins the axis stored just before C, as a * G + g. The view
    stays compact, and a bound test of the joined axis is one of a (0 <= a*G + g < A*G iff
    0 <= a < A), so the DMA halo of a padded axis still zero-fills exactly the padding."""
    values = list(stored(logical_values, "NCHW", layout))
    if groups > 1:
        channel = layout.index("C")
        if group is None:
            values[channel] //= groups
            values[channel - 1] *= groups
        else:
            values[channel - 1] = values[channel - 1] * groups + group
    return tuple(values)


def conv2d_layout_compute(spec: KernelSpec, tiling: Tiling):
    """conv2d in any layout: the GEMM of `conv2d_compute`, its operands gathered from where their
    layouts keep them. The output is computed in conv2d_compute's order and moved to its layout
    by a layout transform of the output buffer (a store has no bound test to keep in shape)."""
    _, _, kh, kw = spec.rhs_shape
    g, batch = spec.groups, batch_extent(spec)
    _, (_, per_group, oh, ow) = spec.grouped_shapes
    images, logical_data = batch * g, (batch,) + tuple(spec.lhs_shape[1:])
    data_shape = group_view(logical_data, spec.data_layout, g)
    weight_shape = stored(spec.rhs_shape, "OIHW", spec.kernel_layout)
    x = te.placeholder(data_shape, spec.dtype, name="data")
    w = te.placeholder(weight_shape, spec.dtype, name="weight")

    def image(b_):  # image b_ is group b_ % G of batch element b_ // G
        return (b_ // g, b_ % g) if g > 1 else (b_, 0)

    def data(b_, c, y, x_):
        n, group = image(b_)
        return padded(x, data_shape, group_view((n, c, y, x_), spec.data_layout, g, group), spec.image_fill)

    a_pad = _gather(spec, tiling, data, images, _pixel_order(spec, oh, ow)[0])
    b_pad = te.compute((images if g > 1 else 1, kh, kw, tiling.kp, tiling.np), lambda b_, ry, rx, c, f: padded(
        w, weight_shape, stored((image(b_)[1] * per_group + f if g > 1 else f, c, ry, rx), "OIHW",
                                spec.kernel_layout)), name="b_pad")
    acc = _accumulate(spec, tiling, a_pad, lambda b_, ry, rx, rc, f: b_pad[b_ if g > 1 else 0, ry, rx, rc, f],
                      images)
    operands = epilogue_operands(spec, ())
    epi = epilogue_compute(spec, acc, tiling, operands)
    out = te.compute((images, per_group, oh, ow), lambda b_, f, y, ox: epi[b_, y * ow + ox, f], name="out")
    views = {"lhs": stored(logical_data, "NCHW", spec.data_layout),
             "out": stored((batch,) + tuple(spec.output_shape[1:]), "NCHW", spec.out_layout)} if g > 1 else {}
    func = kernel_prim_func(spec, {"lhs": x, "rhs": w, **operands}, out, views)
    sch = s_tir.Schedule(func)
    sch.transform_layout(sch.get_sblock("out"), ("write", 0), lambda b_, f, y, ox: group_view(
        (image(b_)[0], f, y, ox), spec.out_layout, g, image(b_)[1]))
    return sch.mod["main"]


CONV2D = OpFamily(
    name="conv2d", ops=("conv2d",), roots=_roots, spec_from_match=conv2d_spec,
    choose_tiling=choose_gemm_tiling, compute=conv2d_compute, schedule=schedule_gemm,
    host_ops={"relax.nn.conv2d": "cgra.conv2d"}, checks_pe_dtype=True)
