"""The simulator's exceptions: one base class, one class per thing that can be wrong.

Stage: simulator (validation, execution, timing). Everything the simulator raises on purpose is a
`SimulatorError`; the ones caused by a bad kernel are also `ValueError`s, so a caller that only
knows "the input was wrong" can catch that.
"""

from __future__ import annotations


class SimulatorError(Exception):
    """Base class of every error the simulator raises on purpose."""


class LaunchError(SimulatorError, ValueError):
    """The launch itself is malformed: the command buffer's size, or a bound host tensor."""


class CommandError(SimulatorError, ValueError):
    """One command of the stream is invalid. Raised before any command runs.

    `index` is the command's position in the stream and `op` its opcode name (or the raw number
    for an unknown opcode); the message names both and the offending range.
    """

    def __init__(self, index: int, op: str, problem: str):
        super().__init__(f"command {index} ({op}): {problem}")
        self.index = index
        self.op = op
        self.problem = problem


class CycleLimitExceeded(SimulatorError, RuntimeError):
    """The simulated kernel ran past the cycle limit; names the command that crossed it."""

    def __init__(self, index: int, op: str, end_cycle: int, limit: int):
        super().__init__(f"command {index} ({op}) ends at cycle {end_cycle}, past the limit of "
                         f"{limit} cycles; raise max_cycles if the kernel is meant to run this long")
        self.index = index
        self.op = op
        self.end_cycle = end_cycle
        self.limit = limit
