"""cgra_codegen: lowered TIR -> LLVM IR (llvmlite) -> a host object driving the CGRA runtime.

`build(prim_funcs, arch)` compiles each lowered PrimFunc into an exported tvm-ffi function
`__tvm_ffi_<global_symbol>` that checks its arguments, records the kernel's device commands through
the runtime's C API (docs/runtime-abi.md) and submits them. It is `emit_kernel_bitcode` per kernel
(each kernel its own LLVM module, the unit a kernel cache keeps) and `link_kernels` of them all.

For the compiler's intrinsics and passes: `device_call(name, **operands)` builds a TIR call of a
command function by parameter name, `device_call_positions(name)` says where each parameter's
arguments sit in one, and `SPAD_SCOPE` is the scratchpad's storage scope.
"""

from .device_calls import DEVICE_CALLS
from .emit import CompiledKernels, KernelBitcode, build, emit_kernel_bitcode, link_kernels
from .errors import (CodegenError, DeviceCallError, InvalidDeviceCall, ScratchpadOverflow,
                     UnsupportedNode)
from .spad import SPAD_SCOPE, ScratchpadPlan, plan_scratchpad
from .tir_calls import device_call, device_call_positions

__all__ = [
    "DEVICE_CALLS",
    "SPAD_SCOPE",
    "CodegenError",
    "CompiledKernels",
    "DeviceCallError",
    "InvalidDeviceCall",
    "KernelBitcode",
    "ScratchpadOverflow",
    "ScratchpadPlan",
    "UnsupportedNode",
    "build",
    "device_call",
    "device_call_positions",
    "emit_kernel_bitcode",
    "link_kernels",
    "plan_scratchpad",
]
