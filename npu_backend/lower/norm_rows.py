"""A pre-norm's program on the A panel run a few rows at a time, each piece as its rows arrive.

Stage: lowering, the last pass (after cut_padded_rows: the calls are plain, their row counts the
rows that exist). Input: a kernel whose A panel (tm rows) is loaded by one DMA and then normalised
by its row program (kernels/gemm/row_norm.py and half_row_norm.py: FILL, REDUCE, VFUNC, ELTWISE,
an EPILOGUE for a 16-bit norm's casts, into buffers named `row_*`), every command of it over the
panel's tm rows. Output: the load as one DMA per piece of rows (row_loads.py) and the program as
the same commands per piece, piece p's after piece p's load: every operand moved down by p pieces
of its row stride (a row broadcast, gamma's, has stride 0 and stays). With several row tiles, the
first tile's only (an `if` on the row loop's first iteration: later tiles' programs hide behind
the GEMMs of the tile before).

Why: the vector unit runs the program in order and each command waited for the whole panel's
DMA, so the PE array waited for the load and then for the whole program (GPT-NeoX's q / k / v at
32 tokens on cgra-8x8: the panel loaded at cycle 592, normalised at 1,154). The scoreboard tracks
the bytes each command writes, so a piece's REDUCE starts once its rows are in, and the program
of the first pieces runs while the DMA brings the rest; a GEMM of the first rows
(lower/gemm_rows.py) waits only for them. Each row's commands are the same, on the same values:
the results are the same bits.
"""

from __future__ import annotations

import json

from tvm import ir, sym, tirx

from cgra_codegen import device_call_positions

from .calls import buffer_of, extern_call, touches, with_body
from .row_loads import load_into, loads_in_row_pieces

#: The panel program's buffers (row_norm.PREFIX; padded_rows.py knows them by it too).
PANEL_PREFIX = "row_"


def _operands(name: str, addresses: tuple) -> tuple:
    """(row-count position, ((offset position, row stride position) per operand)) of a call."""
    positions = device_call_positions(name)
    rows = positions["m" if name == "cgra_epilogue" else "rows"][0]
    return rows, tuple((positions[addr][1], positions[stride][0]) for addr, stride in addresses)


#: The program's commands: where their row count is, and each operand walking the panel's rows.
#: (An EPILOGUE's bias row is per column: it stays.)
_COMMANDS = {
    "cgra_fill": _operands("cgra_fill", (("addr", "stride"),)),
    "cgra_reduce": _operands("cgra_reduce", (("a_addr", "a_row_stride"), ("out_addr", "out_stride"))),
    "cgra_vfunc": _operands("cgra_vfunc", (("a_addr", "a_row_stride"), ("out_addr", "out_stride"))),
    "cgra_eltwise": _operands("cgra_eltwise", (("a_addr", "a_row_stride"), ("b_addr", "b_row_stride"),
                                                ("out_addr", "out_stride"))),
    "cgra_epilogue": _operands("cgra_epilogue", (("acc_addr", "acc_stride"), ("out_addr", "out_stride"),
                                                  ("residual_addr", "residual_stride"))),
}
#: Each command's output buffer (the address the program writes).
_OUTPUT = {name: device_call_positions(name)[addr][0] for name, addr in (
    ("cgra_fill", "addr"), ("cgra_reduce", "out_addr"), ("cgra_vfunc", "out_addr"), ("cgra_eltwise", "out_addr"),
    ("cgra_epilogue", "out_addr"))}


def norm_in_rows(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with each A panel's load and row program in pieces of the vector unit's lanes (a
    REDUCE folds a row a lane: a piece of fewer rows would leave lanes idle)."""
    arch = (func.attrs or {}).get("cgra.arch")
    if arch is None:
        return func
    piece = int(json.loads(str(arch))["vector_lanes"])
    return func.with_body(_visit(func.body, None, piece))


def _visit(stmt, loop, piece: int):
    """`stmt` rebuilt with each sequence's panel in pieces (`_pieces`); `loop` the innermost
    loop around it, or None."""
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt(_pieces([_visit(s, loop, piece) for s in stmt.seq], piece, loop))
    if isinstance(stmt, tirx.For):
        return with_body(stmt, _visit(stmt.body, stmt, piece))
    if isinstance(stmt, tirx.IfThenElse):
        else_case = _visit(stmt.else_case, loop, piece) if stmt.else_case is not None else None
        return tirx.IfThenElse(stmt.condition, _visit(stmt.then_case, loop, piece), else_case)
    return stmt


def _program_call(stmt):
    """The call of a panel-program command that `stmt` makes (a vector command writing a `row_*`
    buffer), or None."""
    for name in _COMMANDS:
        call = extern_call(stmt, name)
        if call is not None:
            out = buffer_of(call.args[_OUTPUT[name]])
            return call if out is not None and out.name.startswith(PANEL_PREFIX) else None
    return None


def _pieces(seq: list, piece: int, loop=None):
    """`seq` with its A panel's load and row program (module doc) in pieces of `piece` rows, or
    unchanged when it has none, or they are not plainly over one number of the panel's rows.
    Under a loop (several row tiles), only its first iteration's: a later tile's program runs
    while the GEMMs of the tile before still keep the PE array busy, where pieces would only add
    each command's issue cycles (cgra-4x4, 64 rows of 64 in tiles of 16: 19,706 cycles whole,
    19,728 in pieces every tile)."""
    start = next((i for i, s in enumerate(seq) if _program_call(s) is not None), None)
    if start is None:
        return seq
    end = start
    while end < len(seq) and _program_call(seq[end]) is not None:
        end += 1
    calls = [_program_call(s) for s in seq[start:end]]
    rows = {_rows_of(call) for call in calls}
    if len(rows) != 1 or None in rows or next(iter(rows)) <= piece:
        return seq
    rows = next(iter(rows))
    panel, stride = _panel(calls)
    at = [i for i in range(start) if panel is not None and load_into(seq[i], panel) is not None]
    if len(at) != 1 or any(touches(s, panel) for s in seq[at[0] + 1:start]):
        return seq
    loads = loads_in_row_pieces(seq[at[0]], panel, rows, piece, stride)
    if not isinstance(loads, tirx.SeqStmt):  # (None, or under an `if`: a streamed panel's)
        return seq
    body = []
    for index, load in enumerate(loads.seq):
        first = index * piece
        body.append(load)
        body += [tirx.Evaluate(_piece_of(call, first, min(piece, rows - first))) for call in calls]
    if loop is not None and not (isinstance(loop.extent, tirx.IntImm) and loop.extent.value == 1):
        whole = tirx.SeqStmt([seq[at[0]]] + seq[start:end])
        body = [tirx.IfThenElse(loop.loop_var == loop.min, tirx.SeqStmt(body), whole)]
    return seq[:at[0]] + seq[at[0] + 1:start] + body + seq[end:]


def _rows_of(call):
    """The row count of a program command, or None when it is not a constant."""
    rows = call.args[_COMMANDS[str(call.args[0].value)][0]]
    return int(rows.value) if isinstance(rows, tirx.IntImm) else None


def _panel(calls: list):
    """(the buffer the program reads that it does not write: the loaded panel, its row stride),
    or (None, None) unless there is exactly one such buffer, read at a constant stride."""
    found = {}
    for call in calls:
        _, operands = _COMMANDS[str(call.args[0].value)]
        for offset_at, stride_at in operands:
            buffer = buffer_of(call.args[offset_at - 1])
            if buffer is not None and not buffer.name.startswith(PANEL_PREFIX):
                found.setdefault(buffer.name, (buffer, call.args[stride_at]))
    if len(found) != 1:
        return None, None
    buffer, stride = next(iter(found.values()))
    return (buffer, stride) if isinstance(stride, tirx.IntImm) else (None, None)


def _piece_of(call, first: int, rows: int):
    """`call` over `rows` of the panel's rows from row `first`: its row count, and each operand's
    offset moved down by `first` of its rows."""
    rows_at, operands = _COMMANDS[str(call.args[0].value)]
    args = list(call.args)
    args[rows_at] = tirx.IntImm(str(args[rows_at].ty), rows)
    analyzer = sym.Analyzer()
    for offset_at, stride_at in operands:
        if buffer_of(args[offset_at - 1]) is not None:
            args[offset_at] = analyzer.simplify(args[offset_at] + first * args[stride_at])
    return ir.Call(call.op, args, call.attrs, call.ty_args, call.span, call.ty)
