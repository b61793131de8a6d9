"""An op family: everything the compiler knows about one kind of NPU kernel, in one object.

Stage: all per-kernel stages. A family says how its ops are found in a Relax graph (`roots`,
followed by the fused epilogue chains of epilogue.py, or standalone `patterns`), how a match
becomes a spec (`spec_from_match`, raising UnsupportedOperator with the reason an op stays on
the host), and how a spec becomes commands: `choose_tiling` (tile sizes for the PE array and
the scratchpad), `compute` (the TensorIR over padded tiles) and `schedule` (tile, stage into the
scratchpad, tensorize onto the intrinsics). The partitioner, the target hook, tiling and explain
all go through the one list of families in registry.py, the way VTA's `top/op.py` pairs a
compute with its schedule. Adding an op is one family module, one entry in that list and a test
(docs/architecture.md walks through it).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

#: () -> [(pattern name, DFPattern, {role: DFPattern})]
PatternsFn = Callable[[], list]


def _none() -> list:
    return []


@dataclasses.dataclass(frozen=True)
class OpFamily:
    name: str  # "conv2d"
    ops: tuple  # the spec `op` values whose kernels this family builds ("conv2d",)
    choose_tiling: Callable  # (spec, arch) -> Tiling; raises ScratchpadTooSmall
    compute: Callable  # (spec, tiling) -> the kernel's schedulable PrimFunc
    schedule: Callable  # (s_tir.Schedule, spec, tiling, arch) -> None, transforms in place
    spec_from_match: Callable | None = None  # (pattern name, {role: expr}) -> spec
    roots: PatternsFn = _none  # () -> [epilogue.Root]: ops followed by an epilogue chain
    patterns: PatternsFn = _none  # () -> [(name, pattern, roles)]: standalone patterns
    # () -> [(name, pattern, roles)]: two or three roots fused into one kernel (separable.py,
    # inverted_residual.py), tried before any root's epilogue chain, which would otherwise take
    # each root alone.
    pairs: PatternsFn = _none
    # Relax op -> the pattern `explain` reads a host call of it with, to say why it stayed there.
    host_ops: dict = dataclasses.field(default_factory=dict)
    # Whether the PE array must compute the spec's dtype (arch.macs_per_pe).
    checks_pe_dtype: bool = True
