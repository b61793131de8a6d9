"""LOOKUP: an int8 function of an int8 tile by a 256-entry table, on the vector unit.

Stage: simulator (decode, execute; the timing layer calls `cost.lookup_cycles`). In: a LOOKUP
record (isa.py) and the scratchpad. Out: the decoded command (its regions checked) and, executed,
the int8 tile `out[i, j] = table[a[i, j] + 128]`.

Why a command of its own: between quantized layers a function of one int8 tensor (onnxruntime's
QLinearSigmoid, a SiLU's x * sigmoid(x) requantised) has only 256 inputs, so its exact result is
a table the compiler fills from the scales (Arm Ethos-U's and TFLite's int8 LUT activations).
No other command indexes by a value: as float arithmetic the sigmoid takes three FABRIC passes
and rounds apart from onnxruntime near a half step. The vector lanes read the table from the
scratchpad, an element a lane a cycle (cost.lookup_cycles).
"""

from __future__ import annotations

import numpy as np

from .commands import Checker, Command
from .isa import FIELDS, DType, Op
from .regions import Region

TABLE_ENTRIES = 256


class LookupCommand(Command):
    """`a` and `out` (rows, cols) int8, `table` (256,) int8."""

    __slots__ = ("rows", "cols", "a", "table", "out")

    @property
    def elements(self) -> int:
        return self.rows * self.cols


def decode_lookup(check: Checker, index: int, op: Op, record: list[int], tensors) -> LookupCommand:
    """LOOKUP: flags 0, sizes >= 1, A, the table and out inside the scratchpad."""
    del tensors
    fields = dict(zip(FIELDS[op], record))
    check.flags(fields["flags"], 0)
    rows, cols = fields["rows"], fields["cols"]
    check.positive(rows=rows, cols=cols)
    cmd = LookupCommand(index, op)
    cmd.rows, cmd.cols = rows, cols
    cmd.a = check.matrix("A", fields["a_addr"], rows, cols, fields["a_stride"], DType.INT8, written=False)
    cmd.table = check.region(Region("table", fields["table_addr"], (TABLE_ENTRIES,), (1,), np.dtype(np.int8)))
    cmd.out = check.matrix("out", fields["out_addr"], rows, cols, fields["out_stride"], DType.INT8, written=True)
    cmd.reads = (cmd.a, cmd.table)
    cmd.writes = (cmd.out,)
    return cmd


def execute_lookup(cmd: LookupCommand, spad: np.ndarray) -> None:
    """out = table[a + 128] over the tile, read entirely before it is written (in place is fine)."""
    table = cmd.table.view(spad).copy()
    values = cmd.a.view(spad).astype(np.int32) + 128
    cmd.out.view(spad)[...] = table[values]
