"""The host CPU beside the NPU: the figures that model the time of the operators left on the host.

Stage: shared (the hardware description's `host` table; `HardwareDescription.host_cpu` reads it).
In: a host call's arithmetic operations and the bytes of its tensors; out: its modelled cycles of
the host clock and of the NPU clock, so that a profile can add the host's work to the NPU's
cycles reproducibly (npu_backend/device/host_calls.py measures the wall time beside it).

The table (docs/hardware-description.md, "The host table"):

    clock_mhz             the host core's clock
    ops_per_cycle         arithmetic operations (add, multiply, max, exp, ...) it sustains per cycle
    bytes_per_cycle       bytes of tensors it reads and writes per cycle from memory
    call_overhead_cycles  cycles every host call costs besides its work (dispatch, argument checks)

A call's cycles = call_overhead_cycles + max(ops / ops_per_cycle, bytes / bytes_per_cycle): a
roofline, one core, no overlap between calls.

`default_host` is a modest Arm application core (Cortex-A55 class) and this project's assumption,
not a measurement: 1.5 GHz, 2 operations a cycle (TVM's generated loops at -O1 are mostly scalar;
the A55 issues two a cycle), 4 bytes a cycle (6 GB/s, about what one A55 streams from LPDDR4), and
1500 cycles (1 us) of overhead a call.
"""

from __future__ import annotations

import math

#: The keys of a host table, each a number: clock_mhz, ops_per_cycle and bytes_per_cycle positive,
#: call_overhead_cycles non-negative.
POSITIVE_KEYS = ("bytes_per_cycle", "clock_mhz", "ops_per_cycle")
KEYS = ("bytes_per_cycle", "call_overhead_cycles", "clock_mhz", "ops_per_cycle")


def default_host() -> dict:
    """The host figures of a chip whose description leaves `host` out (module docstring)."""
    return {"bytes_per_cycle": 4.0, "call_overhead_cycles": 1500.0, "clock_mhz": 1500.0, "ops_per_cycle": 2.0}


def check_host(host) -> str | None:
    """What is wrong with a host table (None if nothing): exactly KEYS, finite numbers, positive
    where POSITIVE_KEYS says so."""
    if not isinstance(host, dict):
        return f"'host' must be an object of host-CPU figures, got {type(host).__name__}"
    if set(host) != set(KEYS):
        missing, unknown = sorted(set(KEYS) - set(host)), sorted(set(host) - set(KEYS))
        return f"'host' must have the keys {list(KEYS)} (missing {missing}, unknown {unknown})"
    for key in KEYS:
        value = host[key]
        good = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and \
            (value > 0 if key in POSITIVE_KEYS else value >= 0)
        if not good:
            kind = "positive" if key in POSITIVE_KEYS else "non-negative"
            return f"host['{key}'] must be a {kind} number, got {value!r}"
    return None


def host_call_cycles(host: dict, ops: float, nbytes: float) -> float:
    """Cycles of the host clock one call of `ops` operations over `nbytes` of tensors takes."""
    return host["call_overhead_cycles"] + max(ops / host["ops_per_cycle"], nbytes / host["bytes_per_cycle"])
