"""Lowering of TIR statements to LLVM control flow (stage: codegen).

In: the body of a lowered PrimFunc (SeqStmt, For, IfThenElse, AllocBuffer, DeclBuffer,
BufferStore, Bind, Evaluate(call_extern), AssertStmt, AttrStmt) and the kernel state, with the
builder positioned after the prologue. Out: the body's LLVM IR, every runtime call checked.
One short method per statement kind, found through `_table`.

Bind, AllocBuffer and DeclBuffer have no body: what they define is visible to the statements
after them in the same scope. Bind values become SSA values; AllocBuffer gives a buffer its
scratchpad address (planned in spad.py) or host stack memory; DeclBuffer makes an alias
(`A_1 = A.view(32)`) share the binding of the buffer whose data it takes.
"""

from __future__ import annotations

import llvmlite.ir as ir
import tvm
from tvm import tirx

from . import device_calls
from .context import LOCAL, SCRATCHPAD, BufferBinding, KernelState
from .errors import UnsupportedNode
from .exprs import ExprLowering, dtype_of, is_buffer_data, op_name
from .llvm_types import int_arith, itemsize, llvm_type
from .spad import SPAD_SCOPE, buffer_bytes

CALL_EXTERN_OP = "tirx.call_extern"


class BodyLowering:
    def __init__(self, state: KernelState):
        self.state = state
        self.exprs = ExprLowering(state)
        self._table = {
            tirx.SeqStmt: self._seq, tirx.For: self._for, tirx.IfThenElse: self._if,
            tirx.AllocBuffer: self._alloc_buffer, tirx.DeclBuffer: self._decl_buffer,
            tirx.BufferStore: self._buffer_store, tirx.Bind: self._bind,
            tirx.Evaluate: self._evaluate, tirx.AssertStmt: self._assert,
            tirx.AttrStmt: self._attr,
        }

    @property
    def b(self) -> ir.IRBuilder:
        return self.state.builder

    def lower(self, stmt) -> None:
        method = self._table.get(type(stmt))
        if method is None:
            raise UnsupportedNode(self.state.kernel, type(stmt).__name__, f"statement {stmt}")
        method(stmt)

    def _seq(self, stmt) -> None:
        for child in stmt.seq:
            self.lower(child)

    def _attr(self, stmt) -> None:
        self.lower(stmt.body)  # attributes are hints for other backends

    def _bind(self, stmt) -> None:
        self.state.bind_value(stmt.var, self.exprs.lower(stmt.value))

    def _for(self, stmt) -> None:
        """A counted loop with a phi; blocks are created in textual order (header, body,
        latch, end) and branches to later blocks are filled in once those exist."""
        if stmt.kind == tirx.ForKind.THREAD_BINDING:
            raise UnsupportedNode(self.state.kernel, "For(thread_binding)",
                                  "the CGRA host code has no threads")
        dtype = dtype_of(stmt.loop_var)
        start = self.exprs.lower_as(stmt.min, dtype)
        end = int_arith(self.b, "add", start, self.exprs.lower_as(stmt.extent, dtype),
                        name="loop.end")
        step = (ir.Constant(llvm_type(dtype), 1) if stmt.step is None
                else self.exprs.lower_as(stmt.step, dtype))
        preheader = self.b.block
        header = self.state.new_block("for.header")
        self.b.branch(header)
        self.b.position_at_end(header)
        induction = self.b.phi(llvm_type(dtype), name=stmt.loop_var.name)
        induction.add_incoming(start, preheader)
        in_range = self.exprs.compare("<", induction, end, dtype)
        body = self.state.new_block("for.body")
        self.b.position_at_end(body)
        self.state.bind_value(stmt.loop_var, induction)
        self.lower(stmt.body)
        induction.add_incoming(self.b.add(induction, step, name="loop.next"), self.b.block)
        self.b.branch(header)
        exit_block = self.state.new_block("for.end")
        self.b.position_at_end(header)
        self.b.cbranch(in_range, body, exit_block)
        self.b.position_at_end(exit_block)

    def _if(self, stmt) -> None:
        condition = self.exprs.lower_condition(stmt.condition)
        decision = self.b.block
        branch_ends, targets = [], []
        for name, branch in (("if.then", stmt.then_case), ("if.else", stmt.else_case)):
            if branch is None:
                continue
            targets.append(self.state.new_block(name))
            self.b.position_at_end(targets[-1])
            self.lower(branch)
            branch_ends.append(self.b.block)
        merge = self.state.new_block("if.end")
        for block in branch_ends:
            self.b.position_at_end(block)
            self.b.branch(merge)
        self.b.position_at_end(decision)
        self.b.cbranch(condition, targets[0], targets[1] if len(targets) > 1 else merge)
        self.b.position_at_end(merge)

    def _alloc_buffer(self, stmt) -> None:
        buffer_var = stmt.buffer
        dtype = str(buffer_var.ty.dtype)
        if str(buffer_var.ty.storage_scope) == SPAD_SCOPE:
            binding = BufferBinding(buffer_var.name, SCRATCHPAD, dtype, root=buffer_var,
                                    spad_base=self.state.plan.base_of(buffer_var))
        else:
            count = buffer_bytes(self.state.kernel, buffer_var) // itemsize(dtype)
            memory = self.state.alloca(ir.ArrayType(llvm_type(dtype), count), buffer_var.name)
            binding = BufferBinding(buffer_var.name, LOCAL, dtype, root=buffer_var,
                                    pointer=memory)
        self.state.bind_buffer(buffer_var, binding)

    def _decl_buffer(self, stmt) -> None:
        if not is_buffer_data(stmt.data):
            raise UnsupportedNode(self.state.kernel, "DeclBuffer",
                                  f"'{stmt.buffer.name}' takes its data from {stmt.data}; only "
                                  "aliases of another buffer's data (X.data) are supported")
        self.state.bind_buffer(stmt.buffer, self.state.buffer_of(stmt.data.args[0]))

    def _buffer_store(self, stmt) -> None:
        dtype = str(stmt.buffer.ty.dtype)
        value = self.exprs.lower_as(stmt.value, dtype)
        self.b.store(value, self.exprs.host_element(stmt.buffer, stmt.indices))

    def _evaluate(self, stmt) -> None:
        value = stmt.value
        if isinstance(value, tirx.IntImm):
            return  # Evaluate(0): a no-op left by simplification
        if isinstance(value, tvm.ir.Call) and op_name(value) == CALL_EXTERN_OP:
            device_calls.lower_device_call(self.state, self.exprs, value)
            return
        raise UnsupportedNode(self.state.kernel, f"Evaluate({type(value).__name__})",
                              f"only call_extern of cgra_* functions is lowered, got {value}")

    def _assert(self, stmt) -> None:
        passed = self.exprs.lower_condition(stmt.condition)
        failed_block = self.state.new_block("assert.fail")
        ok = self.state.new_block("assert.ok")
        self.b.cbranch(passed, ok, failed_block)
        self.b.position_at_end(failed_block)
        parts = [p.value if isinstance(p, tvm.ir.StringImm) else str(p)
                 for p in stmt.message_parts]
        message = f"cgra kernel '{self.state.kernel}': " + "".join(parts)
        kind = stmt.error_kind if hasattr(stmt, "error_kind") else stmt.kind  # TVM 0.27 names it error_kind
        self.state.set_error(str(kind.value), self.state.mb.cstring(message))
        self.b.branch(self.state.fail_block)
        self.b.position_at_end(ok)
