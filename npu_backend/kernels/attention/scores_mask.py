"""A mask of whole tiles loaded by the DMA straight into each item's scores, not copied there.

Stage: kernel definition (rows.py when `RowTiling.mask` is "in_scores"; the tile search,
attention_tiles.scores_mask_tiling, takes it where it is priced cheaper than the mask held whole).
In: the spec, the tiling, the item. Out: the item's mask tile's load into its S.

rows.py adds a mask of whole tq x Sk tiles (Swin's relative position bias, a per-head constant)
by copying the item's tile into S (a VFUNC identity: a vector cycle a score) and accumulating
Q Kᵀ onto it in the GEMM. Where the vector unit holds the kernel (Swin's windows: ~34 of ~400
vector cycles an item are that copy) the load engine has room: the tile is loaded from DRAM into
the item's S instead, with its Q two items ahead, and the copy goes (the mask is then read once
per item, not once per batch: 1 KB an item of Swin's 16 x 16 windows). The same values reach S
(a DMA moves bits), so the GEMM accumulates onto the same S: the same bits as the copy's.

S has three copies under a mask in the GEMM (attention_tiles.score_copies): item t + 2's tile
lands in the copy item t - 1 used, after that item's sums' and P V GEMMs read it (the scoreboard
orders the load after them), long before item t + 2's scores (item t's softmax and GEMMs between).
"""

from __future__ import annotations

from cgra_sim import cost

from .prim_build import guarded

#: RowTiling.mask of this form.
MODE = "in_scores"


def applies(spec, t, in_gemm: bool) -> bool:
    """Whether the kernel may load its mask into S: a mask the GEMM accumulates onto (`in_gemm`,
    attention_tiles.mask_in_gemm: rows.py copies it into S) held whole today, one per query head
    (Swin's bias: a mask shared by the heads, a causal or padding tile, stays loaded once and
    copied, rather than crossing DRAM once per head)."""
    if t.mask != "whole" or not in_gemm:
        return False
    _, mhk, mg, _, _ = spec.mask_shape
    return mhk * mg == spec.hk * spec.g > 1


def item_cycles(spec, arch, rows: int) -> tuple:
    """(vector cycles an item saves: the copy's VFUNC identity, load engine cycles it adds: the
    tile's transfer)."""
    sk = spec.mask_shape[4]
    return cost.vfunc_cycles(arch, rows * sk, "identity"), cost.dma_transfer_cycles(arch, rows * sk * 4)


def load(w, spec, t, item) -> None:
    """The item's mask tile (zero rows past the sequence) into its S (rows.py's _load_q)."""
    mb, mhk, mg, msq, msk = spec.mask_shape
    with w.grid("i, e", t.tq, msk) as (i, e):
        row = item.row0 + i
        value = w["mask"][item.n if mb > 1 else 0, item.head if mhk * mg > 1 else 0, row, e]
        w.store("s", (item.s_slot, i, e), guarded(row, spec.sq, t.tq, value))
