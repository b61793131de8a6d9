"""The kernel stages' bodies: one offloaded function (`Kernel`) from its spec to scheduled s_tir.

Stage: tiling, s_tir, scheduled (pipeline.KERNEL_STAGES lists them in order, each with its
reason; the fourth, lowered, is lower/stage.py's). Every stage is `(kernel, arch, options) ->
kernel`; `run_kernel_stages` runs a list of them, naming the stage and the kernel in any error and
dumping each output. A user's kernel (register_kernel) or schedule (register_schedule) runs here,
inside the error wrapping that says whose code failed on which kernel and layer.
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir

from ..errors import CGRAError, ScheduleError, one_line, stage_context
from ..options import dump
from .registry import family_of, kernel_builder_of, schedule_of, tiling_of
from .common.schedule_check import check_scheduled, check_signature
from .tir.tir import KERNEL_ATTR


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One offloaded function on its way to plain TIR: what it computes (`spec`), its exported
    `symbol` and PrimFunc attributes, and what the stages have made of it so far."""

    symbol: str
    spec: object  # a family's spec (kernels/common/spec.py, kernels/elementwise/eltwise.py)
    attrs: dict  # PrimFunc attributes of the lowered kernel (cgra.arch, cgra.source_ops)
    tiling: object = None  # kernels.Tiling, from the "tiling" stage on
    func: object = None  # the PrimFunc: s_tir, then scheduled, then lowered
    pattern: str = ""  # the cgra pattern that fused it ("" for a user's PrimFunc)
    layer: str = ""  # the model nodes it computes, for error messages

    def script(self) -> str:
        """What a dump of the latest stage shows: the PrimFunc, or before there is one the tiling."""
        return self.func.script() if self.func is not None else str(self.tiling)


def run_kernel_stages(kernel: Kernel, arch, options, stages: list) -> dict:
    """Every stage's output Kernel (`stages`: pipeline.KERNEL_STAGES), by stage name; each dumped as
    it comes, so a failing stage leaves the ones before it to read. Errors name the stage and the
    kernel."""
    outputs = {}
    for index, (name, stage) in enumerate(stages):
        with stage_context(name, kernel.symbol):
            kernel = outputs[name] = stage(kernel, arch, options)
        dump(options, f"kernels/{kernel.symbol}/{index + 1}_{name}.py", kernel)
    return outputs


def choose_tiling(kernel: Kernel, arch, options) -> Kernel:
    """The kernel cut to the PE array and the scratchpad: tile sizes from its family's search."""
    del options
    return dataclasses.replace(kernel, tiling=tiling_of(kernel.spec, arch))


def define(kernel: Kernel, arch, options) -> Kernel:
    """The kernel as schedulable TensorIR over padded tile grids (its family's compute), or the
    kernel a user wrote for the pattern (register_kernel), checked against it."""
    del options
    builtin = family_of(kernel.spec).compute(kernel.spec, kernel.tiling)
    builder = kernel_builder_of(kernel.spec, kernel.pattern)
    if builder is None:
        return dataclasses.replace(kernel, func=builtin)
    where = f"the user kernel of {kernel.pattern or kernel.spec.op} (kernel {kernel.symbol}" + \
        (f", layer {kernel.layer})" if kernel.layer else ")")
    try:
        func = builder(kernel.spec, arch)
    except CGRAError:
        raise
    except Exception as err:
        raise ScheduleError(f"{where} raised {type(err).__name__}: {err}") from err
    check_signature(func, builtin, where)
    return dataclasses.replace(kernel, func=func.with_attr(KERNEL_ATTR, True))


def schedule(kernel: Kernel, arch, options) -> Kernel:
    """Tiles in the scratchpad, tensorized onto the PE array and the vector unit: the built-in
    schedule, or the one a user registered for the pattern or the op (register_schedule); a
    kernel written for the NPU (cgra.kernel) as it is. Errors say whose schedule failed where."""
    del options
    # A conv2d with a symbolic image size: TVM's region-cover check cannot prove that OH * OW
    # rows fit in the whole tiles covering them (it can for a variable alone, not for a
    # variable times a constant), and refuses compute_at; the schedule runs without the
    # primitives' checks then, and the kernel is checked against numpy at many sizes instead
    # (tests/test_dynamic_shapes.py). Likewise a row kernel's rows H * s, and a row of symbolic
    # length held in a tile as wide as its bound (rows.py; tests/test_symbolic_attention.py).
    unchecked = getattr(kernel.spec, "symbolic_image", False) or getattr(kernel.spec, "unchecked_schedule", False)
    sch = s_tir.Schedule(kernel.func, enable_check=not unchecked)
    function = schedule_of(kernel.spec, kernel.pattern)
    builtin = function is family_of(kernel.spec).schedule
    layer = f", layer {kernel.layer}" if kernel.layer else ""
    where = (f"the {'built-in' if builtin else 'user'} schedule of {kernel.pattern or kernel.spec.op} "
             f"(kernel {kernel.symbol}{layer})")
    if bool((kernel.func.attrs or {}).get(KERNEL_ATTR, False)):
        function = _as_written  # written for the NPU: lowered as it is
    try:
        function(sch, kernel.spec, kernel.tiling if builtin else _plain(kernel.tiling), arch)
    except s_tir.ScheduleError as err:
        raise ScheduleError(f"{where} failed: {one_line(err)}") from err
    except CGRAError:
        raise
    except Exception as err:
        if builtin:
            raise
        # The user's traceback stays attached (raise ... from err); this says where it ran.
        raise ScheduleError(f"{where} raised {type(err).__name__}: {err}") from err
    check_scheduled(sch, where)
    return dataclasses.replace(kernel, func=sch.mod["main"])


def _plain(tiling):
    """The tiling a user's schedule gets: without the built-in GEMM schedule's own refinements
    (an output tile finished in pieces of rows, A's panel streamed during the first column tile,
    a third copy of the operand tiles sized for the built-in tiles),
    which assume its loop order; a user's tile sizes or loop order (columns outside rows) with
    them computed wrong results (tests/test_user_schedules.py)."""
    names = {field.name for field in dataclasses.fields(tiling)} if dataclasses.is_dataclass(tiling) else set()
    if not {"epilogue_rows", "stream_panel"} <= names:
        return tiling
    return dataclasses.replace(tiling, epilogue_rows=0, stream_panel=False, operand_copies=2)


def _as_written(sch, spec, tiling, arch) -> None:
    """The schedule of a kernel written for the NPU: none."""
    del sch, spec, tiling, arch
