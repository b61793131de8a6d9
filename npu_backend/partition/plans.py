"""The partition's plan: which patterns made groups in a module, remembered for its next compile.

Stage: partition (around FuseOpsByPattern). FuseOpsByPattern runs the patterns one after another,
each on the module the ones before left, and a pattern that makes no group leaves the module as
it was. So the patterns that made groups, run alone in the same order, partition the module the
same way. A module partitioned before tries only those: ShuffleNetV2's 35 patterns become 5 and
FuseOpsByPattern takes 62 ms instead of 115 ms (the other 30 were refused by their checks or
found their operators taken by earlier patterns, which no test short of running them tells).

In: the module and what `ModuleCalls` read of it. The plan's key (`fingerprint`) is the module's
structure with every shape and dtype (TVM's structural hash, tensor contents left out: hashing
VGG-19's 548 MB of weights takes 0.26 s) and the contents of its small constants (a check reads
a one-element constant: a divisor, a zero point; a plain norm's, whether its gamma is all ones:
`ModuleCalls` keeps those of up to 64 elements and every vector); the caller (partition/stage.py) adds the patterns it would try, the chip, the
options, the fabric mapper and the compiler's version. Out: the plan's payload (`plan_payload`),
read back by `read_plan`. A plan that were stale could only leave out a pattern (its check
still decides every group that is made): a layer left to a smaller kernel or the host, never a
wrong kernel.
"""

from __future__ import annotations

import hashlib
import json

import tvm_ffi

from .composite import composite_name
from .pattern_ops import ModuleCalls


def fingerprint(mod, calls: ModuleCalls) -> str | None:
    """The plan's key for `mod`: its structure and its small constants' contents (`calls` read
    them); None when the walk missed some of them (no plan then)."""
    constants = calls.small_constants
    if constants is None:
        return None
    digest = hashlib.sha256(f"{tvm_ffi.structural_hash(mod, skip_tensor_content=True):x};".encode())
    for data in constants:
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def grouped_patterns(partitioned) -> list[str]:
    """The names of the patterns that made the offloaded functions of `partitioned`."""
    return sorted({composite_name(func) for func in partitioned.functions.values()
                   if "Codegen" in (getattr(func, "attrs", None) or {})})


def plan_payload(names: list[str]) -> bytes:
    """What the kernel cache keeps for a plan: the names of the patterns that made its groups."""
    return json.dumps({"grouped": names}).encode()


def read_plan(payload: bytes | None) -> frozenset[str] | None:
    """The pattern names a plan holds; None for no plan (or one this compiler did not write)."""
    try:
        names = json.loads(payload)["grouped"] if payload is not None else None
    except (ValueError, KeyError, TypeError):
        return None
    return frozenset(names) if isinstance(names, list) and all(isinstance(n, str) for n in names) else None
