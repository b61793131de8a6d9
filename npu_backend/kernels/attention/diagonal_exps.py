"""The exps of a causal item's scores over the keys its rows see, not over the masked triangle.

Stage: kernel definition (rows.py's softmax under a causal triangle when `RowTiling.diagonal`;
the tile search, attention_tiles.py, prices it with `diagonal_exp_cycles`). In: the spec and the
tiling. Out: the exp commands' row groups and their keys, and the P buffers' count.

An item of tq query rows computes keys up to its last row's diagonal; row i of it sees only
those up to its own (row0 + i + c), and the triangle above holds -inf after the band's add, whose
exp is +0. The exp is the vector unit's costliest step (an element a cycle on cgra-8x8's one
function-unit lane), and half the band's tq x (tq - 1) entries are masked: 28 of an 8-row
item's. So P = exp(S - m) is written out of place, into a P buffer per query tile (a tile's
items always write the same entries: its rows' visible keys), filled with zeros once when the
kernel starts: the entries no exp writes are masked ones, already +0, as their exp would have
made them. The exps run over row groups, each up to its last row's diagonal: pairs of rows
(tq / 2 commands, an entry a pair masked: the fixed cost of a command is 2 cycles, so pairs
beat single rows and halves), or with a stack of query heads (rows y tq + i, rows.py) row i of
every head of the stack as one command of `stack` rows (row stride tq rows), none masked.

Exact: every visible entry is the same exp of the same S - m; every other entry of the item's
keys is +0, as exp(-inf - m) = +0 was (a row of an unsafe softmax whose max is -inf gives NaN in
its visible entries either way, so its output stays NaN).
"""

from __future__ import annotations

from tvm.script.ir_builder import tirx as T

from cgra_sim import cost

from .prim_build import plus
from .script_text import vfunc

#: The row pairs need at least this many rows to save anything over one command (rows.py).
MIN_ROWS = 4


def applies(spec, tq: int) -> bool:
    """Whether the kernel may take the diagonal exps: a causal triangle of offset >= 0 (every row
    sees key 0) and tiles of at least MIN_ROWS rows."""
    return spec.causal is not None and spec.causal >= 0 and tq >= MIN_ROWS


def exp_groups(tq: int, stack: int) -> list:
    """(first row, rows, row stride in rows, last row of the tile) of each exp command of an item:
    rows g, g + 1 of the tile, or row i of each of the `stack` heads (module doc)."""
    if stack > 1:
        return [(i, stack, tq, i) for i in range(tq)]
    return [(g, min(2, tq - g), 1, min(g + 2, tq) - 1) for g in range(0, tq, 2)]


def group_keys(spec, tq: int, tile: int, last: int) -> int:
    """Keys query tile `tile`'s row `last` sees (up to its diagonal, inside the keys)."""
    return min(spec.sk, tile * tq + last + spec.causal + 1)


def diagonal_exp_cycles(spec, arch, tq: int, stack: int, tile: int) -> int:
    """Vector unit cycles of an item's exps over query tile `tile` (cost.vfunc_issue_cycles, as the
    single exp is counted under a causal triangle)."""
    return sum(cost.vfunc_issue_cycles(arch, rows * group_keys(spec, tq, tile, last), "exp")
               for _, rows, _, last in exp_groups(tq, stack))


def p_copies(t) -> int:
    """P buffers of the kernel: one a query tile (at least two: neighbouring items overlap)."""
    return max(t.mp // t.tq, 2)


def p_fill_cycles(arch, t) -> int:
    """Vector unit cycles of the P buffers' fill with zeros when the kernel starts (rows.py: one
    FILL of every copy's rows, as the simulator charges it). The items' vector work waits for it:
    a stack of query heads doubles its rows (128 tokens, tq 4, stack 2 on cgra-8x8: 4,130 cycles,
    against 222 the exps saved: 46,784 -> 49,609)."""
    return cost.vector_cycles(arch, p_copies(t) * t.rows, t.p_stride)


def exps(w, spec, t, item, s: tuple, scale) -> tuple:
    """rows.py's P = exp(S - m) of `item` (its S - m: (buffer, offset, row stride) `s`; `scale`
    the exp's, or None): in place, or with `t.diagonal` over each row group's visible keys into
    the item's P (module doc). Returns P (buffer, offset, row stride)."""
    if not t.diagonal:
        w.add(vfunc("exp", t.rows, item.keys, s, s, scale=scale))
        return s
    ps, tiles = t.p_stride, t.mp // t.tq
    p = (w["p"], item.p_slot * (t.rows * ps), ps)
    for first, rows, stride, last in exp_groups(t.tq, t.stack):
        see = last + spec.causal + 1  # keys the group's last row sees past row0
        keys = min(spec.sk, see) if tiles == 1 else T.min(spec.sk, item.row0 + see)
        at = first * ps
        w.add(vfunc("exp", rows, keys, (s[0], plus(s[1], at) if at else s[1], stride * ps),
                    (p[0], plus(p[1], at) if at else p[1], stride * ps), scale=scale))
    return p
