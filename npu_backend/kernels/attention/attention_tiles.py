"""The attention kernel's tile search: how many query rows a tile holds.

Stage: tiling. Per (batch, K / V head) the kernel holds Kᵀ and V whole, once (a head's load waits for
the tiles of the head before); per tile of tq query rows the Q tile, the mask tile and
the output twice, and each intermediate once (the vector unit and the PE array run the steps in
order): the scores, the masked scores, S - max and exp of tq x Sk, the columns, O. The search
takes the tq (halvings of Sq) with the fewest estimated cycles among those that fit.
`choose_attention_tiling` takes this kernel where it fits and moves no more DRAM bytes than the
key-tile kernel (flash_tiles.py), else that one; neither fitting refuses the attention
(ScratchpadTooSmall), whose normal form then runs as separate kernels.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription

from ...errors import ScratchpadTooSmall
from ..common.spad_layout import a_row_stride
from ..common.spec import Tiling, aligned, round_up
from ..common.unary import halvings
from .flash_tiles import choose_flash_tiling
from .spec import AttentionSpec

LOWEST = float(np.finfo(np.float32).min)  # a safe softmax's max starts here, not at -inf
TINY = float(np.finfo(np.float32).tiny)  # added to a safe softmax's sum before its reciprocal
F32_BYTES = 4


def attention_footprint(spec, tq: int, whole_mask: bool = False, arch: HardwareDescription | None = None) -> int:
    """Scratchpad bytes of the kernel with tiles of tq query rows (`whole_mask`: the mask held
    whole, once, rather than a tile twice; `arch`: the GEMMs' A tiles, Q and exp(S - max), with
    their rows padded against bank conflicts as the schedule lays them out)."""
    sk, d, dv = spec.sk, spec.d, spec.dv
    qd, pk = (a_row_stride(tq, d, F32_BYTES, arch), a_row_stride(tq, sk, F32_BYTES, arch)) if arch else (d, sk)
    heads = aligned(d * sk * F32_BYTES) + aligned(sk * dv * F32_BYTES)
    mask = 0
    if spec.mask_shape:
        msq, msk = spec.mask_shape[3:]
        rows = (round_up(spec.sq, tq) if whole_mask else tq) if msq > 1 else 1
        mask = (1 if whole_mask else 2) * aligned(rows * msk * F32_BYTES) + aligned(tq * sk * F32_BYTES)
    tile = 2 * aligned(tq * d * F32_BYTES) + (aligned(tq * qd * F32_BYTES) if spec.scale is not None else 0)
    scores = 2 * aligned(tq * sk * F32_BYTES) + aligned(tq * pk * F32_BYTES)  # scores, S - max, exp
    columns = 3 * aligned(tq * F32_BYTES)
    out = aligned(tq * dv * F32_BYTES) + 2 * aligned(tq * dv * F32_BYTES)
    return heads + mask + tile + scores + columns + out


def attention_tile_cycles(spec, arch: HardwareDescription, tq: int) -> int:
    """The PE array's and the vector unit's cycles on one tile of tq query rows."""
    sk, d, dv = spec.sk, spec.d, spec.dv
    work = cost.gemm_steady_cycles(arch, tq, sk, d, "float32") + cost.gemm_steady_cycles(arch, tq, dv, sk, "float32")
    work += cost.vector_cycles(arch, tq, sk) + cost.vector_cycles(arch, tq, dv)  # the GEMMs' FILLs
    if spec.scale is not None:
        work += cost.vfunc_cycles(arch, tq * d, "identity", scale=True)
    if spec.mask_shape:
        work += cost.eltwise_cycles(arch, tq * sk, 2 * tq * sk)
    work += 2 * (cost.reduce_cycles(arch, tq, sk) + cost.vector_cycles(arch, tq, 1))
    work += cost.eltwise_cycles(arch, tq * sk, tq * sk + tq) + cost.vfunc_cycles(arch, tq * sk, "exp")
    work += cost.vfunc_cycles(arch, tq, "reciprocal", offset=spec.safe) + cost.eltwise_cycles(arch, tq * dv, tq * dv + tq)
    return work


def estimate_attention_cycles(spec, arch: HardwareDescription, tq: int, whole_mask: bool = False) -> int:
    """Tiles over every (b, hk, g), each loading Q (and a mask tile), working, storing O; a head's
    K and V loads (and a whole mask per batch) wait for the tiles before (single-buffered), with
    their latency."""
    tiles = spec.b * spec.hk * spec.g * (-(-spec.sq // tq))
    load = cost.dma_transfer_cycles(arch, tq * spec.d * F32_BYTES)
    heads = spec.b * spec.hk * (2 * arch.dma_latency + cost.dma_transfer_cycles(arch, spec.sk * (spec.d + spec.dv) * F32_BYTES))
    if spec.mask_shape:
        msq, msk = spec.mask_shape[3:]
        if whole_mask:
            heads += spec.b * (arch.dma_latency + cost.dma_transfer_cycles(
                arch, (round_up(spec.sq, tq) if msq > 1 else 1) * msk * F32_BYTES))
        else:
            load += cost.dma_transfer_cycles(arch, (tq if msq > 1 else 1) * msk * F32_BYTES)
    store = cost.dma_transfer_cycles(arch, tq * spec.dv * F32_BYTES)
    loop = cost.BufferedLoop(tiles, load, (attention_tile_cycles(spec, arch, tq),), store)
    return cost.double_buffered_cycles(arch, loop).total + heads


def attention_fits(parts: dict, arch: HardwareDescription) -> bool:
    """Whether an attention (normalise/attentions.read_attention's parts: sizes, masks, scale,
    safe) runs as one kernel on `arch`: with whole score rows, or over key tiles (flash.py)."""
    masked = bool(parts["masks"])
    spec = AttentionSpec(parts["B"], parts["Hk"], parts["G"], parts["Sq"], parts["Sk"], parts["D"], parts["Dv"],
                         scale=None if parts["scale"] == 1.0 else parts["scale"],
                         mask_shape=(1, 1, 1, parts["Sq"], parts["Sk"]) if masked else (), safe=parts["safe"])
    # A constant causal mask: built by the key-tile kernel if it tiles so, else read as a mask.
    causal = dataclasses.replace(spec, mask_shape=(), causal=parts.get("causal"))
    for candidate in ([causal] if causal.causal is not None else []) + [spec]:
        try:
            choose_attention_tiling(candidate, arch)
            return True
        except ScratchpadTooSmall:
            continue
    return False


def choose_attention_tiling(spec, arch: HardwareDescription):
    """The whole-row kernel's Tiling where it fits and moves no more DRAM bytes than the key-tile
    (flash) kernel's FlashTiling (flash_tiles.py), else that: a longer sequence, or a mask the
    whole-row kernel would read once per head."""
    try:
        rows = whole_row_tiling(spec, arch)
    except ScratchpadTooSmall:
        rows = None
    flash = choose_flash_tiling(spec, arch)
    if rows is not None and (flash is None or whole_row_dma_bytes(spec, rows) <= flash.dma_bytes):
        return rows
    if flash is not None:
        return flash
    raise ScratchpadTooSmall(
        f"attention over {spec.sk} keys of {spec.d} + {spec.dv} dims: the K and V tiles of the fewest keys and one "
        f"query row do not fit the scratchpad of '{arch.name}' ({arch.spad_bytes} bytes); the attention runs as "
        "separate matmul and softmax kernels")


def whole_row_dma_bytes(spec, tiling: Tiling) -> int:
    """DRAM bytes of the whole-row kernel: Q, K, V and O once, the mask once per batch when held
    whole (tw), else once per head."""
    heads = spec.b * spec.hk * spec.g
    moved = (heads * spec.sq + spec.b * spec.hk * spec.sk) * (spec.d + spec.dv) * F32_BYTES
    if spec.mask_shape:
        _, mhk, mg, msq, msk = spec.mask_shape
        moved += spec.b * msq * msk * F32_BYTES * (mhk * mg if tiling.tw else heads // spec.b)
    return moved


def whole_row_tiling(spec, arch: HardwareDescription) -> Tiling:
    """tq query rows a tile, and (tw 1) whether a mask shared by the heads is held whole, loaded
    once per batch: a whole mask whenever one fits (it crosses DRAM once instead of once per
    head: bytes and energy; its load hides behind the heads' anyway), then the tq with the fewest
    estimated cycles. A constant causal mask is not this kernel's: it has no mask operand."""
    if spec.causal is not None:
        raise ScratchpadTooSmall("a constant causal mask: the key-tile kernel builds it and skips the masked tiles")
    shared = bool(spec.mask_shape) and spec.mask_shape[1] == 1
    choices = [(tq, whole) for tq in halvings(spec.sq) for whole in ((True, False) if shared else (False,))
               if attention_footprint(spec, tq, whole, arch) <= arch.spad_bytes]
    if choices:
        tq, whole = min(choices, key=lambda c: (not c[1], estimate_attention_cycles(spec, arch, *c), -c[0]))
        return Tiling(tq, spec.sk, spec.d, round_up(spec.sq, tq), spec.sk, spec.d, int(whole))
    raise ScratchpadTooSmall(
        f"attention over {spec.sk} keys of {spec.d} + {spec.dv} dims: a K / V head and two rows of scores need "
        f"{attention_footprint(spec, 2, arch=arch)} bytes, the scratchpad of '{arch.name}' has {arch.spad_bytes}; the "
        "attention runs as separate matmul and softmax kernels")

