"""The target hook `relax.ext.cgra`: offloaded Relax functions -> one runtime module of NPU kernels.

Stage: target hook, schedule, lowering and codegen. Input: the functions partitioning marked
`Codegen="cgra"`, the target options (`arch`: the hardware description's JSON; `options`: the
CompileOptions' JSON). Output: a static-library runtime module holding one exported function per
offloaded function, in tvm-ffi's calling convention, that the VM links and `export_library`
packs.

Each kernel goes through `KERNEL_STAGES`, the one ordered list of what happens to it.
"""

from __future__ import annotations

import os
import tempfile

import tvm
import tvm_ffi

from cgra_codegen import build
from cgra_sim.arch import HardwareDescription

from .errors import UnsupportedCopy, stage_context
from .kernels import kernel_prim_func
from .lowering import lower_kernel
from .options import CompileOptions, dump
from .patterns import composite_call, spec_from_composite
from .schedule import schedule_kernel
from .tiling import choose_tiling

# Each stage: (name, fn(state) -> output). The output is dumped under the stage's name.
KERNEL_STAGES = [
    # Read what the offloaded function computes and cut it to the PE array and scratchpad.
    ("tiling", lambda s: choose_tiling(*s["spec"].gemm_extents, s["spec"].dtype, s["spec"].acc_dtype,
                                       bool(s["spec"].bias_shape), s["arch"], s["spec"].row_step,
                                       has_residual=bool(s["spec"].residual_shape))),
    # The kernel as schedulable TensorIR over padded tile grids (s_tir before scheduling).
    ("s_tir", lambda s: kernel_prim_func(s["spec"], s["tiling"])),
    # Tiles in the scratchpad, tensorized onto the PE array and the vector unit.
    ("scheduled", lambda s: schedule_kernel(s["s_tir"], s["spec"], s["tiling"], s["arch"])),
    # Plain TIR: copies become DMA, buffers are flattened; what the code generator walks.
    ("lowered", lambda s: lower_kernel(s["scheduled"], s["symbol"], s["attrs"])),
]


def compile_kernel(func, arch: HardwareDescription, options: CompileOptions):
    """One offloaded Relax function -> its lowered PrimFunc, through KERNEL_STAGES."""
    symbol = str(func.attrs["global_symbol"])
    source_ops = _source_ops(func)
    state = {"arch": arch, "symbol": symbol,
             "attrs": {"cgra.arch": arch.to_json(), "cgra.source_ops": ",".join(source_ops)}}
    with stage_context("partition", symbol):
        _check_call_order(func)
        state["spec"] = spec_from_composite(func, source_ops)
    for index, (name, stage) in enumerate(KERNEL_STAGES):
        with stage_context(name, symbol):
            state[name] = stage(state)
        dump(options, f"kernels/{symbol}/{index + 1}_{name}.py", state[name])
    return state["lowered"]


def _source_ops(func) -> list[str]:
    """The Relax operators this kernel was fused from, in order."""
    composite, _ = composite_call(func)
    return [binding.value.op.name.replace("relax.", "")
            for block in composite.body.blocks for binding in block.bindings
            if isinstance(getattr(binding.value, "op", None), tvm.ir.Op)]


def _check_call_order(func) -> None:
    """The kernel's parameters are the composite's; the wrapper must pass its own in order."""
    _, call = composite_call(func)
    if call is not None and list(call.args) != list(func.params):
        raise UnsupportedCopy("the offloaded function reorders its parameters before the composite")


def relax_ext_cgra(funcs, target_options, constant_names):
    """tvm's BYOC entry: compile the offloaded functions into one static-library module."""
    del constant_names  # weights arrive as arguments (bind_constants=False)
    arch = HardwareDescription.from_json(str(target_options["arch"]))
    options = CompileOptions.from_json(str(target_options.get("options", "{}")))
    lowered = [compile_kernel(func, arch, options) for func in funcs]
    compiled = build(lowered, arch)
    dump(options, "llvm/kernels.ll", compiled.llvm_ir)
    return [_static_library(compiled)]


def _static_library(compiled):
    handle, path = tempfile.mkstemp(suffix=".o", prefix="cgra_kernels_")
    with os.fdopen(handle, "wb") as out:
        out.write(compiled.object_bytes)
    try:
        return tvm.runtime.load_static_library(path, list(compiled.symbols))
    finally:
        os.unlink(path)


def register_target_hook() -> None:
    tvm_ffi.register_global_func("relax.ext.cgra", relax_ext_cgra, override=True)
