"""Decoding of a command stream, with every check that needs only one command at a time.

Stage: simulator, step 1 (decode -> dataflow check -> execute -> time). In: the raw records
(int64 array of shape (n, isa.RECORD_WORDS), or the same little-endian bytes), the host tensors
bound to the slots and the hardware description. Out: one decoded command per record
(`DmaCommand`, `GemmCommand`, `DepthwiseCommand`, `FillCommand`, `EpilogueCommand`,
`PoolCommand`, `EltwiseCommand`), each naming
the scratchpad `Region`s it reads and writes, so later steps never look at record words again.

Checks made here (each failure is a `CommandError` naming the command, its kind and the range):
known opcode and flags, unused words zero, dtypes known and combined as isa.ACC_DTYPE says, sizes
>= 1, slots in range, every DMA coordinate inside the tensor plus its halo, every scratchpad byte
inside [0, spad_bytes), and no command writing one element twice (a load whose scratchpad strides
alias, a store whose loops revisit a tensor element, a 2-D destination whose rows overlap), since
the result would then depend on an order the ISA does not define.
"""

from __future__ import annotations

import math

import numpy as np

from .arch import HardwareDescription
from .box import DmaBox
from .errors import CommandError, LaunchError
from .isa import (ACC_DTYPE, BOX_DIMS, EPILOGUE_BIAS, EPILOGUE_CLIP, EPILOGUE_RELU, EPILOGUE_REQUANTISE,
                  EPILOGUE_RESIDUAL, FIELDS, GEMM_ACCUMULATE, POOL_AVERAGE, RECORD_WORDS, UNIT_OF, DType,
                  EltwiseFunc, Op)
from .regions import Region

#: A DMA box may have max(spad_bytes, this) points: far above what a scratchpad-sized box needs
#: (a load cannot exceed the scratchpad), low enough that checking and moving it stays cheap.
MIN_BOX_POINT_LIMIT = 1 << 22
NUMPY_DTYPE = {dtype: np.dtype(dtype.numpy_name) for dtype in DType}
_DTYPE_OF_NUMPY = {np_dtype: dtype for dtype, np_dtype in NUMPY_DTYPE.items()}
_OPS = {int(op): op for op in Op}
_DMA_FLAGS, _DMA_SLOT, _DMA_SPAD_ADDR = (FIELDS[Op.DMA_LOAD].index(name)
                                         for name in ("flags", "slot", "spad_addr"))


class Command:
    """What every decoded command has: its place in the stream and its scratchpad footprint."""

    # repeat_of: index of the first earlier command with the same record (-1: none). Decoding
    # depends only on the record, the tensors' shapes and the arch, all fixed within a stream,
    # so a repeated record shares the first one's decoded fields (its regions included).
    __slots__ = ("index", "op", "unit", "reads", "writes", "repeat_of")

    def __init__(self, index: int, op: Op):
        self.index = index
        self.op = op
        self.unit = UNIT_OF[op]
        self.reads: tuple[Region, ...] = ()
        self.writes: tuple[Region, ...] = ()
        self.repeat_of = -1

    def repeated_at(self, index: int) -> "Command":
        """A copy of this decoded command at stream position `index` (same record)."""
        cls = type(self)
        names = _SLOTS.get(cls)
        if names is None:
            names = _SLOTS[cls] = tuple(name for klass in cls.__mro__
                                        for name in getattr(klass, "__slots__", ()))
        copy = object.__new__(cls)
        for name in names:
            setattr(copy, name, getattr(self, name))
        copy.index, copy.repeat_of = index, self.index
        return copy


_SLOTS: dict = {}  # Command subclass -> every slot name along its MRO


class DmaCommand(Command):
    """DMA_LOAD / DMA_STORE between host tensor `slot` and the scratchpad `region` (the box)."""

    # inner: per loop, the slice of the box's in-bounds points (box.inbounds_ranges) when the
    # box reaches into the halo and they form a non-empty sub-box; None otherwise.
    # host_view: the box (halo-free) or that sub-box as a view on the host tensor, else None.
    __slots__ = ("slot", "tensor", "box", "region", "halo_free", "host_points", "inner", "host_view")

    @property
    def box_bytes(self) -> int:
        """Bytes the engine streams: every box element, halo included."""
        return self.box.num_points * self.region.dtype.itemsize

    @property
    def host_bytes(self) -> int:
        """Bytes actually moved to or from host memory (halo elements excluded)."""
        return self.host_points * self.region.dtype.itemsize

    def inbounds_mask(self):
        """Where the box lies inside the tensor; None when it lies entirely inside."""
        return None if self.halo_free else self.box.inbounds_mask(self.tensor.shape)


class GemmCommand(Command):
    """acc (+)= A @ B with A (m, k), B (k, n), acc (m, n) in the accumulator dtype."""

    __slots__ = ("dtype", "m", "n", "k", "accumulate", "a", "b", "acc")

    @property
    def macs(self) -> int:
        return self.m * self.n * self.k


class DepthwiseCommand(Command):
    """acc[y, x, c] (+)= sum over taps (ry, rx) of A[y, x, ry, rx, c] * B[ry, rx, c]: `a` is the
    5-D window view (oh, ow, kh, kw, n), whose taps overlap; `b` (kh, kw, n); `acc` (oh, ow, n)
    in the accumulator dtype. Each PE computes one output element over the taps."""

    __slots__ = ("dtype", "oh", "ow", "n", "kh", "kw", "accumulate", "a", "b", "acc")

    @property
    def m(self) -> int:
        """Output pixels: the rows of the PE array's work."""
        return self.oh * self.ow

    @property
    def k(self) -> int:
        """Taps: MACs per output element."""
        return self.kh * self.kw

    @property
    def macs(self) -> int:
        return self.m * self.n * self.k


class PoolCommand(Command):
    """out[y, x, c] = max (or, averaging, sum / count) over the window's taps: `a` is the 5-D
    window view (oh, ow, kh, kw, n), `out` (oh, ow, n) in the input dtype. `valid` holds, per
    tap, whether it lies inside the valid rectangle, shape (oh, ow, kh, kw, 1); `count` the
    divisor per output, float32 (oh, ow, 1), or None for max. Both depend only on the record."""

    __slots__ = ("dtype", "average", "oh", "ow", "n", "kh", "kw", "a", "out", "valid", "count")

    @property
    def taps(self) -> int:
        """Window elements the lanes step through: every tap of every output, valid or not."""
        return self.oh * self.ow * self.n * self.kh * self.kw


class FillCommand(Command):
    """region[:, :] = value."""

    __slots__ = ("region", "value")


class EpilogueCommand(Command):
    """out = requantise(clip(relu(acc + bias + residual))); `bias`, `residual` are None without
    their flag, `clip` is None or the (lo, hi) bounds as numpy scalars of the accumulator dtype,
    `scale` None or the (1, n) float32 row of a requantisation to int8 around `zero_point`."""

    __slots__ = ("acc", "bias", "residual", "out", "relu", "clip", "scale", "zero_point")


class EltwiseCommand(Command):
    """out = func(a, b) elementwise over a (rows, cols) tile; `a` and `b` are strided views whose
    zero strides broadcast them, `out` a (rows, cols) region with adjacent columns."""

    __slots__ = ("func", "dtype", "a", "b", "out")

    @property
    def elements(self) -> int:
        return self.out.shape[0] * self.out.shape[1]


def as_records(commands) -> np.ndarray:
    """The stream as an int64 array of shape (n, RECORD_WORDS); accepts bytes or an array."""
    if isinstance(commands, (bytes, bytearray, memoryview)):
        raw = bytes(commands)
        if len(raw) % (8 * RECORD_WORDS):
            raise LaunchError(f"command buffer holds {len(raw)} bytes, not a whole number of "
                              f"{8 * RECORD_WORDS}-byte records")
        return np.frombuffer(raw, dtype="<i8").reshape(-1, RECORD_WORDS)
    records = np.asarray(commands)
    if records.size == 0:
        return np.zeros((0, RECORD_WORDS), dtype=np.int64)
    if records.dtype.kind not in "iu":
        raise LaunchError(f"commands must be int64 records, got dtype {records.dtype}")
    if records.ndim != 2 or records.shape[1] != RECORD_WORDS:
        raise LaunchError(f"commands must have shape (n, {RECORD_WORDS}), got {records.shape}")
    return records.astype(np.int64, copy=False)


def check_tensors(tensors) -> list[np.ndarray]:
    """The host tensors, checked: numpy arrays of rank 1..4, C-contiguous, of an ISA dtype."""
    checked = []
    for slot, tensor in enumerate(tensors):
        if not isinstance(tensor, np.ndarray):
            raise LaunchError(f"slot {slot}: expected a numpy array, got {type(tensor).__name__}")
        if tensor.dtype not in _DTYPE_OF_NUMPY:
            raise LaunchError(f"slot {slot}: dtype {tensor.dtype} is not one of "
                              f"{', '.join(d.numpy_name for d in DType)}")
        if not 1 <= tensor.ndim <= BOX_DIMS:
            raise LaunchError(f"slot {slot}: rank {tensor.ndim} is outside 1..{BOX_DIMS}")
        if not tensor.flags.c_contiguous:
            raise LaunchError(f"slot {slot}: tensor must be C-contiguous (pass np.ascontiguousarray)")
        checked.append(tensor)
    return checked


class _Checker:
    """Raises `CommandError`s for the command being decoded and builds checked regions."""

    __slots__ = ("index", "op", "spad_bytes", "arch")

    def __init__(self, arch: HardwareDescription):
        self.arch = arch
        self.spad_bytes = arch.spad_bytes
        self.index = 0
        self.op = "?"

    def fail(self, problem: str):
        raise CommandError(self.index, self.op, problem)

    def flags(self, flags: int, known: int):
        if flags & ~known:
            self.fail(f"flags {flags:#x} set unknown bits {flags & ~known:#x} (known: {known:#x})")

    def positive(self, **sizes: int):
        for name, value in sizes.items():
            if value < 1:
                self.fail(f"{name} must be >= 1, got {value}")

    def dtype(self, field: str, code: int, allowed) -> DType:
        if code not in {int(d) for d in allowed}:
            names = ", ".join(f"{d.name}={int(d)}" for d in allowed)
            self.fail(f"{field} code {code} is not allowed here (allowed: {names})")
        return DType(code)

    def pe_dtype(self, code: int) -> DType:
        """The input dtype of a PE-array command: one the ISA accumulates and the arch computes."""
        dtype = self.dtype("dtype", code, tuple(ACC_DTYPE))
        if dtype.numpy_name not in self.arch.macs_per_pe:
            self.fail(f"the PE array of '{self.arch.name}' has no {dtype.numpy_name} MACs "
                      f"(it computes on {', '.join(self.arch.dtypes)})")
        return dtype

    def region(self, region: Region) -> Region:
        """`region`, after checking it lies inside the scratchpad."""
        if region.lo < 0 or region.hi > self.spad_bytes:
            where = "start below address 0" if region.lo < 0 else \
                f"exceed the {self.spad_bytes}-byte scratchpad"
            self.fail(f"scratchpad bytes [{region.lo}, {region.hi}) of {region.name} {where}")
        return region

    def matrix(self, name: str, addr: int, rows: int, cols: int, stride: int, dtype: DType,
               written: bool) -> Region:
        """A checked (rows, cols) region with a row stride in elements."""
        if stride < 0:
            self.fail(f"{name} row stride must be >= 0, got {stride}")
        if written and rows > 1 and stride < cols:
            self.fail(f"{name} row stride {stride} is smaller than its {cols} columns: "
                      "the rows it writes would overlap")
        size = dtype.itemsize
        return self.region(Region(name, addr, (rows, cols), (stride * size, size), NUMPY_DTYPE[dtype]))


def _decode_dma(check: _Checker, index: int, op: Op, record: list[int], tensors) -> DmaCommand:
    flags, slot, spad_addr = record[_DMA_FLAGS], record[_DMA_SLOT], record[_DMA_SPAD_ADDR]
    check.flags(flags, 0)
    if not 0 <= slot < len(tensors):
        check.fail(f"slot {slot} is out of range: the launch binds {len(tensors)} tensors")
    tensor = tensors[slot]
    box = DmaBox(record)
    if min(box.extents) < 1:
        check.positive(**{f"extent{loop}": box.extents[loop] for loop in range(BOX_DIMS)})
    for loop, tdim in enumerate(box.tdims):
        if not 0 <= tdim < tensor.ndim:
            check.fail(f"tdim{loop} = {tdim} is not a dimension of slot {slot} (rank {tensor.ndim})")
    halo_free = _check_coordinates(check, box, slot, tensor.shape)
    limit = max(check.spad_bytes, MIN_BOX_POINT_LIMIT)
    if box.num_points > limit:
        check.fail(f"the box has {box.num_points} points, more than the simulator's limit of {limit}")
    dtype = tensor.dtype
    strides = tuple(s * dtype.itemsize for s in box.sstrides)
    region = check.region(Region("box", spad_addr, box.extents, strides, dtype))
    if op is Op.DMA_STORE and not box.tensor_injective(tensor.ndim):
        check.fail(f"the box revisits elements of slot {slot}: a store must write each element once")
    if op is Op.DMA_STORE and not tensor.flags.writeable:
        check.fail(f"slot {slot} is read-only and cannot be stored to")
    if op is Op.DMA_LOAD and not box.spad_injective():
        check.fail(f"scratchpad strides {box.sstrides} alias: the load would write elements twice")
    cmd = DmaCommand(index, op)
    cmd.slot, cmd.tensor, cmd.box, cmd.halo_free, cmd.region = slot, tensor, box, halo_free, region
    ranges = None if halo_free else box.inbounds_ranges(tensor.shape)
    if ranges is not None:
        cmd.host_points = math.prod(stop - start for start, stop in ranges)
    else:
        cmd.host_points = box.num_points if halo_free else box.inbounds_points(tensor.shape)
    cmd.inner = None if ranges is None or cmd.host_points == 0 else \
        tuple(slice(start, stop) for start, stop in ranges)
    cmd.host_view = box.tensor_view(tensor, cmd.inner) if halo_free or cmd.inner else None
    if op is Op.DMA_LOAD:
        cmd.writes = (cmd.region,)
    else:
        cmd.reads = (cmd.region,)
    return cmd


def _check_coordinates(check: _Checker, box: DmaBox, slot: int, shape) -> bool:
    """Checks the box against the tensor plus halo; returns whether it avoids the halo."""
    halo_free = True
    for dim in range(BOX_DIMS):
        if dim >= len(shape):
            if box.origin[dim] or box.pad_lo[dim] or box.pad_hi[dim]:
                check.fail(f"origin/pad words of dimension {dim} must be 0: slot {slot} has rank "
                           f"{len(shape)}")
            continue
        lo_pad, hi_pad = box.pad_lo[dim], box.pad_hi[dim]
        if lo_pad < 0 or hi_pad < 0:
            check.fail(f"halo of dimension {dim} must be >= 0, got pad_lo {lo_pad}, pad_hi {hi_pad}")
        low, high = box.coordinate_range(dim)
        if low < -lo_pad or high >= shape[dim] + hi_pad:
            check.fail(f"coordinates [{low}, {high + 1}) of dimension {dim} leave slot {slot}'s range "
                       f"[{-lo_pad}, {shape[dim] + hi_pad}) (size {shape[dim]}, halo {lo_pad} below, "
                       f"{hi_pad} above)")
        halo_free = halo_free and low >= 0 and high < shape[dim]
    return halo_free


def _decode_gemm(check: _Checker, index: int, op: Op, record: list[int], tensors) -> GemmCommand:
    (_, flags, dtype_code, m, n, k, a_addr, a_stride, b_addr, b_stride, acc_addr,
     acc_stride) = record[:len(FIELDS[op])]
    check.flags(flags, GEMM_ACCUMULATE)
    dtype = check.pe_dtype(dtype_code)
    check.positive(m=m, n=n, k=k)
    cmd = GemmCommand(index, op)
    cmd.dtype, cmd.m, cmd.n, cmd.k = dtype, m, n, k
    cmd.accumulate = bool(flags & GEMM_ACCUMULATE)
    cmd.a = check.matrix("A", a_addr, m, k, a_stride, dtype, written=False)
    cmd.b = check.matrix("B", b_addr, k, n, b_stride, dtype, written=False)
    cmd.acc = check.matrix("acc", acc_addr, m, n, acc_stride, ACC_DTYPE[dtype], written=True)
    cmd.reads = (cmd.a, cmd.b, cmd.acc) if cmd.accumulate else (cmd.a, cmd.b)
    cmd.writes = (cmd.acc,)
    return cmd


def _decode_depthwise(check: _Checker, index: int, op: Op, record: list[int],
                      tensors) -> DepthwiseCommand:
    (_, flags, dtype_code, oh, ow, n, kh, kw, a_addr, a_y, a_x, a_ry, a_rx, b_addr, b_ry, b_rx,
     acc_addr, acc_y, acc_x) = record[:len(FIELDS[op])]
    check.flags(flags, GEMM_ACCUMULATE)
    dtype = check.pe_dtype(dtype_code)
    check.positive(oh=oh, ow=ow, n=n, kh=kh, kw=kw)
    strides = dict(a_y_stride=a_y, a_x_stride=a_x, a_ry_stride=a_ry, a_rx_stride=a_rx,
                   b_ry_stride=b_ry, b_rx_stride=b_rx, acc_y_stride=acc_y, acc_x_stride=acc_x)
    negative = {name: value for name, value in strides.items() if value < 0}
    if negative:
        check.fail(f"strides must be >= 0, got {negative}")
    if (oh > 1 and acc_y < ow * acc_x) or (ow > 1 and acc_x < n):
        check.fail(f"acc strides (y {acc_y}, x {acc_x}) overlap its {oh} x {ow} x {n} elements")
    cmd = DepthwiseCommand(index, op)
    cmd.dtype, cmd.oh, cmd.ow, cmd.n, cmd.kh, cmd.kw = dtype, oh, ow, n, kh, kw
    cmd.accumulate = bool(flags & GEMM_ACCUMULATE)
    size, acc_size = dtype.itemsize, ACC_DTYPE[dtype].itemsize
    cmd.a = check.region(Region("A", a_addr, (oh, ow, kh, kw, n),
                                tuple(s * size for s in (a_y, a_x, a_ry, a_rx, 1)), NUMPY_DTYPE[dtype]))
    cmd.b = check.region(Region("B", b_addr, (kh, kw, n), (b_ry * size, b_rx * size, size),
                                NUMPY_DTYPE[dtype]))
    cmd.acc = check.region(Region("acc", acc_addr, (oh, ow, n), (acc_y * acc_size, acc_x * acc_size, acc_size),
                                  NUMPY_DTYPE[ACC_DTYPE[dtype]]))
    cmd.reads = (cmd.a, cmd.b, cmd.acc) if cmd.accumulate else (cmd.a, cmd.b)
    cmd.writes = (cmd.acc,)
    return cmd


def _decode_pool(check: _Checker, index: int, op: Op, record: list[int], tensors) -> PoolCommand:
    fields = dict(zip(FIELDS[op], record))
    flags, average = fields["flags"], bool(fields["flags"] & POOL_AVERAGE)
    check.flags(flags, POOL_AVERAGE)
    dtype = check.dtype("dtype", fields["dtype"], (DType.FLOAT32,) if average else tuple(DType))
    oh, ow, n, kh, kw = (fields[name] for name in ("oh", "ow", "n", "kh", "kw"))
    check.positive(oh=oh, ow=ow, n=n, kh=kh, kw=kw, stride_y=fields["stride_y"], stride_x=fields["stride_x"],
                   dilation_y=fields["dilation_y"], dilation_x=fields["dilation_x"])
    strides = {name: fields[name] for name in ("a_row_stride", "a_col_stride", "out_y_stride", "out_x_stride")}
    negative = {name: value for name, value in strides.items() if value < 0}
    if negative:
        check.fail(f"strides must be >= 0, got {negative}")
    out_y, out_x = strides["out_y_stride"], strides["out_x_stride"]
    if (oh > 1 and out_y < ow * out_x) or (ow > 1 and out_x < n):
        check.fail(f"out strides (y {out_y}, x {out_x}) overlap its {oh} x {ow} x {n} elements")
    cmd = PoolCommand(index, op)
    cmd.dtype, cmd.average, cmd.oh, cmd.ow, cmd.n, cmd.kh, cmd.kw = dtype, average, oh, ow, n, kh, kw
    size, row, col = dtype.itemsize, strides["a_row_stride"], strides["a_col_stride"]
    sy, sx, dy, dx = (fields[name] for name in ("stride_y", "stride_x", "dilation_y", "dilation_x"))
    cmd.a = check.region(Region("A", fields["a_addr"], (oh, ow, kh, kw, n),
                                tuple(s * size for s in (sy * row, sx * col, dy * row, dx * col, 1)),
                                NUMPY_DTYPE[dtype]))
    cmd.out = check.region(Region("out", fields["out_addr"], (oh, ow, n),
                                  (out_y * size, out_x * size, size), NUMPY_DTYPE[dtype]))
    positions = (np.arange(oh)[:, None] * sy + np.arange(kh)[None, :] * dy,
                 np.arange(ow)[:, None] * sx + np.arange(kw)[None, :] * dx)  # (oh, kh), (ow, kw)
    rows, cols = _pool_rectangle(check, fields, "valid", positions)
    cmd.valid = (rows[:, None, :, None] & cols[None, :, None, :])[..., None]
    cmd.count = None
    if average:
        rows, cols = _pool_rectangle(check, fields, "count", positions)
        counts = rows.sum(axis=1)[:, None] * cols.sum(axis=1)[None, :]
        cmd.count = np.maximum(counts, 1).astype(np.float32)[..., None]
    elif any(fields[f"count_{edge}"] for edge in ("y_lo", "y_hi", "x_lo", "x_hi")):
        check.fail("count_* words are set but POOL_AVERAGE is off: words of a disabled operand must be 0")
    cmd.reads, cmd.writes = (cmd.a,), (cmd.out,)
    return cmd


def _pool_rectangle(check: _Checker, fields: dict, name: str, positions):
    """Per (output row, tap row) and (output column, tap column): whether the tap's window
    position lies inside the `name` rectangle (0 <= lo <= hi on each axis)."""
    inside = []
    for axis, position in zip("yx", positions):
        lo, hi = fields[f"{name}_{axis}_lo"], fields[f"{name}_{axis}_hi"]
        if not 0 <= lo <= hi:
            check.fail(f"{name} rectangle {axis} range [{lo}, {hi}) is not 0 <= lo <= hi")
        inside.append((position >= lo) & (position < hi))
    return inside


def _fill_value(check: _Checker, dtype: DType, bits: int):
    """The constant of a FILL: an integer in range of `dtype`, or a float32 bit pattern."""
    if dtype is DType.FLOAT32:
        return np.array([bits & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]
    info = np.iinfo(NUMPY_DTYPE[dtype])
    if not info.min <= bits <= info.max:
        check.fail(f"value {bits} does not fit {dtype.numpy_name} [{info.min}, {info.max}]")
    return NUMPY_DTYPE[dtype].type(bits)


def _decode_fill(check: _Checker, index: int, op: Op, record: list[int], tensors) -> FillCommand:
    _, flags, dtype_code, addr, rows, cols, stride, bits = record[:len(FIELDS[op])]
    check.flags(flags, 0)
    dtype = check.dtype("dtype", dtype_code, tuple(DType))
    check.positive(rows=rows, cols=cols)
    cmd = FillCommand(index, op)
    cmd.region = check.matrix("region", addr, rows, cols, stride, dtype, written=True)
    cmd.value = _fill_value(check, dtype, bits)
    cmd.writes = (cmd.region,)
    return cmd


def _decode_epilogue(check: _Checker, index: int, op: Op, record: list[int],
                     tensors) -> EpilogueCommand:
    (_, flags, acc_code, out_code, m, n, acc_addr, acc_stride, bias_addr, out_addr,
     out_stride) = record[:11]
    check.flags(flags, EPILOGUE_BIAS | EPILOGUE_RELU | EPILOGUE_RESIDUAL | EPILOGUE_CLIP | EPILOGUE_REQUANTISE)
    requantise = bool(flags & EPILOGUE_REQUANTISE)
    acc_dtype = check.dtype("acc_dtype", acc_code, (DType.INT32,) if requantise else tuple(ACC_DTYPE.values()))
    out_dtype = check.dtype("out_dtype", out_code, (DType.INT8,) if requantise else (acc_dtype,))
    check.positive(m=m, n=n)
    cmd = EpilogueCommand(index, op)
    cmd.acc = check.matrix("acc", acc_addr, m, n, acc_stride, acc_dtype, written=False)
    cmd.bias = None
    if flags & EPILOGUE_BIAS:
        cmd.bias = check.matrix("bias", bias_addr, 1, n, n, acc_dtype, written=False)
    cmd.residual = _epilogue_residual(check, flags, record, m, n, acc_dtype)
    cmd.clip = _epilogue_clip(check, flags, record, acc_dtype)
    cmd.scale, cmd.zero_point = _epilogue_requantise(check, flags, record, n)
    cmd.out = check.matrix("out", out_addr, m, n, out_stride, out_dtype, written=True)
    cmd.relu = bool(flags & EPILOGUE_RELU)
    cmd.reads = tuple(r for r in (cmd.acc, cmd.bias, cmd.residual, cmd.scale) if r is not None)
    cmd.writes = (cmd.out,)
    return cmd


def _unused_when_off(check: _Checker, flags: int, flag: int, record: list[int], names) -> bool:
    """Whether `flag` is set; without it its words must be 0 (a stale operand is a bug upstream)."""
    if flags & flag:
        return True
    for name in names:
        value = record[FIELDS[Op.EPILOGUE].index(name)]
        if value:
            check.fail(f"{name} is {value} but flag {flag:#x} is off: words of a disabled operand must be 0")
    return False


def _epilogue_residual(check: _Checker, flags: int, record: list[int], m: int, n: int, dtype: DType):
    """The residual tile (m x n, acc dtype, its own row stride), or None without EPILOGUE_RESIDUAL."""
    names = ("residual_addr", "residual_stride")
    if not _unused_when_off(check, flags, EPILOGUE_RESIDUAL, record, names):
        return None
    addr, stride = (record[FIELDS[Op.EPILOGUE].index(name)] for name in names)
    return check.matrix("residual", addr, m, n, stride, dtype, written=False)


def _epilogue_clip(check: _Checker, flags: int, record: list[int], dtype: DType):
    """(lo, hi) in the acc dtype, or None without EPILOGUE_CLIP. Bounds are FILL-style value bits;
    lo <= hi and neither NaN, so min(max(x, lo), hi) == max(min(x, hi), lo): the order of the two
    comparisons (which differs between frameworks) cannot change a result."""
    names = ("clip_lo_bits", "clip_hi_bits")
    if not _unused_when_off(check, flags, EPILOGUE_CLIP, record, names):
        return None
    lo, hi = (_fill_value(check, dtype, record[FIELDS[Op.EPILOGUE].index(name)]) for name in names)
    if np.isnan(lo) or np.isnan(hi) or not lo <= hi:
        check.fail(f"clip bounds [{lo}, {hi}] are not an ordered pair of numbers (need lo <= hi, no NaN)")
    return lo, hi


def _decode_eltwise(check: _Checker, index: int, op: Op, record: list[int], tensors) -> EltwiseCommand:
    (_, flags, func, dtype_code, rows, cols, a_addr, a_row, a_col, b_addr, b_row, b_col, out_addr,
     out_stride) = record[:len(FIELDS[op])]
    check.flags(flags, 0)
    if func not in {int(f) for f in EltwiseFunc}:
        check.fail(f"func {func} is not an elementwise function (known: "
                   f"{', '.join(f'{f.name}={int(f)}' for f in EltwiseFunc)})")
    dtype = check.dtype("dtype", dtype_code, tuple(DType))
    check.positive(rows=rows, cols=cols)
    strides = dict(a_row_stride=a_row, a_col_stride=a_col, b_row_stride=b_row, b_col_stride=b_col)
    negative = {name: value for name, value in strides.items() if value < 0}
    if negative:
        check.fail(f"strides must be >= 0, got {negative}")
    size, np_dtype = dtype.itemsize, NUMPY_DTYPE[dtype]
    cmd = EltwiseCommand(index, op)
    cmd.func, cmd.dtype = EltwiseFunc(func), dtype
    cmd.a = check.region(Region("A", a_addr, (rows, cols), (a_row * size, a_col * size), np_dtype))
    cmd.b = check.region(Region("B", b_addr, (rows, cols), (b_row * size, b_col * size), np_dtype))
    cmd.out = check.matrix("out", out_addr, rows, cols, out_stride, dtype, written=True)
    cmd.reads = (cmd.a, cmd.b)
    cmd.writes = (cmd.out,)
    return cmd


def _epilogue_requantise(check: _Checker, flags: int, record: list[int], n: int):
    """(scale row, zero point) of a requantisation to int8, or (None, 0) without
    EPILOGUE_REQUANTISE: the scale a (1, n) float32 region, the zero point an int8 value."""
    names = ("scale_addr", "out_zero_point")
    if not _unused_when_off(check, flags, EPILOGUE_REQUANTISE, record, names):
        return None, 0
    addr, zero_point = (record[FIELDS[Op.EPILOGUE].index(name)] for name in names)
    if not -128 <= zero_point <= 127:
        check.fail(f"out_zero_point {zero_point} does not fit int8 [-128, 127]")
    return check.matrix("scale", addr, 1, n, n, DType.FLOAT32, written=False), zero_point


_DECODERS = {
    Op.DMA_LOAD: _decode_dma,
    Op.DMA_STORE: _decode_dma,
    Op.GEMM: _decode_gemm,
    Op.FILL: _decode_fill,
    Op.EPILOGUE: _decode_epilogue,
    Op.DEPTHWISE: _decode_depthwise,
    Op.POOL: _decode_pool,
    Op.ELTWISE: _decode_eltwise,
}


def decode_stream(arch: HardwareDescription, records: np.ndarray, tensors) -> list[Command]:
    """Decodes and checks every record; raises `CommandError` at the first bad one.

    A record equal to an earlier one is not decoded again: it was valid there and is valid
    here (the checks see only the record, the tensors and the arch), so it gets a copy of the
    earlier command (`Command.repeated_at`). Compiled loops repeat many records (weight tiles,
    epilogues), so this saves most of the decoding."""
    check = _Checker(arch)
    commands = []
    first_of: dict[tuple, Command] = {}
    for index, record in enumerate(records.tolist()):
        key = tuple(record)
        earlier = first_of.get(key)
        if earlier is not None:
            commands.append(earlier.repeated_at(index))
            continue
        op = _OPS.get(record[0])
        check.index, check.op = index, op.name if op is not None else f"opcode {record[0]}"
        if op is None:
            check.fail(f"unknown opcode {record[0]} (known: "
                       f"{', '.join(f'{o.name}={int(o)}' for o in Op)})")
        used = len(FIELDS[op])
        if any(record[used:]):
            first = used + next(i for i, w in enumerate(record[used:]) if w)
            check.fail(f"word {first} is {record[first]} but {op.name} records use only words "
                       f"0..{used - 1}; unused words must be 0")
        first_of[key] = cmd = _DECODERS[op](check, index, op, record, tensors)
        commands.append(cmd)
    return commands
