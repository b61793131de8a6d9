"""The CGRA NPU instruction set: the one definition of the command stream.

Stage: shared by every stage. The compiler's codegen emits calls whose arguments follow these
layouts, the C++ runtime records them as fixed-size records (its header `cgra_isa.h` is generated
from this module, see `c_header`), and the simulator decodes and executes them.

A command is a record of `RECORD_WORDS` little-endian int64 words. Word 0 is the opcode, word 1
the flags; the meaning of the other words depends on the opcode and is given by the field tables
below (`FIELDS`). Unused words are zero. Scratchpad addresses are byte addresses; strides and
extents count elements.

The format is versioned by `STREAM_VERSION`; any change to a layout, opcode or flag bumps it.
Pure Python: importing this module never imports tvm.
"""

from __future__ import annotations

import enum
import sys

STREAM_VERSION = 2
RECORD_WORDS = 32
#: Number of loop dimensions (and tensor dimensions) a DMA box can have.
BOX_DIMS = 4


@enum.unique
class Op(enum.IntEnum):
    """Command opcodes. Each runs on one unit of the NPU (see `UNIT_OF`)."""

    DMA_LOAD = 1  # host tensor box -> scratchpad, zero fill inside the padding halo
    DMA_STORE = 2  # scratchpad -> host tensor box, halo elements dropped
    GEMM = 3  # PE array: acc (+)= A @ B on scratchpad tiles
    FILL = 4  # vector unit: fill a 2-D scratchpad region with a constant
    EPILOGUE = 5  # vector unit: out = requant(clip(relu(acc + bias + residual))) (each step optional)
    DEPTHWISE = 6  # PE array: per-channel sliding-window MACs (a depthwise conv2d tile)
    POOL = 7  # vector unit: max or average over a sliding window (max_pool2d, avg_pool2d, mean)
    ELTWISE = 8  # vector unit: out = func(a, b) over a 2-D tile, operands strided (0 broadcasts)


@enum.unique
class DType(enum.IntEnum):
    """Element types a command can name. The value is the code stored in records."""

    INT8 = 1
    INT32 = 2
    FLOAT32 = 3

    @property
    def itemsize(self) -> int:
        return {DType.INT8: 1, DType.INT32: 4, DType.FLOAT32: 4}[self]

    @property
    def numpy_name(self) -> str:
        return {DType.INT8: "int8", DType.INT32: "int32", DType.FLOAT32: "float32"}[self]

    @classmethod
    def from_name(cls, name: str) -> "DType":
        for member in cls:
            if member.numpy_name == str(name):
                return member
        raise ValueError(f"dtype '{name}' is not supported by the CGRA NPU "
                         f"(supported: {', '.join(m.numpy_name for m in cls)})")


@enum.unique
class EltwiseFunc(enum.IntEnum):
    """What an ELTWISE computes from its two operands (word `func`), in the operands' dtype.
    Integer results wrap like two's-complement hardware; float32 rounds once per operation."""

    ADD = 1  # a + b
    SUBTRACT = 2  # a - b
    MULTIPLY = 3  # a * b
    MAXIMUM = 4  # max(a, b) (NaN propagates, as numpy.maximum)
    MINIMUM = 5  # min(a, b) (NaN propagates, as numpy.minimum)


@enum.unique
class Unit(enum.IntEnum):
    """The NPU's independent queues. Commands on different units may overlap in time."""

    LOAD = 0  # DMA engine, host -> scratchpad
    COMPUTE = 1  # PE array
    STORE = 2  # DMA engine, scratchpad -> host
    VECTOR = 3  # vector unit (fills, epilogues): runs beside the PE array


UNIT_OF = {
    Op.DMA_LOAD: Unit.LOAD,
    Op.DMA_STORE: Unit.STORE,
    Op.GEMM: Unit.COMPUTE,
    Op.FILL: Unit.VECTOR,
    Op.EPILOGUE: Unit.VECTOR,
    Op.DEPTHWISE: Unit.COMPUTE,
    Op.POOL: Unit.VECTOR,
    Op.ELTWISE: Unit.VECTOR,
}

# Flags (word 1).
GEMM_ACCUMULATE = 1  # GEMM and DEPTHWISE: add to the accumulator; without it, overwrite it
EPILOGUE_BIAS = 1  # add bias[j] (a row vector of n elements, acc dtype)
EPILOGUE_RELU = 2  # max(x, 0) after the bias and the residual
EPILOGUE_RESIDUAL = 4  # add residual[i, j] (an m x n tile, acc dtype, own row stride) after the bias
EPILOGUE_CLIP = 8  # min(max(x, clip_lo), clip_hi) last; bounds are acc-dtype value bits like FILL's
# After all of the above, int32 -> int8: out = rne(clamp(f32(x) * scale[j], -128 - zp, 127 - zp)) + zp,
# scale a row of n float32 at scale_addr, zp = out_zero_point (onnxruntime's QLinearConv arithmetic).
EPILOGUE_REQUANTISE = 16
POOL_AVERAGE = 1  # POOL: sum of the valid taps / the taps inside the count rectangle; without it, max


def _dma_fields():
    fields = ["op", "flags", "slot", "spad_addr"]
    fields += [f"origin{d}" for d in range(BOX_DIMS)]  # tensor coordinates of the box's first element
    fields += [f"pad_lo{d}" for d in range(BOX_DIMS)]  # halo below 0 per tensor dim (zeros / dropped)
    fields += [f"pad_hi{d}" for d in range(BOX_DIMS)]  # halo above shape[d] per tensor dim
    for loop in range(BOX_DIMS):
        fields += [
            f"extent{loop}",  # trip count of box loop `loop` (1 for unused loops)
            f"tdim{loop}",  # tensor dimension the loop walks
            f"tstep{loop}",  # elements it advances along that dimension per iteration
            f"sstride{loop}",  # scratchpad elements it advances per iteration
        ]
    return tuple(fields)


#: Word layout of every opcode. The position in the tuple is the word index.
FIELDS = {
    Op.DMA_LOAD: _dma_fields(),
    Op.DMA_STORE: _dma_fields(),
    Op.GEMM: ("op", "flags", "dtype", "m", "n", "k", "a_addr", "a_stride", "b_addr",
              "b_stride", "acc_addr", "acc_stride"),
    Op.FILL: ("op", "flags", "dtype", "addr", "rows", "cols", "stride", "value_bits"),
    # Words 11.. were added in stream version 2 (residual and clip, then requantisation); earlier
    # words kept their place.
    Op.EPILOGUE: ("op", "flags", "acc_dtype", "out_dtype", "m", "n", "acc_addr", "acc_stride",
                  "bias_addr", "out_addr", "out_stride", "residual_addr", "residual_stride",
                  "clip_lo_bits", "clip_hi_bits", "scale_addr", "out_zero_point"),
    # A depthwise window: acc[y, x, c] (+)= sum over taps (ry, rx) of A[y, x, ry, rx, c] * B[ry, rx, c]
    # (ry-major tap order), A's element at a_addr + y*a_y + x*a_x + ry*a_ry + rx*a_rx + c: the
    # taps of neighbouring outputs overlap in the scratchpad. Every PE owns one output element.
    Op.DEPTHWISE: ("op", "flags", "dtype", "oh", "ow", "n", "kh", "kw", "a_addr", "a_y_stride",
                   "a_x_stride", "a_ry_stride", "a_rx_stride", "b_addr", "b_ry_stride",
                   "b_rx_stride", "acc_addr", "acc_y_stride", "acc_x_stride"),
    # A pooling window: tap (y, x, ry, rx) sits at window position (py, px) = (y*stride_y +
    # ry*dilation_y, x*stride_x + rx*dilation_x), its element of channel c at a_addr + py*a_row +
    # px*a_col + c. Taps whose position lies outside the valid rectangle [valid_y_lo, valid_y_hi)
    # x [valid_x_lo, valid_x_hi) (the padding) are not taken: out[y, x, c] = max over the valid
    # taps, or with POOL_AVERAGE their sum (ry-major) / the number of taps inside the count
    # rectangle (count_* words; all 0 without POOL_AVERAGE). The rectangles are per command, so
    # the padding never has to be in the scratchpad as a value (-inf for max).
    Op.POOL: ("op", "flags", "dtype", "oh", "ow", "n", "kh", "kw", "a_addr", "a_row_stride",
              "a_col_stride", "stride_y", "stride_x", "dilation_y", "dilation_x", "out_addr",
              "out_y_stride", "out_x_stride", "valid_y_lo", "valid_y_hi", "valid_x_lo",
              "valid_x_hi", "count_y_lo", "count_y_hi", "count_x_lo", "count_x_hi"),
    # out[i, j] = func(A[i * a_row + j * a_col], B[i * b_row + j * b_col]) for i < rows, j < cols
    # (strides in elements; a stride of 0 broadcasts the operand along that axis); out's rows
    # are out_stride apart, its columns adjacent. No flags are defined (word 1 must be 0).
    Op.ELTWISE: ("op", "flags", "func", "dtype", "rows", "cols", "a_addr", "a_row_stride",
                 "a_col_stride", "b_addr", "b_row_stride", "b_col_stride", "out_addr", "out_stride"),
}

for _op, _fields in FIELDS.items():
    assert len(_fields) <= RECORD_WORDS, f"{_op.name} record is longer than {RECORD_WORDS} words"

#: GEMM / DEPTHWISE accumulator dtype for each input dtype.
ACC_DTYPE = {DType.INT8: DType.INT32, DType.FLOAT32: DType.FLOAT32}

# Layout of one host tensor slot in a launch's slot table (int64 words).
SLOT_FIELDS = ("data_addr", "dtype", "ndim") + tuple(f"shape{d}" for d in range(BOX_DIMS))
SLOT_WORDS = len(SLOT_FIELDS)


def word(op: Op, field: str) -> int:
    """Index of `field` in the record of `op`."""
    return FIELDS[op].index(field)


def encode(op: Op, **values: int) -> list[int]:
    """Build one record. Unknown fields are an error; missing fields are zero."""
    record = [0] * RECORD_WORDS
    record[0] = int(op)
    for name, value in values.items():
        if name not in FIELDS[op]:
            raise KeyError(f"{op.name} has no field '{name}' (fields: {', '.join(FIELDS[op])})")
        record[FIELDS[op].index(name)] = int(value)
    return record


def c_header() -> str:
    """The C header the runtime is compiled with, so the two sides never disagree."""
    lines = [
        "/* Generated from cgra_sim/isa.py by `python -m cgra_sim.isa OUT`. Do not edit. */",
        "#ifndef CGRA_ISA_H_",
        "#define CGRA_ISA_H_",
        f"#define CGRA_STREAM_VERSION {STREAM_VERSION}",
        f"#define CGRA_RECORD_WORDS {RECORD_WORDS}",
        f"#define CGRA_BOX_DIMS {BOX_DIMS}",
        f"#define CGRA_SLOT_WORDS {SLOT_WORDS}",
        f"#define CGRA_GEMM_ACCUMULATE {GEMM_ACCUMULATE}",
        f"#define CGRA_EPILOGUE_BIAS {EPILOGUE_BIAS}",
        f"#define CGRA_EPILOGUE_RELU {EPILOGUE_RELU}",
        f"#define CGRA_EPILOGUE_RESIDUAL {EPILOGUE_RESIDUAL}",
        f"#define CGRA_EPILOGUE_CLIP {EPILOGUE_CLIP}",
        f"#define CGRA_POOL_AVERAGE {POOL_AVERAGE}",
        f"#define CGRA_EPILOGUE_REQUANTISE {EPILOGUE_REQUANTISE}",
    ]
    lines += [f"#define CGRA_OP_{op.name} {int(op)}" for op in Op]
    lines += [f"#define CGRA_DTYPE_{dt.name} {int(dt)}" for dt in DType]
    lines += [f"#define CGRA_ELTWISE_{func.name} {int(func)}" for func in EltwiseFunc]
    lines += [f"#define CGRA_DTYPE_{dt.name}_BYTES {dt.itemsize}" for dt in DType]
    for op, fields in FIELDS.items():
        lines += [f"#define CGRA_{op.name}_{name.upper()} {i}" for i, name in enumerate(fields)]
    lines += [f"#define CGRA_SLOT_{name.upper()} {i}" for i, name in enumerate(SLOT_FIELDS)]
    lines.append("#endif  /* CGRA_ISA_H_ */")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m cgra_sim.isa OUT.h   (writes the runtime's C header)")
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        out.write(c_header())
