"""The runtime's command functions: the C function that records each opcode, its parameters in C
order and what it computes (docs/runtime-abi.md). The C prototypes and definitions (cgra_sim.c_api)
and the code generator's calls (cgra_codegen.device_calls, tir_calls) are generated from this table;
the records they fill are isa.py's."""

from __future__ import annotations

import dataclasses
import enum

from .isa import (BODY_MAX_NODES, BOX_WORDS, EPILOGUE_BIAS, EPILOGUE_CLIP, EPILOGUE_REQUANTISE,
                  EPILOGUE_RESIDUAL, FABRIC_INPUT_B, FIELDS, POOL_AVERAGE, UNPACK4_ZERO_POINTS,
                  VFUNC_OFFSET, VFUNC_SCALE, Op, word)


@enum.unique
class ParamKind(enum.Enum):
    """How a command function takes one parameter: its meaning, and so its C type."""

    INT32 = "int32"  # a code: flags, a dtype, an ELTWISE func
    INT64 = "int64"  # an extent, a stride in elements, a coordinate, an integer value
    SPAD_ADDR = "spad_addr"  # a scratchpad byte address
    SLOT = "slot"  # a host tensor slot, bound by cgra_kernel_bind
    BOX = "box"  # a DMA box: a pointer to BOX_WORDS int64 words, the record's origin0 .. sstride3
    VALUE_BITS = "value_bits"  # a value of the command's dtype: the integer, or the float32 bits

    @property
    def c_type(self) -> str:
        return {ParamKind.INT32: "int32_t", ParamKind.SLOT: "int32_t",
                ParamKind.BOX: "const int64_t*"}.get(self, "int64_t")


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of a command function: named after the record field it fills (the box,
    which fills BOX_WORDS fields, is `box`)."""

    name: str
    kind: ParamKind
    when: int = 0  # a flag bit: the parameter matters only when `flags` has it (else it is 0)


@dataclasses.dataclass(frozen=True)
class CommandFunction:
    """The C function that records one opcode: `int32_t cgra_<op>(CGRAKernel* kernel, ...)`
    with `params` in order; every record field no parameter fills is listed in `fixed` (0), or is
    word 0 (the opcode)."""

    op: Op
    doc: str  # what the command computes, for the generated C header
    params: tuple[Param, ...]
    fixed: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"cgra_{self.op.name.lower()}"

    def fields_of(self, param: Param) -> tuple[str, ...]:
        """The record fields `param` fills, in order."""
        if param.kind is not ParamKind.BOX:
            return (param.name,)
        first = word(self.op, "origin0")
        return FIELDS[self.op][first:first + BOX_WORDS]


def _command(op: Op, doc: str, *params, fixed: tuple[str, ...] = ()) -> CommandFunction:
    """`params`: (name, kind[, flag bit]) tuples; a bare name is an int64 parameter."""
    return CommandFunction(op, doc, tuple(Param(*p) if isinstance(p, tuple) else Param(p, _I64)
                                          for p in params), fixed)


_I32, _I64, _ADDR = ParamKind.INT32, ParamKind.INT64, ParamKind.SPAD_ADDR
_BITS, _SLOT, _BOX = ParamKind.VALUE_BITS, ParamKind.SLOT, ParamKind.BOX
_DMA_BOX = (
    "`box` points to 28 int64 words laid out as the DMA record's words 4..31 (origin[4], "
    "pad_lo[4], pad_hi[4], then for each of the 4 loops: extent, tdim, tstep, sstride). The "
    "element type is the tensor's.")

#: The runtime's command functions, one per opcode (docs/runtime-abi.md): the opcode, what the
#: command computes, then its parameters in C order: (name, kind[, flag bit]), or a bare name for
#: an int64. Their C prototypes and definitions are generated from this table (cgra_sim.c_api), and so are the code generator's calls to them (cgra_codegen.device_calls).
COMMAND_FUNCTIONS = {command.op: command for command in (
    _command(
        Op.DMA_LOAD,
        "DMA from host tensor `slot` into the scratchpad at spad_addr: box coordinates in the "
        "halo load zeros, or with CGRA_DMA_FILL_LOWEST the element type's lowest value (-inf "
        "for float32; a max pool's padding). " + _DMA_BOX,
        ("flags", _I32), ("slot", _SLOT), ("spad_addr", _ADDR), ("box", _BOX)),
    _command(
        Op.DMA_STORE,
        "DMA from the scratchpad at spad_addr to host tensor `slot`: box coordinates in the halo "
        "are dropped. " + _DMA_BOX,
        ("slot", _SLOT), ("spad_addr", _ADDR), ("box", _BOX), fixed=("flags",)),
    _command(
        Op.GEMM,
        "PE array: acc[i,j] (+)= sum_k A[i,k] * B[k,j], i < m, j < n (+= with "
        "CGRA_GEMM_ACCUMULATE). dtype is the input dtype code; the accumulator is int32 for int8, "
        "float32 for float32, bfloat16 and float16, int64 for int16 (16x8: A int16, B int8). Strides "
        "are in elements.",
        ("flags", _I32), ("dtype", _I32), "m", "n", "k", ("a_addr", _ADDR), "a_stride",
        ("b_addr", _ADDR), "b_stride", ("acc_addr", _ADDR), "acc_stride"),
    _command(
        Op.FILL,
        "Vector unit: region[i,j] = value for i < rows, j < cols, rows `stride` elements apart "
        "from addr (value_bits: the int64 value, or the float32 bit pattern).",
        ("dtype", _I32), ("addr", _ADDR), "rows", "cols", "stride", ("value_bits", _BITS),
        fixed=("flags",)),
    _command(
        Op.EPILOGUE,
        "Vector unit: out[i,j] = requant(clip(relu(acc[i,j] + bias[j] + residual[i,j]))), each "
        "step enabled by its flag: CGRA_EPILOGUE_BIAS (n elements, acc dtype), _RESIDUAL (an m x n "
        "tile, acc dtype, own stride), _RELU, _CLIP (clip_lo/hi_bits: acc-dtype value bits as for "
        "cgra_fill, lo <= hi), _REQUANTISE (int32 acc -> int8 out: rne(clamp(float(x) * scale[j], "
        "-128 - zp, 127 - zp)) + zp, scale a row of n float32 at scale_addr, zp = "
        "out_zero_point; int64 acc -> int16 out alike, within [-32768, 32767]; float32 acc -> int8 out "
        "quantises: rne(clamp(x / scale[j], -128 - zp, 127 - zp)) + zp, onnxruntime's QuantizeLinear), "
        "_DEQUANTISE (with _REQUANTISE of an int32 acc: the int8 q becomes a float32 out, "
        "float32(q - zp) * scale[2j + 1], scale then a row of 2n float32, per channel its multiplier at 2j; DequantizeLinear). out_dtype is acc_dtype, or with a float32 acc bfloat16 or float16: the "
        "result rounded to nearest even, the bias and residual then in out_dtype; a bfloat16 or float16 acc is "
        "only widened exactly to a float32 out (a cast, flags 0). A disabled "
        "operand's arguments must be 0. (ABI v2 added the last six arguments.)",
        ("flags", _I32), ("acc_dtype", _I32), ("out_dtype", _I32), "m", "n", ("acc_addr", _ADDR),
        "acc_stride", ("bias_addr", _ADDR, EPILOGUE_BIAS), ("out_addr", _ADDR), "out_stride",
        ("residual_addr", _ADDR, EPILOGUE_RESIDUAL), ("residual_stride", _I64, EPILOGUE_RESIDUAL),
        ("clip_lo_bits", _BITS, EPILOGUE_CLIP), ("clip_hi_bits", _BITS, EPILOGUE_CLIP),
        ("scale_addr", _ADDR, EPILOGUE_REQUANTISE), ("out_zero_point", _I64, EPILOGUE_REQUANTISE)),
    _command(
        Op.DEPTHWISE,
        "PE array, one output element per PE (a depthwise conv2d tile): acc[y,x,c] (+)= "
        "sum_{ry<kh, rx<kw} A[y*a_y_stride + x*a_x_stride + ry*a_ry_stride + rx*a_rx_stride + c] "
        "* B[ry*b_ry_stride + rx*b_rx_stride + c] for y < oh, x < ow, c < n, taps ry-major "
        "(elements past a_addr, b_addr: the taps of neighbouring outputs overlap); acc's element "
        "at y*acc_y_stride + x*acc_x_stride + c. dtype and flags as for cgra_gemm.",
        ("flags", _I32), ("dtype", _I32), "oh", "ow", "n", "kh", "kw", ("a_addr", _ADDR),
        "a_y_stride", "a_x_stride", "a_ry_stride", "a_rx_stride", ("b_addr", _ADDR), "b_ry_stride",
        "b_rx_stride", ("acc_addr", _ADDR), "acc_y_stride", "acc_x_stride"),
    _command(
        Op.POOL,
        "Vector unit, a pooling window (max_pool2d, avg_pool2d, mean): out[y,x,c] = max, or with "
        "CGRA_POOL_AVERAGE sum (ry-major) / count, over the taps (ry < kh, rx < kw) at window "
        "position (py, px) = (y*stride_y + ry*dilation_y, x*stride_x + rx*dilation_x) that lie in "
        "the valid rectangle [valid_y_lo, valid_y_hi) x [valid_x_lo, valid_x_hi), tap element "
        "A[py*a_row_stride + px*a_col_stride + c] past a_addr; count = taps inside the count "
        "rectangle (count_*: all 0 without CGRA_POOL_AVERAGE). y < oh, x < ow, c < n; out's "
        "element at y*out_y_stride + x*out_x_stride + c. dtype: int8, int16 (stream v11), int32 or float32 for max, "
        "float32 for an average; out has the input dtype. The padding is never in the "
        "scratchpad: taps outside the valid rectangle are skipped.",
        ("flags", _I32), ("dtype", _I32), "oh", "ow", "n", "kh", "kw", ("a_addr", _ADDR),
        "a_row_stride", "a_col_stride", "stride_y", "stride_x", "dilation_y", "dilation_x",
        ("out_addr", _ADDR), "out_y_stride", "out_x_stride", "valid_y_lo", "valid_y_hi",
        "valid_x_lo", "valid_x_hi",
        *((f"count_{axis}_{end}", _I64, POOL_AVERAGE) for axis in "yx" for end in ("lo", "hi"))),
    _command(
        Op.ELTWISE,
        "Vector unit: out[i,j] = func(A[i*a_row_stride + j*a_col_stride], B[i*b_row_stride + "
        "j*b_col_stride]) for i < rows, j < cols (elements past a_addr, b_addr; out's element at "
        "i*out_stride + j). func is a CGRA_ELTWISE_* code (ADD, SUBTRACT, MULTIPLY, MAXIMUM, "
        "MINIMUM); a, b and out share `dtype` (int8, int32 or float32; integers wrap; bfloat16 and "
        "float16 computed in float32, rounded to nearest even). A stride of 0 broadcasts an "
        "operand along that axis.",
        ("func", _I32), ("dtype", _I32), "rows", "cols", ("a_addr", _ADDR), "a_row_stride",
        "a_col_stride", ("b_addr", _ADDR), "b_row_stride", "b_col_stride", ("out_addr", _ADDR),
        "out_stride", fixed=("flags",)),
    _command(
        Op.FABRIC,
        "PE fabric: out[i,j] = body(A[i*a_row_stride + j*a_col_stride], B[i*b_row_stride + "
        "j*b_col_stride]) for i < rows, j < cols (out's element at i*out_stride + j), the body a "
        "dataflow graph of `nodes` (1..16) operations node0.., each word: op (CGRA_BODY_ADD .. "
        "CGRA_BODY_SHL) in bits 0-7, two operand references in bits 8-15 and 16-23 "
        "(CGRA_BODY_INPUT_A, CGRA_BODY_INPUT_B, CGRA_BODY_IMMEDIATE, or CGRA_BODY_FIRST_NODE + i "
        "for an earlier node i), an immediate (int32, or float32 bits) in bits 32-63; the last "
        "node is the output. The chip maps the body onto its PEs as a modulo schedule and streams "
        "the tile through it. dtype int32 or float32 (integers wrap). B is read only with "
        "CGRA_FABRIC_INPUT_B (its words 0 without); a stride of 0 broadcasts an operand. With CGRA_FABRIC_INT8 "
        "A, B and out hold int8: read as the body's dtype, the output rounded half to even and saturated to int8.",
        ("flags", _I32), ("dtype", _I32), "rows", "cols", ("a_addr", _ADDR), "a_row_stride",
        "a_col_stride", ("b_addr", _ADDR, FABRIC_INPUT_B), ("b_row_stride", _I64, FABRIC_INPUT_B),
        ("b_col_stride", _I64, FABRIC_INPUT_B), ("out_addr", _ADDR), "out_stride", "nodes",
        *(f"node{i}" for i in range(BODY_MAX_NODES))),
    _command(
        Op.REDUCE,
        "Vector unit, a row reduction: for i < rows, out[i*out_stride] = fold(out[i*out_stride], "
        "A[i*a_row_stride + j*a_col_stride]) for j = 0 .. cols-1 in order, fold a CGRA_REDUCE_* "
        "code: SUM (o + a), MAX (max(o, a), NaN propagates) or SUM_SQUARES (o + a*a), each step "
        "rounded to float32. It accumulates into out: a FILL sets the start (0, or -inf for a "
        "max). dtype float32. The lanes take one row each.",
        ("func", _I32), ("dtype", _I32), "rows", "cols", ("a_addr", _ADDR), "a_row_stride",
        "a_col_stride", ("out_addr", _ADDR), "out_stride", fixed=("flags",)),
    _command(
        Op.VFUNC,
        "Vector unit, a special function: out[i,j] = f(t), t = A[i*a_row_stride + j*a_col_stride], "
        "then t = t * scale with CGRA_VFUNC_SCALE and t = t + offset with CGRA_VFUNC_OFFSET "
        "(scale_bits, offset_bits: float32 bits, 0 without their flag), for i < rows, j < cols "
        "(out's element at i*out_stride + j). f a CGRA_VFUNC_* code: IDENTITY, EXP, TANH, ERF, "
        "GELU (erf form), RSQRT, RECIPROCAL, SIGMOID, SILU, GELU_TANH, each a specified sequence of rounded float32 "
        "operations (docs/transformer-ops.md). dtype float32, or (stream v14) bfloat16 / float16: A "
        "widened exactly, f computed in float32, the result rounded to nearest even into out, A float32 "
        "(not rounded) with CGRA_VFUNC_FLOAT32_IN, out float32 holding the rounded result with "
        "CGRA_VFUNC_FLOAT32_OUT (both flags 16-bit dtypes only).",
        ("flags", _I32), ("func", _I32), ("dtype", _I32), "rows", "cols", ("a_addr", _ADDR),
        "a_row_stride", "a_col_stride", ("out_addr", _ADDR), "out_stride",
        ("scale_bits", _BITS, VFUNC_SCALE), ("offset_bits", _BITS, VFUNC_OFFSET)),
    _command(
        Op.UNPACK4,
        "Vector unit, 4-bit weights into a float32 tile (onnxruntime's MatMulNBits layout): for i < "
        "rows, j < cols, q = nibble i % 2 (0 the low one) of byte A[j*a_col_stride + i/2], g = i / "
        "group, out[i*out_stride + j] = float32(q - z) * S[j*scale_col_stride + g] (rounded once), "
        "S float32, z nibble g % 2 of byte Z[j*zero_col_stride + g/2] with CGRA_UNPACK4_ZERO_POINTS "
        "(zero_addr and zero_col_stride 0 without it), else 8. A and Z are bytes (int8 slots holding "
        "uint8 bits). With CGRA_UNPACK4_INT8 (stream v11) q is the nibble as signed int4 (-8..7) and "
        "out[i*out_stride + j] = int8 q, an int8 GEMM's B tile (QDQ int4 weights); scale unread, zero words 0.",
        ("flags", _I32), "rows", "cols", "group", ("a_addr", _ADDR), "a_col_stride", ("scale_addr", _ADDR),
        "scale_col_stride", ("zero_addr", _ADDR, UNPACK4_ZERO_POINTS),
        ("zero_col_stride", _I64, UNPACK4_ZERO_POINTS), ("out_addr", _ADDR), "out_stride"),
    _command(
        Op.LOOKUP,
        "Vector unit, a table lookup on int8: out[i*out_stride + j] = T[A[i*a_stride + j] + 128] for "
        "i < rows, j < cols, T 256 int8 at table_addr (entry k for the input k - 128). An int8 "
        "function of one quantized tensor (a QLinearSigmoid, a SiLU between quantized layers) "
        "computed exactly, its table made at compile time. A, T and out hold int8.",
        "rows", "cols", ("a_addr", _ADDR), "a_stride", ("table_addr", _ADDR), ("out_addr", _ADDR),
        "out_stride", fixed=("flags",)),
)}
