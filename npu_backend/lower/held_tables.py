"""RoPE's compact cos / sin tables: each column tile of the first period loads its slice, the
later periods read the slices held.

Stage: lowering, after the DMA pass and before double buffering (beside stream_panel.py).
Input: a column tile loop annotated HOLD_TABLES = p (kernels/gemm/rope_epilogue.py: compact
(rows, W) tables, p = W / tn column tiles a period, tile c reading the tables' columns
(c mod p) * tn .. + tn) whose body allocates a scratchpad tile of each table (buffers cos_pad,
sin_pad) and loads it by one DMA. Output: each table tile with p copies allocated before the
loop; tile c reads copy c mod p and loads it only while c < p.

Why: GPT-NeoX's tables repeat every head (48 of its q / k / v projection's 192 columns); loaded
per output tile they were half of the kernel's loads (49,152 of 107,264 bytes at 32 tokens on
cgra-8x8), and the kernel was load-bound. Loaded whole before the column loop instead, the
first GEMM would wait behind them (the load engine runs in order); a slice in each of the first
period's tiles keeps their loads beside B's tiles, as before.
"""

from __future__ import annotations

from tvm import tirx

from cgra_codegen import SPAD_SCOPE as SPAD

from ..kernels.common.spec import HOLD_TABLES
from .calls import map_loops, with_body
from .double_buffer import ExprRedirect, with_copies
from .stream_panel import _loads, _loads_within

TABLES = ("cos_pad", "sin_pad")


def hold_tables(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_body(map_loops(func.body, _held))


def _held(loop):
    """`loop` with its tables held where it is an annotated column loop (module doc)."""
    periods = (loop.annotations or {}).get(HOLD_TABLES)
    held = _hold(loop, int(periods)) if periods is not None else None
    return loop if held is None else held


def _hold(loop, periods: int):
    """The tables' copies allocated, then the loop reading copy c mod p and loading it while
    c < p; None for a nest it does not recognise (`_tiles`)."""
    tiles = _tiles(loop)
    if tiles is None:
        return None
    body = loop.body
    held = {tile: with_copies(tile, periods) for tile in tiles}
    column = loop.loop_var - loop.min
    rest = [s for s in body.seq if not (isinstance(s, tirx.AllocBuffer) and any(s.buffer.same_as(t) for t in tiles))]
    seq = tirx.SeqStmt(rest)
    for tile, copies in held.items():  # one buffer at a time: ExprRedirect's offset is per buffer
        seq = ExprRedirect({tile: copies}, tirx.floormod(column, periods)).stmt(seq)
    first = tirx.LT(column, periods)
    guarded = [tirx.IfThenElse(first, s, None) if any(_loads(s, c) for c in held.values()) else s for s in seq.seq]
    allocs = [tirx.AllocBuffer(copies) for copies in held.values()]
    return tirx.SeqStmt(allocs + [with_body(loop, tirx.SeqStmt(guarded))])


def _tiles(loop):
    """The table tiles of an annotated column loop, or None: a serial loop of constant bounds
    whose body allocates exactly one scratchpad tile of each table, each written by exactly one
    DMA load at the top level of the body (guarding it guards every write)."""
    body = loop.body
    if not (isinstance(loop.min, tirx.IntImm) and loop.kind == tirx.ForKind.SERIAL and isinstance(body, tirx.SeqStmt)):
        return None
    tiles = []
    for name in TABLES:
        found = [s.buffer for s in body.seq if isinstance(s, tirx.AllocBuffer) and s.buffer.scope() == SPAD
                 and str(s.buffer.name).startswith(name)]
        if len(found) != 1:
            return None
        loads = [s for s in body.seq if _loads(s, found[0])]
        if len(loads) != 1 or sum(_loads_within(s, found[0]) for s in body.seq) != 1:
            return None
        tiles.append(found[0])
    return tiles
