"""The compile flow: one ordered list of named stages, run by `tvm.compile`, `compile` and the CLI.

Stage: all of them, in order. Each stage is `(mod, arch, options) -> mod`; with
`CompileOptions.dump_dir` set, each stage's output is written under its name. The per-kernel
stages (s_tir, schedule, lowering, LLVM IR) run inside `codegen` (see `target_hook.py`); what
is left on the host goes through TVM's own CPU pipeline afterwards.
"""

from __future__ import annotations

import tvm
from tvm import relax

from cgra_sim.arch import HardwareDescription

from .normalise.clips import canonicalize_clips_pass
from .normalise.fold_weights import fold_weights
from .options import CompileOptions, dump
from .patterns import make_patterns
from .normalise.qdq import canonicalize_qdq
from .partition.scalar_args import bind_scalar_arguments
from .partition.source_nodes import record_source_nodes


def _normalise(mod, arch, options):
    del arch, options
    # QDQ layers (dequantize -> conv2d / matmul -> quantize) become int8 x int8 -> int32 with
    # an int32 bias and a requantisation to int8, onnxruntime's arithmetic (qdq_form.py); first,
    # while the quantized weights are still int8 constants under their dequantize.
    mod = canonicalize_qdq(mod)
    # Inference batch norm after a conv2d with constant weights becomes scaled weights and a
    # bias add (conv2d + bias + relu is one NPU kernel, no batch_norm is left on the host), and
    # the constant arithmetic importers leave around weights (bias reshapes, transposed Gemm
    # weights) is folded, so the patterns see plain tensors. numpy does it in milliseconds
    # where FoldBatchnormToConv2D + FoldConstant took seconds (fold_weights.py).
    mod = fold_weights(mod)
    return tvm.transform.Sequential([
        # What fold_weights has no numpy rule for (fast when nothing is left: it builds only
        # the constant subexpressions that remain).
        relax.transform.FoldConstant(),
        relax.transform.CanonicalizeBindings(),
        # ONNX Clip (relu6) imports as opaque maximum / minimum PrimFunc calls: make them R.clip
        # with constant bounds, as PyTorch's relu6 already is, so the epilogue can fuse them.
        canonicalize_clips_pass(),
        # What folding left unused (PyTorch's max_pool2d returns a tuple with zeros_like
        # indices that FoldConstant turns into a constant nobody reads).
        relax.transform.DeadCodeElimination(),
    ])(mod)


def _partition(mod, arch, options):
    del options
    # Offload every subgraph a cgra pattern matches and its checks accept; weights stay
    # arguments so the kernels can DMA them.
    partitioned = relax.transform.FuseOpsByPattern(make_patterns(arch), bind_constants=False,
                                                   annotate_codegen=True)(mod)
    # Each offloaded call site keeps the model nodes (ONNX node names) it came from, so every
    # kernel launch reports its own layer (identical layers get a copy of the kernel each).
    partitioned = record_source_nodes(mod, partitioned)
    # Scalars (a requantisation's zero point) are bound inside the kernel that needs them at
    # compile time (scalar_args.py).
    return bind_scalar_arguments(partitioned)


def _codegen(mod, arch, options):
    # Compile each offloaded function for the NPU (relax.ext.cgra) and replace it with a call
    # to the compiled kernel.
    target_options = {"cgra": {"arch": arch.to_json(), "options": options.to_json()}}
    return relax.transform.RunCodegen(target_options=target_options)(mod)


STAGES = [
    ("normalise", _normalise),
    ("partition", _partition),
    ("codegen", _codegen),
]


def run_stages(mod: tvm.IRModule, arch: HardwareDescription, options: CompileOptions) -> tvm.IRModule:
    dump(options, "0_input.py", mod)
    for index, (name, stage) in enumerate(STAGES):
        mod = stage(mod, arch, options)
        dump(options, f"{index + 1}_{name}.py", mod)
    return mod


def cgra_pipeline(arch: HardwareDescription, options: CompileOptions = CompileOptions()):
    """The whole Relax pipeline for the NPU: the CGRA stages, then TVM's CPU pipeline for the host."""

    @tvm.transform.module_pass(opt_level=0, name="cgra.Pipeline")
    def pipeline(mod, _ctx):
        mod = run_stages(mod, arch, options)
        return relax.get_pipeline("default_build")(mod)

    return pipeline
