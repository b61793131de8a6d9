"""A command stream as text: one line per command, for a person to read.

Stage: simulator tooling. In: int64 command records (isa.py). Out: lines "index  OPCODE  field=value
...", the fields being the ones the Chrome trace shows (trace.command_args). `cgra-sim run
--dump-dir` writes one such listing per kernel launch next to its launch file; the launch files
hold the exact records for `cgra-sim replay`.
"""

from __future__ import annotations

import numpy as np

from .isa import Op
from .trace import command_args


def _value(value) -> str:
    return ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)


def format_stream(records, title: str = "") -> str:
    """The listing of `records` (an int64 array of shape (n, RECORD_WORDS)), `title` first."""
    records = np.asarray(records)
    lines = [title] if title else []
    for index, record in enumerate(records):
        code = int(record[0])
        name = Op(code).name if code in Op._value2member_map_ else f"opcode {code}"
        fields = " ".join(f"{key}={_value(value)}" for key, value in command_args(record).items())
        lines.append(f"{index:6d}  {name:<10} {fields}")
    return "\n".join(lines) + "\n"
