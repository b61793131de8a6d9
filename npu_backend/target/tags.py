"""Target tags: `target="cgra"` (the default preset), one tag per preset (`cgra-16x16`), and one
per chip a user registers (`register_arch("my_chip.json")`, then `target="my-chip"`).

Stage: entry. A CGRA target is TVM's llvm target (the host runs the control code) with the key
`cgra` and a key naming the preset. `tvm.compile` takes its Relax pipeline from
`relax.pipeline.PIPELINE_MAP["default"]`; we wrap that entry so that a target with the `cgra`
key runs the CGRA stages first and every other target is untouched.
"""

from __future__ import annotations

import tvm
from tvm.relax import pipeline as relax_pipeline

from cgra_sim.arch import DEFAULT_ARCH, load_arch, preset_names

from ..options import CompileOptions
from .relax_pipeline import cgra_pipeline

TARGET_KEY = "cgra"
#: LLVM's optimisation level for the operators left on the host, which TVM builds at its llvm
#: target's "opt-level" (default 3). At -O1 softmax, layer norm and GELU run as fast as at -O3
#: (1 x 12 x 197 x 197 softmax and 197 x 768 layer norm + GELU: 2.5 ms both) and build in half
#: the time or less: Swin's 28 host functions took 0.39 s of its 0.56 s warm recompile at -O3.
#: `npu_backend.compile(..., host_opt_level=2 or 3)` raises it (`cgra_target`).
HOST_OPT_LEVEL = 1
_REGISTERED: dict = {}  # chip name -> HardwareDescription, for the tags of chips users register


def _tag(name: str, opt_level: int = HOST_OPT_LEVEL) -> dict:
    """The target config of chip `name`: TVM's llvm target with the cgra key and the chip's name."""
    return {"kind": "llvm", "keys": [TARGET_KEY, name, "cpu"], "opt-level": opt_level}


def register_target_tags() -> None:
    """Register the tag `cgra` (the default preset) and one tag per preset."""
    tvm.target.register_tag(TARGET_KEY, _tag(DEFAULT_ARCH))
    for name in preset_names():
        tvm.target.register_tag(name, _tag(name))


def cgra_target(name: str, host_opt_level: int = 0) -> tvm.target.Target:
    """The target of chip `name` (a preset or a registered chip), its host operators built at
    -O`host_opt_level` when that is above HOST_OPT_LEVEL."""
    return tvm.target.Target(_tag(name, max(HOST_OPT_LEVEL, host_opt_level)))


def register_arch(arch) -> str:
    """Make a chip (a JSON description's path, a HardwareDescription or a preset name) a target
    tag named after it, so that `tvm.compile(mod, target=name)` compiles for it; returns the name.
    Registering a changed description under a name again replaces it; a preset's name stays the
    preset's."""
    arch = load_arch(arch)
    if arch.name in preset_names() or arch.name == TARGET_KEY:
        if arch.name != TARGET_KEY and arch == load_arch(arch.name):
            return arch.name
        raise ValueError(f"chip '{arch.name}' has the name of a preset but other parameters: give it a name "
                         f"of its own (the 'name' field of its description)")
    _REGISTERED[arch.name] = arch
    tvm.target.register_tag(arch.name, _tag(arch.name), override=True)
    return arch.name


def arch_of_target(target: tvm.target.Target):
    """The chip a cgra target names (by its key: a preset or a registered chip), or None for a
    non-cgra target."""
    keys = list(target.keys)
    if TARGET_KEY not in keys:
        return None
    for key in keys:
        if key in _REGISTERED:
            return _REGISTERED[key]
    names = [key for key in keys if key in preset_names()]
    return load_arch(names[0] if names else DEFAULT_ARCH)


def install_default_pipeline() -> None:
    """Make PIPELINE_MAP's default entry dispatch cgra targets to the CGRA pipeline (once)."""
    original = relax_pipeline.PIPELINE_MAP["default"]
    if getattr(original, "_cgra_dispatch", False):
        return

    def default_pipeline(**kwargs):
        @tvm.transform.module_pass(opt_level=0, name="cgra.DefaultDispatch")
        def dispatch(mod, ctx):
            target = tvm.target.Target.current(allow_none=True)
            arch = arch_of_target(target) if target is not None else None
            if arch is None:
                return original(**kwargs)(mod)
            return cgra_pipeline(arch, CompileOptions())(mod)
        return dispatch

    default_pipeline._cgra_dispatch = True
    relax_pipeline.PIPELINE_MAP["default"] = default_pipeline
