"""A tile's loads that its GEMM does not read queued after the ones it does.

Stage: lowering, after double buffering. Input: statement sequences whose first GEMM (a
`cgra_gemm` call, or a loop or sequence that holds one) is preceded by DMA loads, some into
buffers that no GEMM there reads (an epilogue's operand: RoPE's cosine tile, rope_epilogue.py).
Output: those loads moved, in their order, to just before the GEMM, after the loads of its
operands.

Why: the load engine takes its loads in program order, so the GEMM waited for the epilogue's
tile too, which it does not read (Llama's q / k / v + RoPE at 32 tokens on cgra-8x8: 128 cycles
at the first tile, and the last tile's GEMM, which the kernel's end waits for, as much later).
The same loads into the same bytes: the results are the same.
"""

from __future__ import annotations

from tvm import tirx

from .calls import buffer_args, extern_call, map_sequences, touches
from .row_loads import load_target


def operands_first(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_body(map_sequences(func.body, _reordered))


def _reordered(seq: list):
    """`seq` with the loads before its first GEMM that no GEMM there reads moved after the rest."""
    first = next((i for i, s in enumerate(seq) if _gemm_buffers(s)), None)
    if first is None:
        return tirx.SeqStmt(seq)
    read = _gemm_buffers(seq[first])
    loads = [_plain_load(s) for s in seq[:first]]
    operands = [i for i, b in enumerate(loads) if b is not None and any(b.same_as(r) for r in read)]
    later = [i for i, b in enumerate(loads) if b is not None and operands and i < operands[-1]
             and not any(b.same_as(r) for r in read)]
    if not later or any(touches(seq[j], loads[i]) for j in range(later[0] + 1, first) if j not in later
                        for i in later):
        return tirx.SeqStmt(seq)
    kept = [s for i, s in enumerate(seq[:first]) if i not in later]
    return tirx.SeqStmt(kept + [seq[i] for i in later] + seq[first:])


def _plain_load(stmt):
    """The buffer an unguarded DMA load `stmt` writes, or None."""
    return load_target(stmt) if extern_call(stmt, "cgra_dma_load") is not None else None


def _gemm_buffers(stmt) -> list:
    """The buffers the GEMMs in `stmt` pass (empty: no GEMM)."""
    if isinstance(stmt, tirx.SeqStmt):
        return [b for s in stmt.seq for b in _gemm_buffers(s)]
    if isinstance(stmt, tirx.For):
        return _gemm_buffers(stmt.body)
    if isinstance(stmt, tirx.IfThenElse):
        return _gemm_buffers(stmt.then_case) + (_gemm_buffers(stmt.else_case) if stmt.else_case is not None else [])
    call = extern_call(stmt, "cgra_gemm")
    return buffer_args(call) if call is not None else []
