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
        if STREAM_PANEL in (stmt.annotations or {}) and loops:
            body, alloc = _stream(body, stmt, loops[-1])
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
    and the allocation of those copies."""
    seq = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    a_tile = [s.buffer for s in seq if isinstance(s, tirx.AllocBuffer) and s.buffer.scope() == SPAD
              and str(s.buffer.name).startswith("a_pad")]
    if len(a_tile) != 1:
        raise ValueError(f"STREAM_PANEL loop without exactly one A tile allocation: {a_tile}")
    panel = with_copies(a_tile[0], int(step_loop.extent))
    rest = [s for s in seq if not (isinstance(s, tirx.AllocBuffer) and s.buffer.same_as(a_tile[0]))]
    rest = ExprRedirect({a_tile[0]: panel}, step_loop.loop_var - step_loop.min).stmt(tirx.SeqStmt(rest))
    first = tirx.EQ(column_loop.loop_var, column_loop.min)
    guarded = [tirx.IfThenElse(first, s, None) if _loads(s, panel) else s for s in rest.seq]
    return tirx.SeqStmt(guarded), tirx.AllocBuffer(panel)


def _loads(stmt, buffer) -> bool:
    call = extern_call(stmt, "cgra_dma_load")
    return call is not None and any(b.same_as(buffer.data) or b.same_as(buffer) for b in buffer_args(call))
