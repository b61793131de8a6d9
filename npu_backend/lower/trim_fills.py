"""A FILL that an EPILOGUE after it partly overwrites fills only the rest.

Stage: lowering, after fold_init and before the ragged-tile cut and double buffering (buffers
are still N-d, calls are (data, offset) pairs: calls.py). Input: a sequence

    cgra_fill(X, off, rows, cols, stride, value)
    ...                                   # nothing that reads or writes X
    cgra_epilogue(..., out=X, out_off, m, n == cols, out_stride == stride, ...)

where the EPILOGUE's rows lie inside the FILL's (out_off = off + k * stride, k + m <= rows) and
it reads none of X. Output: the FILL cut to its rows before and after the EPILOGUE's (none, one
or two FILLs).

Why: kernels/fused/inverted_residual.py computes the depthwise's window as `if_then_else(inside the
image, epilogue, 0)`, which s_tir's decompose_padding turns into a FILL of each window row and
the EPILOGUE of its pixels inside the image: the FILL would write every pixel the EPILOGUE then
overwrites (a second pass of the vector unit over the window). What is left is the padding.
Applied only when the pattern is exact; the result is the same scratchpad contents.
"""

from __future__ import annotations

from tvm import ir, sym, tirx

from cgra_codegen import device_call_positions

from .calls import buffer_of, extern_call, map_sequences, touches

_FILL, _EPILOGUE = device_call_positions("cgra_fill"), device_call_positions("cgra_epilogue")


def trim_overwritten_fills(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_body(map_sequences(func.body, _trim_in_sequence))


def _trim_in_sequence(seq: list):
    out = []
    for i, stmt in enumerate(seq):
        fill = extern_call(stmt, "cgra_fill")
        rows = _overwritten_rows(fill, seq[i + 1:]) if fill is not None else None
        out += [stmt] if rows is None else _fills_around(fill, *rows)
    return tirx.SeqStmt(out) if len(out) > 1 else out[0] if out else tirx.Evaluate(0)


def _arg(call, positions: dict, name: str, index: int = 0):
    return call.args[positions[name][index]]


def _overwritten_rows(fill, rest: list):
    """(first, count): the FILL's rows the first later use of its buffer, an EPILOGUE writing
    them all and reading none of it, overwrites; None if that use is anything else."""
    buffer = buffer_of(_arg(fill, _FILL, "addr"))
    if buffer is None:
        return None
    for stmt in rest:
        if not touches(stmt, buffer):
            continue
        epilogue = extern_call(stmt, "cgra_epilogue")
        if epilogue is None:
            return None
        reads = [buffer_of(epilogue.args[_EPILOGUE[name][0]])
                 for name in ("acc_addr", "bias_addr", "residual_addr", "scale_addr")]
        out = buffer_of(_arg(epilogue, _EPILOGUE, "out_addr"))
        if out is None or not out.same_as(buffer) or any(r is not None and r.same_as(buffer) for r in reads):
            return None
        return _rows_inside(fill, epilogue)
    return None


def _rows_inside(fill, epilogue):
    """(first, count) of the EPILOGUE's rows among the FILL's, when they are whole FILL rows."""
    analyzer = sym.Analyzer()
    stride, cols = _arg(fill, _FILL, "stride"), _arg(fill, _FILL, "cols")
    if not (analyzer.can_prove_equal(stride, _arg(epilogue, _EPILOGUE, "out_stride"))
            and analyzer.can_prove_equal(cols, _arg(epilogue, _EPILOGUE, "n"))
            and isinstance(stride, tirx.IntImm) and stride.value > 0):
        return None
    delta = analyzer.simplify(_arg(epilogue, _EPILOGUE, "out_addr", 1) - _arg(fill, _FILL, "addr", 1))
    rows, count = analyzer.simplify(_arg(fill, _FILL, "rows")), analyzer.simplify(_arg(epilogue, _EPILOGUE, "m"))
    if not all(isinstance(v, tirx.IntImm) for v in (delta, rows, count)) or delta.value % stride.value:
        return None
    first = delta.value // stride.value
    return (first, count.value) if 0 <= first and first + count.value <= rows.value else None


def _fills_around(fill, first: int, count: int) -> list:
    """The FILL's rows before `first` and from first + count on, as FILLs (none if empty)."""
    stride, rows = _arg(fill, _FILL, "stride").value, _arg(fill, _FILL, "rows").value
    parts = [(0, first), (first + count, rows - first - count)]
    return [tirx.Evaluate(_with_rows(fill, start * stride, length)) for start, length in parts if length > 0]


def _with_rows(fill, offset: int, rows: int):
    args = list(fill.args)
    (position,) = _FILL["rows"]
    args[position] = tirx.IntImm(str(args[position].ty), rows)
    offset_position = _FILL["addr"][1]
    args[offset_position] = args[offset_position] + offset
    return ir.Call(fill.op, args, fill.attrs, fill.ty_args, fill.span, fill.ty)
