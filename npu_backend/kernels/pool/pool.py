"""The pooling family: max_pool2d, avg_pool2d and global average pooling on the vector unit's POOL.

Stage: partition (its patterns and spec), kernel definition and schedule (its tiles and their
search: pool_tiles.py). One Relax call each, no epilogue: relax.nn.max_pool2d, relax.nn.avg_pool2d, relax.nn.adaptive_avg_pool2d to a
1 x 1 output and relax.mean over the two spatial axes (what the ONNX importer makes of
GlobalAveragePool), on any order of the NCHW axes. The kernel's blocks:

    a_pad   the input window in the scratchpad, (N, rows, columns, channels) with the padding
            as the DMA's zero halo: window position (py, px) is input pixel (py - top, px - left)
    acc     the pooled tile, one POOL command per (image, channel tile)
    out     the store back to the host tensor, in its layout

A tile is a whole image by `tn` channels, so whether a tap lies in the padding depends only on
the output's place in the image, known at compile time: the valid rectangle is the image, the
count rectangle the image (count_include_pad=False) or the padded image (True). Ceil mode's last
windows reach past the padded image into more halo, outside both.

With a symbolic image height or width (`symbolic_axes`), a tile is a block of outputs along it:
where the padding lies is then known only at run time, so it is loaded with the window (the DMA
halo: the dtype's lowest value for a max pool, zero for an average that counts the padding) and
every tap along the axis is valid. A static image whose whole window of two channels does not
fit the scratchpad (Tiny YOLOv3's first max pool, 16 x 416 x 416) is cut the same way into blocks
of output rows (`blocked_axes`); its last block computes the rows past the image and does not store
them.
"""

from __future__ import annotations

import dataclasses

from tvm import sym, te, tirx
from tvm.relax.dpl import is_op, wildcard

from cgra_sim.arch import HardwareDescription

from ...errors import UnsupportedOperator
from ...normalise.large_pools import MAX_TAPS
from ...relax_info import dtype_of, holds_condition, shape_dims
from ..common.dynamic import CUT_PARAMS, GATHERS, batch_extent, dim_var, read_shape
from ..family import OpFamily
from .global_pool import choose_global_tiling, global_pool_compute, is_symbolic_global, schedule_global_pool
from ..intrinsics import SPAD, get_intrin
from ..intrinsics.vector_unit import lowest_value, never_valid_taps, pool_value
from ..common.operands import kernel_prim_func, logical, padded, stored
from .pool_tiles import block_sizes, blocked_axes, choose_pool_tiling, pool_window, symbolic_axes, window_extents
from ..common.spec import KernelSpec, PoolAttrs, Tiling

#: Pattern name -> the Relax operator it matches.
POOL_OPS = {
    "cgra.max_pool2d": "relax.nn.max_pool2d",
    "cgra.avg_pool2d": "relax.nn.avg_pool2d",
    "cgra.adaptive_avg_pool2d": "relax.nn.adaptive_avg_pool2d",
    "cgra.mean": "relax.mean",
}
#: Input dtypes per kind: an average of integers would round, which POOL does not do.
POOL_DTYPES = {"max": ("float32", "int8", "int16"), "avg": ("float32",)}
_KIND_NAMES = {"max": "a max pool", "avg": "an average"}


def _patterns() -> list:
    """(name, pattern, annotations) of every pooling pattern."""
    graphs = []
    for name, op in reversed(POOL_OPS.items()):
        data = wildcard()
        root = is_op(op)(data)
        graphs.append((name, root, {"root": root, "lhs": data}))
    return graphs


def pool_spec(name: str, annotated: dict) -> KernelSpec:
    """The pooling kernel of a matched call; raises UnsupportedOperator with the reason it cannot."""
    call, data = annotated["root"], annotated["lhs"]
    op = name.removeprefix("cgra.")
    # The batch may be symbolic (one kernel for every batch size, kernels/common/dynamic.py); which
    # axis is the batch depends on the layout, checked once the spec knows it.
    shape, names = read_shape(data, "data", symbolic_axes=range(4), expressions=True)
    if len(shape) != 4:
        raise UnsupportedOperator(f"{op} of a rank-{len(shape)} tensor: the NPU pools 4-D images")
    spec = _SPECS[name](op, call, shape, dtype_of(data))
    if names:
        spec = _with_symbols(op, spec, names, call)
    if spec.dtype not in POOL_DTYPES[spec.pool.kind]:
        raise UnsupportedOperator(f"{op} on {spec.dtype}: the NPU's POOL takes "
                                  f"{' or '.join(POOL_DTYPES[spec.pool.kind])} for {_KIND_NAMES[spec.pool.kind]}")
    taps = spec.pool.size[0] * spec.pool.size[1]  # (a symbolic image's global average sums it in blocks)
    if not is_symbolic_global(spec) and taps > MAX_TAPS:
        raise UnsupportedOperator(f"{op} with a window of {taps} taps: the NPU's POOL kernel takes at most {MAX_TAPS} "
                                  "(its window is one expression; normalise/large_pools.py splits the larger windows "
                                  "it can into passes, this one it cannot)")
    outside = never_valid_taps(pool_window(spec), spec.output_shape[2:])
    if outside:
        axis, tap = outside[0]
        raise UnsupportedOperator(f"{op} of a {shape} image: window {'row' if axis == 0 else 'column'} {tap} lies "
                                  "in the padding for every output (an image smaller than the window); the NPU's "
                                  "POOL kernel takes whole windows")
    return spec


def _with_symbols(op: str, spec: KernelSpec, names: dict, call) -> KernelSpec:
    """`spec` with its symbolic axes: the batch, and the image height or width of a windowed
    pool (not an average in ceil mode) or a global average along it (its tiles then cut the axis
    into blocks of outputs; see `symbolic_axes`; global_pool.py)."""
    batch = spec.data_layout.index("N")
    spatial = {axis: names[spec.data_layout.index(axis)] for axis in "HW" if spec.data_layout.index(axis) in names}
    if spatial:
        reason = _symbolic_image_refusal(op, spec, list(spatial))
        if reason is not None:
            what = " and ".join(f"{axis} ({name})" for axis, name in spatial.items())
            raise UnsupportedOperator(f"{op} with a symbolic {what}: the NPU's POOL kernel takes {reason} (bind it, "
                                      "e.g. with relax.transform.BindSymbolicVars)")
    out_axis = 0 if dict(spec.caller_shapes).get("out") is not None else spec.out_layout.index("N")
    batch_out = (("out", out_axis, names[batch]),) if batch in names else ()
    spec = dataclasses.replace(spec, symbols=tuple(("lhs", a, n) for a, n in sorted(names.items())) + batch_out)
    if spatial and spec.pool.ceil_mode:
        _check_ceil_extents(op, spec, call)
    return spec


def _check_ceil_extents(op: str, spec: KernelSpec, call) -> None:
    """A ceil-mode pool's output height / width as the kernel computes them (`symbolic_axes`)
    must be Relax's (its struct info) at every size: Relax and PyTorch differ on whether a last
    window that starts in the trailing padding counts. Compared at sizes 1 to 64."""
    dims = shape_dims(call)
    for index, extent in symbolic_axes(spec):
        theirs = dims[spec.out_layout.index("HW"[index])] if dims is not None else None
        if holds_condition(theirs):  # the last-window rule, where it may apply
            raise UnsupportedOperator(
                f"{op} in ceil mode with a symbolic {'HW'[index]}: the model's output size holds a condition "
                f"({theirs}), which TVM 0.27 cannot carry into an offloaded function (FuseOpsByPattern has no "
                "type rule for if_then_else); a window and stride for which no last window starts in the padding "
                "(e.g. 3x3 stride 2, no padding) run on the NPU")
        if theirs is None or any(_at(extent, size) != _at(theirs, size) for size in range(1, 65)):
            raise UnsupportedOperator(f"{op} in ceil mode with a symbolic {'HW'[index]}: the NPU kernel's output "
                                      f"{'height' if index == 0 else 'width'} ({extent}) is not the model's "
                                      f"({theirs}) at every size")


def _at(extent, size: int) -> int:
    """An extent of symbolic dimensions with every one of them at `size`."""
    if isinstance(extent, int):
        return extent
    for var in tirx.analysis.undefined_vars(extent):
        extent = tirx.Let(var, tirx.IntImm(str(var.ty), size), extent)
    return int(sym.Analyzer().simplify(extent))


def _symbolic_image_refusal(op: str, spec: KernelSpec, axes: list) -> str | None:
    """Why a pool cannot take these symbolic image axes ("H", "W"), or None if it can."""
    if spec.pool.whole:
        return None  # in blocks, divided by the run-time area (global_pool.py)
    if spec.pool.ceil_mode and spec.pool.kind == "avg":
        # (a max pool's last windows take the halo's lowest values past the padded image)
        return ("no ceil mode along a symbolic size for an average (its last windows' counts depend on where "
                "the image ends)")
    for axis in axes:
        index = "HW".index(axis)
        if (spec.padding[index] or spec.padding[index + 2]) and spec.pool.kind == "avg" and \
                not spec.pool.count_include_pad:
            return ("no padding along a symbolic size for an average that counts only the image's taps "
                    "(count_include_pad=False)")
    return None


def _layout(op: str, attrs) -> str:
    layout, out_layout = str(attrs.layout), str(attrs.out_layout)
    if sorted(layout) != sorted("NCHW") or out_layout != layout:
        raise UnsupportedOperator(f"{op} with layout {layout} -> {out_layout}: the NPU pools an order of the axes "
                                  "NCHW (e.g. NCHW or NHWC) into the same layout")
    return layout


def _window_spec(op: str, call, shape, dtype: str) -> KernelSpec:
    """max_pool2d / avg_pool2d: their attributes as they are."""
    attrs = call.attrs
    layout = _layout(op, attrs)
    kind = "max" if op == "max_pool2d" else "avg"
    dilation = tuple(int(d) for d in attrs.dilation)
    if kind == "avg" and dilation != (1, 1):
        raise UnsupportedOperator(f"avg_pool2d with dilation {dilation}: the NPU averages undilated windows")
    padding = tuple(int(p) for p in attrs.padding)
    padding = padding * (4 // len(padding))
    pool = PoolAttrs(kind, tuple(int(k) for k in attrs.pool_size), bool(attrs.ceil_mode),
                     bool(attrs.count_include_pad))
    return KernelSpec("pool", dtype=dtype, acc_dtype=dtype, lhs_shape=logical(shape, layout), rhs_shape=(),
                      strides=tuple(int(s) for s in attrs.strides), padding=padding, dilation=dilation,
                      data_layout=layout, out_layout=layout, pool=pool, param_roles=("lhs",))


def _global_spec(shape, layout: str, dtype: str, caller_shapes=()) -> KernelSpec:
    """An average over the whole image: a window of H x W taps."""
    n, c, h, w = logical(shape, layout)
    return KernelSpec("pool", dtype=dtype, acc_dtype=dtype, lhs_shape=(n, c, h, w), rhs_shape=(),
                      data_layout=layout, out_layout=layout, pool=PoolAttrs("avg", (h, w), whole=True),
                      param_roles=("lhs",), caller_shapes=caller_shapes)


def _adaptive_spec(op: str, call, shape, dtype: str) -> KernelSpec:
    layout = _layout(op, call.attrs)
    size = call.attrs.output_size
    if size is None or tuple(int(s) for s in size) not in ((1, 1), (1,)):
        raise UnsupportedOperator(f"adaptive_avg_pool2d to {None if size is None else tuple(int(s) for s in size)}: "
                                  "the NPU runs the global one (output_size 1)")
    return _global_spec(shape, layout, dtype)


def _mean_spec(op: str, call, shape, dtype: str) -> KernelSpec:
    """mean over the two spatial axes of NCHW (2, 3) or NHWC (1, 2) data, keepdims or not."""
    axes = tuple(sorted(int(a) % 4 for a in call.attrs.axis)) if call.attrs.axis is not None else (0, 1, 2, 3)
    layouts = {(2, 3): "NCHW", (1, 2): "NHWC"}
    if axes not in layouts:
        raise UnsupportedOperator(f"mean over axes {axes} is not a global average pool (axes (2, 3) of NCHW or "
                                  "(1, 2) of NHWC data)")
    caller = () if call.attrs.keepdims else (("out", tuple(d for i, d in enumerate(shape) if i not in axes)),)
    return _global_spec(shape, layouts[axes], dtype, caller)


_SPECS = {
    "cgra.max_pool2d": _window_spec,
    "cgra.avg_pool2d": _window_spec,
    "cgra.adaptive_avg_pool2d": _adaptive_spec,
    "cgra.mean": _mean_spec,
}


def pool_compute(spec: KernelSpec, tiling: Tiling):
    """out[b, c, y, x] (in the spec's layout) = the pooled window of image b, channel c."""
    if is_symbolic_global(spec):
        return global_pool_compute(spec, tiling)
    n = batch_extent(spec)  # an int, or the symbolic batch's variable
    _, channels, h, w = spec.lhs_shape
    _, _, oh, ow = spec.output_shape
    top, left, _, _ = spec.padding
    in_h, in_w = window_extents(spec)
    window, tile_out, acc_out = pool_window(spec), (oh, ow), [oh, ow]
    image, window_in = [h, w], [in_h, in_w]
    axes, symbolic = blocked_axes(spec, tiling), symbolic_axes(spec)
    blocks = block_sizes(axes, tiling)
    for index, extent in axes:  # blocks of outputs along each symbolic axis (or a static height)
        if symbolic:
            image[index] = dim_var(spec.symbolic("lhs")[spec.data_layout.index("HW"[index])])
        acc_out[index] = sym.Analyzer().simplify(tirx.ceildiv(tirx.max(extent, 1), blocks[index]) * blocks[index])
        k, step, spacing = spec.pool.size[index], spec.strides[index], spec.dilation[index]
        window_in[index] = (acc_out[index] - 1) * step + (k - 1) * spacing + 1
    if axes:
        (oh, ow), window, tile_out = _block(spec, axes, blocks)
    in_h, in_w = window_in
    data_shape = stored((n, channels, *image), "NCHW", spec.data_layout)
    x = te.placeholder(data_shape, spec.dtype, name="data")
    # A max pool's blocks along a symbolic axis take its padding as taps: they hold the lowest value.
    fill = lowest_value(spec.dtype) if axes and spec.pool.kind == "max" else 0
    a_pad = te.compute((n, in_h, in_w, tiling.np), lambda b_, py, px, c: padded(
        x, data_shape, stored((b_, c, py - top, px - left), "NCHW", spec.data_layout), fill), name="a_pad")
    acc = te.compute((n, *acc_out, tiling.np), lambda b_, y, ox, c: pool_value(
        lambda py, px, ch: a_pad[b_, py, px, ch], y, ox, c, window, tile_out, spec.dtype), name="acc")

    def stored_out(*index):
        axis = dict(zip(spec.out_layout, index))
        return acc[axis["N"], axis["H"], axis["W"], axis["C"]]

    out = te.compute(stored((n, channels, oh, ow), "NCHW", spec.out_layout), stored_out, name="out")
    func = kernel_prim_func(spec, {"lhs": x}, out)
    if not symbolic:  # a static height's last block computes its rows past the image, unstored
        return func
    # A last block's POOL is cut to its outputs, its window load to what they read: v outputs
    # read (v - 1) * stride + (k - 1) * dilation + 1 window rows, the padding past the image
    # among them; along each symbolic axis in blocks of more than one output (each such block
    # loop is a symbolic tile loop, lower/ragged.py, outermost first: rows, then columns).
    # With one symbolic axis, its block loop is the innermost symbolic tile loop.
    cut = [index for index, _ in axes if blocks[index] > 1] if len(axes) == 2 else [axes[0][0]]
    gathers = [[spec.data_layout.index("HW"[index]), spec.strides[index], 1,
                (spec.pool.size[index] - 1) * spec.dilation[index] + 1 - spec.strides[index]]
               + ([level] if len(axes) == 2 else []) for level, index in enumerate(cut)]
    params = [("oh", "ow")[index] for index in cut]
    return func.with_attr(CUT_PARAMS, {"cgra_pool": params if len(axes) == 2 else params[0]}) \
        .with_attr(GATHERS, {"data": gathers})


def _block(spec: KernelSpec, axes: list, blocks: dict):
    """A pool with symbolic axes (`symbolic_axes`: index 0 the height, 1 the width, and its
    extent in outputs) in blocks of `blocks[index]` outputs: (the output's (oh, ow) with those
    extents, the POOL window of one block, the block's (rows, columns) of outputs). Every tap of
    the block's outputs along a symbolic axis is in its window, valid and counted (the padding
    along it is loaded: `symbolic_axes`)."""
    _, _, oh, ow = spec.output_shape
    out, tile_out = [oh, ow], [oh, ow]
    window = pool_window(spec)
    valid, count = list(window.valid), list(window.count) if window.count is not None else None
    for index, extent in axes:
        out[index], tile_out[index] = extent, blocks[index]
        span = window.extent(blocks[index], index)
        valid[2 * index:2 * index + 2] = (0, span)
        if count is not None:
            count[2 * index:2 * index + 2] = (0, span)
    window = dataclasses.replace(window, valid=tuple(valid), count=None if count is None else tuple(count))
    return tuple(out), window, tuple(tile_out)


def schedule_pool(sch, spec: KernelSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """Per (image, tn channels): one DMA of the input window, one POOL, one DMA store. The tile
    loops are the accumulator's own (it is the anchor), so its output loops keep their extents
    even when they are 1 (a global pool's 1 x 1 output) and the tile can always be tensorized."""
    if is_symbolic_global(spec):
        return schedule_global_pool(sch, spec, tiling, arch)
    acc = sch.get_sblock("acc")
    images, rows, cols, channels = sch.get_loops(acc)
    channel_tile, channel = sch.split(channels, [None, tiling.tn])
    axes = blocked_axes(spec, tiling)
    if not axes:
        sch.reorder(images, channel_tile, rows, cols, channel)
        window, (oh, ow) = pool_window(spec), spec.output_shape[2:]
    else:  # blocks of outputs along the symbolic axes, the channel tiles inside each: the
        # ragged last block's tiles come one after another, not between whole ones, whose loads
        # they could not hide behind their shorter POOLs
        blocks = block_sizes(axes, tiling)
        block_loops = []
        if 0 in blocks:
            block_loop, rows = sch.split(rows, [None, blocks[0]])
            block_loops.append(block_loop)
        if 1 in blocks:
            block_loop, cols = sch.split(cols, [None, blocks[1]])
            block_loops.append(block_loop)
        sch.reorder(images, *block_loops, channel_tile, rows, cols, channel)
        _, window, (oh, ow) = _block(spec, axes, blocks)
    tile_loop = channel_tile
    sch.set_scope(acc, 0, SPAD)
    a_pad = sch.get_sblock("a_pad")
    sch.compute_at(a_pad, tile_loop)
    sch.set_scope(a_pad, 0, SPAD)
    sch.reverse_compute_at(sch.get_sblock("out"), tile_loop)
    sch.tensorize(rows, get_intrin("pool", oh, ow, tiling.tn, window, spec.dtype))


def choose_tiling(spec: KernelSpec, arch: HardwareDescription) -> Tiling:
    return choose_global_tiling(spec, arch) if is_symbolic_global(spec) else choose_pool_tiling(spec, arch)


POOL = OpFamily(
    name="pool", ops=("pool",), patterns=_patterns, spec_from_match=pool_spec, choose_tiling=choose_tiling,
    compute=pool_compute, schedule=schedule_pool, host_ops={op: name for name, op in POOL_OPS.items()},
    checks_pe_dtype=True)
