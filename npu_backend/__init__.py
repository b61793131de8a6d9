"""npu_backend: a CGRA NPU backend for Apache TVM.

`import npu_backend` registers everything: the target tags (`cgra`, one per preset), the `cgra.*`
partition patterns, the `relax.ext.cgra` target hook, the pipeline behind `tvm.compile(mod,
target="cgra")`, and the simulator as the runtime's device backend (the C++ runtime is built on
first use and cached). Then:

    ex = tvm.compile(mod, target="cgra")          # or npu_backend.compile(mod, arch="cgra-16x16")
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    with npu_backend.profile() as prof:
        out = vm["main"](*inputs)
    print(prof.total_cycles, prof.to_json())
"""

from __future__ import annotations

import tvm
from tvm.relax.backend.pattern_registry import register_patterns

from cgra_sim.arch import DEFAULT_ARCH, HardwareDescription, load_arch, preset_names

from .device.artifact import DamagedArtifact, install_load_check
from .device.host_calls import install_vm_instrument
from .device.profile import Profile, profile
from .device.runtime_lib import load_runtime
from .device.simulator_backend import register_backend
from .errors import (CGRAError, InvalidModel, LengthPastBound, ScheduleError, ScratchpadTooSmall, UnsupportedCopy,
                     UnsupportedOperator, original_error)
from .options import CompileOptions
from .partition.stage import fusion_patterns
from .pipeline import STAGES
from .target.relax_ext import register_target_hook
from .target.relax_pipeline import cgra_pipeline
from .target.tags import cgra_target, install_default_pipeline, register_arch, register_target_tags
from .tools.explain import Placement, explain, format_placements, model_macs, npu_mac_fraction

try:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _version

    __version__ = _version("npu-backend")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"

__all__ = [
    "__version__", "CGRAError", "CompileOptions", "DEFAULT_ARCH", "DamagedArtifact", "HardwareDescription", "InvalidModel",
    "LengthPastBound", "Placement", "Profile",
    "STAGES", "ScheduleError", "ScratchpadTooSmall", "UnsupportedCopy", "UnsupportedOperator",
    "compile", "explain", "format_placements", "from_exported_program", "from_onnx", "load_arch", "model_macs", "npu_mac_fraction", "preset_names",
    "profile", "register_arch",
]


def compile(mod: tvm.IRModule, arch=None, *, dump_dir: str | None = None,  # noqa: A001 (the API's name)
            shape_bounds: dict | None = None, host_opt_level: int = 0, fuse_chains: bool = False):
    """Compile a Relax module for the CGRA NPU described by `arch` (preset name, JSON path or
    HardwareDescription; default cgra-8x8). Returns an executable for `relax.VirtualMachine`.
    With `dump_dir`, every stage's output is written there under the stage's name.
    `shape_bounds` ({"n": 64}): the largest value of symbolic dimensions; kernels are compiled
    once for every size, the bound only steers their tiles (docs/dynamic-shapes.md).
    `host_opt_level`: LLVM's optimisation level (0-3) for the host code that records the command
    streams; the commands, cycles and results are the same at every level, 0 builds fastest.
    The operators left on the host build at -O1 (as fast as -O3 on softmax, layer norm, GELU),
    or at `host_opt_level` when higher.
    `fuse_chains`: run an elementwise chain after a conv2d / matmul (a leaky relu, a hard-swish)
    inside that kernel, on each output tile: less DRAM traffic and energy, more cycles
    (CompileOptions.fuse_chains)."""
    arch = load_arch(arch)
    options = CompileOptions(dump_dir=dump_dir, shape_bounds=shape_bounds or {}, host_opt_level=host_opt_level,
                             fuse_chains=fuse_chains)
    target = cgra_target(arch.name if arch.name in preset_names() else DEFAULT_ARCH, host_opt_level)
    try:
        return tvm.relax.build(mod, target=target, relax_pipeline=cgra_pipeline(arch, options))
    except RuntimeError as err:
        ours = original_error(err)
        if ours is err:
            raise
        raise ours from ours.__cause__  # e.g. the exception a user's schedule raised, with its traceback


def from_exported_program(exported_program, *args, **kwargs) -> tvm.IRModule:
    """`tvm.relax.frontend.torch.from_exported_program`, the same arguments, for a bfloat16 / float16
    model too: TVM's importer adds a 16-bit bias to a float32 conv / linear result and raises;
    here the bias is widened and the biased result rounded to the model's dtype, as PyTorch's
    layer computes it (frontend/torch_import.py; needs torch)."""
    from .frontend.torch_import import from_exported_program as import_program

    return import_program(exported_program, *args, **kwargs)


def from_onnx(model, shape_dict=None, dtype_dict="float32", opset=None, custom_ops=None) -> tvm.IRModule:
    """`tvm.relax.frontend.onnx.from_onnx`, keeping each ONNX node's name on the calls made for
    it, so that profiles and `cgra-sim run` name every kernel's layers (needs the onnx extra).
    `model`: an onnx.ModelProto, the path of an .onnx file or its bytes; a file that is not a
    model, or a graph that is not valid, raises InvalidModel saying what is wrong.
    `custom_ops`: op type -> builder(node) returning a PrimFunc (inputs, then the output) that
    the node becomes (called with R.call_tir, so it runs on the NPU when it qualifies), or None
    for TVM's own conversion: custom-domain ops, or chosen layers replaced by your TensorIR
    (docs/own-kernels.md). The builder gets a `CustomNode` (name, op_type, attrs, input shapes
    and dtypes)."""
    from .frontend.onnx_import import from_onnx as import_onnx  # the onnx package is an optional extra

    return import_onnx(model, shape_dict, dtype_dict, opset, custom_ops)


def _register() -> None:
    """What `import npu_backend` sets up: the runtime library, the simulator backend, the target
    hook, tags and pipeline, the exported-library check, and the patterns in TVM's registry."""
    load_runtime()
    register_backend()
    register_target_hook()
    register_target_tags()
    install_default_pipeline()
    install_load_check()
    install_vm_instrument()  # host calls and host/NPU crossings in profiles (device/host_calls.py)
    # Also list the patterns in TVM's registry (with the default chip's limits) so that tools
    # that look there see them; the pipeline itself builds them for the chosen chip.
    # (TVM's registry: later registrations win, so the first pattern to try goes in last.)
    patterns = fusion_patterns(load_arch(DEFAULT_ARCH))
    register_patterns([(p.name, p.pattern, p.annotation_patterns, p.check) for p in reversed(patterns)])


_register()
