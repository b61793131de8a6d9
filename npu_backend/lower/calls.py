"""The device calls of lowered TIR, as the passes after the DMA pass read and rebuild them.

Stage: lowering (fold_init.py, trim_fills.py). In: plain TIR statements whose commands are
`call_extern("cgra_*", ...)` with (buffer data, element offset) pairs for scratchpad operands.
Out: which call a statement makes, which buffers it passes, and a rebuild of a kernel's body
that hands each statement sequence, innermost first, to a pass's rewrite of sequences.
"""

from __future__ import annotations

from tvm import ir, tirx

BUFFER_DATA = ir.Op.get("tirx.buffer_data")


def map_sequences(stmt, on_sequence):
    """`stmt` rebuilt bottom-up through loops and ifs, each SeqStmt's statements (rewritten
    first) replaced by `on_sequence(list of statements)`."""
    if isinstance(stmt, tirx.SeqStmt):
        return on_sequence([map_sequences(s, on_sequence) for s in stmt.seq])
    if isinstance(stmt, tirx.For):
        return with_body(stmt, map_sequences(stmt.body, on_sequence))
    if isinstance(stmt, tirx.IfThenElse):
        else_case = map_sequences(stmt.else_case, on_sequence) if stmt.else_case is not None else None
        return tirx.IfThenElse(stmt.condition, map_sequences(stmt.then_case, on_sequence), else_case)
    return stmt


def map_loops(stmt, on_loop):
    """`stmt` rebuilt bottom-up through loops, sequences and ifs, each loop (its body rebuilt
    first) replaced by `on_loop(loop)`."""
    if isinstance(stmt, tirx.For):
        return on_loop(with_body(stmt, map_loops(stmt.body, on_loop)))
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([map_loops(s, on_loop) for s in stmt.seq])
    if isinstance(stmt, tirx.IfThenElse):
        else_case = map_loops(stmt.else_case, on_loop) if stmt.else_case is not None else None
        return tirx.IfThenElse(stmt.condition, map_loops(stmt.then_case, on_loop), else_case)
    return stmt


def with_body(loop, body):
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, loop.annotations)


def extern_call(stmt, name):
    """The call_extern `name` that `stmt` evaluates, or None."""
    if isinstance(stmt, tirx.Evaluate) and isinstance(stmt.value, ir.Call) \
            and getattr(stmt.value.op, "name", "") == "tirx.call_extern" \
            and str(stmt.value.args[0].value) == name:
        return stmt.value
    return None


def buffer_of(arg):
    """The buffer a call argument `buffer.data` names, or None."""
    return arg.args[0] if isinstance(arg, ir.Call) and arg.op.same_as(BUFFER_DATA) else None


def buffer_args(call) -> list:
    """The buffers a call passes (its `buffer.data` arguments)."""
    return [buffer for buffer in map(buffer_of, call.args) if buffer is not None]


def any_leaf(stmt, test) -> bool:
    """Whether `test` holds for a statement of `stmt` below its sequences, loops and branches."""
    if isinstance(stmt, tirx.SeqStmt):
        return any(any_leaf(s, test) for s in stmt.seq)
    if isinstance(stmt, tirx.For):
        return any_leaf(stmt.body, test)
    if isinstance(stmt, tirx.IfThenElse):
        return any_leaf(stmt.then_case, test) or (stmt.else_case is not None and any_leaf(stmt.else_case, test))
    return test(stmt)


def touches(stmt, buffer) -> bool:
    """Whether `stmt` passes `buffer` to any device call (or stores to it)."""
    def leaf(stmt) -> bool:
        if isinstance(stmt, tirx.Evaluate) and isinstance(stmt.value, ir.Call):
            return any(b.same_as(buffer) for b in buffer_args(stmt.value))
        return isinstance(stmt, tirx.BufferStore) and stmt.buffer.same_as(buffer)

    return any_leaf(stmt, leaf)
