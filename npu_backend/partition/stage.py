"""The partition stage's body: every subgraph an op family's pattern matches and the chip can run
becomes an offloaded function, and so does a user's PrimFunc that compiles as an NPU kernel.

Stage: partition (pipeline.STAGES' second). In and out: a Relax IRModule. This is where the
partitioner meets the kernels: it asks their pattern table which matches the chip can run
(`fusion_patterns`), remembers which patterns made a module's groups in the kernel cache (the
plan cache, plans.py), and tries a PrimFunc called with R.call_tir through the kernel stages it
is given (`tir_offload_reason`, once per PrimFunc, chip and options). The rest of partition/ is
the pieces it joins, and never imports kernels/.
"""

from __future__ import annotations

import dataclasses

import tvm_ffi
from tvm import relax, s_tir
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.transform import FusionPattern

from cgra_sim.arch import HardwareDescription
from cgra_sim.mapping.solver import cache_tag, mode

from ..device.kernel_cache import PLAN_SUFFIX, default_kernel_cache, kernel_key
from ..errors import CGRAError, UnsupportedOperator, one_line
from ..kernels import offload_reason, pattern_table
from ..kernels.common.chains import reads_constants, reads_immediates
from ..kernels.common.dynamic import shape_bounds
from ..kernels.gemm.epilogue import is_epilogue_chain
from ..kernels.registry import pair_pattern_names
from ..kernels.stage import Kernel, run_kernel_stages
from ..kernels.tir.tir import KERNEL_ATTR, tir_spec
from ..options import CompileOptions
from .call_tir import PREFIX, PRIM_FUNC_ATTR, offload_call_tir, remember_prim_func
from .composite import cache_read_elsewhere, mlp_norms, module_bindings, operand_depends_on_match, reads_what_it_computes
from .pattern_ops import ModuleCalls, can_match
from .plans import fingerprint, grouped_patterns, plan_payload, read_plan
from ..kernels.gemm.rope_pass_columns import mark_pass_columns
from .scalar_args import bind_scalar_arguments
from .source_nodes import record_source_nodes


def partition(mod, arch, options, kernel_stages: list):
    """`mod` with its NPU subgraphs as offloaded functions (FuseOpsByPattern over the patterns that
    can match), a user's PrimFunc that compiles through `kernel_stages` offloaded, each offloaded
    call site naming its model nodes and binding its scalar arguments."""
    # Symbolic dimensions the kernels take are read at their bound (kernels/common/dynamic.py).
    # Only the patterns that can match (their operators called, as deeply nested: pattern_ops.py),
    # and the fused pairs' and blocks' only with a depthwise conv2d to find: FuseOpsByPattern
    # would walk the module for each of the others (half its time on ShuffleNetV2).
    calls = ModuleCalls(mod)
    patterns = fusion_patterns(arch, options)
    if not calls.grouped_conv2d:
        patterns = [pattern for pattern in patterns if pattern.name not in pair_pattern_names()]
    patterns = [pattern for pattern in patterns if can_match(pattern.pattern, calls)]
    # A module partitioned before tries only the patterns that made its groups (plans.py).
    cache = default_kernel_cache()
    key = _plan_key(mod, calls, patterns, arch, options) if cache is not None else None
    plan = read_plan(cache.get(key, PLAN_SUFFIX)) if key is not None else None
    if plan is not None:
        patterns = [pattern for pattern in patterns if pattern.name in plan]
    with shape_bounds(bounds_of(mod, options)), module_bindings(mod):
        partitioned = relax.transform.FuseOpsByPattern(patterns, bind_constants=False, annotate_codegen=True)(mod)
    if key is not None and plan is None:
        cache.put(key, plan_payload(grouped_patterns(partitioned)), PLAN_SUFFIX)
    # A user's own PrimFuncs called with R.call_tir: offloaded when they compile as NPU
    # kernels (kernels/tir/tir.py maps their blocks onto the intrinsics), else left to the host.
    partitioned = offload_call_tir(
        partitioned, lambda func, name: _offload_or_refuse(func, name, arch, options, kernel_stages),
        lambda name: {"global_symbol": PREFIX + name, PRIM_FUNC_ATTR: remember_prim_func(name, partitioned[name])})
    # Each offloaded call site keeps the model nodes (ONNX node names) it came from, so every
    # kernel launch reports its own layer (identical layers get a copy of the kernel each).
    partitioned = record_source_nodes(mod, partitioned)
    # Scalars (a requantisation's zero point, a fabric body's immediates) are bound inside the
    # kernel that needs them at compile time (scalar_args.py).
    partitioned = bind_scalar_arguments(partitioned, takes_immediates=reads_immediates, takes_constants=reads_constants)
    # RoPE's table columns that rotate nothing, read from the constants the kernels are called
    # with (kernels/gemm/rope_pass_columns.py).
    return mark_pass_columns(partitioned)


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
                not operand_depends_on_match(context) and not cache_read_elsewhere(context) and \
                offload_reason(name, context.annotated_expr, arch) is None and \
                not has_leaking_intermediate_variables(context) and not _keeps_a_norm(context, arch)
        patterns.append(FusionPattern(entry.name, entry.pattern, entry.annotations, check))
    return patterns


def _keeps_a_norm(context, arch: HardwareDescription) -> bool:
    """Whether a fused MLP's match must leave its linears to their own kernels because one of
    them takes a norm with it (partition/composite.mlp_norms): a post-norm after fc2, or a
    pre-norm fc1's normed linear kernel would take (its own pattern's check passes); Swin's
    second stage on cgra-8x8 lost 1,400 cycles without this, its first MLP's pre-norm, which
    its normed linear refuses, runs on its own either way."""
    pre, post = mlp_norms(context)
    if post or pre is None:
        return post
    ours = {"rhs": "fc1_rhs", "permute": "fc1_permute", "root": "fc1_root", "bias": "fc1_bias",
            "reshape": "fc1_reshape", "act": "fc1_act", "relu": "fc1_relu"}
    roles = {role: context.annotated_expr[theirs] for role, theirs in ours.items() if theirs in context.annotated_expr}
    kind = str(pre.op.name).split(".")[-1]
    roles.update({"lhs": pre.args[0], "row_norm": pre, "norm_weight": pre.args[1],
                  **({"norm_bias": pre.args[2]} if kind == "layer_norm" else {})})
    linear = "linear" if "permute" in roles else "matmul"
    name = f"cgra.{linear}_{kind}_epilogue" if "act" in roles or "reshape" in roles else \
        f"cgra.{linear}_{kind}" + ("_bias" if "bias" in roles else "") + ("_relu" if "relu" in roles else "")
    return offload_reason(name, roles, arch) is None


def bounds_of(mod, options: CompileOptions) -> dict:
    """The bounds of the module's symbolic dimensions: its Relax functions' `tir_var_upper_bound`
    attributes, overridden by the compile options' `shape_bounds`."""
    bounds = {}
    for func in mod.functions.values():
        if isinstance(func, relax.Function) and func.attrs is not None and "tir_var_upper_bound" in func.attrs:
            bounds.update({str(name): int(bound) for name, bound in func.attrs["tir_var_upper_bound"].items()})
    return {**bounds, **dict(options.shape_bounds)}


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


def tir_offload_reason(func, name: str, arch: HardwareDescription, options: CompileOptions,
                       kernel_stages: list) -> str | None:
    """Why PrimFunc `name` cannot run on the NPU, or None when it compiles as a kernel: its
    spec (kernels/tir/tir.py) and every kernel stage, tried once per PrimFunc, chip and options."""
    key = (tvm_ffi.structural_hash(func), name, arch.fingerprint, dataclasses.replace(options, dump_dir=None))
    if key not in _TIR_REASONS:
        try:
            spec = tir_spec(func, name)
            run_kernel_stages(Kernel(PREFIX + name, spec, {}), arch, dataclasses.replace(options, dump_dir=None),
                              kernel_stages)
            _TIR_REASONS[key] = None
        except (CGRAError, s_tir.ScheduleError, RuntimeError, ValueError, TypeError) as err:
            # Ours, or TVM refusing a step (tensorize found no match, a layout it cannot pad).
            _TIR_REASONS[key] = one_line(err)
    return _TIR_REASONS[key]


_TIR_REASONS: dict = {}


def _offload_or_refuse(func, name: str, arch: HardwareDescription, options: CompileOptions,
                       kernel_stages: list) -> str | None:
    """tir_offload_reason, except that a kernel written for the NPU (cgra.kernel: it calls
    device functions) that cannot compile for it is an error: it has no host version."""
    reason = tir_offload_reason(func, name, arch, options, kernel_stages)
    if reason is not None and bool((func.attrs or {}).get(KERNEL_ATTR, False)):
        raise UnsupportedOperator(f"PrimFunc '{name}' is marked {KERNEL_ATTR} (written for the NPU, it cannot run "
                                  f"on the host) but does not compile for {arch.name}: {reason}")
    return reason
