"""The NPU's kernels, one op family per module, and the one list of them (registry.py).

Stage: kernel definition, tiling and schedule (the per-kernel stages pipeline.py lists; their
bodies are stage.py), and the patterns and specs partition offloads with. Families: matmul.py
and conv2d.py (GEMMs on the PE array, sharing gemm.py's tile search and schedule), depthwise.py
(DEPTHWISE on the PE array), pool.py (POOL) and eltwise.py (ELTWISE) on the vector unit. Shared:
the fused epilogue (epilogue.py), the spec and its tile sizes (spec.py), padded operand reads
(operands.py), scratchpad row padding (spad_layout.py) and the tensor intrinsics, one module per
hardware unit (intrinsics/).
"""

from .family import OpFamily
from .registry import (FAMILIES, family_of, offload_reason, offloaded_spec, pattern_table,
                       register_schedule, spec_from_match)
from .spec import KernelSpec, PoolAttrs, Tiling

__all__ = ["FAMILIES", "KernelSpec", "OpFamily", "PoolAttrs", "Tiling", "family_of", "offload_reason",
           "offloaded_spec", "pattern_table", "register_schedule", "spec_from_match"]
