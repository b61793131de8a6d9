"""cgra_codegen: lowered TIR -> LLVM IR (llvmlite) -> a host object driving the CGRA runtime.

`build(prim_funcs, arch)` compiles each lowered PrimFunc into an exported tvm-ffi function
`__tvm_ffi_<global_symbol>` that checks its arguments, records the kernel's device commands through
the runtime's C API (docs/runtime-abi.md) and submits them.
"""

from .device_calls import DEVICE_CALLS
from .emit import CompiledKernels, build
from .errors import CodegenError, InvalidDeviceCall, ScratchpadOverflow, UnsupportedNode
from .spad import ScratchpadPlan, plan_scratchpad

__all__ = [
    "DEVICE_CALLS",
    "CodegenError",
    "CompiledKernels",
    "InvalidDeviceCall",
    "ScratchpadOverflow",
    "ScratchpadPlan",
    "UnsupportedNode",
    "build",
    "plan_scratchpad",
]
