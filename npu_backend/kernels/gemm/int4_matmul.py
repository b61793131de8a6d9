"""Weight-only 4-bit matmul (onnxruntime's MatMulNBits, bits = 4): float32 x @ dequant(W) on the NPU.

Stage: kernels. In: the sizes of one layer (M rows of activations, K, N, the block size, whether it
has zero points) and the chip. Out: a PrimFunc written for the NPU (`cgra.kernel`, docs/own-kernels.md)

    Y[M, N] = X[M, K] @ W,  W[k, n] = float32(q[n, k] - z[n, k / block]) * s[n, k / block]

whose operands are MatMulNBits' own tensors: q packed two per byte (N, k_blocks * block / 2) as int8
bits, s (N, k_blocks) float32, z packed nibbles (N, ceil(k_blocks / 2)) as int8 bits (optional; 8
without). Per tile of nt output channels the kernel DMAs the packed bytes, scales and zero points
(half a byte per weight plus 4 / block bytes of scale), UNPACK4 writes the float32 (K, nt) tile in
the scratchpad (cgra_sim/unpack4.py), and the PE array's float32 GEMM runs on it for every tile of
mt rows of X. The float32 weights never exist in DRAM: a decode step's weight traffic is the packed
bytes, an eighth of float32's.

Why hand-written: the GEMM families tile one GEMM block; this kernel adds a step between the
weight's DMA and the GEMM, on another operand layout, which is simplest to place by hand. Whole K
per tile (the tile holds the full reduction), so the tile search is over (mt, nt) only.
"""

from __future__ import annotations

import dataclasses

import tvm.script

from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import GEMM_ACCUMULATE, UNPACK4_ZERO_POINTS, DType

from ...errors import ScratchpadTooSmall
from ..common.spad_layout import a_row_stride

SPAD = "global.cgra_spad"
#: Share of the scratchpad the tiles may take (the rest absorbs the planner's alignment).
_SPAD_SHARE = 0.9


@dataclasses.dataclass(frozen=True)
class Int4Layer:
    """One MatMulNBits layer's sizes."""

    m: int  # rows of X
    k: int  # the reduction (MatMulNBits' K)
    n: int  # output channels
    block: int  # rows of W per scale
    zero_points: bool

    @property
    def groups(self) -> int:
        return -(-self.k // self.block)

    @property
    def packed_bytes(self) -> int:
        """Bytes of one column's packed weights (MatMulNBits' k_blocks * blob_size)."""
        return self.groups * self.block // 2

    @property
    def zero_bytes(self) -> int:
        return -(-self.groups // 2)


def _divisors(value: int) -> list[int]:
    return [d for d in range(value, 0, -1) if value % d == 0]


@dataclasses.dataclass(frozen=True)
class Int4Tiles:
    """mt rows of X, nt output channels, kt rows of W per tile (kt = K, or a multiple of two
    blocks dividing K: the tile's scales and zero-point bytes then start on a whole byte)."""

    mt: int
    nt: int
    kt: int


def _tile_bytes(layer: Int4Layer, tiles: Int4Tiles) -> int:
    """Scratchpad bytes of the tiles: two buffers of each weight tile (packed, scales, zero points,
    unpacked), one of X's (mt whole rows, padded) and Y's (all of X's rows when K is split)."""
    mt, nt, kt = tiles.mt, tiles.nt, tiles.kt
    whole = kt == layer.k
    groups = layer.groups if whole else kt // layer.block
    packed = layer.packed_bytes if whole else kt // 2
    zeros = (layer.zero_bytes if whole else groups // 2) if layer.zero_points else 0
    weights = nt * (packed + 4 * groups + zeros + 4 * kt)
    return 2 * weights + 4 * (mt * (layer.k + 64) + (mt if whole else layer.m) * nt)


def estimated_cycles(layer: Int4Layer, tiles: Int4Tiles, arch: HardwareDescription) -> int:
    """The busiest unit's cycles, as the double-buffered tiles overlap them: the DMA (weights once,
    X once or per weight tile, Y), the PE array's GEMM folds, or UNPACK4's nibbles; plus a few
    cycles of issue per command (each tile's loads, unpack, GEMMs and stores)."""
    mt, nt, kt = tiles.mt, tiles.nt, tiles.kt
    weight_tiles, row_tiles = (layer.n // nt) * (layer.k // kt), layer.m // mt
    weights = layer.n * (layer.packed_bytes + 4 * layer.groups + (layer.zero_bytes if layer.zero_points else 0))
    x = 4 * layer.m * layer.k * (1 if mt == layer.m else layer.n // nt)
    dma = -(-(weights + x + 4 * layer.m * layer.n) // arch.dma_bytes_per_cycle)
    gemm = weight_tiles * row_tiles * -(-mt // arch.rows) * -(-nt // arch.cols) * kt
    unpack = -(-layer.k * layer.n // arch.vector_lanes)
    return max(dma, gemm, unpack) + 8 * weight_tiles * (3 + 2 * row_tiles)


def choose_tiles(layer: Int4Layer, arch: HardwareDescription) -> Int4Tiles:
    """The tiles that fit the scratchpad with the fewest estimated cycles (`estimated_cycles`):
    per K tile (the whole K, or a multiple of two blocks dividing it; a split K keeps all of X's
    rows in one tile, the partial sums in the scratchpad), every divisor of N and the most rows of
    X that fit with it."""
    budget = int(arch.spad_bytes * _SPAD_SHARE)
    splits = [layer.k] + [kt for kt in _divisors(layer.k) if kt < layer.k and kt % (2 * layer.block) == 0]
    best = None
    for kt in splits:
        for nt in _divisors(layer.n):
            rows = _divisors(layer.m) if kt == layer.k else [layer.m]
            mt = next((mt for mt in rows if _tile_bytes(layer, Int4Tiles(mt, nt, kt)) <= budget), None)
            if mt is None:
                continue
            tiles = Int4Tiles(mt, nt, kt)
            key = (estimated_cycles(layer, tiles, arch), -kt, -nt)
            if best is None or key < best[0]:
                best = (key, tiles)
    if best is None:
        raise ScratchpadTooSmall(f"MatMulNBits (K {layer.k}, N {layer.n}, M {layer.m}): no tile of X's rows and one "
                                 f"weight column fits {budget} bytes of the {arch.spad_bytes}-byte scratchpad; use a "
                                 "chip with a larger scratchpad")
    return best[1]


_TEMPLATE = """
@T.prim_func
def kernel(X: T.Buffer(({m}, {k}), "float32"), Q: T.Buffer(({n}, {kb}), "int8"),
           S: T.Buffer(({n}, {g}), "float32"),{z_param} Y: T.Buffer(({m}, {n}), "float32")):
    T.func_attr({{"cgra.kernel": True, "cgra.macs": {macs}}})
    Q_s = T.alloc_buffer((2, {nt}, {qt}), "int8", scope="{spad}")
    S_s = T.alloc_buffer((2, {nt}, {gt}), "float32", scope="{spad}")
{z_alloc}    W_s = T.alloc_buffer((2, {kt}, {nt}), "float32", scope="{spad}")
    X_s = T.alloc_buffer(({mt}, {ks}), "float32", scope="{spad}")
    Y_s = T.alloc_buffer(({ym}, {nt}), "float32", scope="{spad}")
{x_once}    for nb in range({n} // {nt}):
{fill}        for ki in range({nk}):
            for j, b in T.grid({nt}, {qt}):
                Q_s[(nb * {nk} + ki) % 2, j, b] = Q[nb * {nt} + j, ki * {qt} + b]
            for j, b in T.grid({nt}, {gt}):
                S_s[(nb * {nk} + ki) % 2, j, b] = S[nb * {nt} + j, ki * {gt} + b]
{z_load}            T.evaluate(T.call_extern("int32", "cgra_unpack4", {flags}, {kt}, {nt}, {block},
                Q_s.data, (nb * {nk} + ki) % 2 * {nt} * {qt}, {qt}, S_s.data, (nb * {nk} + ki) % 2 * {nt} * {gt}, {gt},
                {z_args}, W_s.data, (nb * {nk} + ki) % 2 * {kt} * {nt}, {nt}))
            for mb in range({m} // {mt}):
{x_tile}                T.evaluate(T.call_extern("int32", "cgra_gemm", {accumulate}, {f32}, {mt}, {nt}, {kt}, X_s.data, ki * {kt}, {ks},
                    W_s.data, (nb * {nk} + ki) % 2 * {kt} * {nt}, {nt}, Y_s.data, {y_offset}, {nt}))
{y_tile}{y_store}"""


def int4_matmul_kernel(layer: Int4Layer, arch: HardwareDescription):
    """The `cgra.kernel` PrimFunc of `layer` on `arch`: (X, packed, scales[, zeros], Y). Weight
    tiles alternate between two buffers (index (nb * nk + ki) % 2), so the DMA of the next one,
    UNPACK4 and the GEMMs overlap."""
    tiles = choose_tiles(layer, arch)
    mt, nt, kt = tiles.mt, tiles.nt, tiles.kt
    m, k, n = layer.m, layer.k, layer.n
    whole = kt == k
    once = mt == m  # X loaded before the weight tiles, not per tile (always when K is split)
    gt = layer.groups if whole else kt // layer.block
    zt = (layer.zero_bytes if whole else gt // 2) if layer.zero_points else 0
    ks = a_row_stride(mt, k, 4, arch)  # X's rows padded apart, so the PE array reads them from different banks
    buf = "(nb * {nk} + ki) % 2".format(nk=k // kt)
    x_copy = "for i, r in T.grid({mt}, {k}):\n{pad}    X_s[i, r] = X[{row}i, r]\n"
    fields = dict(m=m, k=k, n=n, kb=layer.packed_bytes, g=layer.groups, macs=m * n * k, nt=nt, mt=mt, kt=kt, nk=k // kt,
                  qt=layer.packed_bytes if whole else kt // 2, gt=gt, ks=ks, block=layer.block, spad=SPAD,
                  f32=int(DType.FLOAT32), flags=UNPACK4_ZERO_POINTS if layer.zero_points else 0,
                  ym=mt if whole else m, accumulate=0 if whole else GEMM_ACCUMULATE,
                  y_offset=0 if whole else f"mb * {mt} * {nt}")
    fields.update(
        z_param=f' Z: T.Buffer(({n}, {layer.zero_bytes}), "int8"),' if layer.zero_points else "",
        z_alloc=f'    Z_s = T.alloc_buffer((2, {nt}, {zt}), "int8", scope="{SPAD}")\n' if layer.zero_points else "",
        z_load=(f"            for j, b in T.grid({nt}, {zt}):\n"
                f"                Z_s[{buf}, j, b] = Z[nb * {nt} + j, ki * {zt} + b]\n") if layer.zero_points else "",
        z_args=f"Z_s.data, {buf} * {nt} * {zt}, {zt}" if layer.zero_points else "0, 0, 0",
        x_once=("    for i, r in T.grid({m}, {k}):\n        X_s[i, r] = X[i, r]\n".format(m=m, k=k)) if once else "",
        x_tile="" if once else "                " + x_copy.format(mt=mt, k=k, pad="                ", row=f"mb * {mt} + "),
        fill="" if whole else (f'        T.evaluate(T.call_extern("int32", "cgra_fill", {int(DType.FLOAT32)}, Y_s.data, 0, '
                               f"{m}, {nt}, {nt}, 0))\n"),
        y_tile=("                for i, j in T.grid({mt}, {nt}):\n"
                "                    Y[mb * {mt} + i, nb * {nt} + j] = Y_s[i, j]\n").format(mt=mt, nt=nt) if whole else "",
        y_store="" if whole else ("        for i, j in T.grid({m}, {nt}):\n"
                                  "            Y[i, nb * {nt} + j] = Y_s[i, j]\n").format(m=m, nt=nt))
    return tvm.script.from_source(_TEMPLATE.format(**fields))
