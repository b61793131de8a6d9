"""fabric_exps.py's share of the exps on the PE fabric, in the whole-row kernel over a symbolic length.

Stage: tiling (`with_share`: the share of a whole-row branch, rows_length.choose_row_limits) and
kernel definition (`allocate`, `exps`: lines of rows_length.py's TVMScript text). In: the spec at
the branch's limit and its RowTiling; in the kernel, an item's S - m (buffer name, offset text,
row stride) over the run-time keys. Out: the tiling with `fabric_rows`; the scratch tile T and
the exp commands: the first `fabric_rows` rows of each item as the fabric's three passes (FABRIC
on the PE array's queue: fabric_exps.passes_over, the same commands a static compile writes),
the other rows as one VFUNC on the vector unit, both at once.

The share is the static search's (attention_tiles.fabric_tiling) at the branch's limit, so at a
length up to the limit the commands are a static compile's for that length with the limit's
tiling. It pays where the items are long: at a branch's short lengths the passes' latencies
(82 cycles of the three on cgra-8x8) meet few keys, so the kernel takes the share only from
`RowTiling.fabric_from` on, the shortest run length of the branch from which a static compile
takes a share (`share_from`), and below it the exps are the VFUNC's alone, as before (cgra-8x8,
the 17 .. 512 branch of 16-row items with 5 on the fabric: 3,764 -> 3,832 cycles at 17 tokens
with the share, 6,252 -> 5,494 at 32). Every item computes its `rows` rows at every length
(rows_length.py: Q's rows past the length are zeros, their scores 0, their exps 1, never
stored), so where the share is taken the fabric's rows are there: at s = 1 each pass covers
f x 1 elements, and where f = rows no VFUNC is written. Only an attention fabric_exps.applies
to: no causal triangle, no stacked heads, not safe (an encoder's, spec.causal None).

The fabric's exp is not the function unit's (fabric_exps.py: within 2^-21 relative of float64
where exp >= 2^-126, 2^-126 absolute below, +0 at -inf, 1 at 0): results equal the static
kernel's with the same share bit for bit, and the function-unit-only kernel's within that bound.

Why: the static encoder attention took a share (85,596 -> 67,054 cycles at 128 tokens on
cgra-8x8) and the symbolic one did not: 1.28x the static compile's cycles at 128 tokens.
"""

from __future__ import annotations

import dataclasses

from . import attention_tiles, fabric_exps
from ..intrinsics.fabric import fabric_operands
from .script_text import Writer, call, vfunc

#: The scratch tile of the fabric's rows (rows_length.BUFFERS: its branch keeps one copy).
BUFFER = "w_fabric_t"


def with_share(static, arch, tiling, low: int, limit: int):
    """The whole-row tiling `tiling` of the branch of run lengths (low, limit] with the static
    search's share of the exps at `limit` (attention_tiles.fabric_tiling; none where none
    applies, fits or is priced cheaper), taken from `share_from` on; `static`: length -> the
    spec at that length."""
    shared = attention_tiles.fabric_tiling(static(limit), arch, tiling)
    if not shared.fabric_rows:
        return shared
    return dataclasses.replace(shared, fabric_from=share_from(static, arch, low, limit))


def share_from(static, arch, low: int, limit: int) -> int:
    """The shortest run length of (low, limit] from which on a static compile takes a share of
    the exps (its own whole-row tiling there), found by doubling steps from low + 1 and then
    halving (taken as growing with the length: more keys meet the same pass latencies); 0 for
    every length of the branch. The static compile at `limit` takes one (with_share)."""
    def takes(length: int) -> bool:
        spec = static(length)
        return attention_tiles.fabric_tiling(spec, arch, attention_tiles.whole_row_tiling(spec, arch)).fabric_rows > 0

    below, step = low, 1
    while low + step < limit and not takes(low + step):
        below, step = low + step, 2 * step
    above = min(low + step, limit)
    if below == low:
        return 0
    while above - below > 1:  # takes(above), not takes(below)
        middle = (above + below) // 2
        below, above = (below, middle) if takes(middle) else (middle, above)
    return above


def allocate(w: Writer, t, limit: int) -> None:
    """T: the fabric's rows of an item at the limit's keys (none without a share)."""
    if t.fabric_rows:
        w.alloc(BUFFER, (t.fabric_rows, limit))


def exps(t, s: tuple, keys: str, length: str, scale) -> list:
    """The lines of P = exp(S - m) in place over an item's `keys` (text) columns: S - m `s`
    (buffer name, offset text, row stride), `scale` the exp's power of two or None; from the run
    length (`length`'s text) t.fabric_from on the first t.fabric_rows rows the fabric's three
    passes (T's rows `keys` apart), the others one VFUNC; below it (or without a share) one VFUNC."""
    f = t.fabric_rows
    alone = [vfunc("exp", t.rows, keys, s, s, scale=scale)]
    if not f:
        return alone
    lines = [call("cgra_fabric", **fabric_operands(*operands))
             for operands in fabric_exps.passes_over(f, keys, s[:2], s[2], (BUFFER, 0), scale)]
    if f < t.rows:
        rest = (s[0], f"{s[1]} + {f * s[2]}", s[2])
        lines.append(vfunc("exp", t.rows - f, keys, rest, rest, scale=scale))
    if not t.fabric_from:
        return lines
    return [f"if {length} >= {t.fabric_from}:", *("    " + line for line in lines),
            "else:", *("    " + line for line in alone)]
