"""lower/gemm_rows.py: under a loop annotated GEMM_ROWS = r, a GEMM of m rows (a multiple of r)
becomes m / r GEMMs of r rows, A's and the accumulator's offsets r of their rows apart; any
other GEMM is left as it is. Golden TIR, compared structurally."""

from __future__ import annotations

import tvm
from tvm import tirx

from cgra_codegen import SPAD_SCOPE, device_call
from cgra_sim import isa
from npu_backend.kernels.common.spec import GEMM_ROWS
from npu_backend.lower.gemm_rows import split_gemm_rows

A_STRIDE, ACC_STRIDE = 20, 36  # rows padded against bank conflicts


def _gemm(m, a, b, acc, a_offset=0, acc_offset=0):
    return tirx.Evaluate(device_call("cgra_gemm", flags=isa.GEMM_ACCUMULATE, dtype=1, m=m, n=32, k=16,
                                     a_addr=(a.data, a_offset), a_stride=A_STRIDE, b_addr=b, b_stride=32,
                                     acc_addr=(acc.data, acc_offset), acc_stride=ACC_STRIDE))


def _kernel(m, rows):
    """(buffers, a PrimFunc whose tile loop, annotated GEMM_ROWS = rows if rows, runs one GEMM)."""
    a = tirx.decl_buffer((32, A_STRIDE), "float32", name="a_pad", scope=SPAD_SCOPE)
    b = tirx.decl_buffer((16, 32), "float32", name="b_pad", scope=SPAD_SCOPE)
    acc = tirx.decl_buffer((32, ACC_STRIDE), "float32", name="acc", scope=SPAD_SCOPE)
    tile = tirx.Var("tile", "int32")
    loop = tirx.For(tile, 0, 2, tirx.ForKind.SERIAL, _gemm(m, a, b, acc),
                    annotations={GEMM_ROWS: rows} if rows else None)
    return (a, b, acc, tile), tirx.PrimFunc([], loop)


def _simplified(stmt):
    return tirx.transform.StmtSimplify()(tvm.IRModule({"f": tirx.PrimFunc([], stmt)}))["f"].body


def test_a_tile_gemm_runs_in_pieces_of_the_annotated_rows():
    (a, b, acc, tile), func = _kernel(32, 8)
    pieces = tirx.SeqStmt([_gemm(8, a, b, acc, p * 8 * A_STRIDE, p * 8 * ACC_STRIDE) for p in range(4)])
    tvm.ir.assert_structural_equal(_simplified(split_gemm_rows(func).body.body), _simplified(pieces))


def test_a_gemm_the_rows_do_not_divide_or_an_unannotated_loop_is_left_whole():
    for m, rows in ((24, 16), (32, 0), (8, 8)):
        _, func = _kernel(m, rows)
        tvm.ir.assert_structural_equal(split_gemm_rows(func), func)
