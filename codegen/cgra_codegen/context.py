"""The state shared while one kernel is lowered (stage: codegen).

In: the kernel's PrimFunc, its scratchpad plan and the LLVM function being filled. Holds the LLVM
values of TIR variables, what every buffer variable stands for (a host tensor slot, a scratchpad
range, or host memory), and the error exit that every runtime call branches to on failure.
"""

from __future__ import annotations

import dataclasses

import llvmlite.ir as ir

from .errors import CodegenError, UnsupportedNode
from .llvm_types import PTR, ModuleBuilder, itemsize, llvm_type
from .spad import ScratchpadPlan, buffer_bytes, handle_of

#: What a buffer variable stands for.
HOST_TENSOR = "host tensor"  # a kernel parameter: bound to runtime slot `slot`
SCRATCHPAD = "scratchpad buffer"  # device memory at `spad_base`
LOCAL = "local buffer"  # host stack memory at `pointer`


@dataclasses.dataclass
class BufferBinding:
    name: str
    kind: str
    dtype: str
    root: object = None  # the parameter / AllocBuffer Var that owns the memory
    slot: int | None = None
    spad_base: int | None = None
    pointer: ir.Value | None = None  # host memory (local buffers, host-read scratchpad scalars)
    used_by_device: bool = False


@dataclasses.dataclass
class KernelState:
    kernel: str
    func: object  # tvm.tirx.PrimFunc
    plan: ScratchpadPlan
    mb: ModuleBuilder
    fn: ir.Function
    builder: ir.IRBuilder  # where code goes now
    entry_builder: ir.IRBuilder  # allocas: at the start of the entry block
    kernel_handle: ir.Value | None = None  # %k from cgra_kernel_begin
    fail_block: ir.Block | None = None  # calls cgra_kernel_end, returns -1
    values: dict = dataclasses.field(default_factory=dict)  # Var handle -> LLVM value
    buffers: dict = dataclasses.field(default_factory=dict)  # buffer Var handle -> binding
    shared_memory: dict = dataclasses.field(default_factory=dict)  # name -> entry-block alloca

    # Variables.
    def bind_value(self, var, value: ir.Value) -> None:
        self.values[handle_of(var)] = value

    def value_of(self, var) -> ir.Value:
        value = self.values.get(handle_of(var))
        if value is None:
            raise CodegenError(self.kernel, f"variable '{var.name}' is used but never defined "
                               "(not a loop variable, a Bind, or a dimension of a parameter)")
        return value

    # Buffers.
    def bind_buffer(self, buffer_var, binding: BufferBinding) -> None:
        self.buffers[handle_of(buffer_var)] = binding

    def buffer_of(self, buffer_var) -> BufferBinding:
        binding = self.buffers.get(handle_of(buffer_var))
        if binding is None:
            raise CodegenError(self.kernel, f"buffer '{buffer_var.name}' is used outside the "
                               "scope of its AllocBuffer/DeclBuffer and is not a parameter")
        return binding

    def host_memory(self, buffer_var) -> ir.Value:
        """Host memory behind a buffer that host code loads from or stores to.

        Local buffers have it from their AllocBuffer. A scratchpad buffer that no device command
        touches is only a scalar temporary of the host code and gets stack memory here; one that
        device commands use cannot be read by the host (the scratchpad is on the device)."""
        binding = self.buffer_of(buffer_var)
        if binding.kind == HOST_TENSOR and binding.pointer is not None:
            return binding.pointer  # a parameter the control code reads (entry.READ_PARAMS_ATTR)
        if binding.kind == HOST_TENSOR:
            raise UnsupportedNode(self.kernel, "BufferLoad/BufferStore",
                                  f"host code accesses host tensor '{binding.name}' directly; "
                                  "only device commands (cgra_dma_load/store) may touch "
                                  "kernel parameters, and the control code read those listed in "
                                  "'cgra.read_params'")
        if binding.pointer is None:
            if binding.used_by_device:
                raise CodegenError(self.kernel, self._shared_spad_message(binding))
            count = buffer_bytes(self.kernel, binding.root) // itemsize(binding.dtype)
            binding.pointer = self.alloca(ir.ArrayType(llvm_type(binding.dtype), count),
                                          binding.name)
        return binding.pointer

    def device_uses(self, binding: BufferBinding) -> None:
        """Record that a device command addresses `binding` (a scratchpad buffer)."""
        if binding.pointer is not None and binding.kind == SCRATCHPAD:
            raise CodegenError(self.kernel, self._shared_spad_message(binding))
        binding.used_by_device = True

    @staticmethod
    def _shared_spad_message(binding: BufferBinding) -> str:
        return (f"scratchpad buffer '{binding.name}' is used both by device commands and by "
                "host loads/stores; the host cannot read the scratchpad: keep host scalars in "
                "a 'local' buffer")

    # LLVM helpers.
    def alloca(self, ty: ir.Type, name: str) -> ir.Value:
        """Stack memory allocated once in the entry block (safe inside loops)."""
        memory = self.entry_builder.alloca(ty, name=name)
        memory.type = PTR  # opaque, whatever llvmlite's typed-pointer setting
        return memory

    def shared_alloca(self, name: str, ty: ir.Type) -> ir.Value:
        """One stack slot per kernel for argument arrays filled right before each call."""
        if name not in self.shared_memory:
            self.shared_memory[name] = self.alloca(ty, name)
        return self.shared_memory[name]

    def new_block(self, name: str) -> ir.Block:
        return self.fn.append_basic_block(name)

    def branch_on_failure(self, status: ir.Value) -> None:
        """Continue if a runtime call returned 0, else leave through the error exit."""
        ok = self.new_block("ok")
        failed = self.builder.icmp_signed("!=", status, ir.Constant(status.type, 0))
        self.builder.cbranch(failed, self.fail_block, ok)
        self.builder.position_at_end(ok)

    def set_error(self, kind: str, message: ir.Value) -> None:
        """TVMFFIErrorSetRaisedFromCStr(kind, message)."""
        self.builder.call(self.mb.runtime("TVMFFIErrorSetRaisedFromCStr"),
                          [self.mb.cstring(kind), message])
