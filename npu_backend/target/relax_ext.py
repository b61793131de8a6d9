"""The target hook `relax.ext.cgra`: offloaded Relax functions -> one runtime module of NPU kernels.

Stage: target hook, schedule, lowering and codegen. Input: the functions partitioning marked
`Codegen="cgra"`, the target options (`arch`: the hardware description's JSON; `options`: the
CompileOptions' JSON). Output: a static-library runtime module holding one exported function per
offloaded function, in tvm-ffi's calling convention, that the VM links and `export_library`
packs.

Each kernel goes through `KERNEL_STAGES`, the one ordered list of what happens to it.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import tempfile

import tvm
import tvm_ffi

from cgra_codegen import build
from cgra_sim.arch import HardwareDescription

from ..errors import UnsupportedCopy, stage_context
from ..kernels import KernelSpec, kernel_prim_func
from ..lower.lowering import lower_kernel
from ..options import CompileOptions, dump
from ..patterns import composite_call, spec_from_composite
from ..progress import report_kernel
from ..frontend.provenance import SOURCE_NODES_ATTR
from ..schedule import schedule_kernel
from ..tiling import choose_kernel_tiling

# Each stage: (name, fn(state) -> output). The output is dumped under the stage's name.
KERNEL_STAGES = [
    # Read what the offloaded function computes and cut it to the PE array and scratchpad.
    ("tiling", lambda s: choose_kernel_tiling(s["spec"], s["arch"])),
    # The kernel as schedulable TensorIR over padded tile grids (s_tir before scheduling).
    ("s_tir", lambda s: kernel_prim_func(s["spec"], s["tiling"])),
    # Tiles in the scratchpad, tensorized onto the PE array and the vector unit.
    ("scheduled", lambda s: schedule_kernel(s["s_tir"], s["spec"], s["tiling"], s["arch"])),
    # Plain TIR: copies become DMA, buffers are flattened; what the code generator walks.
    ("lowered", lambda s: lower_kernel(s["scheduled"], s["symbol"], s["attrs"])),
]


def compile_kernel(func, arch: HardwareDescription, options: CompileOptions):
    """One offloaded Relax function -> its lowered PrimFunc, through KERNEL_STAGES.

    Identical layers (same KernelSpec, chip and options) go through the stages once per process
    (`_KERNEL_CACHE`); each still gets its own symbol, source_ops attribute and dump files."""
    symbol = str(func.attrs["global_symbol"])
    spec = offloaded_spec(func)
    attrs = {"cgra.arch": arch.to_json(), "cgra.source_ops": source_ops_attr(func, spec.source_ops)}
    key = (dataclasses.replace(spec, source_ops=()), arch.fingerprint,
           dataclasses.replace(options, dump_dir=None))
    outputs = _KERNEL_CACHE.get(key)
    if outputs is None:
        outputs = _run_kernel_stages(spec, arch, options, symbol, attrs)
        _KERNEL_CACHE[key] = outputs
        while len(_KERNEL_CACHE) > _KERNEL_CACHE_SIZE:
            _KERNEL_CACHE.popitem(last=False)
        return outputs["lowered"]
    _KERNEL_CACHE.move_to_end(key)
    # The lowered body does not depend on the symbol: only the attributes name the kernel.
    outputs = {**outputs, "lowered": _with_attrs(outputs["lowered"], {"global_symbol": symbol, **attrs})}
    for index, (name, _) in enumerate(KERNEL_STAGES):
        dump(options, f"kernels/{symbol}/{index + 1}_{name}.py", outputs[name])
    return outputs["lowered"]


# Every stage's output per (KernelSpec without source_ops, arch fingerprint, options without
# dump_dir), most recently used last. Partitioning already gives the identical layers of one
# module one function; this is for the next compile in the same process (another model with
# the same layer shapes, a recompile, another chip and back).
_KERNEL_CACHE: collections.OrderedDict = collections.OrderedDict()
_KERNEL_CACHE_SIZE = 512


def clear_kernel_cache() -> None:
    """Forget every compiled kernel (for measuring compile time from scratch)."""
    _KERNEL_CACHE.clear()


def offloaded_spec(func) -> KernelSpec:
    """The KernelSpec of an offloaded Relax function, as the compiler reads it (explain too)."""
    symbol = str(func.attrs["global_symbol"])
    with stage_context("partition", symbol):
        _check_call_order(func)
        return spec_from_composite(func, _source_ops(func))


def _run_kernel_stages(spec: KernelSpec, arch: HardwareDescription, options: CompileOptions,
                       symbol: str, attrs: dict) -> dict:
    state = {"arch": arch, "symbol": symbol, "attrs": attrs, "spec": spec}
    for index, (name, stage) in enumerate(KERNEL_STAGES):
        with stage_context(name, symbol):
            state[name] = stage(state)
        # Dumped as it goes, so a failing stage leaves the ones before it to read.
        dump(options, f"kernels/{symbol}/{index + 1}_{name}.py", state[name])
    return {name: state[name] for name, _ in KERNEL_STAGES}


def _with_attrs(func, attrs: dict):
    for key, value in attrs.items():
        func = func.with_attr(key, value)
    return func


def _source_ops(func) -> list[str]:
    """The Relax operators this kernel was fused from, in order."""
    composite, _ = composite_call(func)
    return [binding.value.op.name.replace("relax.", "")
            for block in composite.body.blocks for binding in block.bindings
            if isinstance(getattr(binding.value, "op", None), tvm.ir.Op)]


def source_ops_attr(func, ops) -> str:
    """The kernel's `cgra.source_ops`: its Relax operators, each followed by "@" and the model
    nodes it came from when partitioning recorded them ("nn.conv2d@conv3,add@bn4,nn.relu@relu5").
    The runtime hands the string to the simulator as it is (docs/runtime-abi.md)."""
    nodes = list((func.attrs or {}).get(SOURCE_NODES_ATTR, None) or [])
    if len(nodes) != len(ops):
        nodes = [""] * len(ops)
    return ",".join(f"{op}@{_attr_safe(str(node))}" if str(node) else op for op, node in zip(ops, nodes))


def _attr_safe(nodes: str) -> str:
    # "," separates the operators and "@" an operator from its nodes: not in a node's name.
    return nodes.replace(",", "_").replace("@", "_")


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
    lowered = []
    for func in funcs:
        report_kernel(len(lowered), len(funcs), str(func.attrs["global_symbol"]))
        lowered.append(compile_kernel(func, arch, options))
    report_kernel(len(lowered), len(funcs), "")
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
