"""The fusion patterns for one chip: which Relax subgraphs the partitioner offloads.

Stage: partition. In: the op families' pattern table (name, pattern, role annotations, in the
order to try them; kernels/registry.py) and a function giving the reason a match cannot run on
the chip. Out: TVM `FusionPattern`s whose check functions accept a match only when that reason
is None and no value computed inside it is used outside it (it would have to leave the kernel).
"""

from __future__ import annotations

from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.transform import FusionPattern

from cgra_sim.arch import HardwareDescription


def fusion_patterns(table, offload_reason, arch: HardwareDescription) -> list[FusionPattern]:
    """One FusionPattern per table entry; `offload_reason(name, annotated, arch)` -> str | None."""
    patterns = []
    for entry in table:
        def check(context, name=entry.name):
            return offload_reason(name, context.annotated_expr, arch) is None and \
                not has_leaking_intermediate_variables(context)
        patterns.append(FusionPattern(entry.name, entry.pattern, entry.annotations, check))
    return patterns
