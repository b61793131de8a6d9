"""A pre-norm's panel program for row tile t + 1 issued before tile t's GEMMs and epilogues.

Stage: lowering, the last pass (after norm_rows.py, which puts the first tile's program in
pieces). Input: a loop over row tiles (static extent > 1) whose body is the tile's allocations,
its A panel's load and row program (kernels/gemm/row_norm.py: vector commands writing `row_*`
buffers; as norm_rows.py leaves it, `if t == first: <in pieces> else: <whole>`), then the
tile's column loop (GEMMs reading the normed panel, EPILOGUEs, stores). Output:

    allocations
    for t:  if t == first: program(first)      (in pieces, as before)
            if t + 1 < end: program(t + 1)      (whole)
            columns(t)

Why: the vector unit runs its commands in program order. Tile t + 1's program came after tile
t's EPILOGUEs, which wait for tile t's GEMMs, so the PE array sat idle while the vector unit
normalised each next panel (Swin's q / k / v at 256 x 16 -> 48 on cgra-8x8: four row tiles,
the PE array busy 3,290 of 7,152 cycles). Issued a tile ahead, the program runs while tile t's
GEMMs do, and tile t + 1's GEMMs find their panel ready.

Exact: the same commands on the same values. The program of t + 1 writes its own copies of the
buffers that the column loop reads (double_buffer.py's copies, indexed by t: checked), and its
other buffers (the program's intermediates, one copy) only the vector unit touches, in order.
The allocations move before the loop: their addresses are fixed for it anyway (as
late_residual.py's), and tile t + 1's panel now crosses an iteration.
"""

from __future__ import annotations

import tvm_ffi
from tvm import tirx

from .calls import any_leaf, buffer_args, buffer_of, extern_call, map_loops
from .late_residual import _substituted
from .norm_rows import _program_call


def skew_panels(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_body(map_loops(func.body, _skewed))


def _skewed(tiles: tirx.For):
    """The row-tile loop with each next tile's panel program issued a tile early (module doc),
    or as it is when its body is not allocations, the panel's statements and a column loop."""
    if not (isinstance(tiles.extent, tirx.IntImm) and tiles.extent.value > 1 and isinstance(tiles.body, tirx.SeqStmt)):
        return tiles
    seq = list(tiles.body.seq)
    allocs = [s for s in seq if isinstance(s, tirx.AllocBuffer)]
    rest = [s for s in seq if not isinstance(s, tirx.AllocBuffer)]
    if len(rest) < 2 or not isinstance(rest[-1], tirx.For):
        return tiles
    panel, columns = rest[:-1], rest[-1]
    first, whole = _first_and_whole(panel, tiles.loop_var, tiles.min)
    if whole is None or not _has(columns, "cgra_gemm") or not _own_copies(whole, columns, tiles.loop_var):
        return tiles
    var, end = tiles.loop_var, tiles.min + tiles.extent
    ahead = tirx.IfThenElse(tirx.LT(var + 1, end), _substituted(whole, var, var + 1), None)
    opening = tirx.IfThenElse(tirx.EQ(var, tiles.min), first, None)
    loop = tirx.For(var, tiles.min, tiles.extent, tiles.kind, tirx.SeqStmt([opening, ahead, columns]),
                    tiles.thread_binding, tiles.annotations)
    return tirx.SeqStmt(allocs + [loop])


def _first_and_whole(panel: list, var, first):
    """(the first tile's panel statements, a tile's), or (None, None) unless `panel` is a load
    and a row program only: norm_rows.py's `if var == first: ... else: ...`, or plain."""
    if len(panel) == 1 and isinstance(panel[0], tirx.IfThenElse) and panel[0].else_case is not None:
        cond = panel[0].condition
        if isinstance(cond, tirx.EQ) and cond.a.same_as(var) and _is_program(panel[0].else_case) \
                and tvm_ffi.structural_equal(cond.b, first) and _is_program(panel[0].then_case):
            return panel[0].then_case, panel[0].else_case
        return None, None
    whole = tirx.SeqStmt(panel) if len(panel) > 1 else panel[0]
    return (whole, whole) if _is_program(whole) else (None, None)


def _is_program(stmt) -> bool:
    """Whether `stmt` is DMA loads and panel-program commands only, a program command among them."""
    leaves = []
    any_leaf(stmt, lambda leaf: leaves.append(leaf) and False)
    return any(_program_call(s) is not None for s in leaves) and all(
        _program_call(s) is not None or extern_call(s, "cgra_dma_load") is not None for s in leaves)


def _has(stmt, name: str) -> bool:
    return any_leaf(stmt, lambda leaf: extern_call(leaf, name) is not None)


def _calls(stmt) -> list:
    calls = []
    any_leaf(stmt, lambda leaf: isinstance(leaf, tirx.Evaluate) and calls.append(leaf.value) and False)
    return calls


def _own_copies(program, columns, var) -> bool:
    """Whether every buffer the program and the column loop both pass is one of several copies
    (double_buffer.py's `_x<n>`) that the program picks by the tile `var`: tile t + 1's program
    then writes other bytes than tile t's columns read. A buffer the program writes that the
    columns do not touch is the vector unit's alone (in order)."""
    used = {b.name: b for call in _calls(columns) for b in buffer_args(call)}
    for call in _calls(program):
        for buffer in buffer_args(call):
            if buffer.name not in used:
                continue
            if "_x" not in buffer.name or not _indexed_by(call, buffer, var):
                return False
    return True


def _indexed_by(call, buffer, var) -> bool:
    """Whether each offset `call` gives `buffer` (the argument after its `.data`) uses `var`."""
    args = list(call.args)
    offsets = [args[i + 1] for i, arg in enumerate(args[:-1])
               if buffer_of(arg) is not None and buffer_of(arg).same_as(buffer)]
    return bool(offsets) and all(_uses(offset, var) for offset in offsets)


def _uses(expr, var) -> bool:
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))
