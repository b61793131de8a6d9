"""Double buffering: two copies of every scratchpad tile allocated inside a loop.

Stage: lowering, after copies became DMA (buffers still N-d). Input: a PrimFunc in which each
scratchpad buffer is allocated inside the loop nest that reuses it (s_tir's allocation
planning puts it there). Output: the allocation with a leading dimension of 2, and every use in
iteration `t` of the enclosing loop nest redirected to copy `t % 2`.

Why: with one copy, the DMA for tile t+1 must wait until the PE array has finished reading tile
t (a write-after-read on the same scratchpad bytes). With two, the load of t+1 runs while t is
computed, and the epilogue and store of t while t+1 is computed; the simulator's scoreboard
sees disjoint byte ranges and overlaps them. The tiling budgets twice each buffer for this,
except the buffers of the blocks a kernel names in its SINGLE_BUFFERED attribute (one copy) and
those an enclosing loop's BUFFER_COPIES annotation gives more (a GEMM's operand tiles whose
loads take longer than two steps: kernels/gemm/gemm_copies.py).

Uses of a buffer are (data, element offset) argument pairs of `cgra_*` calls (the convention of
the intrinsics and of the DMA pass) and, rarely, BufferLoad/BufferStore; both are rewritten.
"""

from __future__ import annotations

import functools

from tvm import ir, tirx

from cgra_codegen import SPAD_SCOPE as SPAD

from ..kernels.common.spec import BUFFER_COPIES, SINGLE_BUFFERED
from .dma import buffer_elements, buffer_strides

_BUFFER_DATA = ir.Op.get("tirx.buffer_data")
COPIES = 2


_SUFFIX = "_" + SPAD  # set_scope names a block's buffer <block>_global.cgra_spad


def double_buffer(func: tirx.PrimFunc) -> tirx.PrimFunc:
    single = {str(name) for name in (func.attrs or {}).get(SINGLE_BUFFERED, [])}
    return func.with_body(_rewrite(func.body, [], single))


def _rewrite(stmt, loops, single):
    """`loops`: the enclosing For nodes, outermost first; `single`: blocks kept one copy of."""
    if isinstance(stmt, tirx.For):
        body = _rewrite(stmt.body, loops + [stmt], single)
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body,
                        stmt.thread_binding, stmt.annotations)
    if isinstance(stmt, tirx.SeqStmt):
        seq = [_rewrite(s, loops, single) for s in stmt.seq]
        return _double_allocations(seq, loops, single)
    if isinstance(stmt, tirx.IfThenElse):
        else_case = _rewrite(stmt.else_case, loops, single) if stmt.else_case is not None else None
        return tirx.IfThenElse(stmt.condition, _rewrite(stmt.then_case, loops, single), else_case)
    return stmt


def _double_allocations(seq, loops, single):
    """Give the spad allocations of this sequence two copies indexed by the loops' parity (or
    the copies an enclosing loop's BUFFER_COPIES annotation asks for, the iteration modulo them).

    The allocation stays where it is: the code generator places it at a fixed scratchpad
    address for the whole loop, so copy `t % 2` of iteration t is still there in iteration
    t + 2, which is all double buffering needs."""
    if not loops or _trip_count(loops) < 2:
        return tirx.SeqStmt(seq)
    asked = _copies_asked(loops)
    remap = {}  # copies -> {buffer: its copies}
    for stmt in seq:
        if isinstance(stmt, tirx.AllocBuffer) and stmt.buffer.scope() == SPAD:
            name = str(stmt.buffer.name).removesuffix(_SUFFIX)
            if name not in single:
                copies = asked.get(name, COPIES)
                remap.setdefault(copies, {})[stmt.buffer] = with_copies(stmt.buffer, copies)
    if not remap:
        return tirx.SeqStmt(seq)
    every = {buffer: copy for group in remap.values() for buffer, copy in group.items()}
    out = []
    for stmt in seq:
        if isinstance(stmt, tirx.AllocBuffer) and stmt.buffer in every:
            out.append(tirx.AllocBuffer(every[stmt.buffer]))
            continue
        for copies, group in remap.items():
            stmt = ExprRedirect(group, tirx.floormod(_iteration(loops), copies)).stmt(stmt)
        out.append(stmt)
    return tirx.SeqStmt(out)


def _copies_asked(loops) -> dict:
    """{block name: copies} from the BUFFER_COPIES annotations of the enclosing loops."""
    asked = {}
    for loop in loops:
        for name, copies in dict((loop.annotations or {}).get(BUFFER_COPIES, {})).items():
            asked[str(name)] = int(copies)
    return asked


def _doubled(buffer):
    return with_copies(buffer, COPIES)


def with_copies(buffer, copies: int):
    """`copies` copies of `buffer`, each spanning the buffer's padded size: its row strides
    (storage_align's padding) are kept, so every copy has the layout the intrinsics expect."""
    strides = buffer_strides(buffer)
    return tirx.decl_buffer((copies,) + tuple(buffer.shape), buffer.dtype, f"{buffer.name}_x{copies}",
                            strides=[buffer_elements(buffer)] + strides, scope=SPAD)


def _trip_count(loops) -> int:
    """Iterations of the loops; a symbolic extent (a number of tiles of a symbolic axis) counts
    as 2: it may be, and double buffering is right for any count."""
    return functools.reduce(lambda n, loop: n * (int(loop.extent) if isinstance(loop.extent, tirx.IntImm)
                                                 else 2), loops, 1)


def _iteration(loops):
    """The flat iteration number of the loop nest (row-major over the enclosing loops)."""
    index = 0
    for loop in loops:
        index = index * loop.extent + (loop.loop_var - loop.min)
    return index


class ExprRedirect:
    """Rewrites uses of the remapped buffers to copy `parity` of their doubled (or multiplied:
    hoist_allocs.py) version."""

    def __init__(self, remap, parity):
        self.remap, self.parity = remap, parity

    def stmt(self, stmt):
        if isinstance(stmt, tirx.SeqStmt):
            return tirx.SeqStmt([self.stmt(s) for s in stmt.seq])
        if isinstance(stmt, tirx.For):
            return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, self.stmt(stmt.body),
                            stmt.thread_binding, stmt.annotations)
        if isinstance(stmt, tirx.IfThenElse):
            else_case = self.stmt(stmt.else_case) if stmt.else_case is not None else None
            return tirx.IfThenElse(stmt.condition, self.stmt(stmt.then_case), else_case)
        if isinstance(stmt, tirx.Evaluate):
            return tirx.Evaluate(self.call(stmt.value))
        if isinstance(stmt, tirx.BufferStore) and stmt.buffer in self.remap:
            return tirx.BufferStore(self.remap[stmt.buffer], stmt.value,
                                    [self.parity] + list(stmt.indices))
        return stmt

    def call(self, value):
        if not isinstance(value, ir.Call):
            return value
        args = list(value.args)
        for i, arg in enumerate(args):
            buf = self._buffer_of(arg)
            if buf is None:
                continue
            args[i] = self.remap[buf].data
            args[i + 1] = args[i + 1] + self.parity * buffer_elements(buf)
        return ir.Call(value.op, args, value.attrs, value.ty_args, value.span, value.ty)

    def _buffer_of(self, arg):
        if isinstance(arg, ir.Call) and arg.op.same_as(_BUFFER_DATA):
            buf = arg.args[0]
            return buf if buf in self.remap else None
        return None
