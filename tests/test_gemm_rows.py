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


def _load(host, spad, rows, origin_row=0, offset=0, stride=A_STRIDE):
    """A DMA load of `rows` rows of 16 elements of `host` (rows x 16 at (origin_row, 0)) into
    `spad` at `offset`, its rows `stride` elements apart."""
    box = [origin_row, 0, 0, 0] + [0] * 8 + [rows, 0, 1, stride, 16, 1, 1, 1] + [1, 0, 0, 0] * 2
    return tirx.Evaluate(device_call("cgra_dma_load", flags=0, slot=host, spad_addr=(spad.data, offset),
                                     box=[tirx.IntImm("int64", w) for w in box]))


def _step(m, rows, a_first=True):
    """(host A, buffers, a tile loop annotated GEMM_ROWS = rows whose body loads A's m x 16 tile
    and B's tile, then runs one GEMM of m rows)."""
    host = tirx.decl_buffer((64, 16), "float32", name="lhs")
    a = tirx.decl_buffer((32, A_STRIDE), "float32", name="a_pad", scope=SPAD_SCOPE)
    b = tirx.decl_buffer((16, 32), "float32", name="b_pad", scope=SPAD_SCOPE)
    acc = tirx.decl_buffer((32, ACC_STRIDE), "float32", name="acc", scope=SPAD_SCOPE)
    weights = tirx.decl_buffer((16, 32), "float32", name="rhs")
    loads = [_load(host, a, m), _load(weights, b, 16, stride=32)]
    body = tirx.SeqStmt((loads if a_first else loads[::-1]) + [_gemm(m, a, b, acc)])
    loop = tirx.For(tirx.Var("tile", "int32"), 0, 2, tirx.ForKind.SERIAL, body, annotations={GEMM_ROWS: rows})
    return host, (a, b, acc), weights, loop


def test_a_steps_b_tile_loads_first_and_its_a_tile_in_pieces_of_the_rows():
    """The first GEMM of r rows waits for B's tile and A's first r rows, not for all of A."""
    host, (a, b, acc), weights, loop = _step(32, 8)
    expected = [_load(weights, b, 16, stride=32), tirx.SeqStmt([_load(host, a, 8, p * 8, p * 8 * A_STRIDE)
                                                                for p in range(4)]),
                tirx.SeqStmt([_gemm(8, a, b, acc, p * 8 * A_STRIDE, p * 8 * ACC_STRIDE) for p in range(4)])]
    got = split_gemm_rows(tirx.PrimFunc([], loop)).body.body
    tvm.ir.assert_structural_equal(_simplified(got), _simplified(tirx.SeqStmt(expected)))


def test_loads_the_pass_does_not_recognise_keep_their_order():
    """B loaded before A already (nothing to move), or a GEMM the rows do not divide: the loads
    stay as they are."""
    for m, rows, a_first in ((32, 8, False), (24, 16, True)):
        *_, loop = _step(m, rows, a_first)
        got = split_gemm_rows(tirx.PrimFunc([], loop)).body.body
        tvm.ir.assert_structural_equal(tirx.SeqStmt(list(got.seq[:2])), tirx.SeqStmt(list(loop.body.seq[:2])))
