"""RoPE's pass-through column tiles: no rotation, their tables not loaded, the store reads x.

Stage: lowering, last (after cut_padded_rows.py: every command of a tile is in its final form).
Input: a column tile loop annotated ROPE_ROTATES = [p, first, last, ...]
(kernels/gemm/rope_epilogue.py: tile c rotates where c mod p lies in a [first, last) range; the
others' tables are C = 1, S = 0) whose body runs the epilogue of kernels/intrinsics/rope_epilogue.py:

    rot = x[:, partner] * S         ELTWISE multiply per run      (reads sin_pad)
    epi = x * C; epi += rot          ELTWISE multiply, add         (reads cos_pad, then rot)
    store epi

with x the accumulator or the biased one (the bias's EPILOGUE). Output: those ELTWISEs and the
tables' loads run only on the tiles that rotate; elsewhere the store reads x where it read epi
(the multiply wrote epi at x's own offsets and strides, checked: otherwise the loop is left as
it is).

Why: GPT-NeoX rotates the first quarter of each q and k head and none of v: four of the six
8-column tiles a head's 48 columns make (q's and k's unrotated halves, v) multiplied by 1, added
0 and loaded tables of ones and zeros: 200 of the 234 vector cycles of such a tile on cgra-8x8.
Exact, and closer to PyTorch than before: the tile's outputs are x itself (x * 1 + partner * 0
was x for finite values only).
"""

from __future__ import annotations

import tvm_ffi
from tvm import ir, tirx

from ..kernels.common.spec import ROPE_ROTATES
from .calls import buffer_args, buffer_of, extern_call, map_loops, with_body

TABLES = ("cos_pad", "sin_pad")
#: cgra_eltwise's arguments: name, op, dtype, rows, cols, then (data, offset, row stride, step)
#: of the two operands and (data, offset, row stride) of the output
X, COS, OUT = 5, 9, 13


def skip_pass_through(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_body(map_loops(func.body, lambda loop: _skipped(loop)
                                    if ROPE_ROTATES in (loop.annotations or {}) else loop))


def _named(buffer, prefixes) -> bool:
    return buffer is not None and str(buffer.name).startswith(prefixes)


def _skipped(loop):
    """The loop with its pass-through tiles' rotation left out (module doc), or as it is when its
    combine multiplies do not write epi where x is."""
    values = [int(v) for v in loop.annotations[ROPE_ROTATES]]
    period, ranges = values[0], list(zip(values[1::2], values[2::2]))
    combines = _leaves(loop.body, lambda s: (c := extern_call(s, "cgra_eltwise")) is not None
                       and _named(buffer_of(c.args[COS]), "cos_pad"))
    if not combines:
        return loop
    calls = [s.value for s in combines]
    x, epi = buffer_of(calls[0].args[X]), buffer_of(calls[0].args[OUT])
    for call in calls:  # epi written at x's offsets and strides, from x alone
        if not (buffer_of(call.args[X]).same_as(x) and buffer_of(call.args[OUT]).same_as(epi)
                and tvm_ffi.structural_equal(call.args[X + 1], call.args[OUT + 1])
                and tvm_ffi.structural_equal(call.args[X + 2], call.args[OUT + 2])):
            return loop
    column = loop.loop_var - loop.min
    if not (isinstance(loop.extent, tirx.IntImm) and loop.extent.value <= period):
        column = tirx.floormod(column, period)
    rotates = _within(column, ranges)
    return with_body(loop, _guarded(loop.body, rotates, x, epi))


def _within(column, ranges):
    """column in one of the [first, last) ranges, as TIR (False for none)."""
    terms = [tirx.EQ(column, first) if last == first + 1 else tirx.And(tirx.GE(column, first), tirx.LT(column, last))
             for first, last in ranges]
    if not terms:
        return tirx.const(False, "bool")
    condition = terms[0]
    for term in terms[1:]:
        condition = tirx.Or(condition, term)
    return condition


def _guarded(stmt, rotates, x, epi):
    """`stmt` with the rotation's commands and the tables' loads under `rotates`, and each store
    of epi reading x where it does not rotate."""
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([_guarded(s, rotates, x, epi) for s in stmt.seq])
    if isinstance(stmt, tirx.For):
        return with_body(stmt, _guarded(stmt.body, rotates, x, epi))
    if isinstance(stmt, tirx.IfThenElse):
        else_case = _guarded(stmt.else_case, rotates, x, epi) if stmt.else_case is not None else None
        return tirx.IfThenElse(stmt.condition, _guarded(stmt.then_case, rotates, x, epi), else_case)
    store = extern_call(stmt, "cgra_dma_store")
    if store is not None and any(b.same_as(epi) for b in buffer_args(store)):
        return tirx.IfThenElse(rotates, stmt, tirx.Evaluate(_reading(store, epi, x)))
    if _rotation(stmt, epi):
        return tirx.IfThenElse(rotates, stmt, None)
    return stmt


def _rotation(stmt, epi) -> bool:
    """Whether `stmt` is an ELTWISE of the rotation (it reads a table, or writes rot or epi) or a
    load of a table."""
    call = extern_call(stmt, "cgra_eltwise")
    if call is not None:
        return any(_named(b, TABLES + ("rot",)) or b.same_as(epi) for b in buffer_args(call))
    call = extern_call(stmt, "cgra_dma_load")
    return call is not None and any(_named(b, TABLES) for b in buffer_args(call))


def _reading(call, old, new):
    """`call` with its `old.data` arguments `new.data`."""
    def swapped(arg):
        if (buffer := buffer_of(arg)) is None or not buffer.same_as(old):
            return arg
        return ir.Call(arg.op, [new], arg.attrs, arg.ty_args, arg.span, arg.ty)

    return ir.Call(call.op, [swapped(a) for a in call.args], call.attrs, call.ty_args, call.span, call.ty)


def _leaves(stmt, test) -> list:
    """The statements of `stmt` below its sequences, loops and branches for which `test` holds."""
    if isinstance(stmt, tirx.SeqStmt):
        return [s for child in stmt.seq for s in _leaves(child, test)]
    if isinstance(stmt, tirx.For):
        return _leaves(stmt.body, test)
    if isinstance(stmt, tirx.IfThenElse):
        return _leaves(stmt.then_case, test) + (_leaves(stmt.else_case, test) if stmt.else_case is not None else [])
    return [stmt] if test(stmt) else []
