"""The code generator's entry point: lowered PrimFuncs -> verified LLVM IR -> object file.

Stage: codegen. In: lowered `tvm.tirx.PrimFunc`s (attrs "global_symbol", optionally "cgra.arch",
"cgra.source_ops" and "cgra.macs_per_output") and the hardware description. Out: `CompiledKernels` holding the LLVM IR
(as generated, in LLVM's own syntax), a position-independent object for the host, and the
kernel names; each kernel is exported as `__tvm_ffi_<global_symbol>`.
"""

from __future__ import annotations

import dataclasses
import functools

import llvmlite.binding as llvm
import tvm
from cgra_sim import HardwareDescription, load_arch

from .entry import emit_kernel
from .errors import CodegenError
from .llvm_types import ModuleBuilder
from .spad import plan_scratchpad


@dataclasses.dataclass(frozen=True)
class CompiledKernels:
    llvm_ir: str  # the module before optimisation, as LLVM prints it
    object_bytes: bytes  # ELF/Mach-O object for the host, position independent
    symbols: list[str]  # global_symbol of each kernel; exported as __tvm_ffi_<symbol>


def build(prim_funcs, arch: HardwareDescription | str, *, opt_level: int = 2) -> CompiledKernels:
    """Compile lowered PrimFuncs (a list, an IRModule, or one PrimFunc) for `arch`."""
    arch = load_arch(arch)
    return link_kernels([emit_kernel_bitcode(func, arch) for func in _as_list(prim_funcs)], opt_level=opt_level)


@dataclasses.dataclass(frozen=True)
class KernelBitcode:
    """One kernel compiled on its own: an LLVM module (bitcode, not yet optimised) exporting
    `__tvm_ffi_<symbol>`. The unit the compiler's persistent kernel cache stores."""

    symbol: str
    bitcode: bytes


def emit_kernel_bitcode(func, arch: HardwareDescription | str) -> KernelBitcode:
    """One lowered PrimFunc -> its own verified LLVM module (link_kernels joins them)."""
    arch = load_arch(arch)
    kernel = _kernel_name(func)
    _check_arch(func, kernel, arch)
    mb = ModuleBuilder(kernel, llvm.get_process_triple())
    mb.module.data_layout = str(_target_machine(0).target_data)
    emit_kernel(mb, func, kernel, arch, plan_scratchpad(func, kernel, arch))
    parsed = llvm.parse_assembly(str(mb.module))
    parsed.verify()
    return KernelBitcode(kernel, parsed.as_bitcode())


def link_kernels(kernels, *, opt_level: int = 2) -> CompiledKernels:
    """Kernels' modules -> one module (the runtime's declarations and each kernel's private
    strings merged by LLVM's linker), optimised at `opt_level`, as one object."""
    machine = _target_machine(opt_level)
    linked = llvm.parse_assembly("")
    linked.name = "cgra_kernels"
    linked.triple = llvm.get_process_triple()
    linked.data_layout = str(machine.target_data)
    symbols: list[str] = []
    for kernel in kernels:
        if kernel.symbol in symbols:
            raise CodegenError(kernel.symbol, "two PrimFuncs share this global_symbol")
        linked.link_in(llvm.parse_bitcode(kernel.bitcode))
        symbols.append(kernel.symbol)
    linked.verify()
    llvm_ir = str(linked)
    if opt_level > 0:
        _optimise(linked, machine, opt_level)
        linked.verify()
    return CompiledKernels(llvm_ir, bytes(machine.emit_object(linked)), symbols)


@functools.cache
def _initialise_llvm() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@functools.cache
def _target_machine(opt_level: int):
    _initialise_llvm()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(opt=opt_level, reloc="pic", codemodel="default")


def _optimise(module, machine, opt_level: int) -> None:
    tuning = llvm.create_pipeline_tuning_options(speed_level=opt_level)
    passes = llvm.create_pass_builder(machine, tuning)
    passes.getModulePassManager().run(module, passes)


def _as_list(prim_funcs) -> list:
    if isinstance(prim_funcs, tvm.tirx.PrimFunc):
        return [prim_funcs]
    if isinstance(prim_funcs, tvm.IRModule):
        return [prim_funcs[gv] for gv in prim_funcs.get_global_vars()]
    return list(prim_funcs)


def _kernel_name(func) -> str:
    symbol = func.attrs.get("global_symbol") if func.attrs is not None else None
    if not symbol:
        raise CodegenError("<unnamed>", "PrimFunc has no 'global_symbol' attribute; the "
                           "exported function is named after it")
    return str(symbol)


def _check_arch(func, kernel: str, arch: HardwareDescription) -> None:
    """A kernel scheduled for one architecture must not be compiled for another."""
    scheduled_for = func.attrs.get("cgra.arch")
    if scheduled_for is not None and str(scheduled_for) != arch.to_json():
        other = HardwareDescription.from_json(str(scheduled_for)).name
        raise CodegenError(kernel, f"was scheduled for architecture '{other}' but build() was "
                           f"given '{arch.name}' ({arch.fingerprint}); compile with the same "
                           "hardware description the schedule used")
