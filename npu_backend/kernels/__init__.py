"""The NPU's kernels, one op family per module, and the one list of them (registry.py).

Stage: kernel definition, tiling and schedule (the per-kernel stages pipeline.py lists; their
bodies are stage.py), and the patterns and specs partition offloads with. The families sit in
folders with their tile searches: gemm/ (matmul.py and conv2d.py, GEMMs on the PE array sharing
gemm.py's tile search, gemm_schedule.py's schedule and epilogue.py's fused chain; depthwise.py, DEPTHWISE),
pool/ (POOL), fused/ (separable and inverted residual blocks), elementwise/ (ELTWISE, EPILOGUE
and FABRIC kernels) and tir/ (a user's PrimFunc). What they share is in common/ (the spec and
its tile sizes, padded operand reads and views, the one-input kernels' unary.py, scratchpad row
padding), the tensor intrinsics, one module per hardware unit, in intrinsics/.
"""

from .family import OpFamily
from .registry import (FAMILIES, family_of, offload_reason, offloaded_spec, pattern_table,
                       register_schedule, spec_from_match)
from .common.spec import KernelSpec, PoolAttrs, Tiling

__all__ = ["FAMILIES", "KernelSpec", "OpFamily", "PoolAttrs", "Tiling", "family_of", "offload_reason",
           "offloaded_spec", "pattern_table", "register_schedule", "spec_from_match"]
