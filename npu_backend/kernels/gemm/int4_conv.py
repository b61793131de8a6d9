"""conv2d with 4-bit weights packed in DRAM: UNPACK4 on the way into the PE array, a GEMM a tap.

Stage: kernels (normalise/int4_weights.py replaces normalise/int4_convs.py's host PrimFunc with it).
In: one layer's sizes and arithmetic (int4_convs.Int4ConvLayer: NCHW / OIHW, groups 1, any stride,
padding and dilation; "int8" requantising or "float32" weight-only) and the chip. Out: a PrimFunc
written for the NPU (`cgra.kernel`, docs/own-kernels.md).

Per tile of nt output channels the kernel DMAs the packed bytes (half a byte a weight, tap-major:
r = (ry * KW + rx) * C + c) with the int32 bias and float32 multipliers (int8) or the scales
(float32), and UNPACK4 writes the (K, nt) weight tile in the scratchpad: int8 with UNPACK4_INT8,
else float32(u - 8) * s per `group` rows. Then per tile of th whole output rows of an image (mt =
th * OW GEMM rows), per tap (ry, rx), it gathers the tap's (mt, C)
operand with one strided DMA box (the padding is the box's halo: zero, or -128 when that is the
int8 activation's zero point) and runs a GEMM of depth C into the accumulator against the tap's C
consecutive rows of the weight tile (the first tap overwrites the accumulator, the others add;
the accumulator and output tiles alternate between two buffers, so the next tile's GEMMs do not
wait for this one's EPILOGUE). int8: one EPILOGUE adds the bias and requantises (qdq.py's
arithmetic); float32: the accumulator is the output. The weight tiles alternate between two
buffers and tile t + 1 is loaded and unpacked before tile t's GEMMs are issued, so the vector
unit unpacks while the PE array multiplies; the gathers alternate between two buffers too. With
C even (a tap's rows start on a whole byte) UNPACK4 runs a tap at a time, so tap 0's GEMM waits for
its rows only. Where the estimate says so, pixel tiles go outside the weight tiles instead (the
weights reloaded and unpacked per pixel tile, the image gathered once: a chip whose scratchpad
holds few float32 weight columns).

Why hand-written: as int4_matmul.py (a step between the weight's DMA and the GEMM, on the packed
layout). Why a GEMM a tap rather than one over the whole im2col row: a tap's operand is one DMA
box of the image (C channels x th rows x OW columns), the whole row would be KH * KW boxes
scattered into one tile, and the tap's weight rows are consecutive in the unpacked tile.
"""

from __future__ import annotations

import tvm.script

from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import EPILOGUE_BIAS, EPILOGUE_REQUANTISE, EPILOGUE_RESIDUAL, GEMM_ACCUMULATE, UNPACK4_INT8, DType

from ...errors import ScratchpadTooSmall
from ...normalise.int4_convs import Int4ConvLayer
from ..common.spad_layout import a_row_stride

SPAD = "global.cgra_spad"
_SPAD_SHARE = 0.9
_ISSUE = 8  # cycles of issue a command, as int4_qmatmul.py counts them
#: Pixel tiles outside are priced a third above their estimate, so they win where they save a quarter: the estimate does not
#: see how well the taps' gathers overlap the GEMMs (float32, cgra-16x16, 1x32x16x16x32 3x3: two
#: weight tiles under one pixel tile took 23,252 cycles, one weight tile 18,810, estimated 11,076
#: and 11,164), and with the image gathered once a weight tile the programs are the ones measured.
_PIXELS_OUTER_MARGIN = 4 / 3


def _divisors(value: int) -> list[int]:
    return [d for d in range(value, 0, -1) if value % d == 0]


def _itemsize(layer: Int4ConvLayer) -> int:
    return 1 if layer.mode == "int8" else 4


def _buffers(layer: Int4ConvLayer, th: int, nt: int) -> tuple[int, int]:
    """(weight tile buffers, gather buffers): two, to alternate, unless there is one tile."""
    return (1 if nt == layer.f else 2), (1 if layer.n * layer.oh == th else 2)


def _tile_bytes(layer: Int4ConvLayer, th: int, nt: int, arch: HardwareDescription) -> int:
    """The weight tiles' buffers (packed, unpacked, bias + multiplier or scales), the taps'
    gathered operands' buffers, and two of the accumulator, (int8) output and correction tiles."""
    item, mt = _itemsize(layer), th * layer.ow
    extra = 8 if layer.mode == "int8" else 4 * layer.groups
    weights = nt * (layer.packed_bytes + item * layer.k + extra)
    gathered = layer.kh * layer.kw * mt * a_row_stride(mt, layer.c, item, arch) * item
    wb, xb = _buffers(layer, th, nt)
    return wb * weights + xb * gathered + 2 * mt * nt * (4 + (1 + 4 * layer.corrected if layer.mode == "int8" else 0))


def estimated_cycles(layer: Int4ConvLayer, th: int, nt: int, arch: HardwareDescription,
                     pixels_outer: bool = False) -> int:
    """The busiest unit's cycles (DMA: the packed weights and the image, one of them once and the
    other once per tile of the other, and the output; PE array: a GEMM a tap and tile; vector
    unit: UNPACK4, EPILOGUE), plus the first weight tile's unpack, which nothing overlaps,
    plus a few cycles of issue per command. `pixels_outer`: the loop order of `int4_conv_kernel`."""
    item, mt, taps = _itemsize(layer), th * layer.ow, layer.kh * layer.kw
    weight_tiles, pixel_tiles = layer.f // nt, layer.n * layer.oh // th
    extra = 8 if layer.mode == "int8" else 4 * layer.groups
    image = layer.n * layer.oh * layer.ow * taps * layer.c * item
    weights, unpacks = layer.f * (layer.packed_bytes + extra), layer.k * layer.f
    if pixels_outer:
        weights, unpacks = pixel_tiles * weights, pixel_tiles * unpacks
    else:
        image *= weight_tiles
    dma = -(-(weights + image + layer.n * layer.f * layer.oh * layer.ow * item) // arch.dma_bytes_per_cycle)
    gemm = weight_tiles * pixel_tiles * taps * -(-mt // arch.rows) * -(-nt // arch.cols) * layer.c
    passes = 2 if layer.mode == "int8" else 1
    vector = -(-(unpacks + passes * layer.n * layer.oh * layer.ow * layer.f) // arch.vector_lanes)
    first = -(-layer.k * nt // arch.vector_lanes)
    # What nothing overlaps at the ends: the first tap's gather before the first GEMM, the last
    # tile's EPILOGUE and store after the last.
    ends = -(-(mt * layer.c * item + mt * nt * item) // arch.dma_bytes_per_cycle) + -(-mt * nt // arch.vector_lanes)
    commands = weight_tiles * pixel_tiles * (2 * taps + 3) + (pixel_tiles if pixels_outer else 1) * 4 * weight_tiles
    return max(dma, gemm, vector) + first + ends + _ISSUE * commands


def choose_tiles(layer: Int4ConvLayer, arch: HardwareDescription) -> tuple[int, int, bool]:
    """(th, nt, pixels_outer): divisors of OH and F whose tiles fit the scratchpad and the loop
    order, the fewest estimated cycles."""
    budget = int(arch.spad_bytes * _SPAD_SHARE)
    best = None
    for nt in _divisors(layer.f):
        for th in _divisors(layer.oh):
            if _tile_bytes(layer, th, nt, arch) > budget:
                continue
            weights_outer = estimated_cycles(layer, th, nt, arch)
            priced = estimated_cycles(layer, th, nt, arch, True) * _PIXELS_OUTER_MARGIN
            pixels_outer = priced < weights_outer
            key = (min(priced, weights_outer), -nt, -th)
            if best is None or key < best[0]:
                best = (key, (th, nt, pixels_outer))
    if best is None:
        raise ScratchpadTooSmall(f"conv2d with int4 weights (C {layer.c}, F {layer.f}, {layer.kh}x{layer.kw}): no tile "
                                 f"of one output row and one channel fits {budget} bytes of the {arch.spad_bytes}-byte "
                                 "scratchpad; use a chip with a larger one")
    return best[1]


_TEMPLATE = """
@T.prim_func
def kernel(X: T.Buffer(({n}, {c}, {h}, {w}), "{dt}"), Q: T.Buffer(({f}, {kb}), "int8"),{params}
           Y: T.Buffer(({n}, {f}, {oh}, {ow}), "{dt}")):
    T.func_attr({{"cgra.kernel": True, "cgra.macs": {macs}}})
    Q_s = T.alloc_buffer(({wb}, {nt}, {kb}), "int8", scope="{spad}")
{allocs}    W_s = T.alloc_buffer(({wb}, {k}, {nt}), "{dt}", scope="{spad}")
    X_s = T.alloc_buffer(({xb}, {taps}, {mt}, {ks}), "{dt}", scope="{spad}")
    A_s = T.alloc_buffer((2, {mt}, {nt}), "{acc}", scope="{spad}")
{load0}{steady}{last}"""

_INT8 = dict(
    params=' B: T.Buffer(({f},), "int32"), M: T.Buffer(({f},), "float32"),{r_param}',
    allocs=('    B_s = T.alloc_buffer(({wb}, {nt}), "int32", scope="{spad}")\n'
            '    M_s = T.alloc_buffer(({wb}, {nt}), "float32", scope="{spad}")\n'
            '    Y_s = T.alloc_buffer((2, {mt}, {nt}), "int8", scope="{spad}")\n{r_alloc}'),
    operands=("{pad}for j in range({nt}):\n{pad}    B_s[{t} % 2, j] = B[{t} * {nt} + j]\n"
              "{pad}for j in range({nt}):\n{pad}    M_s[{t} % 2, j] = M[{t} * {nt} + j]\n"),
    unpack_args="Q_s.data, 0, 0, 0, 0, 0",
    finish=('{r_load}{pad}    T.evaluate(T.call_extern("int32", "cgra_epilogue", {flags}, {i32}, {i8}, {mt}, {nt}, A_s.data,\n'
            '{pad}        {par} * {mt} * {nt}, {nt}, B_s.data, {t} % 2 * {nt}, Y_s.data, {par} * {mt} * {nt}, {nt}, {residual},\n'
            '{pad}        0, 0, M_s.data, {t} % 2 * {nt},\n'
            '{pad}        {zp}))\n'
            '{pad}    for j, yy, xx in T.grid({nt}, {th}, {ow}):\n'
            '{pad}        Y[b, {t} * {nt} + j, yb * {th} + yy, xx] = Y_s[{par}, yy * {ow} + xx, j]\n'))
_FLOAT32 = dict(
    params=' S: T.Buffer(({f}, {g}), "float32"),',
    allocs='    S_s = T.alloc_buffer(({wb}, {nt}, {g}), "float32", scope="{spad}")\n',
    operands="{pad}for j, s in T.grid({nt}, {g}):\n{pad}    S_s[{t} % 2, j, s] = S[{t} * {nt} + j, s]\n",
    unpack_args="S_s.data, {t} % 2 * {nt} * {g} + u * {chunk_groups}, {g}, 0, 0, 0",
    finish=('{pad}    for j, yy, xx in T.grid({nt}, {th}, {ow}):\n'
            '{pad}        Y[b, {t} * {nt} + j, yb * {th} + yy, xx] = A_s[{par}, yy * {ow} + xx, j]\n'))

_LOAD = """{pad}for j, q in T.grid({nt}, {kb}):
{pad}    Q_s[{t} % 2, j, q] = Q[{t} * {nt} + j, q]
{operands}{pad}for u in range({chunks}):
{pad}    T.evaluate(T.call_extern("int32", "cgra_unpack4", {unpack}, {chunk}, {nt}, {group}, Q_s.data,
{pad}        {t} % 2 * {nt} * {kb} + u * {chunk} // 2, {kb}, {unpack_args}, W_s.data, {t} % 2 * {k} * {nt} + u * {chunk} * {nt},
{pad}        {nt}))
"""

_COMPUTE = """{pad}for b, yb in T.grid({n}, {oh} // {th}):
{pad}    for ry, rx in T.grid({kh}, {kw}):
{gather}{gemm}{finish}"""

_GATHER = """{pad}for yy, xx, ci in T.grid({th}, {ow}, {c}):
{pad}    X_s[(b * {yt} + yb) % 2, ry * {kw} + rx, yy * {ow} + xx, ci] = {value}
"""

_GEMM = """{pad}T.evaluate(T.call_extern("int32", "cgra_gemm", T.min(ry * {kw} + rx, {accumulate}), {gemmd}, {mt}, {nt}, {c}, X_s.data,
{pad}    ((b * {yt} + yb) % 2 * {taps} + ry * {kw} + rx) * {mt} * {ks}, {ks}, W_s.data,
{pad}    {t} % 2 * {k} * {nt} + (ry * {kw} + rx) * {c} * {nt}, {nt}, A_s.data, {par} * {mt} * {nt}, {nt}))
"""

#: The other loop order: per tile of output rows, the taps gathered once, then every weight tile
#: loaded, unpacked and multiplied (the weights cross DRAM once a pixel tile, the image once).
_PIXELS_OUTER = """{pad}for b, yb in T.grid({n}, {oh} // {th}):
{pad}    for ry, rx in T.grid({kh}, {kw}):
{gather}{load0}{steady}{last}"""

_TILE = """{pad}for ry, rx in T.grid({kh}, {kw}):
{gemm}{finish}"""


def _gather_value(layer: Int4ConvLayer) -> str:
    """The gathered element: X at the tap's pixel, the halo's value outside the image."""
    (sh, sw), (dh, dw), (top, left, _, _) = layer.stride, layer.dilation, layer.padding
    y = f"(yb * {{th}} + yy) * {sh} + ry * {dh} - {top}"
    x = f"xx * {sw} + rx * {dw} - {left}"
    load = f"X[b, ci, {y}, {x}]"
    if not any(layer.padding):
        return load
    fill = f'T.{layer.mode}({layer.halo})'
    guard = f"0 <= {y} and {y} < {layer.h} and 0 <= {x} and {x} < {layer.w}"
    return f"T.if_then_else({guard}, {load}, {fill})"


def _correction(layer: Int4ConvLayer, fields: dict) -> dict:
    """The template's parts of an int8 layer's padding correction R (int4_convs.py): its
    parameter, its (mt, nt) int32 tile, loaded per output tile before the EPILOGUE adds it."""
    if not layer.corrected:
        return dict(r_param="", r_alloc="", r_load="")
    return dict(r_param=' R: T.Buffer(({f}, {oh}, {ow}), "int32"),'.format(**fields),
                r_alloc='    R_s = T.alloc_buffer((2, {mt}, {nt}), "int32", scope="{spad}")\n'.format(**fields),
                r_load=("{pad}    for j, yy, xx in T.grid({nt}, {th}, {ow}):\n"
                        "{pad}        R_s[{par}, yy * {ow} + xx, j] = R[{t} * {nt} + j, yb * {th} + yy, xx]\n"))


def _unpack_rows(layer: Int4ConvLayer) -> int:
    """Rows of the weight tile one UNPACK4 writes: a tap's C when they start on a whole byte and
    a whole scale group (so tap 0's GEMMs wait for its rows only, not the whole tile's), else K."""
    c, group = layer.c, layer.group
    if c % 2 == 0 and c < layer.k and (layer.mode == "int8" or group >= layer.k or c % group == 0):
        return c
    return layer.k


def int4_conv_kernel(layer: Int4ConvLayer, arch: HardwareDescription):
    """The `cgra.kernel` PrimFunc of `layer` on `arch`: (X, Q, B, M, Y) for int8, (X, Q, S, Y)
    for float32 (int4_convs.host_prim_func's parameters). Weight tiles outer (the image gathered
    once a weight tile) or pixel tiles outer (the weights loaded once a pixel tile): the cheaper."""
    th, nt, pixels_outer = choose_tiles(layer, arch)
    int8 = layer.mode == "int8"
    parts = _INT8 if int8 else _FLOAT32
    mt = th * layer.ow
    wb, xb = _buffers(layer, th, nt)
    fields = dict(wb=wb, xb=xb, n=layer.n, c=layer.c, h=layer.h, w=layer.w, f=layer.f, kh=layer.kh, kw=layer.kw,
                  oh=layer.oh, ow=layer.ow, k=layer.k, kb=layer.packed_bytes, g=layer.groups,
                  group=1 if int8 else layer.group, taps=layer.kh * layer.kw, th=th, yt=layer.oh // th, mt=mt, nt=nt,
                  spad=SPAD, macs=layer.macs, ks=a_row_stride(mt, layer.c, _itemsize(layer), arch), dt=layer.mode,
                  acc="int32" if int8 else "float32", accd=int(DType.INT32 if int8 else DType.FLOAT32),
                  gemmd=int(DType.INT8 if int8 else DType.FLOAT32), accumulate=GEMM_ACCUMULATE,
                  unpack=UNPACK4_INT8 if int8 else 0, i8=int(DType.INT8), i32=int(DType.INT32), zp=layer.zero_point,
                  flags=EPILOGUE_BIAS | EPILOGUE_REQUANTISE | (EPILOGUE_RESIDUAL if layer.corrected else 0),
                  residual="R_s.data, {par} * {mt} * {nt}, {nt}" if layer.corrected else "0, 0, 0")
    fields.update(_correction(layer, fields))
    fields["value"] = _gather_value(layer).format(**fields)
    fields["chunk"] = chunk = _unpack_rows(layer)
    fields.update(chunks=layer.k // chunk, chunk_groups=0 if layer.group >= layer.k else chunk // layer.group)

    def text(template: str, pad: str, t: str = "0", par: str = "0", **parts_) -> str:
        return template.format(**dict(fields, t=t, pad=pad, par=par, **parts_))

    def load(t: str, pad: str) -> str:
        return text(_LOAD, pad, t, operands=text(parts["operands"], pad, t), unpack_args=text(parts["unpack_args"], pad, t))

    # The accumulator (and output, correction) tiles alternate: by pixel tile when weight tiles are
    # outer, by weight tile when pixel tiles are; a tile's first tap overwrites its accumulator.
    def compute(t: str, pad: str) -> str:  # weights outer: a pixel loop per weight tile
        par = "(b * {} + yb) % 2".format(fields["yt"])
        return text(_COMPUTE, pad, t, par, gather=text(_GATHER, pad + "        "),
                    gemm=text(_GEMM, pad + "        ", t, par),
                    finish=text(text(parts["finish"], pad, t, par), pad, t, par))  # twice: r_load's fields

    def tile(t: str, pad: str) -> str:  # pixels outer: one weight tile's GEMMs (finish is indented from pad - 4)
        par = f"{t} % 2"
        return text(_TILE, pad, t, par, gemm=text(_GEMM, pad + "    ", t, par),
                    finish=text(text(parts["finish"], pad[:-4], t, par), pad[:-4], t, par))

    tiles = layer.f // nt
    if pixels_outer:
        steady = (f"        for nb in range({tiles - 1}):\n" + load("(nb + 1)", " " * 12) + tile("nb", " " * 12)) \
            if tiles > 1 else ""
        body = text(_PIXELS_OUTER, "    ", gather=text(_GATHER, " " * 12), load0=load("0", " " * 8), steady=steady,
                    last=tile(str(tiles - 1), " " * 8))
        load0, steady, last = "", "", body
    else:
        steady = (f"    for nb in range({tiles - 1}):\n" + load("(nb + 1)", "        ") + compute("nb", "        ")) \
            if tiles > 1 else ""
        load0, last = load("0", "    "), compute(str(tiles - 1), "    ")
    return tvm.script.from_source(text(_TEMPLATE, "", params=parts["params"].format(**fields),
                                       allocs=parts["allocs"].format(**fields), load0=load0, steady=steady, last=last))
