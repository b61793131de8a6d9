"""Typed errors of the code generator (stage: codegen).

Every error of lowering a kernel names the kernel and says what to change; they all derive from
`CodegenError`, so a caller can catch the stage as a whole. `DeviceCallError` is raised earlier,
while TIR device calls are built.
"""

from __future__ import annotations

STAGE = "codegen"


class CodegenError(Exception):
    """Lowered TIR could not be turned into LLVM IR or an object file."""

    def __init__(self, kernel: str, message: str):
        self.kernel = kernel
        super().__init__(f"cgra {STAGE}: kernel '{kernel}': {message}")


class UnsupportedNode(CodegenError):
    """A TIR node kind, or a call_extern name, that this stage does not lower."""

    def __init__(self, kernel: str, node_type: str, detail: str = ""):
        self.node_type = node_type
        self.stage = STAGE
        text = f"unsupported TIR node {node_type} in stage '{STAGE}'"
        if detail:
            text += f": {detail}"
        super().__init__(kernel, text)


class InvalidDeviceCall(CodegenError):
    """A cgra_* call_extern whose arguments do not fit the runtime ABI."""


class DeviceCallError(TypeError):
    """A device call built (`device_call`) with operands that do not fit its command function's
    parameters. Raised while an intrinsic or a pass builds TIR, so it names no kernel."""


class ScratchpadOverflow(CodegenError):
    """The kernel's scratchpad buffers do not fit in the architecture's scratchpad."""

    def __init__(self, kernel: str, buffers: list[tuple[str, int]], total: int, capacity: int,
                 arch_name: str):
        self.buffers = list(buffers)
        self.total = total
        self.capacity = capacity
        listing = ", ".join(f"'{name}' ({size} bytes)" for name, size in buffers)
        super().__init__(
            kernel,
            f"scratchpad buffers need {total} bytes (64-byte aligned) but '{arch_name}' has "
            f"{capacity} bytes of scratchpad; buffers: {listing}. Use smaller tiles in the "
            "schedule or compile for an architecture with a bigger scratchpad.")
