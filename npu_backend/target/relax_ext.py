"""`relax.ext.cgra`, the function TVM's RunCodegen calls: offloaded Relax functions -> one runtime
module of NPU kernels.

Stage: codegen (the graph's last CGRA stage hands every offloaded function here). Input: the
functions partitioning marked `Codegen="cgra"`, the target options (`arch`: the hardware
description's JSON; `options`: the CompileOptions' JSON). Each function's spec is read the way
explain reads it (kernels.offloaded_spec), taken through pipeline.KERNEL_STAGES to lowered TIR and
compiled by `cgra_codegen` into its own LLVM module, or read back from the persistent kernel cache
(device/kernel_cache.py) when the same kernel was compiled before; the modules are linked into one
(and the same set of kernels linked before is read back linked: `linked_key`).
Output: the runtime's `cgra_kernels` module: a shared library holding one exported function per
offloaded function, in tvm-ffi's calling convention, loaded at once (the VM runs it as it is),
and its object, which `export_library` links into the exported library.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import shutil
import subprocess
import tempfile

import tvm
import tvm_ffi
from tvm import relax

from cgra_codegen import KernelBitcode, emit_kernel_bitcode, link_kernels
from cgra_codegen.errors import ScratchpadOverflow
from cgra_sim.arch import HardwareDescription

from ..errors import CGRAError, ScratchpadTooSmall, remember_error
from ..frontend.provenance import NODE_JOIN, SOURCE_NODES_ATTR
from ..kernels import offloaded_spec
from ..kernels.common.dynamic import shape_bounds
from ..kernels.common.operands import check_views
from ..kernels.gemm.symbolic_matmul import symbolic_reduction
from ..kernels.registry import family_of, kernel_builder_of, packaged, schedule_of
from ..partition.call_tir import wrapped_call
from ..partition.composite import composite_name
from ..options import CompileOptions, dump
from ..relax_info import shape_dims
from ..kernels.stage import Kernel, run_kernel_stages
from ..pipeline import KERNEL_STAGES
from ..progress import report_kernel
from ..device.kernel_cache import LINKED_SUFFIX, default_kernel_cache, kernel_key
from .parallel import compile_all


def compile_kernel(func, arch: HardwareDescription, options: CompileOptions):
    """One offloaded Relax function -> its lowered PrimFunc, through KERNEL_STAGES.

    Identical layers (same spec, chip and options) go through the stages once per process
    (`_KERNEL_CACHE`); each still gets its own symbol, source_ops attribute and dump files."""
    symbol = str(func.attrs["global_symbol"])
    with shape_bounds(dict(options.shape_bounds)):
        spec = offloaded_spec(func)
    attrs = kernel_attrs(func, spec, arch)
    pattern, nodes = kernel_origin(func)
    # The user's schedule or kernel is part of the key: registering one recompiles the kernels it covers.
    key = (dataclasses.replace(spec, source_ops=()), arch.fingerprint,
           dataclasses.replace(options, dump_dir=None), schedule_of(spec, pattern), kernel_builder_of(spec, pattern))
    outputs = _KERNEL_CACHE.get(key)
    if outputs is None:
        outputs = run_kernel_stages(Kernel(symbol, spec, attrs, pattern=pattern, layer=nodes), arch, options,
                                    KERNEL_STAGES)
        if kernel_builder_of(spec, pattern) is None:  # a user's kernel is checked against the built-in one
            check_views(outputs["s_tir"].func, caller_shapes(func), family_of(spec).name, f"kernel {symbol}")
        _KERNEL_CACHE[key] = outputs
        while len(_KERNEL_CACHE) > _KERNEL_CACHE_SIZE:
            _KERNEL_CACHE.popitem(last=False)
        return outputs["lowered"].func
    _KERNEL_CACHE.move_to_end(key)
    # The lowered body does not depend on the symbol: only the attributes name the kernel.
    lowered = outputs["lowered"].func
    for name, value in {"global_symbol": symbol, **attrs}.items():
        lowered = lowered.with_attr(name, value)
    for index, (name, _) in enumerate(KERNEL_STAGES):
        shown = outputs[name] if name != "lowered" else dataclasses.replace(outputs[name], func=lowered)
        dump(options, f"kernels/{symbol}/{index + 1}_{name}.py", shown)
    return lowered


def caller_shapes(func) -> list:
    """The dims of the tensors an offloaded function passes its kernel, then of its result (None
    where unknown); the symbolic sizes beside them (ShapeType parameters) the kernel skips."""
    return [shape_dims(param) for param in func.params if not isinstance(param.ty, relax.ShapeType)] + \
        [shape_dims(func.body)]


def kernel_attrs(func, spec, arch: HardwareDescription) -> dict:
    """The attributes the lowered kernel carries into its code (docs/runtime-abi.md)."""
    per_output, divisor = macs_per_output(spec)
    return {"cgra.arch": arch.to_json(), "cgra.source_ops": source_ops_attr(func, spec.source_ops),
            "cgra.macs_per_output": per_output, "cgra.macs_divisor": divisor}


def kernel_origin(func) -> tuple[str, str]:
    """(the cgra pattern that fused `func`, "" for a user's PrimFunc; its model nodes, joined)."""
    pattern = "" if wrapped_call(func) is not None else composite_name(func)
    nodes = ",".join(dict.fromkeys(n for joined in (func.attrs or {}).get(SOURCE_NODES_ATTR, None) or []
                                   for n in str(joined).split(NODE_JOIN) if n))
    return pattern, nodes


# Every stage's output per (spec without source_ops, arch fingerprint, options without
# dump_dir), most recently used last. Partitioning already gives the identical layers of one
# module one function; this is for the next compile in the same process (another model with
# the same layer shapes, a recompile, another chip and back).
_KERNEL_CACHE: collections.OrderedDict = collections.OrderedDict()
_KERNEL_CACHE_SIZE = 512


def clear_kernel_cache() -> None:
    """Forget every compiled kernel (for measuring compile time from scratch)."""
    _KERNEL_CACHE.clear()


def source_ops_attr(func, ops) -> str:
    """The kernel's `cgra.source_ops`: its Relax operators, each followed by "@" and the model
    nodes it came from when partitioning recorded them ("nn.conv2d@conv3,add@bn4,nn.relu@relu5").
    The runtime hands the string to the simulator as it is (docs/runtime-abi.md)."""
    nodes = list((func.attrs or {}).get(SOURCE_NODES_ATTR, None) or [])
    if len(nodes) != len(ops):
        nodes = [""] * len(ops)
    return ",".join(f"{op}@{_attr_safe(str(node))}" if str(node) else op for op, node in zip(ops, nodes))


def macs_per_output(spec) -> tuple[int, int]:
    """The kernel's `cgra.macs_per_output` and `cgra.macs_divisor`: the model operator's
    multiply-accumulates per output element as a fraction in lowest terms (the runtime multiplies
    it by each launch's output size): an integer for one operator, a fraction for a fused kernel
    (a depthwise conv2d + 1x1 conv2d: C (9 + F) / F); -1 for a user's own kernel, whose work only
    its commands tell."""
    if symbolic_reduction(spec) or getattr(spec, "length", None) is not None:
        # MACs per output vary with the length (a symbolic reduction, an attention's keys over
        # a symbolic length: flash_length.py): the cut commands count them
        return -1, 1
    macs = spec.macs
    if not macs:  # None (unknown) or 0 (pools, elementwise)
        return (-1 if macs is None else 0), 1
    if spec.output_shape is None:  # a kernel's symbolic output: its commands count the MACs
        return -1, 1
    outputs = math.prod(spec.output_shape)
    common = math.gcd(macs, outputs)
    return macs // common, outputs // common


def _attr_safe(nodes: str) -> str:
    """Model node names with the separators of the source_ops attribute replaced."""
    # "," separates the operators and "@" an operator from its nodes: not in a node's name.
    return nodes.replace(",", "_").replace("@", "_")


def relax_ext_cgra(funcs, target_options, constant_names):
    """tvm's BYOC entry: compile the offloaded functions into one runtime module."""
    del constant_names  # weights arrive as arguments (bind_constants=False)
    arch = HardwareDescription.from_json(str(target_options["arch"]))
    options = CompileOptions.from_json(str(target_options.get("options", "{}")))
    cache = default_kernel_cache() if options.dump_dir is None else None  # a dump shows every stage
    try:
        pending = [pending_kernel(func, arch, options, cache) for func in funcs]
        key = linked_key(pending, options) if cache is not None else None
        linked = unpack_linked(cache.get(key, LINKED_SUFFIX)) if key is not None else None
        if linked is None:
            compiled = link_kernels(_kernels(pending, arch, options, cache), opt_level=options.host_opt_level)
            dump(options, "llvm/kernels.ll", compiled.llvm_ir)
            linked = compiled.object_bytes, shared_library(compiled.object_bytes)
            if key is not None:
                cache.put(key, pack_linked(*linked), LINKED_SUFFIX)
        report_kernel(len(funcs), len(funcs), "")
        if cache is not None:
            cache.evict()
        return [tvm.get_global_func("cgra.KernelsModule")(*linked)]
    except CGRAError as err:  # crosses TVM's FFI as a RuntimeError: keep its type
        remember_error(err)
        raise


def linked_key(pending: list, options: CompileOptions) -> str | None:
    """The persistent cache's key of these kernels linked into one object and shared library, when
    every one has a key (a user's schedule or kernel has none): a recompile finding it reads no
    kernel, links nothing and runs no C compiler (ResNet-50: 0.1 s of its 0.26 s warm compile)."""
    if not pending or any(kernel.key is None for kernel in pending):
        return None
    return kernel_key(linked=[kernel.key for kernel in pending], opt_level=str(options.host_opt_level))


def pack_linked(object_bytes: bytes, library: bytes) -> bytes:
    """One cache entry holding a linked object and its shared library (unpack_linked reads it)."""
    return len(object_bytes).to_bytes(8, "little") + object_bytes + library


def unpack_linked(payload: bytes | None) -> tuple[bytes, bytes] | None:
    """(object, shared library) from a cache entry (its checksum checked by the cache), or None."""
    if payload is None or len(payload) < 8:
        return None
    size = int.from_bytes(payload[:8], "little")
    return (payload[8:8 + size], payload[8 + size:]) if 8 + size <= len(payload) else None


def _kernels(pending: list, arch: HardwareDescription, options: CompileOptions, cache) -> list[KernelBitcode]:
    """Every function's kernel: those the cache has; then the built-in ones it lacks, side by
    side in worker processes (parallel.py); then those of a user's schedule or kernel, here (their
    Python code may keep state the user reads afterwards)."""
    looked_up = [read_cached(kernel, cache) for kernel in pending]
    missing = [kernel for kernel in looked_up if isinstance(kernel, PendingKernel)]
    builtin = [kernel for kernel in missing if kernel.builtin]
    own = [kernel for kernel in missing if not kernel.builtin]
    hits = len(pending) - len(missing)

    def progress(done: int, kernel) -> None:
        report_kernel(hits + done, len(pending), "" if kernel is None else kernel.symbol)

    fresh = dict(zip(map(id, builtin), compile_all(builtin, lambda k: compile_pending(k, arch, options, cache), progress)))
    for index, kernel in enumerate(own):
        progress(len(builtin) + index, kernel)
        fresh[id(kernel)] = compile_pending(kernel, arch, options, cache)
    return [fresh[id(kernel)] if isinstance(kernel, PendingKernel) else kernel for kernel in looked_up]


@dataclasses.dataclass(frozen=True)
class PendingKernel:
    """An offloaded function whose kernel the persistent cache does not have (yet)."""

    func: object
    symbol: str
    spec: object
    pattern: str
    key: str | None  # its cache key; None: not to be cached
    builtin: bool  # built-in schedule and kernel of a packaged family (not a user's)


def pending_kernel(func, arch: HardwareDescription, options: CompileOptions, cache=None) -> PendingKernel:
    """What it takes to compile one offloaded function's kernel, with its key in the persistent
    `cache` (None without a cache, and for a user's schedule or kernel: Python code the key
    cannot capture, always compiled)."""
    symbol = str(func.attrs["global_symbol"])
    with shape_bounds(dict(options.shape_bounds)):
        spec = offloaded_spec(func)
    pattern, _ = kernel_origin(func)
    builtin = bool(pattern) and kernel_builder_of(spec, pattern) is None \
        and schedule_of(spec, pattern) is family_of(spec).schedule and packaged(spec)
    key = None
    if cache is not None and builtin:
        key = kernel_key(spec=repr(dataclasses.replace(spec, source_ops=())), symbol=symbol,
                         attrs=json.dumps(kernel_attrs(func, spec, arch), sort_keys=True),
                         options=dataclasses.replace(options, dump_dir=None).to_json())
    return PendingKernel(func, symbol, spec, pattern, key, builtin)


def read_cached(kernel: PendingKernel, cache=None):
    """The kernel's bitcode from the persistent `cache` (a KernelBitcode), else `kernel`."""
    if kernel.key is not None and cache is not None:
        bitcode = cache.get(kernel.key)
        if bitcode is not None:
            return KernelBitcode(kernel.symbol, bitcode)
    return kernel


def compile_pending(kernel: PendingKernel, arch: HardwareDescription, options: CompileOptions,
                    cache=None) -> KernelBitcode:
    """A kernel through KERNEL_STAGES and the code generator, then kept in the cache."""
    try:
        compiled = emit_kernel_bitcode(compile_kernel(kernel.func, arch, options), arch)
    except ScratchpadOverflow as err:
        spec, pattern = kernel.spec, kernel.pattern
        who = "a user's kernel" if kernel_builder_of(spec, pattern) else \
            "a user schedule" if schedule_of(spec, pattern) is not family_of(spec).schedule else "the built-in schedule"
        nodes = kernel_origin(kernel.func)[1]
        raise ScratchpadTooSmall(f"{err} (kernel of pattern {pattern or spec.op}, scheduled by {who}"
                                 f"{', layer ' + nodes if nodes else ''})") from err
    if kernel.key is not None and cache is not None:
        cache.put(kernel.key, compiled.bitcode)
    return compiled


def shared_library(object_bytes: bytes) -> bytes:
    """The kernels' object linked into a shared library (the host's C compiler, as export_library
    does). The runtime's `cgra_kernels` module (runtime/src/kernels_module.cc) holds both: it loads
    the library at once, so the VM runs the executable as it is, and gives `export_library` the
    object to link. (A static library would not run until exported: the VM would first write the
    whole executable into a temporary shared library and load that, 4 s and twice the weights'
    memory for AlexNet; one of TVM's LLVM modules runs, but TVM's JIT takes 2.5 s on
    DenseNet-121's kernels.)"""
    with tempfile.TemporaryDirectory(prefix="cgra_kernels_") as folder:
        obj, shared = os.path.join(folder, "kernels.o"), os.path.join(folder, "kernels.so")
        with open(obj, "wb") as out:
            out.write(object_bytes)
        linker = _c_compiler()
        done = subprocess.run([linker, "-shared", "-o", shared, obj], capture_output=True, text=True, check=False)
        if done.returncode:
            raise CGRAError(f"linking the NPU kernels into a shared library with {linker} failed: "
                            f"{done.stderr.strip()[-2000:]}")
        with open(shared, "rb") as library:
            return library.read()


def _c_compiler() -> str:
    """The C compiler that links the kernels: CC, else cc, gcc or clang on PATH."""
    for name in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise CGRAError("linking the NPU kernels needs a C compiler (cc, gcc or clang on PATH, or CC): "
                    "install one (e.g. apt install gcc); export_library needs it as well")


def register_target_hook() -> None:
    """Register `relax.ext.cgra`, the function RunCodegen calls for functions with Codegen="cgra"."""
    tvm_ffi.register_global_func("relax.ext.cgra", relax_ext_cgra, override=True)
