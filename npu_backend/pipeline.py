"""The compile flow, in order: the graph stages, each kernel's stages, the lowering passes.

Stage: all of them. `tvm.compile(mod, target="cgra")`, `npu_backend.compile`, `explain` and the
CLI run these same lists. Every stage is `(ir, arch, options) -> ir`: the graph stages take and
give a Relax IRModule, a kernel's stages a `Kernel` (one offloaded function on its way to plain
TIR). With `CompileOptions.dump_dir` each stage's output is written under its name: the graph's
as `<n>_<stage>.py`, a kernel's as `kernels/<symbol>/<n>_<stage>.py` (codegen adds the LLVM IR,
target/relax_ext.py). What stays on the host goes through TVM's own CPU pipeline afterwards.
"""

from __future__ import annotations

import dataclasses

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.transform import FusionPattern

from cgra_sim.arch import HardwareDescription
from cgra_sim.mapping import pe_array
from cgra_sim.mapping.solver import cache_tag, mode

from .collector import gc_paused
from .errors import (CGRAError, ScheduleError, UnsupportedChip, UnsupportedOperator, one_line, remember_error,
                     stage_context)
from .kernels import family_of, offload_reason, pattern_table
from .kernels.dynamic import rebind_dimensions, shape_bounds
from .kernels.chains import reads_immediates
from .kernels.epilogue import is_epilogue_chain
from .kernels.registry import kernel_builder_of, pair_pattern_names, schedule_of, tiling_of
from .kernels.schedule_check import check_scheduled, check_signature
from .kernels.tir import KERNEL_ATTR, tir_spec
from .lower.dma import lower_copies_to_dma
from .lower.double_buffer import double_buffer
from .lower.fold_init import fold_accumulator_init
from .lower.ragged import cut_ragged_tiles
from .lower.trim_fills import trim_overwritten_fills
from .normalise.batch_norms import batch_norms_as_scale_shift
from .normalise.bool_scans import bool_scans_as_counts_pass
from .normalise.clips import canonicalize_clips_pass
from .normalise.conv1ds import conv1ds_as_conv2ds_pass
from .normalise.conv3ds import conv3ds_as_conv2ds_pass
from .normalise.conv_transposes import conv_transposes_as_convs_pass
from .normalise.fold_weights import fold_remaining_constants, fold_weights, restore_kept_transposes
from .normalise.large_pools import split_large_pools_pass
from .normalise.qdq import canonicalize_qdq
from .normalise.rewrite import scans_shared
from .normalise.scalars import scalar_operands_pass
from .normalise.sums import sums_as_adds_pass
from .options import CompileOptions, clear_dump, dump
from .partition.call_tir import (PREFIX, PRIM_FUNC_ATTR, drop_unused_prim_funcs, offload_call_tir,
                                 offloaded_prim_funcs, remember_prim_func)
from .partition.composite import reads_what_it_computes
from .partition.pattern_ops import ModuleCalls, can_match
from .partition.plans import fingerprint, grouped_patterns, plan_payload, read_plan
from .partition.scalar_args import bind_scalar_arguments
from .partition.source_nodes import record_source_nodes
from .device.host_averages import host_averages_as_typed
from .device.host_ops import host_ops_to_runtime, with_host_anchor
from .device.kernel_cache import PLAN_SUFFIX, default_kernel_cache, kernel_key
from .device.weights import hold_weights


# ------------------------------------------------------------------ the graph: Relax in, Relax out

def normalise(mod, arch, options):
    del arch, options
    # QDQ layers (dequantize -> conv2d / matmul -> quantize) become int8 x int8 -> int32 with
    # an int32 bias and a requantisation to int8, onnxruntime's arithmetic (normalise/qdq.py);
    # first, while the quantized weights are still int8 constants under their dequantize.
    mod = canonicalize_qdq(mod)
    # Inference batch norm after a conv2d with constant weights becomes scaled weights and a
    # bias add, and the constant arithmetic importers leave around weights (bias reshapes,
    # transposed Gemm weights) is folded, with numpy in milliseconds (normalise/fold_weights.py).
    mod = fold_weights(mod)
    # A batch norm no conv2d took (after a pool or an add) becomes x * scale + shift with numpy
    # constants: two elementwise kernels instead of a host op (normalise/batch_norms.py).
    mod = batch_norms_as_scale_shift(mod)
    # The rewrites below run on a module that calls their operators (normalise/rewrite.py).
    with scans_shared():
        return tvm.transform.Sequential([
            # TVM's FoldConstant, for what fold_weights has no numpy rule for (and only if there is any).
            tvm.transform.module_pass(lambda m, _ctx: fold_remaining_constants(m), opt_level=0,
                                      name="cgra.FoldConstant"),
            # The weight transposes fold_weights kept from FoldConstant, back (the matmul kernel
            # reads them as stored).
            tvm.transform.module_pass(lambda m, _ctx: restore_kept_transposes(m), opt_level=0,
                                      name="cgra.RestoreTransposes"),
            relax.transform.CanonicalizeBindings(),
            # A transposed convolution becomes one conv2d per output phase and an interleave: the
            # NPU's GEMM kernels, and no multiplications by inserted zeros (normalise/conv_transposes.py).
            conv_transposes_as_convs_pass,
            # A conv1d as a conv2d one pixel high, a conv3d as conv2d's over frames
            # (normalise/conv1ds.py, conv3ds.py).
            conv1ds_as_conv2ds_pass, conv3ds_as_conv2ds_pass,
            # A bool cumsum counts, as PyTorch's does (normalise/bool_scans.py): as bool no target builds it.
            bool_scans_as_counts_pass,
            # ONNX Sum imports as a stack and a reduction: as adds, a residual add the conv2d kernel
            # fuses or elementwise adds (normalise/sums.py).
            sums_as_adds_pass,
            # x * 0.5: a scalar constant operand as a (1, ..., 1) tensor, an ELTWISE broadcast
            # (normalise/scalars.py).
            scalar_operands_pass,
            # ONNX Clip (relu6) imports as opaque maximum / minimum PrimFunc calls: make them R.clip
            # with constant bounds, as PyTorch's relu6 already is, so the epilogue can fuse them.
            canonicalize_clips_pass(),
            # A pooling window of more than 256 taps becomes a row pass and a column pass: the POOL
            # command's window expression must not grow with the window (normalise/large_pools.py).
            split_large_pools_pass,
            # What folding left unused (PyTorch's max_pool2d returns a tuple with zeros_like
            # indices that FoldConstant turns into a constant nobody reads).
            relax.transform.DeadCodeElimination(),
        ])(mod)


def partition(mod, arch, options):
    # Offload every subgraph an op family's pattern matches and the chip can run (kernels/);
    # weights stay arguments so the kernels can DMA them. Symbolic dimensions the kernels take
    # are read at their bound (kernels/dynamic.py).
    # Only the patterns that can match (their operators called, as deeply nested: partition/
    # pattern_ops.py), and the fused pairs' and blocks' only with a depthwise conv2d to find:
    # FuseOpsByPattern would walk the module for each of the others (half its time on ShuffleNetV2).
    calls = ModuleCalls(mod)
    patterns = fusion_patterns(arch, options)
    if not calls.grouped_conv2d:
        patterns = [pattern for pattern in patterns if pattern.name not in pair_pattern_names()]
    patterns = [pattern for pattern in patterns if can_match(pattern.pattern, calls)]
    # A module partitioned before tries only the patterns that made its groups (partition/plans.py).
    cache = default_kernel_cache()
    key = _plan_key(mod, calls, patterns, arch, options) if cache is not None else None
    plan = read_plan(cache.get(key, PLAN_SUFFIX)) if key is not None else None
    if plan is not None:
        patterns = [pattern for pattern in patterns if pattern.name in plan]
    with shape_bounds(bounds_of(mod, options)):
        partitioned = relax.transform.FuseOpsByPattern(patterns, bind_constants=False, annotate_codegen=True)(mod)
    if key is not None and plan is None:
        cache.put(key, plan_payload(grouped_patterns(partitioned)), PLAN_SUFFIX)
    # A user's own PrimFuncs called with R.call_tir: offloaded when they compile as NPU
    # kernels (kernels/tir.py maps their blocks onto the intrinsics), else left to the host.
    partitioned = offload_call_tir(partitioned, lambda func, name: _offload_or_refuse(func, name, arch, options),
                                   lambda name: {"global_symbol": PREFIX + name,
                                                 PRIM_FUNC_ATTR: remember_prim_func(name, partitioned[name])})
    # Each offloaded call site keeps the model nodes (ONNX node names) it came from, so every
    # kernel launch reports its own layer (identical layers get a copy of the kernel each).
    partitioned = record_source_nodes(mod, partitioned)
    # Scalars (a requantisation's zero point, a fabric body's immediates) are bound inside the
    # kernel that needs them at compile time (partition/scalar_args.py).
    return bind_scalar_arguments(partitioned, takes_immediates=reads_immediates)


def _plan_key(mod, calls: ModuleCalls, patterns, arch: HardwareDescription, options: CompileOptions) -> str | None:
    """The key of `mod`'s partition plan: the module, the patterns to try, and what their checks
    depend on besides."""
    module = fingerprint(mod, calls)
    try:
        mapper = cache_tag(mode())  # a fabric chain's check maps it
    except (ValueError, ImportError):  # a bad $CGRA_MAPPER: the mapper says so if it runs
        return None
    return None if module is None else kernel_key(
        plan=module, patterns=[pattern.name for pattern in patterns], arch=arch.to_json(), mapper=mapper,
        options=dataclasses.replace(options, dump_dir=None).to_json())


def fusion_patterns(arch: HardwareDescription, options: CompileOptions = CompileOptions()) -> list[FusionPattern]:
    """The op families' patterns (kernels.pattern_table, in the order to try them), each accepting
    a match only when the chip can run it and no value computed inside it is used outside it
    (that value would have to leave the kernel too); a chain after a GEMM-shaped kernel's
    epilogue only with `options.fuse_chains`."""
    patterns = []
    for entry in pattern_table():
        if is_epilogue_chain(entry.name) and not options.fuse_chains:
            continue
        def check(context, name=entry.name, annotations=entry.annotations):
            return not reads_what_it_computes(context, annotations) and \
                offload_reason(name, context.annotated_expr, arch) is None and \
                not has_leaking_intermediate_variables(context)
        patterns.append(FusionPattern(entry.name, entry.pattern, entry.annotations, check))
    return patterns


def codegen(mod, arch, options):
    # Compile each offloaded function for the NPU (relax.ext.cgra, target/relax_ext.py: every
    # kernel through KERNEL_STAGES, then LLVM IR) and replace it with a call to the kernel.
    options = dataclasses.replace(options, shape_bounds=bounds_of(mod, options))
    target_options = {"cgra": {"arch": arch.to_json(), "options": options.to_json()}}
    offloaded = offloaded_prim_funcs(mod)
    mod = relax.transform.RunCodegen(target_options=target_options)(mod)
    # The kernels' weights go to the runtime's weights module, out of the VM executable, whose
    # code generation would hash every byte of them (device/weights.py).
    mod = hold_weights(mod)
    # Concatenations, splits and transposes left on the host run as the runtime's copies, not
    # host code TVM compiles for each model (device/host_ops.py).
    mod = host_ops_to_runtime(mod)
    # An integer average left on the host returns the dtype Relax gives it, which the NPU
    # kernels reading it were compiled for, not TOPI's int64 (device/host_averages.py).
    mod = host_averages_as_typed(mod)
    # A user's PrimFunc that now runs only as an NPU kernel is not built for the host too.
    return drop_unused_prim_funcs(mod, offloaded)


def bounds_of(mod, options: CompileOptions) -> dict:
    """The bounds of the module's symbolic dimensions: its Relax functions' `tir_var_upper_bound`
    attributes, overridden by the compile options' `shape_bounds`."""
    bounds = {}
    for func in mod.functions.values():
        if isinstance(func, relax.Function) and func.attrs is not None and "tir_var_upper_bound" in func.attrs:
            bounds.update({str(name): int(bound) for name, bound in func.attrs["tir_var_upper_bound"].items()})
    return {**bounds, **dict(options.shape_bounds)}


STAGES = [
    ("normalise", normalise),
    ("partition", partition),
    ("codegen", codegen),
]


# ------------------------------------------------------------------ one kernel: Kernel in, Kernel out

@dataclasses.dataclass(frozen=True)
class Kernel:
    """One offloaded function on its way to plain TIR: what it computes (`spec`), its exported
    `symbol` and PrimFunc attributes, and what the stages have made of it so far."""

    symbol: str
    spec: object  # a family's spec (kernels/spec.py, kernels/eltwise.py)
    attrs: dict  # PrimFunc attributes of the lowered kernel (cgra.arch, cgra.source_ops)
    tiling: object = None  # kernels.Tiling, from the "tiling" stage on
    func: object = None  # the PrimFunc: s_tir, then scheduled, then lowered
    pattern: str = ""  # the cgra pattern that fused it ("" for a user's PrimFunc)
    layer: str = ""  # the model nodes it computes, for error messages

    def script(self) -> str:
        """What a dump of the latest stage shows: the PrimFunc, or before there is one the tiling."""
        return self.func.script() if self.func is not None else str(self.tiling)


def choose_tiling(kernel: Kernel, arch, options) -> Kernel:
    del options
    # Cut the kernel to the PE array and the scratchpad: tile sizes from its family's search.
    return dataclasses.replace(kernel, tiling=tiling_of(kernel.spec, arch))


def define(kernel: Kernel, arch, options) -> Kernel:
    del options
    # The kernel as schedulable TensorIR over padded tile grids (its family's compute), or the
    # kernel a user wrote for the pattern (register_kernel), checked against it.
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
    del options
    # Tiles in the scratchpad, tensorized onto the PE array and the vector unit: the built-in
    # schedule, or the one a user registered for the pattern or the op (register_schedule).
    # A conv2d with a symbolic image size: TVM's region-cover check cannot prove that OH * OW
    # rows fit in the whole tiles covering them (it can for a variable alone, not for a
    # variable times a constant), and refuses compute_at; the schedule runs without the
    # primitives' checks then, and the kernel is checked against numpy at many sizes instead
    # (tests/test_dynamic_shapes.py).
    sch = s_tir.Schedule(kernel.func, enable_check=not getattr(kernel.spec, "symbolic_image", False))
    function = schedule_of(kernel.spec, kernel.pattern)
    builtin = function is family_of(kernel.spec).schedule
    layer = f", layer {kernel.layer}" if kernel.layer else ""
    where = (f"the {'built-in' if builtin else 'user'} schedule of {kernel.pattern or kernel.spec.op} "
             f"(kernel {kernel.symbol}{layer})")
    if bool((kernel.func.attrs or {}).get(KERNEL_ATTR, False)):
        function = _as_written  # written for the NPU: lowered as it is
    try:
        function(sch, kernel.spec, kernel.tiling, arch)
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


def _as_written(sch, spec, tiling, arch) -> None:
    del sch, spec, tiling, arch


def lower(kernel: Kernel, arch, options) -> Kernel:
    del arch, options
    # Plain TIR: copies become DMA, buffers are flattened; what the code generator walks.
    func = kernel.func.with_attr("global_symbol", kernel.symbol)
    for key, value in kernel.attrs.items():
        func = func.with_attr(key, value)
    mod = tvm.IRModule({kernel.symbol: func})
    for lowering_pass in lowering_passes():
        mod = lowering_pass(mod)
    return dataclasses.replace(kernel, func=mod[kernel.symbol])


KERNEL_STAGES = [
    ("tiling", choose_tiling),
    ("s_tir", define),
    ("scheduled", schedule),
    ("lowered", lower),
]


def lowering_passes() -> list:
    """Scheduled s_tir -> the plain TIR the code generator walks (loops, scratchpad allocations,
    `cgra_*` device calls, address arithmetic); each line says why the pass is there."""
    return [
        s_tir.transform.LowerInitBlock(),  # reduction inits are already FILLs; lower leftovers
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),  # allocate tiles inside their loops
        s_tir.transform.ConvertBlocksToOpaque(),  # block iter vars -> loop expressions
        s_tir.transform.CompactBufferAllocation(),  # scratchpad buffers shrink to one tile
        s_tir.transform.LowerMatchBuffer(),  # intrinsic operands -> base + elem_offset
        s_tir.transform.LowerOpaqueBlock(),  # blocks -> loops, predicates -> if
        # Host <-> scratchpad copies -> DMA boxes. Before any simplifier: it needs N-d buffers
        # and the guards as written (a simplifier may rewrite "2*ox + rx < 12" as "ox < 6",
        # which is equivalent on the loop's range but no longer reads as an in-bounds test).
        _func_pass(lower_copies_to_dma, "cgra.LowerCopiesToDMA"),
        # The accumulator's zero-fill becomes the first reduction step's overwriting GEMM.
        _func_pass(fold_accumulator_init, "cgra.FoldAccumulatorInit"),
        # A FILL the EPILOGUE after it partly overwrites (a window's padding) fills only the rest.
        _func_pass(trim_overwritten_fills, "cgra.TrimOverwrittenFills"),
        # The last tile of a symbolic axis moves and computes only the rows that exist.
        _func_pass(cut_ragged_tiles, "cgra.CutRaggedTiles"),
        # Two copies of each scratchpad tile reused by a loop, so DMA overlaps compute.
        _func_pass(double_buffer, "cgra.DoubleBuffer"),
        s_tir.transform.StmtSimplify(),  # fold the index arithmetic of the remaining calls
        tirx.transform.FlattenBuffer(),  # N-d buffers -> 1-d, for the code generator
        tirx.transform.StmtSimplify(),
        tirx.transform.RemoveNoOp(),
        # An intrinsic's copy of a symbolic dimension (tensorize copies implementations): bound.
        _func_pass(rebind_dimensions, "cgra.RebindDimensions"),
    ]


def _func_pass(fn, name):
    @tvm.tirx.transform.prim_func_pass(opt_level=0, name=name)
    def run(func, _mod, _ctx):
        return fn(func)
    return run


# ------------------------------------------------------------------ running them

def run_stages(mod: tvm.IRModule, arch: HardwareDescription, options: CompileOptions, stages=None) -> tvm.IRModule:
    """The graph stages (or the first few of them, `stages`), each output dumped under its name
    (what an earlier compile dumped in the same folder is removed first)."""
    require_pe_array(arch)
    clear_dump(options, ["0_input.py"] + [f"{i + 1}_{name}.py" for i, (name, _) in enumerate(STAGES)])
    dump(options, "0_input.py", mod)
    for index, (name, stage) in enumerate(STAGES if stages is None else stages):
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


def tir_offload_reason(func, name: str, arch: HardwareDescription, options: CompileOptions) -> str | None:
    """Why PrimFunc `name` cannot run on the NPU, or None when it compiles as a kernel: its
    spec (kernels/tir.py) and every kernel stage, tried once per PrimFunc, chip and options."""
    key = (tvm_ffi.structural_hash(func), name, arch.fingerprint, dataclasses.replace(options, dump_dir=None))
    if key not in _TIR_REASONS:
        try:
            spec = tir_spec(func, name)
            run_kernel_stages(Kernel(PREFIX + name, spec, {}), arch, dataclasses.replace(options, dump_dir=None))
            _TIR_REASONS[key] = None
        except (CGRAError, s_tir.ScheduleError, RuntimeError, ValueError, TypeError) as err:
            # Ours, or TVM refusing a step (tensorize found no match, a layout it cannot pad).
            _TIR_REASONS[key] = one_line(err)
    return _TIR_REASONS[key]


_TIR_REASONS: dict = {}


def _offload_or_refuse(func, name: str, arch: HardwareDescription, options: CompileOptions) -> str | None:
    """tir_offload_reason, except that a kernel written for the NPU (cgra.kernel: it calls
    device functions) that cannot compile for it is an error: it has no host version."""
    reason = tir_offload_reason(func, name, arch, options)
    if reason is not None and bool((func.attrs or {}).get(KERNEL_ATTR, False)):
        raise UnsupportedOperator(f"PrimFunc '{name}' is marked {KERNEL_ATTR} (written for the NPU, it cannot run "
                                  f"on the host) but does not compile for {arch.name}: {reason}")
    return reason


def run_kernel_stages(kernel: Kernel, arch: HardwareDescription, options: CompileOptions) -> dict:
    """Every kernel stage's output Kernel, by stage name; each dumped as it comes, so a failing
    stage leaves the ones before it to read. Errors name the stage and the kernel."""
    outputs = {}
    for index, (name, stage) in enumerate(KERNEL_STAGES):
        with stage_context(name, kernel.symbol):
            kernel = outputs[name] = stage(kernel, arch, options)
        dump(options, f"kernels/{kernel.symbol}/{index + 1}_{name}.py", kernel)
    return outputs


def cgra_pipeline(arch: HardwareDescription, options: CompileOptions = CompileOptions()):
    """The whole Relax pipeline for the NPU: the CGRA stages, then TVM's CPU pipeline for the host."""

    @tvm.transform.module_pass(opt_level=0, name="cgra.Pipeline")
    def pipeline(mod, _ctx):
        with gc_paused():
            try:
                mod = run_stages(mod, arch, options)
            except CGRAError as err:
                remember_error(err)
                raise
            mod = with_host_anchor(mod)
            built = relax.get_pipeline("default_build")(mod)
            # LegalizeOps' reshapes that RewriteDataflowReshape made views again are called by
            # nothing: LLVM compiled them for nothing (ShuffleNetV2's seven, 30 ms).
            made = {gvar.name_hint for gvar in built.functions} - {gvar.name_hint for gvar in mod.functions}
            return drop_unused_prim_funcs(built, made)

    return pipeline
