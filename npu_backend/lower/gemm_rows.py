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
"""

from __future__ import annotations


from tvm import ir, tirx

from cgra_codegen import device_call_positions

from ..kernels.common.spec import GEMM_ROWS
from .calls import extern_call, with_body

_GEMM = device_call_positions("cgra_gemm")
(_M,), (_A_OFFSET,), (_A_STRIDE,) = _GEMM["m"], _GEMM["a_addr"][1:], _GEMM["a_stride"]
(_ACC_OFFSET,), (_ACC_STRIDE,) = _GEMM["acc_addr"][1:], _GEMM["acc_stride"]


def split_gemm_rows(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_body(_visit(func.body, 0))


def _visit(stmt, rows: int):
    """`stmt` with the GEMMs under a GEMM_ROWS loop split into pieces of that loop's rows."""
    if isinstance(stmt, tirx.For):
        inner = int((stmt.annotations or {}).get(GEMM_ROWS, rows))
        return with_body(stmt, _visit(stmt.body, inner))
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([_visit(s, rows) for s in stmt.seq])
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
