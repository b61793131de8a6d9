"""Fold the accumulator's zero-fill into the first GEMM of the reduction.

Stage: lowering, after copies became DMA and before double buffering. Input: a kernel whose
tile body reads
    cgra_fill(acc, off, rows, cols, stride, 0)
    for r0 ...: for r1 ...:            # the reduction steps (any depth, possibly none)
        <DMA loads>
        cgra_gemm(ACCUMULATE, ..., acc, off, stride)
Output: the FILL gone and the GEMM's flags `ACCUMULATE` except on the first reduction step,
where the GEMM overwrites the accumulator (acc = A @ B, the ISA's non-accumulating GEMM).

Why: the FILL is a vector-unit command the first GEMM of every tile must wait for, and the
vector unit runs in order behind the previous tile's epilogue; folding it away removes a
bubble per tile and the FILL's cycles. Applied only when the pattern is exact: the GEMM is the
first use of the accumulator after the FILL and covers exactly the filled region.
"""

from __future__ import annotations

from tvm import ir, sym, tirx

from cgra_codegen import device_call_positions
from cgra_sim.isa import GEMM_ACCUMULATE

from .calls import extern_call, map_sequences, touches, with_body

# Where the accumulator's operands sit in the calls' arguments: (data, offset, rows, cols, stride).
_FILL, _GEMM = device_call_positions("cgra_fill"), device_call_positions("cgra_gemm")
_FILL_ACC = (*_FILL["addr"], *_FILL["rows"], *_FILL["cols"], *_FILL["stride"])
_GEMM_ACC = (*_GEMM["acc_addr"], *_GEMM["m"], *_GEMM["n"], *_GEMM["acc_stride"])
(_GEMM_FLAGS,) = _GEMM["flags"]
(_FILL_VALUE,) = _FILL["value_bits"]


def fold_accumulator_init(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_body(map_sequences(func.body, _fold_in_sequence))


def _fold_in_sequence(seq):
    for i, stmt in enumerate(seq):
        fill = extern_call(stmt, "cgra_fill")
        if fill is None or not _is_zero(fill.args[_FILL_VALUE]):
            continue
        fill_region = [fill.args[i] for i in _FILL_ACC]
        acc = fill_region[0].args[0]
        for j in range(i + 1, len(seq)):
            folded = _fold_into(seq[j], acc, fill_region, [])
            if folded is not None:
                return _fold_in_sequence(seq[:i] + seq[i + 1:j] + [folded] + seq[j + 1:])
            if touches(seq[j], acc):
                break
    return tirx.SeqStmt(seq) if len(seq) > 1 else seq[0]


def _fold_into(stmt, acc, fill_region, loops):
    """`stmt` with its first accumulator use, a GEMM on exactly `fill_region`, made to overwrite
    on the first reduction step; None if the first use of `acc` in `stmt` is anything else."""
    if isinstance(stmt, tirx.For):
        body = _fold_into(stmt.body, acc, fill_region, loops + [stmt])
        return None if body is None else with_body(stmt, body)
    if isinstance(stmt, tirx.SeqStmt):
        items = list(stmt.seq)
        for k, item in enumerate(items):
            if touches(item, acc):
                folded = _fold_into(item, acc, fill_region, loops)
                return None if folded is None else tirx.SeqStmt(items[:k] + [folded] + items[k + 1:])
        return None
    gemm = extern_call(stmt, "cgra_gemm")
    if gemm is None or not _covers(gemm, acc, fill_region):
        return None
    args = list(gemm.args)
    flags = args[_GEMM_FLAGS]
    first_step = _all_first(loops)
    overwrite = flags - GEMM_ACCUMULATE
    # Without a reduction loop the single GEMM overwrites; otherwise only the first step does.
    args[_GEMM_FLAGS] = overwrite if first_step is None else tirx.if_then_else(first_step, overwrite, flags)
    return tirx.Evaluate(ir.Call(gemm.op, args, gemm.attrs, gemm.ty_args, gemm.span, gemm.ty))


def _covers(gemm, acc, fill_region) -> bool:
    data, offset, m, n, stride = (gemm.args[i] for i in _GEMM_ACC)
    if not (isinstance(data, ir.Call) and data.args[0].same_as(acc)):
        return False
    analyzer = sym.Analyzer()
    _, fill_offset, rows, cols, fill_stride = fill_region
    return all(analyzer.can_prove_equal(a, b) for a, b in
               ((offset, fill_offset), (m, rows), (n, cols), (stride, fill_stride)))


def _all_first(loops):
    """The condition 'every enclosing reduction loop is on its first iteration', or None."""
    cond = None
    for loop in loops:
        term = loop.loop_var == loop.min
        cond = term if cond is None else tirx.all(cond, term)
    return cond


def _is_zero(expr) -> bool:
    return isinstance(expr, (tirx.IntImm, tirx.FloatImm)) and expr.value == 0
