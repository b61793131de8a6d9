"""A GEMM of an output tile finished in pieces, as one GEMM per piece of rows.

Stage: lowering, after the accumulator's FILL is folded (fold_init.py matches a tile's whole GEMM)
and before double buffering (which redirects every call's buffers, the pieces' included). Input:
a loop annotated GEMM_ROWS = r (gemm.py: the loop over a matmul's output tiles, when it finishes
them in EPILOGUEs and stores of r rows); the cgra_gemm calls inside it of m rows, m a multiple of r.
Output: each such call as m / r GEMMs of r rows, A's and the accumulator's offsets moved down by r
of their rows each (the same flags, B, depth and strides).

Why: the PE array runs a GEMM's row folds one after another, but the GEMM ends, and the first
piece's EPILOGUE may start, only when its last fold is done. In pieces, the first piece's
EPILOGUE and store run while the array computes the rest, so that after the kernel's last GEMM
only one piece's EPILOGUE and store are left (32 x 64 x 128 on cgra-8x8: 370 cycles after the
last GEMM, 178 in pieces). Back-to-back GEMMs of one shape stream without a refill
(docs/simulator.md), so the pieces cost no PE-array cycles, one command each.

The same pieces start the kernel early: in a reduction step that loads its A tile (or, streamed,
A's panel a step at a time: stream_panel.py) and its B tile before the GEMM, B's load goes first
and A's follows as one DMA per piece of rows, so that the first piece's GEMM waits for B and r
rows of A, not for the whole of both (32 x 64 x 128 on cgra-8x8: its first GEMM at cycle 240, not
336). The bytes, the loads' engine and the GEMMs' results are the same.
"""

from __future__ import annotations


from tvm import ir, tirx

from cgra_codegen import device_call_positions

from ..kernels.common.spec import GEMM_ROWS
from .calls import buffer_of, extern_call, touches, with_body
from .row_loads import load_into, loads_in_row_pieces

_GEMM = device_call_positions("cgra_gemm")
(_M,), (_A_OFFSET,), (_A_STRIDE,) = _GEMM["m"], _GEMM["a_addr"][1:], _GEMM["a_stride"]
(_ACC_OFFSET,), (_ACC_STRIDE,) = _GEMM["acc_addr"][1:], _GEMM["acc_stride"]
(_A_DATA, _), (_B_DATA, _) = _GEMM["a_addr"], _GEMM["b_addr"]


def split_gemm_rows(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_body(_visit(func.body, 0))


def _visit(stmt, rows: int):
    """`stmt` with the GEMMs under a GEMM_ROWS loop split into pieces of that loop's rows."""
    if isinstance(stmt, tirx.For):
        inner = int((stmt.annotations or {}).get(GEMM_ROWS, rows))
        return with_body(stmt, _visit(stmt.body, inner))
    if isinstance(stmt, tirx.SeqStmt):
        seq = _b_then_a_in_rows(list(stmt.seq), rows) if rows else list(stmt.seq)
        return tirx.SeqStmt([_visit(s, rows) for s in seq])
    if isinstance(stmt, tirx.IfThenElse):
        else_case = _visit(stmt.else_case, rows) if stmt.else_case is not None else None
        return tirx.IfThenElse(stmt.condition, _visit(stmt.then_case, rows), else_case)
    gemm = extern_call(stmt, "cgra_gemm") if rows else None
    return stmt if gemm is None else _split(gemm, rows) or stmt


def _split(gemm, rows: int):
    """The GEMM as pieces of `rows` rows, or None if its rows are not a constant multiple of them."""
    m = gemm.args[_M]
    if not isinstance(m, tirx.IntImm) or m.value <= rows or m.value % rows:
        return None
    pieces = []
    for piece in range(m.value // rows):
        args = list(gemm.args)
        args[_M] = tirx.IntImm(str(m.ty), rows)
        args[_A_OFFSET] = args[_A_OFFSET] + piece * rows * args[_A_STRIDE]
        args[_ACC_OFFSET] = args[_ACC_OFFSET] + piece * rows * args[_ACC_STRIDE]
        pieces.append(tirx.Evaluate(ir.Call(gemm.op, args, gemm.attrs, gemm.ty_args, gemm.span, gemm.ty)))
    return tirx.SeqStmt(pieces)


def _b_then_a_in_rows(seq: list, rows: int) -> list:
    """A reduction step's statements `seq` (its tile loads, then its GEMM of m rows) with A's load
    moved after B's and cut into m / rows loads of `rows` rows (row_loads.py); `seq` unchanged
    unless it has exactly one GEMM, one load of its A tile and one of its B tile before it, and
    nothing between the two loads touches A."""
    gemms = [i for i, s in enumerate(seq) if extern_call(s, "cgra_gemm") is not None]
    if len(gemms) != 1:
        return seq
    gemm = extern_call(seq[gemms[0]], "cgra_gemm")
    m, a, b = gemm.args[_M], buffer_of(gemm.args[_A_DATA]), buffer_of(gemm.args[_B_DATA])
    a_at = [i for i, s in enumerate(seq) if load_into(s, a) is not None]
    b_at = [i for i, s in enumerate(seq) if load_into(s, b) is not None]
    if a is None or b is None or len(a_at) != 1 or len(b_at) != 1 or not a_at[0] < b_at[0] < gemms[0] \
            or not isinstance(m, tirx.IntImm) or m.value <= rows or m.value % rows \
            or any(touches(s, a) for s in seq[a_at[0] + 1:b_at[0]]):
        return seq
    pieces = loads_in_row_pieces(seq[a_at[0]], a, m.value, rows, gemm.args[_A_STRIDE])
    if pieces is None:
        return seq
    return seq[:a_at[0]] + seq[a_at[0] + 1:b_at[0] + 1] + [pieces] + seq[b_at[0] + 1:]
