"""The roots a GEMM family offloads, and the order the chains after a linear root are tried in.

Stage: partition (pattern construction). A family with roots (matmul.py, conv2d.py) gets a
pattern for each root with each epilogue chain (epilogue.py), the gated unit (gated.py) and
RoPE (rope_epilogue.py). A linear whose left operand is a plain pre-norm has roots of its own
that take the norm into the GEMM (row_norm.py); a chain after a linear tries those first
(`linear_roots`), since the plain root's wildcard left operand would match the norm's output and
leave the norm a kernel of its own.
"""

from __future__ import annotations

import dataclasses

from tvm.relax.dpl import DFPattern


@dataclasses.dataclass(frozen=True)
class Root:
    """An op a family offloads with an epilogue after it: patterns `cgra.<name>[_chain]`."""

    name: str  # "matmul", "linear", "conv2d"
    pattern: DFPattern  # the op's call
    roles: dict  # role ("lhs", "rhs", "permute") -> the pattern of that operand


def linear_roots(roots, norms: tuple = ("rms_norm", "layer_norm")) -> list:
    """The linear roots (matmul of permute_dims(W)) among `roots`: those normalising their own
    rows with one of `norms` (row_norm.py's `linear_<norm>`) first, then the plain `linear`."""
    names = [f"linear_{norm}{half}" for norm in norms for half in ("", "_half", "_half_wide")] + ["linear"]
    found = [root for root in roots if "permute" in root.roles and root.name in names]
    return sorted(found, key=lambda root: "row_norm" not in root.roles)
