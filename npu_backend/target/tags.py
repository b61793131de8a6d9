"""Target tags: `target="cgra"` (the default preset) and one tag per preset (`cgra-16x16`).

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
from ..pipeline import cgra_pipeline

TARGET_KEY = "cgra"


def register_target_tags() -> None:
    tvm.target.register_tag(TARGET_KEY, {"kind": "llvm", "keys": [TARGET_KEY, DEFAULT_ARCH, "cpu"]})
    for name in preset_names():
        tvm.target.register_tag(name, {"kind": "llvm", "keys": [TARGET_KEY, name, "cpu"]})


def arch_of_target(target: tvm.target.Target):
    """The preset a cgra target names (by its key), or None for a non-cgra target."""
    keys = list(target.keys)
    if TARGET_KEY not in keys:
        return None
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
