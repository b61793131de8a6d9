"""The decoded commands: what every later step of the simulator reads instead of record words.

Stage: simulator, step 1 (decode.py fills them in). One class per kind of command, each naming
the scratchpad `Region`s it reads and writes; `Checker` raises the `CommandError`s of the command
being decoded and builds the checked regions (the decoders per unit: decode_dma.py, decode_pe.py,
decode_vector.py).
"""

from __future__ import annotations

import numpy as np

from .arch import HardwareDescription
from .errors import CommandError
from .isa import ACC_DTYPE, UNIT_OF, DType, Op
from .regions import Region

#: The numpy dtype of each ISA dtype's elements (bfloat16: its bits as uint16, DType.storage).
NUMPY_DTYPE = {dtype: np.dtype(dtype.storage) for dtype in DType}
DTYPE_OF_NUMPY = {np_dtype: dtype for dtype, np_dtype in NUMPY_DTYPE.items()}


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
    # fill: the value a load writes in the halo (0, or the dtype's lowest with DMA_FILL_LOWEST).
    __slots__ = ("slot", "tensor", "box", "region", "halo_free", "host_points", "inner", "host_view", "fill")

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
    `scale` None or the (1, n) float32 row of a requantisation to int8 around `zero_point`;
    `half` the 16-bit float (DType) a float32 accumulator is rounded to on store, whose dtype the
    bias and residual then have (widened exactly), else None; `widen` the 16-bit float (DType) of an
    accumulator that is only widened exactly to a float32 out (a cast: no other step), else None;
    `dequantise` whether the int8 result is dequantised to float32 (`scale` then (1, 2n): per
    channel the requantisation's multiplier, then the dequantisation's scale)."""

    __slots__ = ("acc", "bias", "residual", "out", "relu", "clip", "scale", "zero_point", "half", "widen",
                 "dequantise")


class EltwiseCommand(Command):
    """out = func(a, b) elementwise over a (rows, cols) tile; `a` and `b` are strided views whose
    zero strides broadcast them, `out` a (rows, cols) region with adjacent columns."""

    __slots__ = ("func", "dtype", "a", "b", "out")

    @property
    def elements(self) -> int:
        return self.out.shape[0] * self.out.shape[1]


class ReduceCommand(Command):
    """out[i] = fold(out[i], a[i, j]) for j left to right per row; `a` a strided (rows, cols)
    view, `out` a (rows, 1) column (its row stride the record's)."""

    __slots__ = ("func", "a", "out")

    @property
    def elements(self) -> int:
        return self.a.shape[0] * self.a.shape[1]


class VfuncCommand(Command):
    """out = f(a * scale + offset) elementwise over a (rows, cols) tile, computed in float32;
    `scale` and `offset` numpy float32 scalars or None without their flag. `dtype` float32, or a
    16-bit float: `a` and `out` are each in it or float32 (their regions' dtypes: VFUNC_FLOAT32_IN,
    VFUNC_FLOAT32_OUT), the result rounded to it either way."""

    __slots__ = ("func", "dtype", "a", "out", "scale", "offset")

    @property
    def elements(self) -> int:
        return self.out.shape[0] * self.out.shape[1]


class FabricCommand(Command):
    """out = body(a[, b]) elementwise over a (rows, cols) tile on the PE fabric; `body` the nodes
    of mapping/body.py, `b` None without FABRIC_INPUT_B; strides as ELTWISE's. `int8`
    (FABRIC_INT8): a, b and out hold int8, the output rounded half to even and saturated."""

    __slots__ = ("body", "dtype", "a", "b", "out", "int8")

    @property
    def elements(self) -> int:
        return self.out.shape[0] * self.out.shape[1]


class Checker:
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
