"""A DMA load of a GEMM's A tile cut into loads of a few rows each (gemm_rows.py asks).

Stage: lowering (SplitGemmRows). In: a statement that loads a scratchpad tile by one
`cgra_dma_load` (or such a load under an `if` with no else: A's panel streamed by the first
column tile, stream_panel.py), the tile's rows, the rows of a piece and the tile's row stride.
Out: the same loads as one DMA per piece of rows, in order, under the same `if`; or None when
the box is not one that plainly walks the tile's rows (a halo, a symbolic extent, no box loop of
exactly those rows at that stride).

Why: the scratchpad's scoreboard tracks the bytes each command writes, so the GEMM of a tile's
first rows waits only for the load of those rows.
"""

from __future__ import annotations

from tvm import ir, tirx

from cgra_codegen import device_call_positions
from cgra_sim.isa import BOX_DIMS

from .calls import buffer_of, extern_call

_DMA = device_call_positions("cgra_dma_load")
(_SPAD_DATA, _SPAD_OFFSET), _BOX = _DMA["spad_addr"], _DMA["box"][0]
_ORIGIN, _PADS, _LOOPS = _BOX, _BOX + BOX_DIMS, _BOX + 3 * BOX_DIMS  # pad_lo and pad_hi, then 4 words a loop


def load_target(stmt):
    """The buffer `stmt`'s `cgra_dma_load` writes (load_into's forms), or None."""
    if isinstance(stmt, tirx.IfThenElse) and stmt.else_case is None:
        stmt = stmt.then_case
    call = extern_call(stmt, "cgra_dma_load")
    return buffer_of(call.args[_SPAD_DATA]) if call is not None else None


def load_into(stmt, buffer):
    """The `cgra_dma_load` call that `stmt` makes into `buffer` (itself, or alone under an `if`
    with no else), or None."""
    if isinstance(stmt, tirx.IfThenElse) and stmt.else_case is None:
        stmt = stmt.then_case
    call = extern_call(stmt, "cgra_dma_load")
    if call is None or buffer is None:
        return None
    target = buffer_of(call.args[_SPAD_DATA])
    return call if target is not None and target.same_as(buffer) else None


def loads_in_row_pieces(stmt, buffer, rows: int, piece_rows: int, row_stride):
    """`stmt` (a load into `buffer`, load_into) as loads of piece_rows rows (the last of what is
    left when piece_rows does not divide rows)."""
    call = load_into(stmt, buffer)
    loop = _row_loop(call, rows, row_stride) if call is not None else None
    if loop is None:
        return None
    extent, tdim, tstep = (call.args[_LOOPS + 4 * loop + i] for i in range(3))
    pieces = []
    for piece in range(-(-rows // piece_rows)):
        args = list(call.args)
        args[_SPAD_OFFSET] = args[_SPAD_OFFSET] + piece * piece_rows * row_stride
        origin = _ORIGIN + int(tdim.value)
        args[origin] = args[origin] + tirx.IntImm(str(tstep.ty), piece * piece_rows * tstep.value)
        args[_LOOPS + 4 * loop] = tirx.IntImm(str(extent.ty), min(piece_rows, rows - piece * piece_rows))
        pieces.append(tirx.Evaluate(ir.Call(call.op, args, call.attrs, call.ty_args, call.span, call.ty)))
    body = tirx.SeqStmt(pieces)
    return tirx.IfThenElse(stmt.condition, body, None) if isinstance(stmt, tirx.IfThenElse) else body


def _row_loop(call, rows: int, row_stride):
    """The index of the DMA box loop that walks the tile's `rows` rows `row_stride` elements apart
    in the scratchpad, or None (also for a box with a halo: its pieces would need their own)."""
    if not isinstance(row_stride, tirx.IntImm):
        return None
    words = call.args
    if any(not _is_zero(words[_PADS + i]) for i in range(2 * BOX_DIMS)):
        return None
    found = [loop for loop in range(BOX_DIMS)
             if all(isinstance(words[_LOOPS + 4 * loop + i], tirx.IntImm) for i in range(4))
             and words[_LOOPS + 4 * loop].value == rows and words[_LOOPS + 4 * loop + 3].value == row_stride.value
             and 0 <= words[_LOOPS + 4 * loop + 1].value < BOX_DIMS]
    return found[0] if len(found) == 1 else None


def _is_zero(word) -> bool:
    return isinstance(word, tirx.IntImm) and word.value == 0
