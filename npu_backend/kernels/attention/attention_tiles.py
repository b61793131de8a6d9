"""The whole-row attention kernel's tile search: how many query rows a tile holds, how the mask is read.

Stage: tiling (rows.py writes the kernel these tiles describe). The kernel holds Kᵀ and V of a
K / V head whole (two copies: the next head's load runs under this one's items), and two copies
of each per-item buffer (the Q tile, the scores of tq x Sk, the columns, O and its normalised
copy: the items are software-pipelined, rows.py); the mask of the one batch whole ("whole",
once per batch) or a tile per item ("tile"). The search takes a whole mask where
one fits, then the fitting tiling of the fewest estimated cycles, then the larger tq.
`choose_attention_tiling` takes this kernel where it fits and moves no more DRAM bytes than the
key-tile kernel (flash_tiles.py), else that one; neither fitting refuses the attention
(ScratchpadTooSmall), whose normal form then runs as separate kernels.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription

from ...errors import ScratchpadTooSmall
from ..common.spad_layout import a_row_stride
from ..common.spec import aligned, round_up
from ..common.unary import halvings
from .diagonal_exps import applies, diagonal_exp_cycles, p_copies, p_fill_cycles
from . import fabric_exps, scores_mask
from .flash_tiles import choose_flash_tiling
from .spec import AttentionSpec

LOWEST = float(np.finfo(np.float32).min)  # a safe softmax's max starts here, not at -inf
TINY = float(np.finfo(np.float32).tiny)  # added to a safe softmax's sum before its reciprocal
F32_BYTES = 4
#: The fabric's share of the exps and the mask loaded into S are taken only where they are priced
#: this much cheaper: ViT's four items of 17 x 17, priced 0.3% cheaper with 2 rows on the fabric,
#: ran 7.5% dearer (4,752 -> 5,108 cycles: each item's exps wait for the fabric's latency, which the
#: pipelined estimate does not see).
MARGIN = 0.03


@dataclasses.dataclass(frozen=True)
class RowTiling:
    """tq query rows a tile over the padded mp; `mask` "none", "whole" (a batch's mask held
    whole, loaded per batch) or "tile" (a tq x Sk tile per item); the GEMMs' A tiles' row strides (q_stride:
    Q, p_stride: the scores, which become P in place); copies of K and V (1: a head's load waits
    for the items of the head before); whether the row sums are the PE array's GEMM (sums_on_pe)."""

    tq: int
    mp: int
    mask: str = "none"
    q_stride: int = 0
    p_stride: int = 0
    kv_copies: int = 2
    sums_on_pe: bool = False
    stack: int = 1
    diagonal: bool = False  # the exps over each row's visible keys, into P per query tile (diagonal_exps.py)
    fabric_rows: int = 0  # rows of an item whose exps the fabric computes (fabric_exps.py)
    fabric_from: int = 0  # over a symbolic length: the share from this run length on (length_exps.py)

    @property
    def tm(self) -> int:
        return self.tq

    @property
    def rows(self) -> int:
        """Score rows an item holds: its tq query rows of each of the `stack` query heads of a
        group it takes (their K shared; rows.py stacks them one under the other)."""
        return self.tq * self.stack


def mask_in_gemm(spec) -> bool:
    """Whether the kernel adds the mask by copying it into S and accumulating Q Kᵀ onto it
    (rows.py): for a mask of whole tiles, whose ELTWISE add reads two elements a score (a row or
    a column broadcast reads about one, as the copy does: it stays an ELTWISE)."""
    return bool(spec.mask_shape) and spec.mask_shape[3] > 1 and spec.mask_shape[4] > 1


def mask_on_pe(spec) -> bool:
    """Whether the kernel adds a mask row (per key) or column (per query) by a GEMM of k = 1
    accumulating onto S (rows.py): 1 m or m 1, the product exact, rounds as the ELTWISE add does
    and takes the PE array instead of the vector unit, which the softmax keeps busy."""
    return bool(spec.mask_shape) and (spec.mask_shape[3] > 1) != (spec.mask_shape[4] > 1)


def scale_at(spec) -> str | None:
    """Where the kernel multiplies by the scale (rows.py): "q" the Q tile of every item; a power
    of two commutes with every rounding of S = Q Kᵀ, max and S - max (barring overflow and
    underflow), so without a mask "exp" (the exp VFUNC's scale: one more pipeline stage,
    exp((S - max) * scale) is exactly exp(S * scale - max(S * scale))), and with a mask and a
    group of query heads "k" (Kᵀ once per K / V head); None without a scale."""
    if spec.scale is None:
        return None
    if spec.scale > 0 and math.frexp(spec.scale)[0] == 0.5:
        if not spec.mask_shape:
            return "exp"
        if spec.g > 1:
            return "k"
    return "q"


def score_copies(spec) -> int:
    """Copies of the scores the kernel keeps: two, three with the mask in the GEMM (rows.py
    copies item t + 1's mask into its S while item t - 1's P V GEMM may still read its P)."""
    return 3 if mask_in_gemm(spec) else 2


def _mask_rows(spec, t: RowTiling) -> int:
    """Rows of the mask the kernel holds: every head's whole (padded) mask, or a tile."""
    mb, mhk, mg, msq, _ = spec.mask_shape
    if t.mask == "whole":
        return (2 if spec.mask_shape[0] > 1 else 1) * mhk * mg * (t.mp if msq > 1 else 1)
    return 2 * (t.tq if msq > 1 else 1)


def tile_keys(spec, tq: int, tile: int) -> int:
    """Keys the kernel computes for query tile `tile` of tq rows: every one, or under a causal
    triangle of offset c those up to its last row's diagonal (rows.py)."""
    if spec.causal is None:
        return spec.sk
    return min(spec.sk, (tile + 1) * tq + spec.causal)


def band_width(spec, tq: int, tile: int) -> int:
    """Columns of the causal triangle the kernel adds to query tile `tile`'s scores (rows.py):
    those from its first row's diagonal + 1 to its last row's, inside the keys."""
    if spec.causal is None:
        return 0
    return max(0, min(tq - 1, spec.sk - tile * tq - spec.causal - 1))


def attention_footprint(spec, t: RowTiling) -> int:
    """Scratchpad bytes of the kernel with tiling `t` (every buffer its own bytes)."""
    tq, sk, d, dv = t.rows, spec.sk, spec.d, spec.dv
    kv = aligned(t.kv_copies * d * sk * F32_BYTES) + aligned(t.kv_copies * sk * dv * F32_BYTES)
    item = aligned(2 * tq * t.q_stride * F32_BYTES) + aligned(score_copies(spec) * tq * t.p_stride * F32_BYTES)
    item += 3 * aligned(2 * tq * F32_BYTES) + 2 * aligned(2 * tq * dv * F32_BYTES)
    item += aligned(max(sk, tq) * F32_BYTES) + aligned(F32_BYTES)  # the ones, the scale
    mask = aligned(_mask_rows(spec, t) * spec.mask_shape[4] * F32_BYTES) if t.mask in ("whole", "tile") else 0
    if spec.causal is not None and t.tq > 1:  # the triangle (rows.py)
        mask += aligned(tq * (t.tq - 1) * F32_BYTES)
    if t.diagonal:  # P per query tile
        item += aligned(p_copies(t) * tq * t.p_stride * F32_BYTES)
    item += aligned(fabric_exps.footprint(t, sk) * F32_BYTES)
    if spec.unseen:  # c 1ᵀ V per K / V head, the row of c and the unseen rows' flags (rows.py)
        item += aligned(t.kv_copies * dv * F32_BYTES) + aligned(sk * F32_BYTES) + aligned(2 * tq * F32_BYTES)
    return kv + item + mask


def attention_item_cycles(spec, arch: HardwareDescription, tq: int, sums_on_pe: bool = False, tile: int = -1,
                          stack: int = 1, per_kv: int = 0, diagonal: bool = False, fabric_rows: int = 0) -> tuple:
    """(vector unit, PE array) cycles of one item: its softmax and scale, its two GEMMs [and the
    row sums' GEMM P 1, else a REDUCE] [, the triangle]; over query tile `tile`'s keys (-1: all),
    the tq rows of `stack` query heads; `per_kv` items of a K / V head share its scale (0: G);
    `diagonal`: the exps over the rows' visible keys alone (diagonal_exps.py); `fabric_rows` rows'
    exps on the fabric (fabric_exps.py)."""
    sk, d, dv = (spec.sk if tile < 0 else tile_keys(spec, tq, tile)), spec.d, spec.dv
    band = band_width(spec, tq, tile) if tile >= 0 else 0
    exps = diagonal_exp_cycles(spec, arch, tq, stack, tile) if diagonal and tile >= 0 else None
    tq *= stack
    pe = cost.gemm_steady_cycles(arch, tq, sk, d, "float32") + cost.gemm_steady_cycles(arch, tq, dv, sk, "float32")
    if sums_on_pe:
        pe += cost.gemm_steady_cycles(arch, tq, 1, sk, "float32") + cost.gemm_fill_cycles(arch, tq, 1)
    if mask_on_pe(spec):  # S + a mask row or column
        pe += cost.gemm_steady_cycles(arch, tq, sk, 1, "float32") + cost.gemm_fill_cycles(arch, tq, sk)
    vector = 0
    if scale_at(spec) == "q":  # an ELTWISE multiply by the scale (rows.py)
        vector += cost.eltwise_cycles(arch, tq * d, tq * d + 1)
    elif scale_at(spec) == "k":
        vector += cost.eltwise_cycles(arch, spec.sk * d, spec.sk * d + 1) // (per_kv or spec.g)
    if band:
        vector += cost.eltwise_cycles(arch, tq * band, 2 * tq * band)
    if mask_in_gemm(spec):  # copied into S, the GEMM accumulating onto it
        vector += cost.vfunc_cycles(arch, tq * sk, "identity")
    elif spec.mask_shape and not mask_on_pe(spec):
        vector += cost.eltwise_cycles(arch, tq * sk, tq * sk + 1)
    vector += (1 + (not sums_on_pe)) * (cost.reduce_cycles(arch, tq, sk) + cost.vector_cycles(arch, tq, 1))
    # The exp keeps the vector unit for its issue alone where a function unit computes it (its
    # pipeline's fill delays the P V GEMM, not the next vector command): so counted under a causal
    # triangle, whose items are many and short (the other kernels' tilings keep the older count).
    exp = cost.vfunc_issue_cycles if spec.causal is not None else cost.vfunc_cycles
    vector += cost.eltwise_cycles(arch, tq * sk, tq * sk + tq) + (exp(arch, tq * sk, "exp") if exps is None else exps)
    vector += cost.vfunc_cycles(arch, tq, "reciprocal", offset=spec.safe) + cost.eltwise_cycles(arch, tq * dv, tq * dv + tq)
    saved, added = fabric_exps.fabric_share_cycles(spec, arch, tq, sk, fabric_rows, exp_scale(spec), sums_on_pe)
    return vector - saved, pe + added


def exp_scale(spec):
    """The exp's scale (a power of two, rows.py), or None."""
    return spec.scale if scale_at(spec) == "exp" else None


def sums_on_pe(spec, arch: HardwareDescription, tq: int) -> bool:
    """Whether an item's row sums are the PE array's GEMM P 1 (rows.py): where the vector unit is
    the busier unit with them on it (a short head dim: Llama's 16), not where the PE array is
    (64 dims at 128 tokens: a GEMM of one column there made the layer 6% slower)."""
    return max(attention_item_cycles(spec, arch, tq, True)) < max(attention_item_cycles(spec, arch, tq, False))


def estimate_attention_cycles(spec, arch: HardwareDescription, t: RowTiling) -> int:
    """The items pipelined (rows.py): each the slowest of its vector work, its GEMMs and its
    DMA (Q in, O out, its share of the K / V heads and mask tiles), plus the first item's loads
    and GEMM and the last one's normalisation and store."""
    tiles, groups = t.mp // t.tq, spec.g // t.stack
    items = spec.b * spec.hk * groups * tiles
    kv = cost.dma_transfer_cycles(arch, spec.sk * (spec.d + spec.dv) * F32_BYTES)
    load = cost.dma_transfer_cycles(arch, t.rows * spec.d * F32_BYTES) + kv // (groups * tiles)
    if t.mask == "tile":
        load += cost.dma_transfer_cycles(arch, (_mask_rows(spec, t) // 2) * spec.mask_shape[4] * F32_BYTES)
    copy = 0
    if t.mask == scores_mask.MODE:  # the mask tile's load into S instead of its copy
        copy, loaded = scores_mask.item_cycles(spec, arch, t.rows)
        load += loaded
    store = cost.dma_transfer_cycles(arch, t.rows * spec.dv * F32_BYTES)
    steps = []
    for tile in range(tiles):  # under a causal triangle each query tile its own keys
        causal = spec.causal is not None
        vector, pe = attention_item_cycles(spec, arch, t.tq, t.sums_on_pe, tile if causal else -1, t.stack,
                                           groups * tiles if causal else 0, t.diagonal, t.fabric_rows)
        vector -= copy
        waits = (arch.dma_latency + kv + pe) // (groups * tiles) if t.kv_copies == 1 else 0  # a head's load
        steps.append(max(vector, pe, load + waits, store))  # after the last GEMM of the head before
    ends = 2 * arch.dma_latency + kv + pe + cost.eltwise_cycles(arch, t.rows * spec.dv, t.rows * spec.dv + t.rows) + store
    ends += fabric_exps.config_cycles(arch, t.fabric_rows, exp_scale(spec))
    if t.diagonal:  # the P buffers' fill, before the first item's softmax, under its loads
        ends += max(0, p_fill_cycles(arch, t) - arch.dma_latency - kv - load)
    return items // tiles * sum(steps) + ends


def causal_row_fits(q_shape, scores_shape, offset: int, row_shape, arch: HardwareDescription) -> bool:
    """Whether the attention of Q's `q_shape` (B, Hk, G, Sq, D) and the scores' `scores_shape` runs
    as one kernel on `arch` under a causal triangle of `offset` and a mask row of `row_shape`
    (normalise/causal_rows.py asks: the key-tile kernel needs key tiles that follow the diagonal,
    flash_tiles.py; where none does the s x s mask is kept, which it reads as any mask). V's dims
    are taken as Q's (the partition's own tile search has the real ones)."""
    if len(row_shape) != 5:
        return False
    b, hk, g, sq, d = q_shape
    spec = AttentionSpec(b, hk, g, sq, scores_shape[4], d, d, mask_shape=tuple(row_shape), safe=True, causal=offset)
    try:
        choose_attention_tiling(spec, arch)
    except ScratchpadTooSmall:
        return False
    return True


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
        rows = diagonal_tiling(spec, arch, whole_row_tiling(spec, arch))
    except ScratchpadTooSmall:
        rows = None
    flash = choose_flash_tiling(spec, arch) if not spec.unseen else None  # c 1ᵀ V: rows.py only
    if rows is not None and (flash is None or whole_row_dma_bytes(spec, rows) <= flash.dma_bytes):
        return fabric_tiling(spec, arch, scores_mask_tiling(spec, arch, rows))  # neither compared with flash
    if flash is not None:
        return flash
    raise ScratchpadTooSmall(
        f"attention over {spec.sk} keys of {spec.d} + {spec.dv} dims: the K and V tiles of the fewest keys and one "
        f"query row do not fit the scratchpad of '{arch.name}' ({arch.spad_bytes} bytes); the attention runs as "
        "separate matmul and softmax kernels")


def diagonal_tiling(spec, arch: HardwareDescription, t: RowTiling) -> RowTiling:
    """`t` with the diagonal exps (diagonal_exps.py) where they apply, fit and are estimated
    cheaper, else `t`. Asked of the searched tiling, not inside the search: rows_length.py reads
    whole_row_tiling for its own kernel, which has no diagonal exps."""
    if not applies(spec, t.tq):
        return t
    diagonal = dataclasses.replace(t, diagonal=True)
    if attention_footprint(spec, diagonal) > arch.spad_bytes or \
            estimate_attention_cycles(spec, arch, diagonal) >= estimate_attention_cycles(spec, arch, t):
        return t
    return diagonal


def fabric_tiling(spec, arch: HardwareDescription, t: RowTiling) -> RowTiling:
    """`t` with the share of each item's exp rows on the fabric (fabric_exps.py) the estimate
    prices cheapest, where it applies, fits and is estimated MARGIN cheaper than none, else `t`."""
    if not fabric_exps.applies(spec, t.stack) or t.diagonal:
        return t
    vector, pe = attention_item_cycles(spec, arch, t.tq, t.sums_on_pe)
    if vector <= pe:  # the PE array the busier unit already (nor the fabric's bodies mapped)
        return t
    best, cycles = t, estimate_attention_cycles(spec, arch, t)
    for rows in range(1, t.rows + 1):
        candidate = dataclasses.replace(t, fabric_rows=rows)
        if attention_footprint(spec, candidate) <= arch.spad_bytes:
            estimate = estimate_attention_cycles(spec, arch, candidate)
            if estimate < cycles:
                best, cycles = candidate, estimate
    return best if cycles < (1 - MARGIN) * estimate_attention_cycles(spec, arch, t) else t


def scores_mask_tiling(spec, arch: HardwareDescription, t: RowTiling) -> RowTiling:
    """`t` with its mask of whole tiles loaded into S per item (scores_mask.py) instead of held
    whole and copied, where that is estimated MARGIN cheaper, else `t`."""
    if not scores_mask.applies(spec, t, mask_in_gemm(spec)):
        return t
    candidate = dataclasses.replace(t, mask=scores_mask.MODE)
    cheaper = estimate_attention_cycles(spec, arch, candidate) < (1 - MARGIN) * estimate_attention_cycles(spec, arch, t)
    return candidate if cheaper and attention_footprint(spec, candidate) <= arch.spad_bytes else t


def whole_row_dma_bytes(spec, tiling: RowTiling) -> int:
    """DRAM bytes of the whole-row kernel: Q, K, V and O once, the mask once ("whole") or a
    tile per item."""
    heads = spec.b * spec.hk * spec.g
    moved = (heads * spec.sq + spec.b * spec.hk * spec.sk) * (spec.d + spec.dv) * F32_BYTES
    if tiling.mask == "whole":
        moved += int(np.prod(spec.mask_shape)) * F32_BYTES
    elif tiling.mask in ("tile", scores_mask.MODE):
        moved += heads // tiling.stack * (tiling.mp // tiling.tq) * (_mask_rows(spec, tiling) // 2) * spec.mask_shape[4] * F32_BYTES
    return moved


def stacks(spec) -> tuple:
    """Query heads of a group an item may take (rows.py stacks their rows): 1, or under a causal
    triangle with no mask or one padding row shared by the heads the whole group (each item's
    commands then cover the group's rows, their fixed costs paid once: the exp's pipeline depth)."""
    shared = not spec.mask_shape or (spec.mask_shape[3] == 1 and spec.mask_shape[1] * spec.mask_shape[2] == 1)
    return (1, spec.g) if spec.causal is not None and spec.g > 1 and shared else (1,)


def whole_row_tiling(spec, arch: HardwareDescription) -> RowTiling:
    """A mask held whole whenever one fits (it crosses DRAM once instead of once per head), then
    the fitting tiling of the fewest estimated cycles, then the larger tq. A constant causal mask the kernel
    builds (no mask operand) and skips the keys above each tile's diagonal (rows.py)."""
    modes = ["none"]
    if spec.mask_shape:
        modes = ["whole", "tile"]
    choices = []
    for tq, stack in ((tq, stack) for tq in halvings(spec.sq) for stack in stacks(spec)):
        rows = tq * stack
        q_stride, p_stride = a_row_stride(rows, spec.d, F32_BYTES, arch), a_row_stride(rows, spec.sk, F32_BYTES, arch)
        for mode in modes:
            for copies in (2, 1):
                t = RowTiling(tq, round_up(spec.sq, tq), mode, q_stride, p_stride, copies, sums_on_pe(spec, arch, rows),
                              stack)
                if attention_footprint(spec, t) <= arch.spad_bytes:
                    choices.append(t)
    if choices:
        return min(choices, key=lambda t: (t.mask == "tile", estimate_attention_cycles(spec, arch, t), -t.tq))
    raise ScratchpadTooSmall(
        f"attention over {spec.sk} keys of {spec.d} + {spec.dv} dims: a K / V head and two rows of scores do not "
        f"fit the scratchpad of '{arch.name}' ({arch.spad_bytes} bytes); the attention runs as separate matmul and "
        "softmax kernels")
