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

from ..errors import FamilyError

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
    # Required: whether the spec's dtype must be one the PE array computes (arch.dtypes), else
    # the op stays on the host with that reason. True for kernels on the PE array (GEMM,
    # DEPTHWISE), False for the vector unit and the fabric, whose dtypes the spec reader checks.
    checks_pe_dtype: bool | None = None

    def __post_init__(self):
        """Fail where the family is made, naming the field, not later with a wrong reason."""
        def missing(field: str, why: str):
            raise FamilyError(f"OpFamily '{self.name}': {field} {why} (docs/architecture.md, Add an operator)")

        if not isinstance(self.name, str) or not self.name:
            missing("name", "must be a non-empty string")
        if not isinstance(self.ops, tuple) or not self.ops or not all(isinstance(op, str) for op in self.ops):
            missing("ops", f"must be a non-empty tuple of the spec `op` values it builds, not {self.ops!r}")
        for field in ("choose_tiling", "compute", "schedule", "roots", "patterns", "pairs"):
            if not callable(getattr(self, field)):
                missing(field, f"must be a function, not {type(getattr(self, field)).__name__}")
        if self.checks_pe_dtype is None:
            missing("checks_pe_dtype", "is unset: True if its kernels run on the PE array (a spec dtype "
                                       "outside arch.dtypes stays on the host), False for the vector unit "
                                       "or the fabric (its spec_from_match refuses the dtypes they lack)")
        has_patterns = any(getattr(self, field) is not _none for field in ("roots", "patterns", "pairs"))
        if has_patterns and self.spec_from_match is None:
            missing("spec_from_match", "is unset but the family has patterns: (pattern name, {role: expr}) "
                                       "-> spec, raising UnsupportedOperator with the reason")
        if self.host_ops and not isinstance(self.host_ops, dict):
            missing("host_ops", "must be a dict of Relax op -> pattern name")
