"""The CGRA NPU instruction set: the one definition of the command stream and its C API.

Stage: shared by every stage. The compiler's codegen emits calls of the runtime's command
functions (`COMMAND_FUNCTIONS`: one per opcode, its parameters in C order), the C++ runtime
records each call as a fixed-size record, and the simulator decodes and executes the records.
In: nothing (pure Python: importing this module never imports tvm). Out: these tables; the
runtime's C sources are generated from them by `cgra_sim.c_api` at build time.

A command is a record of `RECORD_WORDS` little-endian int64 words. Word 0 is the opcode, word 1
the flags; the meaning of the other words depends on the opcode and is given by the field tables
below (`FIELDS`). Unused words are zero. Scratchpad addresses are byte addresses; strides and
extents count elements.

The format is versioned by `STREAM_VERSION`; any change to a layout, opcode or flag bumps it.
"""

from __future__ import annotations

import enum

STREAM_VERSION = 14
#: The oldest stream version this simulator still runs: v3 only added a flag (DMA_FILL_LOWEST)
#: that v2 streams never set, v4 an opcode (FABRIC), v5 two (REDUCE, VFUNC), v6 one (UNPACK4) and
#: v7 two dtype codes (BFLOAT16, FLOAT16) that earlier streams never use, v8 three VFUNC functions
#: (SIGMOID, SILU, GELU_TANH), v9 two dtype codes (INT16, INT64),
#: v10 an opcode (LOOKUP), v11 a flag (UNPACK4_INT8) and a max POOL's int16 dtype, v12 a requantising
#: EPILOGUE from a float32 accumulator (a QuantizeLinear) and an EPILOGUE's 16-bit float accumulator
#: (widened to float32: a cast), v13 a flag (EPILOGUE_DEQUANTISE), v14 a VFUNC's 16-bit float dtype and
#: its flags VFUNC_FLOAT32_IN / VFUNC_FLOAT32_OUT, that earlier streams never use.
OLDEST_STREAM_VERSION = 2
RECORD_WORDS = 32
#: Number of loop dimensions (and tensor dimensions) a DMA box can have.
BOX_DIMS = 4


@enum.unique
class Op(enum.IntEnum):
    """Command opcodes. Each runs on one unit of the NPU (see `UNIT_OF`)."""

    DMA_LOAD = 1  # host tensor box -> scratchpad, zero (or lowest-value) fill inside the padding halo
    DMA_STORE = 2  # scratchpad -> host tensor box, halo elements dropped
    GEMM = 3  # PE array: acc (+)= A @ B on scratchpad tiles
    FILL = 4  # vector unit: fill a 2-D scratchpad region with a constant
    EPILOGUE = 5  # vector unit: out = requant(clip(relu(acc + bias + residual))) (each step optional)
    DEPTHWISE = 6  # PE array: per-channel sliding-window MACs (a depthwise conv2d tile)
    POOL = 7  # vector unit: max or average over a sliding window (max_pool2d, avg_pool2d, mean)
    ELTWISE = 8  # vector unit: out = func(a, b) over a 2-D tile, operands strided (0 broadcasts)
    FABRIC = 9  # PE fabric: out = body(a[, b]) over a 2-D tile, the body a dataflow graph mapped onto the PEs
    REDUCE = 10  # vector unit: per row of a 2-D tile, out[i] = sum / max / sum of squares, accumulated into out
    VFUNC = 11  # vector unit: out = f(a * scale + offset) over a 2-D tile, f exp, tanh, erf, GELU, rsqrt, 1/x
    UNPACK4 = 12  # vector unit: 4-bit weights packed two per byte -> float32 (q - zero) * scale tile
    LOOKUP = 13  # vector unit: int8 out = table[a + 128] over a 2-D int8 tile, a 256-entry int8 table


@enum.unique
class DType(enum.IntEnum):
    """Element types a command can name. The value is the code stored in records.

    BFLOAT16 and FLOAT16 are PE-array input dtypes only (GEMM, DEPTHWISE accumulate them in
    float32), an EPILOGUE's output (its float32 result rounded to nearest even), an ELTWISE's
    and a VFUNC's operand format (widened, computed in float32, rounded on store); the
    scratchpad holds bfloat16 as its 16 bits (numpy uint16: `storage`), float16 as numpy's.
    INT16 is the PE array's 16x8 input (GEMM: int16 A times int8 B, Arm Ethos-U's 16x8 mode)
    accumulating in INT64, and a requantising EPILOGUE's output (int16.py)."""

    INT8 = 1
    INT32 = 2
    FLOAT32 = 3
    BFLOAT16 = 4
    FLOAT16 = 5
    INT16 = 6
    INT64 = 7

    @property
    def itemsize(self) -> int:
        return {DType.INT8: 1, DType.INT32: 4, DType.FLOAT32: 4, DType.BFLOAT16: 2, DType.FLOAT16: 2,
                DType.INT16: 2, DType.INT64: 8}[self]

    @property
    def numpy_name(self) -> str:
        """The dtype's name (numpy's and TVM's; numpy has no bfloat16: see `storage`)."""
        return {DType.INT8: "int8", DType.INT32: "int32", DType.FLOAT32: "float32", DType.BFLOAT16: "bfloat16",
                DType.FLOAT16: "float16", DType.INT16: "int16", DType.INT64: "int64"}[self]

    @property
    def storage(self) -> str:
        """The numpy dtype that holds its elements: bfloat16's 16 bits as uint16."""
        return "uint16" if self is DType.BFLOAT16 else self.numpy_name

    @property
    def lowest(self) -> float | int:
        """The lowest value of the type: what a max pool's padding holds (-inf for the floats;
        bfloat16's as its bits, 0xFF80, the storage's value)."""
        return {DType.INT8: -128, DType.INT32: -(1 << 31), DType.FLOAT32: float("-inf"), DType.BFLOAT16: 0xFF80,
                DType.FLOAT16: float("-inf"), DType.INT16: -(1 << 15), DType.INT64: -(1 << 63)}[self]

    @classmethod
    def from_name(cls, name: str) -> "DType":
        for member in cls:
            if member.numpy_name == str(name):
                return member
        raise ValueError(f"dtype '{name}' is not supported by the CGRA NPU "
                         f"(supported: {', '.join(m.numpy_name for m in cls)})")


#: The dtypes the vector unit and the PE fabric compute in (FILL, ELTWISE, POOL, FABRIC, ...):
#: the 16-bit floats are not among them, but for ELTWISE and VFUNC (widened, computed in float32,
#: rounded).
VECTOR_DTYPES = (DType.INT8, DType.INT32, DType.FLOAT32)
#: 16-bit float inputs of the PE array: products accumulated in float32, rounded to nearest
#: even when an EPILOGUE stores them.
HALF_FLOATS = (DType.BFLOAT16, DType.FLOAT16)
#: The B operand's dtype of a GEMM whose A has the key's dtype, where they differ: int16
#: activations times int8 weights (16x8); every other GEMM multiplies two of one dtype.
GEMM_B_DTYPE = {DType.INT16: DType.INT8}


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
class ReduceFunc(enum.IntEnum):
    """What a REDUCE folds each row into (word `func`), float32, columns left to right, every
    step rounded: out[i] = out[i] + a, max(out[i], a) (NaN propagates) or out[i] + a * a."""

    SUM = 1
    MAX = 2
    SUM_SQUARES = 3


@enum.unique
class VFunc(enum.IntEnum):
    """The function of a VFUNC (word `func`), float32, each a specified sequence of rounded
    float32 operations (cgra_sim/special.py, with its error bounds against float64)."""

    IDENTITY = 1  # t (the scale and offset only)
    EXP = 2
    TANH = 3
    ERF = 4
    GELU = 5  # t Phi(t) = t (1 + erf(t / sqrt 2)) / 2, the erf form
    RSQRT = 6  # 1 / sqrt(t), correctly rounded square root and divide
    RECIPROCAL = 7  # 1 / t, correctly rounded
    SIGMOID = 8  # 1 / (1 + e^-t) from exp(-|t|): stream version 8
    SILU = 9  # t sigmoid(t)
    GELU_TANH = 10  # t sigmoid(2 sqrt(2 / pi) (t + 0.044715 t^3)), GELU's tanh form


@enum.unique
class BodyOp(enum.IntEnum):
    """The operation of one node of a FABRIC body (bits 0..7 of its word): a PE's ALU operation,
    in the command's dtype (int32 wraps, float32 rounds once per operation; max and min propagate
    NaN). Shifts are int32 only, by an immediate."""

    ADD = 1
    SUB = 2
    MUL = 3
    MAX = 4
    MIN = 5
    SHR = 6  # arithmetic
    SHL = 7


# A FABRIC body node's word: op (bits 0..7), operand references (bits 8..15, 16..23) and an
# immediate (bits 32..63: the int32 value or the float32 bits). A reference names input A
# (BODY_INPUT_A), input B (BODY_INPUT_B), the immediate (BODY_IMMEDIATE) or node i < this one's
# index (BODY_FIRST_NODE + i); the last node's value is the output.
BODY_INPUT_A = 0
BODY_INPUT_B = 1
BODY_FIRST_NODE = 2
BODY_IMMEDIATE = 255
#: Nodes a FABRIC record carries (words node0 ..).
BODY_MAX_NODES = 16


def body_word(op: "BodyOp", first: int, second: int, imm_bits: int = 0) -> int:
    """One FABRIC body node's word (an int64, as the record holds it)."""
    word = int(op) | (first << 8) | (second << 16) | ((imm_bits & 0xFFFFFFFF) << 32)
    return word - (1 << 64) if word >= 1 << 63 else word


def body_fields(word: int) -> tuple[int, int, int, int]:
    """(op code, first reference, second reference, immediate bits) of a body node's word."""
    word &= (1 << 64) - 1
    return word & 0xFF, (word >> 8) & 0xFF, (word >> 16) & 0xFF, word >> 32


@enum.unique
class Unit(enum.IntEnum):
    """The NPU's independent queues. Commands on different units may overlap in time."""

    LOAD = 0  # DMA engine, host -> scratchpad
    COMPUTE = 1  # PE array
    STORE = 2  # DMA engine, scratchpad -> host
    VECTOR = 3  # vector unit (fills, epilogues): runs beside the PE array


UNIT_OF = {Op.DMA_LOAD: Unit.LOAD, Op.DMA_STORE: Unit.STORE, Op.GEMM: Unit.COMPUTE,
           Op.FILL: Unit.VECTOR, Op.EPILOGUE: Unit.VECTOR, Op.DEPTHWISE: Unit.COMPUTE,
           Op.POOL: Unit.VECTOR, Op.ELTWISE: Unit.VECTOR, Op.FABRIC: Unit.COMPUTE, Op.REDUCE: Unit.VECTOR,
           Op.VFUNC: Unit.VECTOR, Op.UNPACK4: Unit.VECTOR, Op.LOOKUP: Unit.VECTOR}

# Flags (word 1).
GEMM_ACCUMULATE = 1  # GEMM and DEPTHWISE: add to the accumulator; without it, overwrite it
EPILOGUE_BIAS = 1  # add bias[j] (a row vector of n elements, acc dtype)
EPILOGUE_RELU = 2  # max(x, 0) after the bias and the residual
EPILOGUE_RESIDUAL = 4  # add residual[i, j] (an m x n tile, acc dtype, own row stride) after the bias
EPILOGUE_CLIP = 8  # min(max(x, clip_lo), clip_hi) last; bounds are acc-dtype value bits like FILL's
# After all of the above, int32 -> int8: out = rne(clamp(f32(x) * scale[j], -128 - zp, 127 - zp)) + zp,
# scale a row of n float32 at scale_addr, zp = out_zero_point (onnxruntime's QLinearConv arithmetic).
# From a float32 accumulator (stream v12) it quantises: out = rne(clamp(x / scale[j], -128 - zp, 127 - zp)) + zp,
# the quotient correctly rounded (onnxruntime's QuantizeLinear divides; x * (1 / scale) differs at ties).
EPILOGUE_REQUANTISE = 16
# With REQUANTISE from an int32 accumulator (stream v13), the int8 result q is dequantised to a float32
# out: out = float32(q - zp) * dscale[j]; the row at scale_addr then holds 2n float32, channel j's pair
# (multiplier, dscale) at 2j, 2j + 1 (so a tile of channels is one contiguous slice of a per-layer row):
# onnxruntime's QuantizeLinear -> DequantizeLinear at a quantized model's float output.
EPILOGUE_DEQUANTISE = 32
POOL_AVERAGE = 1  # POOL: sum of the valid taps / the taps inside the count rectangle; without it, max
# DMA_LOAD: the halo holds the dtype's lowest value (-inf, -128, INT32_MIN) instead of 0: a max pool's
# padding, loaded with the window when where the padding lies depends on a run-time size.
DMA_FILL_LOWEST = 1
FABRIC_INPUT_B = 1  # FABRIC: the body reads a second input, B (its words are 0 without it)
# FABRIC: A, B and out hold int8: the inputs are read as the body's dtype (sign-extended to int32,
# or converted exactly to float32), the output rounded half to even (float32) and saturated to
# [-128, 127] when stored. Ops between quantized layers (QLinearAdd, QLinearMul).
FABRIC_INT8 = 2
VFUNC_SCALE = 1  # VFUNC: t = a * scale (scale_bits: float32 bits) before the function
VFUNC_OFFSET = 2  # VFUNC: t = t + offset (offset_bits) after the scale, before the function
# A VFUNC whose dtype is bfloat16 or float16 (stream v14) reads A in that format (widened exactly to
# float32), computes in float32 and rounds its result to nearest even in that format: out holds it.
# These two flags (16-bit dtype only) keep an operand float32 instead: with FLOAT32_IN, A is float32,
# read as it is (not rounded); with FLOAT32_OUT, out is float32 and holds the rounded result widened
# back (exact): PyTorch's astype(act(x), h) followed by a float32 op, in one pass (docs/transformer-ops.md).
VFUNC_FLOAT32_IN = 4
VFUNC_FLOAT32_OUT = 8
# UNPACK4: the zero points are 4-bit values packed like the weights at zero_addr; without it every
# zero point is 8 (onnxruntime's MatMulNBits default for 4 bits).
UNPACK4_ZERO_POINTS = 1
# UNPACK4: the nibbles are signed int4 (two's complement, -8..7) and the tile int8 q, unscaled (an
# int8 x int4 GEMM's B operand: QDQ int4 weights, zero point 0); scale and zero-point words 0.
UNPACK4_INT8 = 2


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


#: Word layout of every opcode. The position in the tuple is the word index. What each command
#: computes from its words is documented once, with the C function that records it
#: (`COMMAND_FUNCTIONS` below; the runtime's generated header carries the same text).
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
    Op.DEPTHWISE: ("op", "flags", "dtype", "oh", "ow", "n", "kh", "kw", "a_addr", "a_y_stride",
                   "a_x_stride", "a_ry_stride", "a_rx_stride", "b_addr", "b_ry_stride",
                   "b_rx_stride", "acc_addr", "acc_y_stride", "acc_x_stride"),
    Op.POOL: ("op", "flags", "dtype", "oh", "ow", "n", "kh", "kw", "a_addr", "a_row_stride",
              "a_col_stride", "stride_y", "stride_x", "dilation_y", "dilation_x", "out_addr",
              "out_y_stride", "out_x_stride", "valid_y_lo", "valid_y_hi", "valid_x_lo",
              "valid_x_hi", "count_y_lo", "count_y_hi", "count_x_lo", "count_x_hi"),
    Op.ELTWISE: ("op", "flags", "func", "dtype", "rows", "cols", "a_addr", "a_row_stride",
                 "a_col_stride", "b_addr", "b_row_stride", "b_col_stride", "out_addr", "out_stride"),
    Op.FABRIC: ("op", "flags", "dtype", "rows", "cols", "a_addr", "a_row_stride", "a_col_stride", "b_addr",
                "b_row_stride", "b_col_stride", "out_addr", "out_stride", "nodes")
               + tuple(f"node{i}" for i in range(BODY_MAX_NODES)),
    Op.REDUCE: ("op", "flags", "func", "dtype", "rows", "cols", "a_addr", "a_row_stride", "a_col_stride",
                "out_addr", "out_stride"),
    Op.VFUNC: ("op", "flags", "func", "dtype", "rows", "cols", "a_addr", "a_row_stride", "a_col_stride",
               "out_addr", "out_stride", "scale_bits", "offset_bits"),
    Op.UNPACK4: ("op", "flags", "rows", "cols", "group", "a_addr", "a_col_stride", "scale_addr",
                 "scale_col_stride", "zero_addr", "zero_col_stride", "out_addr", "out_stride"),
    Op.LOOKUP: ("op", "flags", "rows", "cols", "a_addr", "a_stride", "table_addr", "out_addr", "out_stride"),
}

for _op, _fields in FIELDS.items():
    assert len(_fields) <= RECORD_WORDS, f"{_op.name} record is longer than {RECORD_WORDS} words"

#: Words of a DMA box: the DMA records' origin0 .. sstride3 (the C API's `const int64_t* box`).
BOX_WORDS = RECORD_WORDS - FIELDS[Op.DMA_LOAD].index("origin0")

#: GEMM / DEPTHWISE accumulator dtype for each input dtype.
ACC_DTYPE = {DType.INT8: DType.INT32, DType.INT16: DType.INT64, DType.FLOAT32: DType.FLOAT32, DType.BFLOAT16: DType.FLOAT32,
             DType.FLOAT16: DType.FLOAT32}

# Layout of one host tensor slot in a launch's slot table (int64 words).
SLOT_FIELDS = ("data_addr", "dtype", "ndim") + tuple(f"shape{d}" for d in range(BOX_DIMS)) + ("flags",)
SLOT_WORDS = len(SLOT_FIELDS)
#: A slot's `flags`: the tensor is a constant the runtime holds (a weight of its weights module),
#: its address and contents fixed while the module lives; the device may load it before the
#: launch starts (prefetch.py). Set by the runtime at bind (runtime/src/held_constants.h).
SLOT_FLAG_CONSTANT = 1


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


# The command functions' table lives in its own module and is read through this one too
# (isa.COMMAND_FUNCTIONS); imported last, as it reads the fields above.
from .command_functions import COMMAND_FUNCTIONS, CommandFunction, Param, ParamKind  # noqa: E402,F401
