"""Scratchpad address planning (stage: codegen, before any LLVM IR is written).

In: a lowered PrimFunc and the hardware description. Out: a `ScratchpadPlan` giving every
`global.cgra_spad` AllocBuffer a 64-byte aligned byte base address.

An AllocBuffer is live until the end of its enclosing scope (the SeqStmt it sits in), so buffers
allocated in disjoint scopes (two sibling loop bodies) share addresses: the planner is a stack
that grows in program order and pops back when a scope ends. The device orders commands on the
same scratchpad bytes already (a loop reuses one tile buffer every iteration), so sharing adds no
new kind of hazard.
"""

from __future__ import annotations

import dataclasses

from tvm import tirx

from .errors import CodegenError, ScratchpadOverflow, UnsupportedNode
from .llvm_types import itemsize

#: The storage scope of scratchpad buffers, for the schedules that allocate them and this planner
#: (TVM wants custom scopes as `<rank>.<tag>`).
SPAD_SCOPE = "global.cgra_spad"
SPAD_ALIGN = 64


def handle_of(node) -> int:
    """Identity of a TIR object (Vars are compared by identity, never by `==`)."""
    return node.__chandle__()


@dataclasses.dataclass(frozen=True)
class SpadBuffer:
    name: str
    size: int  # bytes
    base: int  # byte address in the scratchpad


@dataclasses.dataclass(frozen=True)
class ScratchpadPlan:
    buffers: tuple[SpadBuffer, ...]
    total: int  # bytes needed: the highest end address of any buffer
    capacity: int
    bases: dict  # buffer Var handle -> base

    def base_of(self, buffer_var) -> int:
        return self.bases[handle_of(buffer_var)]


def align_up(value: int, alignment: int = SPAD_ALIGN) -> int:
    return (value + alignment - 1) // alignment * alignment


def buffer_bytes(kernel: str, buffer_var) -> int:
    """Size in bytes of a (flattened) buffer with a constant shape."""
    count = 1
    for extent in buffer_var.ty.shape:
        if not isinstance(extent, tirx.IntImm):
            raise CodegenError(kernel, f"buffer '{buffer_var.name}' has a symbolic size "
                               f"({list(buffer_var.ty.shape)}); scratchpad and local buffers "
                               "need constant shapes: tile the symbolic dimension")
        count *= int(extent.value)
    return count * itemsize(buffer_var.ty.dtype)


class _Planner:
    """Walks the statements in program order; one short method per statement kind."""

    def __init__(self, kernel: str):
        self.kernel = kernel
        self.top = 0
        self.high = 0
        self.buffers: list[SpadBuffer] = []
        self.bases: dict[int, int] = {}
        self._table = {
            tirx.SeqStmt: self._seq,
            tirx.For: self._body_of,
            tirx.AttrStmt: self._body_of,
            tirx.IfThenElse: self._if,
            tirx.AllocBuffer: self._alloc,
            tirx.DeclBuffer: self._leaf,
            tirx.BufferStore: self._leaf,
            tirx.Bind: self._leaf,
            tirx.Evaluate: self._leaf,
            tirx.AssertStmt: self._leaf,
        }

    def visit(self, stmt) -> None:
        method = self._table.get(type(stmt))
        if method is None:
            raise UnsupportedNode(self.kernel, type(stmt).__name__,
                                  "while planning the scratchpad")
        method(stmt)

    def _seq(self, stmt) -> None:
        saved = self.top  # the SeqStmt is a scope: its allocations end with it
        for child in stmt.seq:
            self.visit(child)
        self.top = saved

    def _body_of(self, stmt) -> None:
        self.visit(stmt.body)

    def _if(self, stmt) -> None:
        self.visit(stmt.then_case)
        if stmt.else_case is not None:
            self.visit(stmt.else_case)

    def _alloc(self, stmt) -> None:
        buffer_var = stmt.buffer
        if str(buffer_var.ty.storage_scope) != SPAD_SCOPE:
            return
        size = buffer_bytes(self.kernel, buffer_var)
        base = align_up(self.top, _alignment(stmt))
        self.top = base + size
        self.high = max(self.high, self.top)
        self.buffers.append(SpadBuffer(buffer_var.name, size, base))
        self.bases[handle_of(buffer_var)] = base

    def _leaf(self, stmt) -> None:
        pass


def _alignment(stmt) -> int:
    """SPAD_ALIGN, or more if the AllocBuffer asks for it (annotation buffer_data_alignment)."""
    requested = stmt.annotations.get("buffer_data_alignment") if stmt.annotations else None
    return max(SPAD_ALIGN, int(requested) if requested is not None else 0)


def plan_scratchpad(func, kernel: str, arch) -> ScratchpadPlan:
    """Place every scratchpad buffer of `func`; raise `ScratchpadOverflow` if they do not fit."""
    planner = _Planner(kernel)
    planner.visit(func.body)
    if planner.high > arch.spad_bytes:
        raise ScratchpadOverflow(kernel, [(b.name, b.size) for b in planner.buffers],
                                 planner.high, arch.spad_bytes, arch.name)
    return ScratchpadPlan(tuple(planner.buffers), planner.high, arch.spad_bytes, planner.bases)
