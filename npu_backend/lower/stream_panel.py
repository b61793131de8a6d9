"""A's row panel loaded step by step during a row tile's first column tile, held for the rest.

Stage: lowering, after the DMA pass and before double buffering. Input: a reduction-step loop
annotated STREAM_PANEL (gemm.py, for a tiling with `stream_panel`) whose body allocates the A
tile (buffer a_pad), loads it by DMA and runs the step's GEMM, inside the loop over column
tiles. Output: the A buffer with one copy per reduction step (the whole row panel), allocated
before the column loop; step k loads copy k, only in the first column tile (the load guarded by
`column == first`); every column tile's GEMMs read the copies.

Why: a panel loaded whole before the first GEMM (holds_a_panel) keeps the PE array waiting for
tm x K elements (a 32 x 128 float32 panel: 1,024 cycles at 16 bytes a cycle); loaded a step at a
time beside B's tiles, the first GEMM waits for one step's A and B, and the column tiles after
the first still load only B.
"""

from __future__ import annotations

from tvm import tirx
from tvm.tirx.analysis import undefined_vars

from cgra_codegen import SPAD_SCOPE as SPAD

from ..kernels.common.spec import STREAM_PANEL
from .calls import buffer_args, extern_call, with_body
from .double_buffer import ExprRedirect, with_copies


def stream_panels(func: tirx.PrimFunc) -> tirx.PrimFunc:
    body, pending = _visit(func.body, [])
    if pending:  # the column loop is the body itself
        body = tirx.SeqStmt([alloc for _, alloc in pending] + [body])
    return func.with_body(body)


def _visit(stmt, loops):
    """(stmt rebuilt, [(column loop var, the panel's allocation to place before that loop)])."""
    if isinstance(stmt, tirx.For):
        body, pending = _visit(stmt.body, loops + [stmt])
        streamed = _stream(body, stmt, loops[-1]) if STREAM_PANEL in (stmt.annotations or {}) and loops else None
        if streamed is not None:
            body, alloc = streamed
            pending = pending + [(loops[-1].loop_var, alloc)]
        body, pending = _place(body, pending)
        return with_body(stmt, body), pending
    if isinstance(stmt, tirx.SeqStmt):
        out, up = [], []
        for each in stmt.seq:
            rebuilt, pending = _visit(each, loops)
            mine = [alloc for var, alloc in pending if _is_loop_of(each, var)]
            up += [(var, alloc) for var, alloc in pending if not _is_loop_of(each, var)]
            out += mine + [rebuilt]
        return tirx.SeqStmt(out), up
    if isinstance(stmt, tirx.IfThenElse):
        then_case, pending = _visit(stmt.then_case, loops)
        else_case, more = _visit(stmt.else_case, loops) if stmt.else_case is not None else (None, [])
        return tirx.IfThenElse(stmt.condition, then_case, else_case), pending + more
    return stmt, []


def _place(body, pending):
    """A loop body that is itself the column loop: the panel's allocation goes before it here."""
    mine = [alloc for var, alloc in pending if _is_loop_of(body, var)]
    if not mine:
        return body, pending
    return tirx.SeqStmt(mine + [body]), [(var, alloc) for var, alloc in pending if not _is_loop_of(body, var)]


def _is_loop_of(stmt, var) -> bool:
    return isinstance(stmt, tirx.For) and stmt.loop_var.same_as(var)


def _stream(body, step_loop, column_loop):
    """The step loop's body with A as one copy per step, its load only in the first column tile;
    and the allocation of those copies. None for a nest it does not recognise (`_a_tile`)."""
    a_tile = _a_tile(body, step_loop, column_loop)
    if a_tile is None:
        return None
    seq = list(body.seq)
    panel = with_copies(a_tile, int(step_loop.extent))
    rest = [s for s in seq if not (isinstance(s, tirx.AllocBuffer) and s.buffer.same_as(a_tile))]
    rest = ExprRedirect({a_tile: panel}, step_loop.loop_var - step_loop.min).stmt(tirx.SeqStmt(rest))
    first = tirx.EQ(column_loop.loop_var, column_loop.min)
    guarded = [tirx.IfThenElse(first, s, None) if _loads(s, panel) else s for s in rest.seq]
    return tirx.SeqStmt(guarded), tirx.AllocBuffer(panel)


def _a_tile(body, step_loop, column_loop):
    """The A tile of a step loop whose panel may be streamed, or None: constant extents, exactly
    one scratchpad A tile allocated in the step's body, written by exactly one DMA load (at the
    top level of the body, so that guarding it guards every write) whose source does not depend
    on `column_loop`, the loop directly around the step loop. That independence is what makes
    every iteration of `column_loop` read the panel its first iteration loaded: it fails when
    that loop walks rows (columns outside rows) or a kernel window's taps."""
    if not (isinstance(step_loop.extent, tirx.IntImm) and isinstance(column_loop.min, tirx.IntImm)
            and column_loop.kind == tirx.ForKind.SERIAL and isinstance(body, tirx.SeqStmt)):
        return None
    tiles = [s.buffer for s in body.seq if isinstance(s, tirx.AllocBuffer) and s.buffer.scope() == SPAD
             and str(s.buffer.name).startswith("a_pad")]
    if len(tiles) != 1:
        return None
    loads = [s for s in body.seq if _loads(s, tiles[0])]
    if len(loads) != 1 or sum(_loads_within(s, tiles[0]) for s in body.seq) != 1 \
            or any(var.same_as(column_loop.loop_var) for var in undefined_vars(loads[0])):
        return None
    return tiles[0]


def _loads_within(stmt, buffer) -> int:
    """DMA loads into `buffer` anywhere in `stmt`."""
    if isinstance(stmt, tirx.SeqStmt):
        return sum(_loads_within(s, buffer) for s in stmt.seq)
    if isinstance(stmt, tirx.For):
        return _loads_within(stmt.body, buffer)
    if isinstance(stmt, tirx.IfThenElse):
        return _loads_within(stmt.then_case, buffer) + \
            (_loads_within(stmt.else_case, buffer) if stmt.else_case is not None else 0)
    return int(_loads(stmt, buffer))


def _loads(stmt, buffer) -> bool:
    call = extern_call(stmt, "cgra_dma_load")
    return call is not None and any(b.same_as(buffer.data) or b.same_as(buffer) for b in buffer_args(call))
