"""int8 x int4 requantising matmul: a QDQ layer's int4 weights kept packed in DRAM.

Stage: kernels (normalise/int4_weights.py replaces normalise/qdq_int4.py's host PrimFunc with it).
In: the sizes of one layer (M rows of int8 activations, K, N, the output zero point) and the chip. Out:
a PrimFunc written for the NPU (`cgra.kernel`, docs/own-kernels.md)

    acc[m, n] = sum_k int32(X[m, k]) * int32(W[k, n]) + B[n]                     (int32)
    Y[m, n]   = rne(clamp(float32(acc) * M[n], -128 - zp, 127 - zp)) + zp          (int8)

W signed int4 (-8..7, zero point 0: onnxruntime's quantizer writes QDQ int4 weights so), packed
two per byte along each output column (Q (N, ceil(K / 2)), row 2b in byte b's low nibble: ONNX's
INT4 layout of the transposed weight), B the int32 bias with the activation zero point folded in,
M the per-channel float32 multiplier, zp the output zero point: the arithmetic of qdq.py, whose
EPILOGUE requantises the same way. Per tile of nt output channels the kernel DMAs half a byte per
weight, UNPACK4 with UNPACK4_INT8 writes the int8 (K, nt) tile in the scratchpad
(cgra_sim/unpack4.py), and the int8 GEMM and one EPILOGUE run on it per tile of mt rows of X:
the weights cross DRAM packed, half their int8 bytes.

Why hand-written: as int4_matmul.py (a step between the weight's DMA and the GEMM). Whole K per
tile; a layer whose whole-K tiles do not fit keeps its host PrimFunc (ScratchpadTooSmall).
"""

from __future__ import annotations

import tvm.script

from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import EPILOGUE_BIAS, EPILOGUE_REQUANTISE, UNPACK4_INT8, DType

from ...errors import ScratchpadTooSmall
from ...normalise.qdq_int4 import QInt4Layer
from ..common.spad_layout import a_row_stride

SPAD = "global.cgra_spad"
_SPAD_SHARE = 0.9
def _divisors(value: int) -> list[int]:
    return [d for d in range(value, 0, -1) if value % d == 0]


def _tile_bytes(layer: QInt4Layer, mt: int, nt: int, ks: int) -> int:
    """Two buffers of each weight tile (packed, unpacked, bias, multiplier), X's tile (padded
    rows), the int32 accumulator and the int8 output tile."""
    weights = nt * (layer.packed_bytes + layer.k + 8)
    return 2 * weights + mt * ks + 5 * mt * nt


def estimated_cycles(layer: QInt4Layer, mt: int, nt: int, arch: HardwareDescription) -> int:
    """The busiest unit's cycles (DMA, GEMM folds, UNPACK4 nibbles, EPILOGUE), plus the first
    weight tile's unpack, which nothing overlaps (one tile of all N overlaps nothing), plus issue."""
    weight_tiles, row_tiles = layer.n // nt, layer.m // mt
    x = layer.m * layer.k * (1 if mt == layer.m else weight_tiles)
    dma = -(-(layer.n * (layer.packed_bytes + 8) + x + layer.m * layer.n) // arch.dma_bytes_per_cycle)
    gemm = weight_tiles * row_tiles * -(-mt // arch.rows) * -(-nt // arch.cols) * layer.k
    vector = -(-(layer.k * layer.n + layer.m * layer.n) // arch.vector_lanes)
    first = -(-layer.k * nt // arch.vector_lanes)
    return max(dma, gemm, vector) + first + 8 * weight_tiles * (3 + 3 * row_tiles)


def choose_tiles(layer: QInt4Layer, arch: HardwareDescription) -> tuple[int, int]:
    """(mt, nt): divisors of M and N whose whole-K tiles fit, the fewest estimated cycles."""
    budget = int(arch.spad_bytes * _SPAD_SHARE)
    best = None
    for nt in _divisors(layer.n):
        mt = next((mt for mt in _divisors(layer.m)
                   if _tile_bytes(layer, mt, nt, a_row_stride(mt, layer.k, 1, arch)) <= budget), None)
        if mt is None:
            continue
        key = (estimated_cycles(layer, mt, nt, arch), -nt)
        if best is None or key < best[0]:
            best = (key, (mt, nt))
    if best is None:
        raise ScratchpadTooSmall(f"int8 x int4 matmul (K {layer.k}, N {layer.n}): no whole-K tile fits {budget} "
                                 f"bytes of the {arch.spad_bytes}-byte scratchpad; use a chip with a larger one")
    return best[1]


_TEMPLATE = """
@T.prim_func
def kernel(X: T.Buffer(({m}, {k}), "int8"), Q: T.Buffer(({n}, {kb}), "int8"), B: T.Buffer(({n},), "int32"),
           M: T.Buffer(({n},), "float32"), Y: T.Buffer(({m}, {n}), "int8")):
    T.func_attr({{"cgra.kernel": True, "cgra.macs": {macs}}})
    Q_s = T.alloc_buffer((2, {nt}, {kb}), "int8", scope="{spad}")
    B_s = T.alloc_buffer((2, {nt}), "int32", scope="{spad}")
    M_s = T.alloc_buffer((2, {nt}), "float32", scope="{spad}")
    W_s = T.alloc_buffer((2, {k}, {nt}), "int8", scope="{spad}")
    X_s = T.alloc_buffer(({mt}, {ks}), "int8", scope="{spad}")
    A_s = T.alloc_buffer(({mt}, {nt}), "int32", scope="{spad}")
    Y_s = T.alloc_buffer(({mt}, {nt}), "int8", scope="{spad}")
{x_once}{load0}{steady}{last}"""

_COMPUTE = """{pad}for mb in range({m} // {mt}):
{x_tile}{pad}    T.evaluate(T.call_extern("int32", "cgra_gemm", 0, {i8}, {mt}, {nt}, {k}, X_s.data, 0, {ks},
{pad}        W_s.data, {t} % 2 * {k} * {nt}, {nt}, A_s.data, 0, {nt}))
{pad}    T.evaluate(T.call_extern("int32", "cgra_epilogue", {flags}, {i32}, {i8}, {mt}, {nt}, A_s.data, 0, {nt},
{pad}        B_s.data, {t} % 2 * {nt}, Y_s.data, 0, {nt}, 0, 0, 0, 0, 0, M_s.data, {t} % 2 * {nt}, {zp}))
{pad}    for i, j in T.grid({mt}, {nt}):
{pad}        Y[mb * {mt} + i, {t} * {nt} + j] = Y_s[i, j]
"""


_LOAD = """{pad}for j, b in T.grid({nt}, {kb}):
{pad}    Q_s[{t} % 2, j, b] = Q[{t} * {nt} + j, b]
{pad}for j in range({nt}):
{pad}    B_s[{t} % 2, j] = B[{t} * {nt} + j]
{pad}for j in range({nt}):
{pad}    M_s[{t} % 2, j] = M[{t} * {nt} + j]
{pad}T.evaluate(T.call_extern("int32", "cgra_unpack4", {unpack}, {k}, {nt}, 1, Q_s.data, {t} % 2 * {nt} * {kb}, {kb},
{pad}    Q_s.data, 0, 0, 0, 0, 0, W_s.data, {t} % 2 * {k} * {nt}, {nt}))
"""


def _x_tile(fields: dict, pad: str) -> dict:
    """`fields` with x_tile: X's row tile copied inside the mb loop (indented under `pad`), or none
    when all of X's rows were loaded once."""
    copy = fields.get("x_copy")
    return dict(fields, x_tile="" if copy is None else pad + "    " + copy.replace("{pad}", pad))


def _load(t: str, pad: str, **fields) -> str:
    """Weight tile `t`'s DMAs (packed bytes, bias, multipliers) and its UNPACK4_INT8."""
    return _LOAD.format(t=t, pad=pad, **fields)


def int4_qmatmul_kernel(layer: QInt4Layer, arch: HardwareDescription):
    """The `cgra.kernel` PrimFunc of `layer` on `arch`: (X, Q, B, M, Y). Weight tiles alternate
    between two buffers (nb % 2), so the next tile's DMA and UNPACK4 overlap the GEMMs."""
    mt, nt = choose_tiles(layer, arch)
    m, k = layer.m, layer.k
    ks = a_row_stride(mt, k, 1, arch)
    copy = "for i, r in T.grid({mt}, {k}):\n{pad}    X_s[i, r] = X[{row}i, r]\n"
    fields = dict(m=m, k=k, n=layer.n, kb=layer.packed_bytes, macs=m * layer.n * k, mt=mt, nt=nt, ks=ks, spad=SPAD,
                  unpack=UNPACK4_INT8, i8=int(DType.INT8), i32=int(DType.INT32), zp=layer.zero_point,
                  flags=EPILOGUE_BIAS | EPILOGUE_REQUANTISE,
                  x_once="    " + copy.format(mt=m, k=k, pad="    ", row="") if mt == m else "", x_tile="")
    if mt != m:
        fields["x_copy"] = copy.format(mt=mt, k=k, pad="{pad}    ", row=f"mb * {mt} + ")
    sizes = dict(nt=nt, kb=layer.packed_bytes, unpack=UNPACK4_INT8, k=k)
    # Tile nb + 1 is loaded and unpacked before tile nb's GEMMs and EPILOGUEs are issued, so the
    # vector unit unpacks it while the PE array multiplies (the units run their commands in order).
    tiles = layer.n // nt
    compute = dict(fields, x_tile=fields["x_tile"])
    steady = ("    for nb in range({}):\n".format(tiles - 1) + _load("(nb + 1)", "        ", **sizes)
              + _COMPUTE.format(t="nb", pad="        ", **_x_tile(compute, "        "))) if tiles > 1 else ""
    fields.update(load0=_load("0", "    ", **sizes), steady=steady,
                  last=_COMPUTE.format(t=str(tiles - 1), pad="    ", **_x_tile(compute, "    ")))
    return tvm.script.from_source(_TEMPLATE.format(**fields))
