"""The two vector-unit intrinsics of RoPE in a GEMM's epilogue (kernels/gemm/rope_epilogue.py).

Stage: schedule and tensorize. The output tile holds whole periods of a `RotaryPattern`: every
column j reads its partner j + offset(j mod P) of the same period (rotate_half's other half in a
rotated head, itself elsewhere). Two intrinsics, two blocks of the kernel:

    rope_rotate:   Rot[i, j] = X[i, j + offset(j mod P)] * Sin[i, j]     one ELTWISE multiply per
                                                                         run of equal offsets
    rope_combine:  Out[i, j] = X[i, j] * Cos[i, j] + Rot[i, j]           ELTWISE multiply, add

X is the accumulator tile (or it plus the bias: an EPILOGUE first, its own block). Each output
is the RoPE kernel's (kernels/elementwise/rope.py) two products and add on the same float32
values in the same order, so the result is the same bits.
"""

from __future__ import annotations

import dataclasses

from tvm import tirx

from .builder import SPAD, Tile, intrinsic
from .vector_unit import eltwise_call


@dataclasses.dataclass(frozen=True)
class RotaryPattern:
    """Where each column's partner lies, the same in every period of `period` columns: `runs`
    ((first column, columns, offset), ...) cover 0 .. period - 1 in order; partner = j + offset,
    inside the period."""

    period: int
    runs: tuple

    def __post_init__(self):
        covered = 0
        for start, length, offset in self.runs:
            if start != covered or length < 1 or not (0 <= start + offset and start + length + offset <= self.period):
                raise ValueError(f"rotary runs {self.runs} do not cover a period of {self.period} with partners in it")
            covered += length
        if covered != self.period:
            raise ValueError(f"rotary runs {self.runs} do not cover a period of {self.period}")

    @property
    def name(self) -> str:
        """The pattern in an intrinsic's name."""
        return f"rot{self.period}_" + "_".join(f"{s}x{n}{o:+d}" for s, n, o in self.runs).replace("+", "p").replace("-", "m")

    def offset(self, d):
        """The TIR offset of the partner of column d of a period: a select over the runs."""
        value = tirx.const(self.runs[-1][2], "int32")
        for start, length, offset in reversed(self.runs[:-1]):
            value = tirx.Select(d < start + length, tirx.const(offset, "int32"), value)
        return value

    def partner(self, j, cols: int | None = None):
        """Column j's partner. Written in the form TVM's simplifier gives a tile's block once
        tensorize has moved the tile's offset out (the description must match it as written);
        `cols`: j is a column of a tile of that many, whose period terms fold away when it is
        one period. The outer floormod is the identity on d + offset(d): it bounds the select
        for TVM's region analysis, which would otherwise widen the tile by the largest offset."""
        if cols == self.period:
            return tirx.floormod(self.offset(j) + j, self.period)
        d = tirx.floormod(j, self.period)
        return tirx.floordiv(j, self.period) * self.period + tirx.floormod(self.offset(d) + d, self.period)

    def tile_runs(self, cols: int) -> list:
        """(first column, columns, offset) over a tile of `cols` (whole periods), neighbouring runs
        of one offset merged: one ELTWISE each."""
        merged = []
        for base in range(0, cols, self.period):
            for start, length, offset in self.runs:
                if merged and merged[-1][0] + merged[-1][1] == base + start and merged[-1][2] == offset:
                    merged[-1] = (merged[-1][0], merged[-1][1] + length, offset)
                else:
                    merged.append((base + start, length, offset))
        return merged


def _at(buffer, column):
    """A scratchpad operand `column` elements into `buffer`'s first row."""
    return (buffer.data, buffer.elem_offset + column)


def rope_rotate_intrin(rows: int, cols: int, pattern: RotaryPattern, scope: str = SPAD):
    """Rot = X[partner] * Sin over a rows x cols tile (cols whole periods): one ELTWISE per run."""
    if cols % pattern.period:
        raise ValueError(f"a rotary tile of {cols} columns holds no whole periods of {pattern.period}")

    def value(buffers, i, j):
        return buffers["X"][i, pattern.partner(j, cols)] * buffers["Sin"][i, j]

    def call(buffers, strides):
        x, sin, rot = buffers["X"], buffers["Sin"], buffers["Rot"]
        return [eltwise_call("multiply", "float32", rows, length, (_at(x, start + offset), strides["X"][0], 1),
                             (_at(sin, start), strides["Sin"][0], 1), (_at(rot, start), strides["Rot"][0]))
                for start, length, offset in pattern.tile_runs(cols)]

    return intrinsic([Tile("X", (rows, cols), "float32"), Tile("Sin", (rows, cols), "float32")],
                     Tile("Rot", (rows, cols), "float32"), "rot", value, call, scope=scope)


def rope_combine_intrin(rows: int, cols: int, scope: str = SPAD):
    """Out = X * Cos + Rot over a rows x cols tile: an ELTWISE multiply into Out, an add in place."""
    def value(buffers, i, j):
        return buffers["X"][i, j] * buffers["Cos"][i, j] + buffers["Rot"][i, j]

    def call(buffers, strides):
        out = (buffers["Out"], strides["Out"][0])
        return [eltwise_call("multiply", "float32", rows, cols, (buffers["X"], strides["X"][0], 1),
                             (buffers["Cos"], strides["Cos"][0], 1), out),
                eltwise_call("add", "float32", rows, cols, (*out, 1), (buffers["Rot"], strides["Rot"][0], 1), out)]

    return intrinsic([Tile("X", (rows, cols), "float32"), Tile("Cos", (rows, cols), "float32"),
                      Tile("Rot", (rows, cols), "float32")], Tile("Out", (rows, cols), "float32"), "epi", value, call,
                     scope=scope)
