"""The flash attention kernel's tile search: query rows and key rows a tile, how the mask is read.

Stage: tiling (flash.py writes the kernel these tiles describe). Per query tile of tq rows the
kernel holds, for one head at a time, the Q tile, the running max, sum and output, and the
scores of one key tile (tq x tk); K / V tiles of tk keys stream through the scratchpad
(double-buffered), so any sequence length fits and K and V cross DRAM once per query tile. The
mask is read either as the rows of a query tile (tq x Sk, held while every head of the tile
runs: once in all, whatever the heads) or as a tq x tk block beside each key tile (once per
head, in little space). The search takes the fewest estimated cycles among the tilings within
3% of the fewest DMA bytes.
"""

from __future__ import annotations

import dataclasses

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription

from ..common.spad_layout import a_row_stride
from ..common.spec import aligned, round_up

F32_BYTES = 4
#: How many more DMA bytes than the fewest a tiling may move and still be taken for its cycles
#: (the key tiles of the fewest bytes can be 8 keys wide: many short commands).
BYTES_SLACK = 0.5
#: The most query tiles the search tries (it tries every count of query tiles up to this).
MAX_QUERY_TILES = 256


@dataclasses.dataclass(frozen=True)
class FlashTiling:
    """tq query rows and tk keys a tile; `mask` "none", "rows" (a query tile's rows of the mask,
    held for all its heads) or "blocks" (a tq x tk block per key tile and head); `lean`: the Q
    tile single-buffered and O normalised in place (more rows a tile, less overlap); `pipeline`:
    the key tiles software-pipelined where there are two or more (flash._pipelined_keys); the GEMMs'
    A tiles' row strides (q_stride, p_stride); the estimates the search chose by."""

    tq: int
    tk: int
    mask: str = "none"
    lean: bool = False
    pipeline: bool = True
    q_stride: int = 0
    p_stride: int = 0
    dma_bytes: int = 0
    cycles: int = 0


def mask_rows(spec) -> int:
    """Rows of a query tile's mask tile: tq, or 1 for a mask broadcast along the queries."""
    return spec.mask_shape[3] if spec.mask_shape else 0


def key_tiles(spec, t: FlashTiling) -> int:
    """Key tiles the kernel runs per head over all its query tiles: every one, or under a
    constant causal mask those up to each query tile's diagonal (the ones above are skipped)."""
    tiles = -(-spec.sq // t.tq)
    if spec.causal is None:
        return tiles * -(-spec.sk // t.tk)
    r, keys = t.tq // t.tk, spec.sk // t.tk
    return sum(min(keys, (qt + 1) * r + spec.causal // t.tk) for qt in range(tiles))


def flash_footprint(spec, t: FlashTiling) -> int:
    """Scratchpad bytes of the flash kernel with tiling `t` (every buffer its own bytes: the
    code generator's stack may share some, never more)."""
    tq, tk, d, dv = t.tq, t.tk, spec.d, spec.dv
    rest = spec.sk % tk
    state = (1 if t.lean else 2) * aligned(tq * t.q_stride * F32_BYTES) + 5 * aligned(tq * F32_BYTES)
    state += (1 if t.lean else 3) * aligned(tq * dv * F32_BYTES)
    state += aligned(tq * dv * 2) if t.lean and spec.half_out else 0  # the rounded output (flash.py)
    state += aligned(tq * tk * F32_BYTES) + aligned(tq * t.p_stride * F32_BYTES)

    def keys(w: int) -> int:
        block = aligned(tq * w * F32_BYTES) if t.mask == "blocks" else 0
        return aligned(d * w * F32_BYTES) + aligned(w * dv * F32_BYTES) + block

    if pipelined(spec, t):  # two more copies of S and P (flash._pipelined_keys)
        state += aligned(2 * tq * tk * F32_BYTES) + aligned(2 * tq * t.p_stride * F32_BYTES)
        if spec.causal is not None:  # and the diagonal tiles' K and V beside the pipelined ones'
            state += aligned(2 * d * tk * F32_BYTES) + aligned(2 * tk * dv * F32_BYTES)
    rows = 0
    if t.mask == "rows":
        msq, msk = spec.mask_shape[3:]
        rows = aligned((tq if msq > 1 else 1) * msk * F32_BYTES)
    if spec.causal is not None:  # the band of triangles (flash.py), built once
        rows += aligned((2 * (tq // tk) - 1) * tk * tk * F32_BYTES)
    return state + 2 * keys(tk) + (keys(rest) if rest else 0) + rows


def flash_dma_bytes(spec, t: FlashTiling) -> int:
    """DRAM bytes the kernel moves: Q and O once, K and V once per query tile and head, the
    mask once per batch (rows) or once per head (blocks)."""
    heads = spec.b * spec.hk * spec.g
    moved = heads * spec.sq * (spec.d + spec.dv) * F32_BYTES
    if spec.causal is None:
        moved += heads * -(-spec.sq // t.tq) * spec.sk * (spec.d + spec.dv) * F32_BYTES
    else:
        moved += heads * key_tiles(spec, t) * t.tk * (spec.d + spec.dv) * F32_BYTES
    if spec.mask_shape:
        _, mhk, mg, msq, msk = spec.mask_shape
        per_batch = msq * msk * F32_BYTES
        moved += spec.b * per_batch * (mhk * mg if t.mask == "rows" else spec.hk * spec.g)
    return moved


def pipelined(spec, t: FlashTiling) -> bool:
    """Whether the kernel runs its whole key tiles software-pipelined (flash._pipelined_keys):
    two or more of them (under a constant causal mask: those below the diagonal), unless the
    tiling says not (two more copies of S and P did not fit; flash_length.py's kernel)."""
    return t.pipeline and spec.sk // t.tk >= 2


def flash_key_tile_cycles(spec, arch: HardwareDescription, tq: int, tk: int, overlap: bool = False) -> int:
    """The PE array's and the vector unit's cycles on one key tile of one query tile: their sum,
    or with `overlap` (pipelined key tiles) the longer."""
    d, dv = spec.d, spec.dv
    pe = cost.gemm_steady_cycles(arch, tq, tk, d, "float32") + cost.gemm_steady_cycles(arch, tq, dv, tk, "float32")
    work = 0
    if spec.mask_shape:
        work += cost.eltwise_cycles(arch, tq * tk, 2 * tq * tk)
    work += 2 * cost.reduce_cycles(arch, tq, tk) + cost.eltwise_cycles(arch, tq * tk, tq * tk + tq)
    work += cost.vfunc_cycles(arch, tq * tk, "exp") + cost.eltwise_cycles(arch, tq * dv, tq * dv + tq)
    work += 3 * cost.eltwise_cycles(arch, tq, 2 * tq) + cost.vfunc_cycles(arch, tq, "exp")
    work += cost.vfunc_cycles(arch, tq, "identity")
    return max(work, pe) if overlap else work + pe


def flash_cycles(spec, arch: HardwareDescription, t: FlashTiling) -> int:
    """Estimated cycles: per query tile and head, its key tiles (each the longer of its work and
    its K / V (and mask block) load), the Q load, the fills and the normalisation."""
    tq, tk = t.tq, t.tk
    keys = spec.sk // tk
    tile_bytes = tk * (spec.d + spec.dv) * F32_BYTES + (tq * tk * F32_BYTES if t.mask == "blocks" else 0)
    step = max(flash_key_tile_cycles(spec, arch, tq, tk, pipelined(spec, t)), cost.dma_transfer_cycles(arch, tile_bytes))
    if spec.sk % tk:
        rest = spec.sk % tk
        step_rest = flash_key_tile_cycles(spec, arch, tq, rest) + arch.dma_latency
    else:
        step_rest = 0
    tiles = -(-spec.sq // tq)
    head = 3 * cost.vector_cycles(arch, tq, spec.dv)
    head += cost.dma_transfer_cycles(arch, tq * spec.d * F32_BYTES) * (2 if t.lean else 1)
    head += arch.dma_latency if t.lean else 0
    if spec.causal is not None:  # the r tiles crossing each query tile's diagonal run one after the other
        serial = max(flash_key_tile_cycles(spec, arch, tq, tk), cost.dma_transfer_cycles(arch, tile_bytes))
        diagonal = tiles * (tq // tk)
        steps = (key_tiles(spec, t) - diagonal) * step + diagonal * serial
    else:
        steps = tiles * (keys * step + step_rest)
    total = spec.b * spec.hk * spec.g * (tiles * head + steps)
    if t.mask == "rows":
        msq, msk = spec.mask_shape[3:]
        rows = (tq if msq > 1 else 1) * msk * F32_BYTES
        total += spec.b * tiles * (arch.dma_latency + cost.dma_transfer_cycles(arch, rows))
    return total


def _query_tiles(spec, arch: HardwareDescription) -> list:
    """tq for every count of query tiles (whole PE-array folds where that costs no tile)."""
    sizes = set()
    for count in range(1, min(spec.sq, MAX_QUERY_TILES) + 1):
        tq = -(-spec.sq // count)
        sizes.add(tq)
        folded = round_up(tq, arch.rows)
        if folded < spec.sq and -(-spec.sq // folded) == count:
            sizes.add(folded)
    return sorted(sizes, reverse=True)


def _key_tiles(spec, arch: HardwareDescription, tq: int) -> list:
    """tk: the PE array's columns times powers of two, and Sk. Under a constant causal mask only
    those dividing Sk, the mask's offset and tq (the diagonal then crosses whole key tiles, the
    same band of triangles in every query tile), and none when the last query tile's diagonal
    would pass the last key (a tq not dividing Sq, or more queries than keys below the offset)."""
    sizes, size = {min(spec.sk, 2 * arch.cols)}, arch.cols
    while size < spec.sk:
        sizes.add(size)
        size *= 2
    sizes.add(spec.sk)
    if spec.causal is not None:  # and the last query tile's diagonal inside the keys
        if round_up(spec.sq, tq) + spec.causal > spec.sk:
            return []
        sizes = {s for s in sizes | {1, 2, 4} if not (spec.sk % s or spec.causal % s or tq % s)}
        return sorted(sizes)
    return sorted(s for s in sizes if s >= 2)


def choose_flash_tiling(spec, arch: HardwareDescription) -> FlashTiling | None:
    """Among the fitting tilings within BYTES_SLACK of the fewest estimated DMA bytes, the one
    with the fewest estimated cycles; None if none fits."""
    modes = ["causal"] if spec.causal is not None else ["none"]
    if spec.mask_shape:
        msq, msk = spec.mask_shape[3:]
        modes = ["rows", "blocks"] if msq > 1 and msk > 1 else ["rows"]
    fitting = []
    for tq in _query_tiles(spec, arch):
        q_stride = a_row_stride(tq, spec.d, F32_BYTES, arch)
        for tk in _key_tiles(spec, arch, tq):
            p_stride = a_row_stride(tq, tk, F32_BYTES, arch)
            for mode in modes:
                for lean in (False, True):
                    for pipeline in (True, False):
                        t = FlashTiling(tq, tk, mode, lean, pipeline, q_stride, p_stride)
                        if flash_footprint(spec, t) <= arch.spad_bytes:
                            fitting.append(dataclasses.replace(t, dma_bytes=flash_dma_bytes(spec, t)))
    if not fitting:
        return None
    fewest = min(t.dma_bytes for t in fitting)
    near = [dataclasses.replace(t, cycles=flash_cycles(spec, arch, t)) for t in fitting
            if t.dma_bytes <= fewest * (1 + BYTES_SLACK)]
    return min(near, key=lambda t: (t.cycles, t.dma_bytes))
