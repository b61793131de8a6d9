"""A post-norm after a GEMM whose rows are symbolic (a prefill's length): which specs, which tiling.

Stage: partition (`rows_only`: post_norm.with_post_norm asks whether a spec's symbolic axes
leave the norm's rows whole) and tiling (`regret_tiling`: post_norm_cost.post_norm_tiling's choice
between the tile search's tiling and row tiles holding B, at every length up to the bound).

A decoder's final norm after its last down projection (GPT-NeoX's and GPT-J's RMSNorm and
beta, GPT-2's layer norm) compiled for a symbolic length: the GEMM's rows are the length, its
columns, reduction and weights static. A tile of whole rows holds the same bytes at every
length, so the program of post_norm.py runs on it unchanged, and lower/ragged.py cuts the last
row tile's REDUCE, VFUNC and ELTWISE commands to its rows as it cuts its GEMM and EPILOGUE: no
command reads or writes a row past the length, and the store's box stops at the tensor's end.
The tiles are not finished in pieces (post_norm.post_norm_pieces): ragged.py cuts a tile's
commands, not a piece's.

The tiling: at a static size post_norm_tiling takes the faster of the tile search's tiling and
row tiles holding B; at a symbolic length the one whose estimate is the closest to the fastest
of them at every length from one PE-array fold to the bound (minimax regret, as gemm.py's search
weighs symbolic rows). Priced at the bound alone, row tiles holding B (B loaded once for 128
tiles of 2048 rows) were taken, and at 16 tokens that loads B whole before the first GEMM:
GPT-NeoX's fused down projection ran 5,860 cycles against 3,972 compiled for 16 tokens.
"""

from __future__ import annotations

import dataclasses

from ..common.spec import Tiling, round_up


def rows_only(spec) -> bool:
    """Whether the spec's only symbolic axes are rows: none of the right operand's (no KV
    cache either), not the left operand's last (the reduction) nor the output's last (the
    columns); the other operands' (a residual, RoPE's tables) follow the output's rows. The
    norm's rows are then whole in every tile at every length."""
    last = {role: len(dict(spec.caller_shapes).get(role, ()) or shape) - 1
            for role, shape in (("lhs", spec.lhs_shape), ("out", spec.output_shape))}
    return not spec.rhs_capacity and all(role != "rhs" and axis != last.get(role) for role, axis, _ in spec.symbols)


def lengths(bound: int, fold: int) -> list[int]:
    """The lengths the choice weighs: one PE-array fold and its doublings up to the bound, and
    the bound (gemm.choose_tiling's sizes for symbolic rows)."""
    return sorted({min(bound, fold << k) for k in range(bound.bit_length() + 1)} | {bound})


def at_length(tiling: Tiling, length: int, fold: int) -> Tiling:
    """`tiling` as it runs `length` rows: its row tile cut to them, as many tiles as they take."""
    tm = min(tiling.tm, round_up(length, fold))
    return dataclasses.replace(tiling, tm=tm, mp=round_up(length, tm))


def regret_tiling(tilings: list[Tiling], bound: int, fold: int, cycles) -> Tiling:
    """Of `tilings` (each for `bound` rows), the one whose estimate `cycles(tiling)` at every
    length (`lengths`) exceeds the fastest of them at that length by the smallest factor; ties
    to the faster at the bound, then to the first."""
    sizes = lengths(bound, fold)
    table = [[cycles(at_length(t, size, fold)) for size in sizes] for t in tilings]
    fastest = [min(column) for column in zip(*table)]
    regret = [max(c / f for c, f in zip(row, fastest)) for row in table]
    best = min(range(len(tilings)), key=lambda i: (regret[i], table[i][-1], i))
    return tilings[best]
