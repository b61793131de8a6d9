"""A loop's scratchpad buffers as one copy per iteration, allocated before the loop.

Stage: lowering, before double buffering. Input: a loop annotated HOIST_ALLOCS (gemm.py's loop
over the row pieces of an output tile's epilogue and store) whose body allocates scratchpad
buffers. Output: each such buffer with a leading dimension of the loop's extent, iteration i
using copy i, allocated at the front of the statement sequence that holds the loop (beside the
tile's accumulator, and double-buffered with it per tile by the next pass).

Why: the pieces are a pipeline, piece i's EPILOGUE on the vector unit while piece i - 1 is
stored. With one buffer (or two) per piece, a piece's EPILOGUE would wait (write after read)
for the store of the piece before it (a DMA's latency is longer than a piece's EPILOGUE). And the
code generator plans scratchpad addresses as a stack (codegen/cgra_codegen/spad.py): a buffer
allocated inside the piece loop would take the bytes the reduction loop's operand tiles had, so
the next tile's first operand load would wait until the last piece was stored. Allocated with
the accumulator, the pieces together take the bytes the whole tile's output buffer took.
"""

from __future__ import annotations

from tvm import tirx

from cgra_codegen import SPAD_SCOPE as SPAD

from ..kernels.common.spec import HOIST_ALLOCS
from .calls import map_sequences, with_body
from .double_buffer import ExprRedirect, with_copies


def hoist_allocations(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_body(map_sequences(func.body, _hoist_in_sequence))


def _hoist_in_sequence(seq):
    hoisted, rest = [], []
    for stmt in seq:
        if _annotated(stmt):
            allocs = [s.buffer for s in stmt.body.seq if isinstance(s, tirx.AllocBuffer) and s.buffer.scope() == SPAD]
            remap = {buffer: with_copies(buffer, int(stmt.extent)) for buffer in allocs}
            body = ExprRedirect(remap, stmt.loop_var - stmt.min).stmt(
                tirx.SeqStmt([s for s in stmt.body.seq if not (isinstance(s, tirx.AllocBuffer) and s.buffer in remap)]))
            hoisted += [tirx.AllocBuffer(remap[buffer]) for buffer in allocs]
            stmt = with_body(stmt, body)
        rest.append(stmt)
    if not hoisted:
        return tirx.SeqStmt(seq)
    lead = 0
    while lead < len(rest) and isinstance(rest[lead], tirx.AllocBuffer):
        lead += 1
    return tirx.SeqStmt(rest[:lead] + hoisted + rest[lead:])


def _annotated(stmt) -> bool:
    return isinstance(stmt, tirx.For) and HOIST_ALLOCS in (stmt.annotations or {}) \
        and isinstance(stmt.extent, tirx.IntImm) and isinstance(stmt.body, tirx.SeqStmt)
