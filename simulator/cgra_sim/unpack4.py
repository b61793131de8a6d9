"""UNPACK4: 4-bit weights, packed two per byte, into a float32 tile on the vector unit.

Stage: simulator (decode, execute; the timing layer calls `cost.unpack4_cycles`). In: an UNPACK4
record (isa.py) and the scratchpad. Out: the decoded command (its regions checked) and, executed,
the float32 tile `out[i, j] = float32(q[i, j] - z[g, j]) * s[g, j]`, g = i // group.

The layout is onnxruntime's `MatMulNBits` (com.microsoft): weight column j (an output channel)
is a run of bytes holding its K rows two per byte, row 2b in the low nibble of byte b and row
2b + 1 in the high one; its scales are a run of float32, one per group of `group` rows; its
zero points (optional, UNPACK4_ZERO_POINTS) are nibbles packed like the weights, one per group,
8 without them. The tile is written row-major (rows = K, the GEMM's B operand), so a GEMM reads
it as it reads any float32 weight tile: the weights cross DRAM as half a byte each and become
float32 only inside the scratchpad, on the way into the PE array.

Why a command of its own: no other command turns integers into float32, and the unpack needs a
shift, a mask, a subtract and a multiply per element, each of which would otherwise be a pass
over the tile. The vector lanes run it as one pipelined pass (cost.unpack4_cycles).

With UNPACK4_INT8 (stream v11) the nibbles are signed int4 (two's complement, -8..7: ONNX's INT4,
QDQ models' 4-bit weights) and the tile is int8 `out[i, j] = q[i, j]`, unscaled: an int8 x int4
GEMM's B operand, whose per-channel scales the requantising EPILOGUE applies. No zero points
(their words 0: onnxruntime's quantizer writes int4 weights with zero point 0); the scale words
are not read (the code generator passes every address operand a buffer).
"""

from __future__ import annotations

import numpy as np

from .commands import Checker, Command
from .isa import FIELDS, UNPACK4_INT8, UNPACK4_ZERO_POINTS, DType, Op
from .regions import Region

#: The zero point of every group without UNPACK4_ZERO_POINTS (onnxruntime's default for 4 bits).
DEFAULT_ZERO_POINT = 8


class Unpack4Command(Command):
    """`a` (cols, ceil(rows / 2)) packed bytes, `scale` (cols, groups) float32, `zero` (cols,
    ceil(groups / 2)) packed bytes or None, `out` (rows, cols) float32; with UNPACK4_INT8 `scale` and
    `zero` None and `out` int8 (`signed`)."""

    __slots__ = ("rows", "cols", "group", "a", "scale", "zero", "out", "signed")

    @property
    def elements(self) -> int:
        return self.rows * self.cols

    @property
    def groups(self) -> int:
        return -(-self.rows // self.group)


def _bytes(check: Checker, name: str, addr: int, cols: int, per_col: int, col_stride: int) -> Region:
    if col_stride < per_col:
        check.fail(f"{name} column stride {col_stride} is smaller than the {per_col} bytes of a column")
    return check.region(Region(name, addr, (cols, per_col), (col_stride, 1), np.dtype(np.uint8)))


def decode_unpack4(check: Checker, index: int, op: Op, record: list[int], tensors) -> Unpack4Command:
    """UNPACK4: known flags (zero-point words 0 without theirs and with UNPACK4_INT8, which reads
    no scale), sizes >= 1, every operand inside the scratchpad, columns that do not overlap."""
    fields = dict(zip(FIELDS[op], record))
    flags = fields["flags"]
    check.flags(flags, UNPACK4_ZERO_POINTS | UNPACK4_INT8)
    rows, cols, group = fields["rows"], fields["cols"], fields["group"]
    check.positive(rows=rows, cols=cols, group=group)
    cmd = Unpack4Command(index, op)
    cmd.rows, cmd.cols, cmd.group, cmd.signed = rows, cols, group, bool(flags & UNPACK4_INT8)
    cmd.a = _bytes(check, "A", fields["a_addr"], cols, -(-rows // 2), fields["a_col_stride"])
    if cmd.signed:
        _decode_int8(check, cmd, fields)
    else:
        _decode_float32(check, cmd, fields)
    cmd.reads = tuple(r for r in (cmd.a, cmd.scale, cmd.zero) if r is not None)
    cmd.writes = (cmd.out,)
    return cmd


def _decode_int8(check: Checker, cmd: Unpack4Command, fields: dict) -> None:
    """UNPACK4_INT8's operands: no scale, no zero points, an int8 tile."""
    if fields["flags"] & UNPACK4_ZERO_POINTS or fields["zero_addr"] or fields["zero_col_stride"]:
        check.fail("flag UNPACK4_INT8 takes no zero points: UNPACK4_ZERO_POINTS must be off and "
                   "zero_addr, zero_col_stride 0 (the scale words are not read)")
    cmd.scale = cmd.zero = None
    cmd.out = check.matrix("out", fields["out_addr"], cmd.rows, cmd.cols, fields["out_stride"], DType.INT8,
                           written=True)


def _decode_float32(check: Checker, cmd: Unpack4Command, fields: dict) -> None:
    """The float32 unpack's operands: scales, optional zero points, a float32 tile."""
    groups, cols = cmd.groups, cmd.cols
    scale_stride = fields["scale_col_stride"]
    if scale_stride < groups:
        check.fail(f"scale column stride {scale_stride} is smaller than the column's {groups} groups")
    size = DType.FLOAT32.itemsize
    cmd.scale = check.region(Region("scale", fields["scale_addr"], (cols, groups), (scale_stride * size, size),
                                    np.dtype(np.float32)))
    if fields["flags"] & UNPACK4_ZERO_POINTS:
        cmd.zero = _bytes(check, "zero", fields["zero_addr"], cols, -(-groups // 2), fields["zero_col_stride"])
    elif fields["zero_addr"] or fields["zero_col_stride"]:
        check.fail("zero_addr / zero_col_stride are set but flag UNPACK4_ZERO_POINTS is off: "
                   "words of a disabled operand must be 0")
    else:
        cmd.zero = None
    cmd.out = check.matrix("out", fields["out_addr"], cmd.rows, cmd.cols, fields["out_stride"], DType.FLOAT32,
                           written=True)


def nibbles(packed: np.ndarray, count: int) -> np.ndarray:
    """(cols, bytes) uint8 -> (cols, count) int32: byte b's low nibble, then its high one."""
    both = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
    return both[:, :count].astype(np.int32)


def dequantize(packed: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, rows: int, group: int) -> np.ndarray:
    """The (rows, cols) float32 tile of UNPACK4's operands as numpy arrays (cols-major inputs)."""
    groups = scale.shape[1]
    q = nibbles(packed, rows)
    z = nibbles(zero, groups) if zero is not None else np.full(scale.shape, DEFAULT_ZERO_POINT, np.int32)
    per_row = np.arange(rows) // group
    return ((q - z[:, per_row]).astype(np.float32) * scale[:, per_row].astype(np.float32)).T


def signed_nibbles(packed: np.ndarray, rows: int) -> np.ndarray:
    """(cols, bytes) uint8 -> the (rows, cols) int8 tile of their nibbles read as signed int4."""
    q = nibbles(packed, rows)
    return np.where(q >= 8, q - 16, q).astype(np.int8).T


def pack_signed(weights: np.ndarray) -> np.ndarray:
    """(rows, cols) int4 values (-8..7) -> (cols, ceil(rows / 2)) packed bytes as int8 bits, row 2b
    in byte b's low nibble (ONNX's INT4 layout along each column; the inverse of `signed_nibbles`)."""
    cols = np.asarray(weights, np.int64).T & 0x0F
    if cols.shape[1] % 2:
        cols = np.concatenate([cols, np.zeros((cols.shape[0], 1), np.int64)], axis=1)
    return (cols[:, 0::2] | (cols[:, 1::2] << 4)).astype(np.uint8).view(np.int8)


def execute_unpack4(cmd: Unpack4Command, spad: np.ndarray) -> None:
    """out = float32(q - z) * s (or int8 q with UNPACK4_INT8) over the tile, read entirely before
    it is written."""
    if cmd.signed:
        cmd.out.view(spad)[...] = signed_nibbles(cmd.a.view(spad).copy(), cmd.rows)
        return
    zero = cmd.zero.view(spad).copy() if cmd.zero is not None else None
    tile = dequantize(cmd.a.view(spad).copy(), cmd.scale.view(spad).copy(), zero, cmd.rows, cmd.group)
    cmd.out.view(spad)[...] = tile
