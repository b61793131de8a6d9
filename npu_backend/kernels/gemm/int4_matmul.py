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

from tvm.script import tirx as T

from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import UNPACK4_ZERO_POINTS, DType

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


def _tile_bytes(layer: Int4Layer, mt: int, nt: int) -> int:
    """Scratchpad bytes of the tiles: two buffers of each weight tile (packed, scales, zero points,
    unpacked), one of X's and Y's."""
    weights = nt * (layer.packed_bytes + 4 * layer.groups + (layer.zero_bytes if layer.zero_points else 0))
    return 2 * (weights + 4 * layer.k * nt) + 4 * (mt * (layer.k + 64) + mt * nt)  # + X's row padding


def choose_tiles(layer: Int4Layer, arch: HardwareDescription) -> tuple[int, int]:
    """(mt, nt): divisors of M and N whose tiles fit the scratchpad, the widest nt first (each
    weight is unpacked once; X is reloaded per weight tile), then the tallest mt."""
    budget = int(arch.spad_bytes * _SPAD_SHARE)
    for nt in _divisors(layer.n):
        for mt in _divisors(layer.m):
            if _tile_bytes(layer, mt, nt) <= budget:
                return mt, nt
    raise ScratchpadTooSmall(f"MatMulNBits (K {layer.k}, N {layer.n}): one row of X and one weight column take "
                             f"{_tile_bytes(layer, 1, 1)} bytes with the whole K in the tile, more than "
                             f"{budget} of the {arch.spad_bytes}-byte scratchpad; use a chip with a larger "
                             "scratchpad")


def int4_matmul_kernel(layer: Int4Layer, arch: HardwareDescription):
    """The `cgra.kernel` PrimFunc of `layer` on `arch`: (X, packed, scales[, zeros], Y)."""
    mt, nt = choose_tiles(layer, arch)
    m, k, n, block = layer.m, layer.k, layer.n, layer.block
    kb, g, zb = layer.packed_bytes, layer.groups, layer.zero_bytes
    f32, once = int(DType.FLOAT32), mt == m  # once: X is loaded before the weight tiles, not per tile
    ks = a_row_stride(mt, k, 4, arch)  # X's rows padded apart, so the PE array reads them from different banks
    if layer.zero_points:
        @T.prim_func
        def kernel(X: T.Buffer((m, k), "float32"), Q: T.Buffer((n, kb), "int8"), S: T.Buffer((n, g), "float32"),
                   Z: T.Buffer((n, zb), "int8"), Y: T.Buffer((m, n), "float32")):
            T.func_attr({"cgra.kernel": True})
            Q_s = T.alloc_buffer((2, nt, kb), "int8", scope=SPAD)
            S_s = T.alloc_buffer((2, nt, g), "float32", scope=SPAD)
            Z_s = T.alloc_buffer((2, nt, zb), "int8", scope=SPAD)
            W_s = T.alloc_buffer((2, k, nt), "float32", scope=SPAD)
            X_s = T.alloc_buffer((mt, ks), "float32", scope=SPAD)
            Y_s = T.alloc_buffer((mt, nt), "float32", scope=SPAD)
            if once:
                for i, r in T.grid(m, k):
                    X_s[i, r] = X[i, r]
            for nb in range(n // nt):
                for j, b in T.grid(nt, kb):
                    Q_s[nb % 2, j, b] = Q[nb * nt + j, b]
                for j, b in T.grid(nt, g):
                    S_s[nb % 2, j, b] = S[nb * nt + j, b]
                for j, b in T.grid(nt, zb):
                    Z_s[nb % 2, j, b] = Z[nb * nt + j, b]
                T.evaluate(T.call_extern("int32", "cgra_unpack4", UNPACK4_ZERO_POINTS, k, nt, block,
                                         Q_s.data, nb % 2 * nt * kb, kb, S_s.data, nb % 2 * nt * g, g,
                                         Z_s.data, nb % 2 * nt * zb, zb, W_s.data, nb % 2 * k * nt, nt))
                for mb in range(m // mt):
                    if not once:
                        for i, r in T.grid(mt, k):
                            X_s[i, r] = X[mb * mt + i, r]
                    T.evaluate(T.call_extern("int32", "cgra_gemm", 0, f32, mt, nt, k, X_s.data, 0, ks,
                                             W_s.data, nb % 2 * k * nt, nt, Y_s.data, 0, nt))
                    for i, j in T.grid(mt, nt):
                        Y[mb * mt + i, nb * nt + j] = Y_s[i, j]
        return kernel.with_attr("cgra.macs", m * n * k)

    @T.prim_func
    def kernel_symmetric(X: T.Buffer((m, k), "float32"), Q: T.Buffer((n, kb), "int8"),
                         S: T.Buffer((n, g), "float32"), Y: T.Buffer((m, n), "float32")):
        T.func_attr({"cgra.kernel": True})
        Q_s = T.alloc_buffer((2, nt, kb), "int8", scope=SPAD)
        S_s = T.alloc_buffer((2, nt, g), "float32", scope=SPAD)
        W_s = T.alloc_buffer((2, k, nt), "float32", scope=SPAD)
        X_s = T.alloc_buffer((mt, ks), "float32", scope=SPAD)
        Y_s = T.alloc_buffer((mt, nt), "float32", scope=SPAD)
        if once:
            for i, r in T.grid(m, k):
                X_s[i, r] = X[i, r]
        for nb in range(n // nt):
            for j, b in T.grid(nt, kb):
                Q_s[nb % 2, j, b] = Q[nb * nt + j, b]
            for j, b in T.grid(nt, g):
                S_s[nb % 2, j, b] = S[nb * nt + j, b]
            T.evaluate(T.call_extern("int32", "cgra_unpack4", 0, k, nt, block, Q_s.data, nb % 2 * nt * kb, kb,
                                     S_s.data, nb % 2 * nt * g, g, 0, 0, 0, W_s.data, nb % 2 * k * nt, nt))
            for mb in range(m // mt):
                if not once:
                    for i, r in T.grid(mt, k):
                        X_s[i, r] = X[mb * mt + i, r]
                T.evaluate(T.call_extern("int32", "cgra_gemm", 0, f32, mt, nt, k, X_s.data, 0, ks,
                                         W_s.data, nb % 2 * k * nt, nt, Y_s.data, 0, nt))
                for i, j in T.grid(mt, nt):
                    Y[mb * mt + i, nb * nt + j] = Y_s[i, j]
    return kernel_symmetric.with_attr("cgra.macs", m * n * k)
