"""A post-norm tile's last reduction steps run piece by piece: each piece's rows finished early.

Stage: lowering, after double buffering (the operand tiles have their copies, indexed by the
step) and before the simplifier. Input: a reduction-step loop annotated PIECE_MAJOR = L
(gemm_schedule.py, for a post-norm tile finished in pieces: kernels/gemm/post_norm_tail.py
chooses L) whose body is the operand tiles' allocations, their DMA loads and the step's GEMMs,
one per piece of rows (gemm_rows.py), the same count every step. Output: the allocations before
the loop, the loop over all but the last L steps, then the last L steps' loads (in step order)
and their GEMMs piece by piece: piece 0's L GEMMs, piece 1's, ...

Why: a piece's EPILOGUE and norm (kernels/gemm/post_norm.py) can start only after its last
step's GEMM. In step order the pieces of the last step complete one step-GEMM apart (Bloom's
8 x 64 x 64: 512 cycles), less than a piece's norm (~700 vector cycles), so the norms queue
after the array is done; piece by piece over the last L steps they complete L step-GEMMs apart
and each norm runs behind the next piece's GEMMs. Each piece still accumulates its steps in
order (the same bits); a step's loads go before the GEMMs that read them, and the copies the
last L steps load are L different ones (L <= the operand copies), none read by a GEMM after.
"""

from __future__ import annotations

from tvm import tirx

from ..kernels.common.spec import PIECE_MAJOR
from .calls import extern_call, map_sequences, touches
from .row_loads import load_target


def piece_major_tails(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_body(map_sequences(func.body, _in_sequence))


def _in_sequence(seq):
    """The sequence with each annotated step loop rewritten (`_rewrite`); the DMA loads right
    after such a loop (the tile's bias and residual, read only by its EPILOGUEs) join the tail
    before its GEMMs, so that the first piece's EPILOGUE does not wait for them behind the
    GEMMs of every piece."""
    out, i = [], 0
    while i < len(seq):
        rewritten = _rewrite(seq[i]) if isinstance(seq[i], tirx.For) else None
        if rewritten is None:
            out.append(seq[i])
            i += 1
            continue
        before_gemms, gemms = rewritten
        after = i + 1  # (a load into a buffer the GEMMs touch, an accumulator's bias, stays after them)
        while after < len(seq) and extern_call(seq[after], "cgra_dma_load") is not None and \
                not any(touches(g, load_target(seq[after])) for g in gemms):
            after += 1
        out += before_gemms + list(seq[i + 1:after]) + gemms
        i = after
    return tirx.SeqStmt(out) if len(out) > 1 else out[0]


def _rewrite(loop):
    """(statements up to the tail's GEMMs, the tail's GEMMs) of `loop` with its last steps piece
    by piece, or None when it is not annotated or not the nest the module doc describes."""
    tail = int((loop.annotations or {}).get(PIECE_MAJOR, 0))
    if tail < 2 or not isinstance(loop.extent, tirx.IntImm) or not isinstance(loop.min, tirx.IntImm) or \
            int(loop.extent) < tail or not isinstance(loop.body, tirx.SeqStmt):
        return None
    allocs = [s for s in loop.body.seq if isinstance(s, tirx.AllocBuffer)]
    rest = [s for s in loop.body.seq if not isinstance(s, tirx.AllocBuffer)]
    gemms = [s for s in rest if extern_call(s, "cgra_gemm") is not None]
    loads = [s for s in rest if extern_call(s, "cgra_dma_load") is not None]
    if len(gemms) < 2 or len(gemms) + len(loads) != len(rest) or rest.index(gemms[0]) < len(loads):
        return None  # (something else in the step, or a load after a GEMM: keep the order)
    first_tail = int(loop.min) + int(loop.extent) - tail
    steps = [tirx.IntImm(str(loop.min.ty), first_tail + i) for i in range(tail)]
    tail_loads = [_at(s, loop.loop_var, step) for step in steps for s in loads]
    tail_gemms = [_at(gemms[piece], loop.loop_var, step) for piece in range(len(gemms)) for step in steps]
    annotations = {k: v for k, v in (loop.annotations or {}).items() if k != PIECE_MAJOR}
    head = tirx.For(loop.loop_var, loop.min, tirx.IntImm(str(loop.extent.ty), int(loop.extent) - tail), loop.kind,
                    tirx.SeqStmt(rest), loop.thread_binding, annotations)
    return allocs + ([head] if int(loop.extent) > tail else []) + tail_loads, tail_gemms


def _at(stmt, var, value):
    """`stmt` (a device call, no loops) with `value` for `var` (PrimFunc.specialize rewrites it)."""
    return tirx.PrimFunc([var], stmt).specialize({var: value}).body
