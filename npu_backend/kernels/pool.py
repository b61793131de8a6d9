"""The pooling family: max_pool2d, avg_pool2d and global average pooling on the vector unit's POOL.

Stage: partition (its patterns and spec), kernel definition, tiling and schedule. One Relax call
each, no epilogue: relax.nn.max_pool2d, relax.nn.avg_pool2d, relax.nn.adaptive_avg_pool2d to a
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

With a symbolic image height or width (`symbolic_axis`), a tile is a block of outputs along it:
where the padding lies is then known only at run time, so it is loaded with the window (the DMA
halo: the dtype's lowest value for a max pool, zero for an average that counts the padding) and
every tap along the axis is valid.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

from tvm import sym, te, tirx
from tvm.relax.dpl import is_op, wildcard

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription
from cgra_sim.banks import beat_slowdown
from cgra_sim.isa import DType

from ..errors import ScratchpadTooSmall, UnsupportedOperator
from ..relax_info import dtype_of
from .dynamic import CUT_PARAMS, GATHERS, batch_extent, dim_var, read_shape
from .family import OpFamily
from .intrinsics import SPAD, get_intrin
from .intrinsics.vector_unit import PoolWindow, lowest_value, never_valid_taps, pool_value
from .operands import kernel_prim_func, logical, padded, stored
from .spec import KernelSpec, PoolAttrs, Tiling, aligned, round_up

#: Pattern name -> the Relax operator it matches.
POOL_OPS = {
    "cgra.max_pool2d": "relax.nn.max_pool2d",
    "cgra.avg_pool2d": "relax.nn.avg_pool2d",
    "cgra.adaptive_avg_pool2d": "relax.nn.adaptive_avg_pool2d",
    "cgra.mean": "relax.mean",
}
#: Input dtypes per kind: an average of integers would round, which POOL does not do.
POOL_DTYPES = {"max": ("float32", "int8"), "avg": ("float32",)}


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
    # The batch may be symbolic (one kernel for every batch size, kernels/dynamic.py); which
    # axis is the batch depends on the layout, checked once the spec knows it.
    shape, names = read_shape(data, "data", symbolic_axes=range(4), expressions=True)
    if len(shape) != 4:
        raise UnsupportedOperator(f"{op} of a rank-{len(shape)} tensor: the NPU pools 4-D images")
    spec = _SPECS[name](op, call, shape, dtype_of(data))
    if names:
        spec = _with_symbols(op, spec, names)
    if spec.dtype not in POOL_DTYPES[spec.pool.kind]:
        raise UnsupportedOperator(f"{op} on {spec.dtype}: the NPU's POOL takes "
                                  f"{' or '.join(POOL_DTYPES[spec.pool.kind])} for a {spec.pool.kind} pool")
    outside = never_valid_taps(pool_window(spec), spec.output_shape[2:])
    if outside:
        axis, tap = outside[0]
        raise UnsupportedOperator(f"{op} of a {shape} image: window {'row' if axis == 0 else 'column'} {tap} lies "
                                  "in the padding for every output (an image smaller than the window); the NPU's "
                                  "POOL kernel takes whole windows")
    return spec


def _with_symbols(op: str, spec: KernelSpec, names: dict) -> KernelSpec:
    """`spec` with its symbolic axes: the batch, and the image height or width of a windowed
    pool without ceil mode or a global window along it (its tiles then cut the axis into blocks
    of outputs; see `symbolic_axis`)."""
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
    return dataclasses.replace(spec, symbols=tuple(("lhs", a, n) for a, n in sorted(names.items())) + batch_out)


def _symbolic_image_refusal(op: str, spec: KernelSpec, axes: list) -> str | None:
    """Why a pool cannot take these symbolic image axes ("H", "W"), or None if it can."""
    if len(axes) == 2:
        return "a symbolic height or width, not both"
    if op in ("adaptive_avg_pool2d", "mean"):
        return "no global pool over a symbolic size"
    index = "HW".index(axes[0])
    if spec.pool.ceil_mode:
        return "no ceil mode along a symbolic size"
    if (spec.padding[index] or spec.padding[index + 2]) and spec.pool.kind == "avg" and \
            not spec.pool.count_include_pad:
        return ("no padding along a symbolic size for an average that counts only the image's taps "
                "(count_include_pad=False)")
    return None


def symbolic_axis(spec: KernelSpec):
    """(0 for the height or 1 for the width, its output extent as the kernel indexes it) of a
    pool's symbolic image axis, or None. Its tiles cut that axis into blocks of `tiling.tm`
    outputs, and one POOL window serves every block: every tap along the axis is valid and
    counted, because the padding along it is in the scratchpad, loaded with the window as the
    DMA's halo: the dtype's lowest value for a max pool (DMA_FILL_LOWEST), zeros for an average
    that counts the padding. The last block is cut to the outputs that exist, its window load to
    the rows (or columns) they read (lower/ragged.py)."""
    names = spec.symbolic("lhs")
    for index, axis in enumerate("HW"):
        name = names.get(spec.data_layout.index(axis))
        if name is not None:
            k, step, spacing = spec.pool.size[index], spec.strides[index], spec.dilation[index]
            padded_extent = dim_var(name) + spec.padding[index] + spec.padding[index + 2]
            return index, sym.Analyzer().simplify(tirx.floordiv(padded_extent - spacing * (k - 1) - 1, step) + 1)
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
                      data_layout=layout, out_layout=layout, pool=PoolAttrs("avg", (h, w)),
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


def pool_window(spec: KernelSpec) -> PoolWindow:
    """The POOL window of a pooling kernel's tile (a whole image), rectangles in window positions."""
    _, _, h, w = spec.lhs_shape
    top, left, bottom, right = spec.padding
    valid = (top, top + h, left, left + w)
    count = None
    if spec.pool.kind == "avg":
        count = (0, top + h + bottom, 0, left + w + right) if spec.pool.count_include_pad else valid
    return PoolWindow(spec.pool.kind, tuple(spec.pool.size), tuple(spec.strides), tuple(spec.dilation),
                      valid, count)


def window_extents(spec: KernelSpec) -> tuple[int, int]:
    """(rows, columns) of the input window a pooling kernel holds: every output's taps."""
    _, _, oh, ow = spec.output_shape
    (kh, kw), (sh, sw), (dh, dw) = spec.pool.size, spec.strides, spec.dilation
    return (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1


def pool_compute(spec: KernelSpec, tiling: Tiling):
    """out[b, c, y, x] (in the spec's layout) = the pooled window of image b, channel c."""
    n = batch_extent(spec)  # an int, or the symbolic batch's variable
    _, channels, h, w = spec.lhs_shape
    _, _, oh, ow = spec.output_shape
    top, left, _, _ = spec.padding
    in_h, in_w = window_extents(spec)
    window, tile_out, acc_out = pool_window(spec), (oh, ow), [oh, ow]
    image = [h, w]
    symbolic = symbolic_axis(spec)
    if symbolic is not None:  # blocks of tiling.tm outputs along the symbolic axis
        index, extent = symbolic
        image[index] = dim_var(spec.symbolic("lhs")[spec.data_layout.index("HW"[index])])
        acc_out[index] = sym.Analyzer().simplify(tirx.ceildiv(tirx.max(extent, 1), tiling.tm) * tiling.tm)
        (oh, ow), window, tile_out = _block(spec, tiling, index, extent)
        k, step, spacing = spec.pool.size[index], spec.strides[index], spec.dilation[index]
        in_h, in_w = [(acc_out[0] - 1) * step + (k - 1) * spacing + 1, in_w] if index == 0 else \
            [in_h, (acc_out[1] - 1) * step + (k - 1) * spacing + 1]
    data_shape = stored((n, channels, *image), "NCHW", spec.data_layout)
    x = te.placeholder(data_shape, spec.dtype, name="data")
    # A max pool's blocks along a symbolic axis take its padding as taps: they hold the lowest value.
    fill = lowest_value(spec.dtype) if symbolic is not None and spec.pool.kind == "max" else 0
    a_pad = te.compute((n, in_h, in_w, tiling.np), lambda b_, py, px, c: padded(
        x, data_shape, stored((b_, c, py - top, px - left), "NCHW", spec.data_layout), fill), name="a_pad")
    acc = te.compute((n, *acc_out, tiling.np), lambda b_, y, ox, c: pool_value(
        lambda py, px, ch: a_pad[b_, py, px, ch], y, ox, c, window, tile_out, spec.dtype), name="acc")

    def stored_out(*index):
        axis = dict(zip(spec.out_layout, index))
        return acc[axis["N"], axis["H"], axis["W"], axis["C"]]

    out = te.compute(stored((n, channels, oh, ow), "NCHW", spec.out_layout), stored_out, name="out")
    func = kernel_prim_func(spec, {"lhs": x}, out)
    if symbolic is None:
        return func
    # The last block's POOL is cut to its outputs, its window load to what they read: v outputs
    # read (v - 1) * stride + (k - 1) * dilation + 1 window rows, the padding past the image
    # among them.
    index = symbolic[0]
    k, step, spacing = spec.pool.size[index], spec.strides[index], spec.dilation[index]
    gather = [[spec.data_layout.index("HW"[index]), step, 1, (k - 1) * spacing + 1 - step]]
    return func.with_attr(CUT_PARAMS, {"cgra_pool": ("oh", "ow")[index]}).with_attr(GATHERS, {"data": gather})


def _block(spec: KernelSpec, tiling: Tiling, index: int, extent):
    """A pool with a symbolic height (index 0) or width (1) of `extent` outputs: (the output's
    (oh, ow) with that extent, the POOL window of one block of tiling.tm outputs along it, the
    block's (rows, columns) of outputs). Every tap of the block's outputs is in its window, valid
    and counted (the padding along the axis is loaded: `symbolic_axis`)."""
    _, _, oh, ow = spec.output_shape
    out = [oh, ow]
    out[index] = extent
    tile_out = [oh, ow]
    tile_out[index] = tiling.tm
    window = pool_window(spec)
    span = window.extent(tiling.tm, index)
    valid, count = list(window.valid), list(window.count) if window.count is not None else None
    valid[2 * index:2 * index + 2] = (0, span)
    if count is not None:
        count[2 * index:2 * index + 2] = (0, span)
    window = dataclasses.replace(window, valid=tuple(valid), count=None if count is None else tuple(count))
    return tuple(out), window, tuple(tile_out)


def choose_pool_tiling(spec: KernelSpec, arch: HardwareDescription) -> Tiling:
    """The whole output image (tm = output rows) by `tn` channels (>= 2, any count: the vector
    unit has no column alignment), kh * kw taps at once: the tn with the fewest estimated cycles
    among those whose double-buffered window and output fit the scratchpad. np: channels padded
    to whole tiles. With a symbolic image axis, `_choose_block_tiling`."""
    if symbolic_axis(spec) is not None:
        return _choose_block_tiling(spec, arch)
    n, channels, _, _ = spec.lhs_shape
    _, _, oh, ow = spec.output_shape
    in_h, in_w = window_extents(spec)
    taps = spec.pool.size[0] * spec.pool.size[1]
    size = DType.from_name(spec.dtype).itemsize
    best = None
    for tn in range(2, max(channels, 2) + 1):
        if aligned(2 * in_h * in_w * tn * size) + aligned(2 * oh * ow * tn * size) > arch.spad_bytes:
            break
        tiles = n * -(-channels // tn)
        key = (_estimate_cycles(tiles, in_h * in_w * tn * size, oh * ow * tn * size, oh * ow * tn * taps, arch), -tn)
        if best is None or key < best[0]:
            best = (key, Tiling(oh, tn, taps, oh, round_up(channels, tn), taps))
    if best is None:
        raise ScratchpadTooSmall(
            f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold the {in_h}x{in_w} input "
            f"window of two channels that a pooling kernel takes (the whole image at once): describe a "
            "larger scratchpad")
    return best[1]


def _choose_block_tiling(spec: KernelSpec, arch: HardwareDescription) -> Tiling:
    """A pool with a symbolic height or width: blocks of tm outputs along it (a power of two) by
    tn channels, the whole other axis; the (tm, tn) whose estimate, at sizes from one output to
    the bound (`spec.output_shape`), is the closest to a kernel compiled for that size (minimax
    regret; the whole blocks run first, then the ragged last one, its POOL and window load cut to
    the outputs that exist)."""
    n, channels, _, _ = spec.lhs_shape
    index, _ = symbolic_axis(spec)
    bound = spec.output_shape[2 + index]
    taps = spec.pool.size[0] * spec.pool.size[1]
    size = DType.from_name(spec.dtype).itemsize
    window = pool_window(spec)
    other = spec.output_shape[3 - index]
    other_in = window.extent(other, 1 - index)
    def channel_counts(tm: int):
        """The tn that fit the scratchpad beside a double-buffered block of tm outputs."""
        span = window.extent(tm, index)
        for tn in range(2, max(channels, 2) + 1):
            if aligned(2 * span * other_in * tn * size) + aligned(2 * tm * other * tn * size) > arch.spad_bytes:
                break
            yield tn

    candidates = []
    for tm in (1 << k for k in range(bound.bit_length() + 1)):
        candidates += [(tm, tn) for tn in channel_counts(tm)]
        if tm >= bound:
            break
    if not candidates:
        raise ScratchpadTooSmall(
            f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold a pooling window of one output "
            "along the symbolic axis and two channels: describe a larger scratchpad")

    def block(tm: int, tn: int):
        """(load, pool, store) cycles of one block of tm outputs (the last one cut to what exists)."""
        span = window.extent(tm, index)
        window_tile, out_tile = ((span, other_in), (tm, other)) if index == 0 else ((other_in, span), (other, tm))
        return _commands(span * other_in * tn * size, tm * other * tn * size, tm * other * tn * taps, arch,
                         _banks(spec, arch, *window_tile, tn), _banks(spec, arch, *out_tile, tn))

    def cycles(candidate, outputs: int) -> int:
        """The whole blocks, then the ragged last one, per channel tile (`_estimate_cycles`)."""
        tm, tn = candidate
        channel_tiles = n * -(-channels // tn)
        whole, rest = divmod(outputs, tm)
        total = 0
        for count, extent in ((whole, tm), (1 if rest else 0, rest)):
            if count:
                load, pool, store = block(extent, tn)
                total += channel_tiles * count * _period(load, pool, store, arch)
        load, _, store = block(min(tm, outputs), tn)
        return total + 2 * arch.dma_latency + load + store

    # Powers of two from one output to the bound. (Adding the sizes halfway between them made the
    # choice worse on cgra-8x8: the estimate is not that exact.)
    sizes = sorted({min(bound, 1 << k) for k in range(bound.bit_length() + 1)})
    # The reference at a size: a kernel compiled for it (one block of every output, if it fits).
    fastest = {s: min([cycles(c, s) for c in candidates] + [cycles((s, tn), s) for tn in channel_counts(s)])
               for s in sizes}
    tm, tn = min(candidates, key=lambda c: (max(cycles(c, s) / fastest[s] for s in sizes), cycles(c, bound)))
    return Tiling(tm, tn, taps, round_up(bound, tm), round_up(channels, tn), taps)


def _banks(spec: KernelSpec, arch: HardwareDescription, rows: int, cols: int, channels: int):
    """The scratchpad banks' slowdown of a DMA moving a (rows, cols, channels) tile (stored
    row, column, channel) in the order of the tensor's layout: a narrow block walks the tile
    with a stride and can put a beat's elements in few banks (cgra_sim.banks, as the simulator
    charges it)."""
    size = DType.from_name(spec.dtype).itemsize
    extents = {"N": 1, "C": channels, "H": rows, "W": cols}
    strides = {"N": 0, "C": size, "H": cols * channels * size, "W": channels * size}
    return beat_slowdown(arch.dma_bytes_per_cycle, [extents[a] for a in spec.data_layout],
                         [strides[a] for a in spec.data_layout], size, 0, arch.spad_banks, arch.bank_width_bytes)


def _estimate_cycles(tiles: int, load_bytes: int, store_bytes: int, taps: int, arch: HardwareDescription,
                     load_slowdown=1, store_slowdown=1) -> int:
    """First-order cycles of a tiled pooling kernel, each command priced by the simulator's cost
    model (cgra_sim.cost): the busiest unit per tile, or, with two copies of each buffer, half of a buffer's round trip
    (a window is loaded, with the DMA latency, then pooled before the load two tiles later can
    reuse it; an output is pooled, then stored, with the latency, before it is written again);
    plus the first load and the last store."""
    load, vector, store = _commands(load_bytes, store_bytes, taps, arch, load_slowdown, store_slowdown)
    return tiles * _period(load, vector, store, arch) + 2 * arch.dma_latency + load + store


def _commands(load_bytes: int, store_bytes: int, taps: int, arch: HardwareDescription, load_slowdown=1,
              store_slowdown=1) -> tuple[int, int, int]:
    """Cycles of a tile's window load, POOL and store (cgra_sim.cost)."""
    return (cost.dma_transfer_cycles(arch, load_bytes, Fraction(load_slowdown)), cost.pool_cycles(arch, taps),
            cost.dma_transfer_cycles(arch, store_bytes, Fraction(store_slowdown)))


def _period(load: int, vector: int, store: int, arch: HardwareDescription) -> int:
    """Cycles between tiles in steady state: the busiest unit, or half a double-buffered round trip."""
    return max(load, vector, store, -(-(arch.dma_latency + load + vector) // 2),
               -(-(vector + arch.dma_latency + store) // 2))


def schedule_pool(sch, spec: KernelSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """Per (image, tn channels): one DMA of the input window, one POOL, one DMA store. The tile
    loops are the accumulator's own (it is the anchor), so its output loops keep their extents
    even when they are 1 (a global pool's 1 x 1 output) and the tile can always be tensorized."""
    acc = sch.get_sblock("acc")
    images, rows, cols, channels = sch.get_loops(acc)
    channel_tile, channel = sch.split(channels, [None, tiling.tn])
    symbolic = symbolic_axis(spec)
    if symbolic is None:
        sch.reorder(images, channel_tile, rows, cols, channel)
        tile_loop, window, (oh, ow) = channel_tile, pool_window(spec), spec.output_shape[2:]
    else:  # blocks of tiling.tm outputs along the symbolic axis, the channel tiles inside each:
        # the ragged last block's tiles come one after another, not between whole ones, whose
        # loads they could not hide behind their shorter POOLs
        index, extent = symbolic
        if index == 0:
            block_loop, rows = sch.split(rows, [None, tiling.tm])
        else:
            block_loop, cols = sch.split(cols, [None, tiling.tm])
        sch.reorder(images, block_loop, channel_tile, rows, cols, channel)
        tile_loop = channel_tile
        _, window, (oh, ow) = _block(spec, tiling, index, extent)
    sch.set_scope(acc, 0, SPAD)
    a_pad = sch.get_sblock("a_pad")
    sch.compute_at(a_pad, tile_loop)
    sch.set_scope(a_pad, 0, SPAD)
    sch.reverse_compute_at(sch.get_sblock("out"), tile_loop)
    sch.tensorize(rows, get_intrin("pool", oh, ow, tiling.tn, window, spec.dtype))


POOL = OpFamily(
    name="pool", ops=("pool",), patterns=_patterns, spec_from_match=pool_spec, choose_tiling=choose_pool_tiling,
    compute=pool_compute, schedule=schedule_pool, host_ops={op: name for name, op in POOL_OPS.items()})
