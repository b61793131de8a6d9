"""Tile sizes: what every family's tile search produces and the arithmetic it shares.

Stage: tiling (the first per-kernel stage). A `Tiling` gives a kernel's scratchpad tile sizes
(tm, tn, tk) and the padded extents (mp, np, kp) it iterates over: whole tiles, so that every
inner tile can be tensorized. What the sizes mean per family, and how each family searches them
against the hardware description and the cost model, is in that family's module (gemm.py for
matmul and conv2d, depthwise.py, pool.py, eltwise.py).
"""

from __future__ import annotations

import dataclasses

from cgra_codegen.spad import SPAD_ALIGN as ALIGN  # the code generator's buffer placement


@dataclasses.dataclass(frozen=True)
class Tiling:
    tm: int  # rows of a scratchpad tile (PE-array folds of it run back to back)
    tn: int  # columns of a scratchpad tile (a multiple of the PE array's columns)
    tk: int  # reduction depth of a scratchpad tile
    mp: int  # padded extents: whole tiles
    np: int
    kp: int


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def aligned(nbytes: int) -> int:
    """Bytes a scratchpad buffer of `nbytes` takes, with the code generator's alignment."""
    return round_up(nbytes, ALIGN)
