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

With a symbolic image height or width (`symbolic_axes`), a tile is a block of outputs along it:
where the padding lies is then known only at run time, so it is loaded with the window (the DMA
halo: the dtype's lowest value for a max pool, zero for an average that counts the padding) and
every tap along the axis is valid.
"""

from __future__ import annotations

import dataclasses
import functools
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
    of outputs; see `symbolic_axes`)."""
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
    if op in ("adaptive_avg_pool2d", "mean"):
        return "no global pool over a symbolic size"
    if spec.pool.ceil_mode:
        return "no ceil mode along a symbolic size"
    for axis in axes:
        index = "HW".index(axis)
        if (spec.padding[index] or spec.padding[index + 2]) and spec.pool.kind == "avg" and \
                not spec.pool.count_include_pad:
            return ("no padding along a symbolic size for an average that counts only the image's taps "
                    "(count_include_pad=False)")
    return None


def symbolic_axes(spec: KernelSpec) -> list:
    """(0 for the height or 1 for the width, its output extent as the kernel indexes it) of each
    of a pool's symbolic image axes. Its tiles cut each into blocks of outputs (`block_sizes`),
    and one POOL window serves every block: every tap along the axis is valid and
    counted, because the padding along it is in the scratchpad, loaded with the window as the
    DMA's halo: the dtype's lowest value for a max pool (DMA_FILL_LOWEST), zeros for an average
    that counts the padding. The last block is cut to the outputs that exist, its window load to
    the rows (or columns) they read (lower/ragged.py)."""
    names, axes = spec.symbolic("lhs"), []
    for index, axis in enumerate("HW"):
        name = names.get(spec.data_layout.index(axis))
        if name is not None:
            k, step, spacing = spec.pool.size[index], spec.strides[index], spec.dilation[index]
            padded_extent = dim_var(name) + spec.padding[index] + spec.padding[index + 2]
            axes.append((index, sym.Analyzer().simplify(tirx.floordiv(padded_extent - spacing * (k - 1) - 1, step)
                                                        + 1)))
    return axes


def block_sizes(axes: list, tiling: Tiling) -> dict:
    """{axis index: outputs per block} of a pool's symbolic axes: tiling.tm along the only one,
    or tm rows by tw columns when both are symbolic. The innermost block loop (the columns, or
    the only axis) cuts its last block to what exists; with both symbolic, the last block row
    runs whole (its rows past the image are padding, its outputs past it dropped by the store)."""
    if len(axes) == 2:
        return {0: tiling.tm, 1: tiling.tw}
    return {index: tiling.tm for index, _ in axes}


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
    image, window_in = [h, w], [in_h, in_w]
    axes = symbolic_axes(spec)
    blocks = block_sizes(axes, tiling)
    for index, extent in axes:  # blocks of outputs along each symbolic axis
        image[index] = dim_var(spec.symbolic("lhs")[spec.data_layout.index("HW"[index])])
        acc_out[index] = sym.Analyzer().simplify(tirx.ceildiv(tirx.max(extent, 1), blocks[index]) * blocks[index])
        k, step, spacing = spec.pool.size[index], spec.strides[index], spec.dilation[index]
        window_in[index] = (acc_out[index] - 1) * step + (k - 1) * spacing + 1
    if axes:
        (oh, ow), window, tile_out = _block(spec, axes, blocks)
    in_h, in_w = window_in
    symbolic = axes or None
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
    if not axes:
        return func
    # The last block's POOL is cut to its outputs, its window load to what they read: v outputs
    # read (v - 1) * stride + (k - 1) * dilation + 1 window rows, the padding past the image
    # among them (along the innermost block loop's axis; see `block_sizes`).
    index = axes[-1][0]
    k, step, spacing = spec.pool.size[index], spec.strides[index], spec.dilation[index]
    gather = [[spec.data_layout.index("HW"[index]), step, 1, (k - 1) * spacing + 1 - step]]
    return func.with_attr(CUT_PARAMS, {"cgra_pool": ("oh", "ow")[index]}).with_attr(GATHERS, {"data": gather})


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


def choose_pool_tiling(spec: KernelSpec, arch: HardwareDescription) -> Tiling:
    """The whole output image (tm = output rows) by `tn` channels (>= 2, any count: the vector
    unit has no column alignment), kh * kw taps at once: the tn with the fewest estimated cycles
    among those whose double-buffered window and output fit the scratchpad. np: channels padded
    to whole tiles. With a symbolic image axis, `_choose_block_tiling`."""
    axes = symbolic_axes(spec)
    if len(axes) == 2:
        return _choose_square_tiling(spec, arch)
    if axes:
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
    [(index, _)] = symbolic_axes(spec)
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


def _choose_square_tiling(spec: KernelSpec, arch: HardwareDescription) -> Tiling:
    """A pool with a symbolic height and width: blocks of tm x tw outputs (powers of two) by tn
    channels; the (tm, tw, tn) whose estimate on square outputs from SMALLEST_OUTPUT_SIDE to the
    bound is the closest to a kernel compiled for that size (minimax regret). The last block
    column is cut to the columns that exist, the last block row runs whole (`block_sizes`)."""
    n, channels, _, _ = spec.lhs_shape
    bound = min(spec.output_shape[2:])
    taps = spec.pool.size[0] * spec.pool.size[1]
    size = DType.from_name(spec.dtype).itemsize
    window = pool_window(spec)

    def channel_counts(tm: int, tw: int):
        span_h, span_w = window.extent(tm, 0), window.extent(tw, 1)
        for tn in range(2, max(channels, 2) + 1):
            if aligned(2 * span_h * span_w * tn * size) + aligned(2 * tm * tw * tn * size) > arch.spad_bytes:
                break
            yield tn

    @functools.cache
    def block(tm: int, tw: int, tn: int):
        span_h, span_w = window.extent(tm, 0), window.extent(tw, 1)
        return _commands(span_h * span_w * tn * size, tm * tw * tn * size, tm * tw * tn * taps, arch,
                         _banks(spec, arch, span_h, span_w, tn), _banks(spec, arch, tm, tw, tn))

    def cycles(candidate, side: int) -> int:
        tm, tw, tn = candidate
        tiles = n * -(-channels // tn) * -(-side // tm)  # per block column, every block row whole
        whole, rest = divmod(side, tw)
        total = 0
        for count, columns in ((whole, tw), (1 if rest else 0, rest)):
            if count:
                total += tiles * count * _period(*block(tm, columns, tn), arch)
        load, _, store = block(tm, min(tw, side), tn)
        return total + 2 * arch.dma_latency + load + store

    powers = [1 << k for k in range(bound.bit_length() + 1) if 1 << k <= max(bound, 1)]
    candidates = [(tm, tw, tn) for tm in powers for tw in powers for tn in channel_counts(tm, tw)]
    if not candidates:
        raise ScratchpadTooSmall(
            f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold a pooling window of one output "
            "and two channels: describe a larger scratchpad")
    sizes = sorted({min(bound, 1 << k) for k in range(bound.bit_length() + 1)} -
                   set(range(min(bound, SMALLEST_OUTPUT_SIDE))))
    fastest = {s: min([cycles(c, s) for c in candidates] +
                      [cycles((s, s, tn), s) for tn in channel_counts(s, s)]) for s in sizes}
    tm, tw, tn = min(candidates, key=lambda c: (max(cycles(c, s) / fastest[s] for s in sizes), cycles(c, bound)))
    return Tiling(tm, tn, taps, round_up(spec.output_shape[2], tm), round_up(channels, tn), taps, tw=tw)


#: The smallest square output (a side, in outputs) a pool's tiles for a symbolic height and width
#: are weighed on: smaller images run few blocks, whatever their size.
SMALLEST_OUTPUT_SIDE = 8


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
    axes = symbolic_axes(spec)
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


POOL = OpFamily(
    name="pool", ops=("pool",), patterns=_patterns, spec_from_match=pool_spec, choose_tiling=choose_pool_tiling,
    compute=pool_compute, schedule=schedule_pool, host_ops={op: name for name, op in POOL_OPS.items()})
