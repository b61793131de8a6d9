"""The Relax pipeline of a cgra target: pipeline.STAGES, then TVM's CPU pipeline for the host.

Stage: entry (tags.py installs `cgra_pipeline` for `tvm.compile(mod, target="cgra")`;
`npu_backend.compile`, `explain` and the CLI run the same stages). `run_stages` runs the graph
stages, each output dumped under its name with `CompileOptions.dump_dir`: the graph's as
`<n>_<stage>.py`, a kernel's as `kernels/<symbol>/<n>_<stage>.py` (relax_ext.py, with the LLVM IR).
The stage list is read from pipeline.py when the stages run, not when this module is imported.
"""

from __future__ import annotations

import tvm
from tvm import relax

from cgra_sim.arch import HardwareDescription
from cgra_sim.mapping import pe_array

from .. import pipeline
from ..collector import gc_paused
from ..device.host_costs import with_host_costs
from ..device.host_ops import with_host_anchor
from ..device import length_checks  # noqa: F401  (registers the checks' host function)
from ..frontend.length_checks import with_length_checks
from ..errors import CGRAError, UnsupportedChip, remember_error
from ..options import CompileOptions, clear_dump, dump
from ..partition.call_tir import drop_unused_prim_funcs


def cgra_pipeline(arch: HardwareDescription, options: CompileOptions = CompileOptions()):
    """The whole Relax pipeline for the NPU: the CGRA stages, then TVM's CPU pipeline for the host."""

    @tvm.transform.module_pass(opt_level=0, name="cgra.Pipeline")
    def run(mod, _ctx):
        with gc_paused():
            try:
                mod = run_stages(mod, arch, options)
            except CGRAError as err:
                remember_error(err)
                raise
            mod = with_host_anchor(with_length_checks(mod))  # a length past its bound: a clear error
            built = relax.get_pipeline("default_build")(mod)
            # LegalizeOps' reshapes that RewriteDataflowReshape made views again are called by
            # nothing: LLVM compiled them for nothing (ShuffleNetV2's seven, 30 ms).
            made = {gvar.name_hint for gvar in built.functions} - {gvar.name_hint for gvar in mod.functions}
            # What each host operator costs, for profiles to model the host's time (device/host_costs.py).
            return with_host_costs(drop_unused_prim_funcs(built, made), arch)

    return run


def run_stages(mod: tvm.IRModule, arch: HardwareDescription, options: CompileOptions, stages=None) -> tvm.IRModule:
    """The graph stages (pipeline.STAGES, or the first few of them, `stages`), each output dumped
    under its name (what an earlier compile dumped in the same folder is removed first)."""
    require_pe_array(arch)
    clear_dump(options, ["0_input.py"] + [f"{i + 1}_{name}.py" for i, (name, _) in enumerate(pipeline.STAGES)])
    dump(options, "0_input.py", mod)
    for index, (name, stage) in enumerate(pipeline.STAGES if stages is None else stages):
        mod = stage(mod, arch, options)
        dump(options, f"{index + 1}_{name}.py", mod)
    return mod


def require_pe_array(arch: HardwareDescription) -> None:
    """Refuse, before any stage, a chip whose fabric cannot run the PE array's systolic cell
    (every GEMM and DEPTHWISE cost comes from its mapping: cgra_sim/mapping/pe_array.py)."""
    for dtype in arch.dtypes:
        try:
            pe_array.program(arch, dtype)
        except pe_array.PeArrayError as err:
            raise UnsupportedChip(f"chip '{arch.name}': {err}") from None
