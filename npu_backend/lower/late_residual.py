"""An output tile's residual loaded, and its epilogue run, halfway through the next tile's steps.

Stage: lowering, after double buffering (every buffer's copy is an explicit function of the loop
variables, so that moved statements keep naming their tile's copies). Input: a loop over output
tiles annotated GEMM_ROWS (gemm.py: a static matmul finished in pieces) whose body is the tile's
allocations, its loop of reduction steps (operand loads, GEMMs), then the load of its residual
tile (res_pad) and its epilogue and stores. Output: the residual's load, epilogue and stores of
tile t issued in tile t + 1, after the loads of its middle reduction step; the last tile's after
the loop; the allocations before the loop (their addresses were fixed for the loop anyway).

Why: the load engine takes its loads in program order. Loaded after tile t's last step, the
residual sits in front of tile t + 1's first operand tiles: where tile t's steps keep the load
engine busy (A's panel streamed in the first column tile: lower/stream_panel.py), the PE array
waits for the residual's transfer before tile t + 1 can start (32 x 64 x 128 on cgra-8x8: 210
cycles). Halfway through tile t + 1, whose steps load only B, the engine has room for it, and the
epilogue reads tile t's accumulator copy long before tile t + 2 writes it. The same commands on
the same bytes: the results are the same.
"""

from __future__ import annotations

from tvm import tirx

from cgra_codegen import SPAD_SCOPE as SPAD

from ..kernels.common.spec import GEMM_ROWS
from .calls import any_leaf, extern_call, map_loops, with_body
from .row_loads import load_target


def late_residuals(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_body(map_loops(func.body, lambda loop: _deferred(loop)
                                    if GEMM_ROWS in (loop.annotations or {}) else loop))


def _deferred(tiles: tirx.For):
    """The tile loop with each tile's residual and epilogue moved (module doc), or as it is when
    its body is not allocations, one step loop, the residual's load and statements without
    loads or GEMMs."""
    if not (isinstance(tiles.extent, tirx.IntImm) and tiles.extent.value > 1 and isinstance(tiles.body, tirx.SeqStmt)):
        return tiles
    seq = list(tiles.body.seq)
    allocs = [s for s in seq if isinstance(s, tirx.AllocBuffer)]
    rest = [s for s in seq if not isinstance(s, tirx.AllocBuffer)]
    if len(rest) < 3 or not isinstance(rest[0], tirx.For) or not _has(rest[0], "cgra_gemm") \
            or not isinstance(rest[0].extent, tirx.IntImm) or not isinstance(rest[0].body, tirx.SeqStmt):
        return tiles
    steps, residual, tail = rest[0], rest[1], rest[2:]
    target = load_target(residual)
    if target is None or target.scope() != SPAD or not str(target.name).startswith("res_pad") \
            or any(_has(s, "cgra_dma_load") or _has(s, "cgra_gemm") for s in tail):
        return tiles
    at = _after_loads(list(steps.body.seq))
    if at is None:
        return tiles
    var, first = tiles.loop_var, tiles.min
    previous = _substituted(tirx.SeqStmt([residual] + tail), var, var - 1)
    middle = tirx.And(tirx.EQ(steps.loop_var, steps.min + steps.extent.value // 2), tirx.GT(var, first))
    body = list(steps.body.seq)
    body.insert(at, tirx.IfThenElse(middle, previous, None))
    last = _substituted(tirx.SeqStmt([residual] + tail), var, first + tiles.extent - 1)
    loop = with_body(tiles, with_body(steps, tirx.SeqStmt(body)))
    return tirx.SeqStmt(allocs + [loop, last])


def _after_loads(seq: list):
    """Where a step's statements have issued their loads: before its first GEMM; None if a load
    follows a GEMM."""
    gemm = [i for i, s in enumerate(seq) if _has(s, "cgra_gemm")]
    if not gemm or any(_has(s, "cgra_dma_load") for s in seq[gemm[0]:]):
        return None
    return gemm[0]


def _has(stmt, name: str) -> bool:
    """Whether `stmt` makes the device call `name` anywhere."""
    return any_leaf(stmt, lambda leaf: extern_call(leaf, name) is not None)


def _substituted(stmt, var, value):
    """`stmt` with `value` for `var` (PrimFunc.specialize does the rewrite) and fresh variables
    for its loops (it is placed beside the statement it copies: TIR defines a variable once)."""
    return _fresh_loops(tirx.PrimFunc([var], stmt).specialize({var: value}).body)


def _fresh_loops(stmt):
    if isinstance(stmt, tirx.For):
        fresh = tirx.Var(stmt.loop_var.name, stmt.loop_var.ty)
        body = tirx.PrimFunc([stmt.loop_var], _fresh_loops(stmt.body)).specialize({stmt.loop_var: fresh}).body
        return tirx.For(fresh, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, stmt.annotations)
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([_fresh_loops(s) for s in stmt.seq])
    if isinstance(stmt, tirx.IfThenElse):
        else_case = _fresh_loops(stmt.else_case) if stmt.else_case is not None else None
        return tirx.IfThenElse(stmt.condition, _fresh_loops(stmt.then_case), else_case)
    return stmt
