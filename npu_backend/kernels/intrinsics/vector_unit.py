"""The vector unit's intrinsics: FILL, EPILOGUE, ELTWISE and POOL over scratchpad tiles.

Stage: schedule and tensorize. Each factory returns the (description, implementation) pair of one
intrinsic sized for a kernel's tile (builder.py). The expressions of an output element that a
kernel's TE compute must build identically for tensorize to match (`activation`, `requantise`,
`eltwise_value`, `pool_value`) are defined here once and used by both. A POOL's `PoolWindow`
carries everything its expression depends on, all known at compile time: the pooling kernel
holds the whole image in one tile, so which taps lie in the padding is a property of the
output's position in the tile, not of the tile's place. The simulator's functional core
implements the same rules (isa.py).
"""

from __future__ import annotations

import dataclasses

from tvm import tirx

from cgra_codegen import device_call
from cgra_sim.isa import (EPILOGUE_BIAS, EPILOGUE_CLIP, EPILOGUE_DEQUANTISE, EPILOGUE_RELU, EPILOGUE_REQUANTISE,
                          EPILOGUE_RESIDUAL, POOL_AVERAGE, EltwiseFunc)

from .builder import SPAD, Tile, intrinsic
from .fabric import body_value, fabric_call, int8_body_value
from .pe_array import dtype_code

HALF_FLOATS = ("bfloat16", "float16")


def activation(value, dtype: str, relu: bool, clip):
    """relu, then clip to (lo, hi): the tail of an epilogue, in `dtype`."""
    if relu:
        value = tirx.max(value, tirx.const(0, dtype))
    if clip is not None:
        lo, hi = (tirx.const(bound, dtype) for bound in clip)
        value = tirx.min(tirx.max(value, lo), hi)
    return value


def requantise(value, scale, zero_point: int, out_dtype: str = "int8"):
    """int32 `value` -> int8 (int64 -> int16 with `out_dtype` "int16"): nearbyint(clamp(
    float32(value) * scale, lowest - zp, highest - zp)) + zp, onnxruntime's arithmetic (docs/simulator.md);
    a float32 `value` is quantised: value / scale in place of the product (onnxruntime's QuantizeLinear)."""
    bits = 16 if out_dtype == "int16" else 8
    product = value / scale if str(value.ty) == "float32" else tirx.Cast("float32", value) * scale
    lowest, highest = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    lo, hi = (tirx.const(float(bound), "float32") for bound in (lowest - zero_point, highest - zero_point))
    clamped = tirx.min(tirx.max(product, lo), hi)
    return tirx.Cast(out_dtype, tirx.nearbyint(clamped) + tirx.const(float(zero_point), "float32"))


def fill_intrin(rows: int, cols: int, dtype: str, *, value=None, scope: str = SPAD):
    """FILL: set a rows x cols tile to `value`, a constant or an expression of the kernel's
    symbolic dimensions that the kernel computes at run time (global_pool.py's 1 / (H * W));
    zero without one (a reduction's init)."""
    def call(buffers, strides):
        C = buffers["C"]  # a zero fill's bits are 0, as lower/fold_init.py looks for
        return device_call("cgra_fill", dtype=dtype_code(dtype), addr=C, rows=rows, cols=cols,
                           stride=strides["C"][0], value_bits=0 if value is None else value)

    description = tirx.Cast(dtype, 0) if value is None else value

    return intrinsic([], Tile("C", (rows, cols), dtype), "init", lambda buffers, i, j: description, call,
                     scope=scope)


def accumulate_intrin(rows: int, cols: int, dtype: str, *, scope: str = SPAD):
    """ELTWISE add in place: Out[rows, cols] += B, a reduction's update over tiles
    (global_pool.py sums its blocks)."""
    def call(buffers, strides):
        out = (buffers["Out"], strides["Out"][0])
        return eltwise_call("add", dtype, rows, cols, (*out, 1), (buffers["B"], strides["B"][0], 1), out)

    return intrinsic([Tile("B", (rows, cols), dtype)], Tile("Out", (rows, cols), dtype), "acc",
                     lambda buffers, i, j: buffers["B"][i, j], call, accumulate=True, scope=scope)


def epilogue_flags(bias: bool, relu: bool, residual: bool, clip, zero_point, dequantise: bool = False) -> int:
    return ((EPILOGUE_BIAS if bias else 0) | (EPILOGUE_RELU if relu else 0)
            | (EPILOGUE_RESIDUAL if residual else 0) | (EPILOGUE_CLIP if clip is not None else 0)
            | (EPILOGUE_REQUANTISE if zero_point is not None else 0) | (EPILOGUE_DEQUANTISE if dequantise else 0))


def dequantise_value(value, scale, zero_point: int):
    """int8 `value` -> float32(int32(value) - zp) * scale: onnxruntime's DequantizeLinear, the
    EPILOGUE's last step with EPILOGUE_DEQUANTISE (docs/command-stream.md)."""
    difference = tirx.Cast("int32", value) - tirx.const(zero_point, "int32")
    return tirx.Cast("float32", difference) * scale


def epilogue_value(buffers, i, j, dtype: str, *, bias: bool, relu: bool, residual: bool, clip):
    """One element of EPILOGUE before any requantisation or rounding: activation(Acc + Bias + Res),
    a bias or residual of another dtype (a 16-bit float output's) widened to `dtype`."""
    def widened(value):
        return value if str(value.ty) == dtype else value.astype(dtype)

    total = buffers["Acc"][i, j]
    total = total + widened(buffers["Bias"][j]) if bias else total
    total = total + widened(buffers["Res"][i, j]) if residual else total
    return activation(total, dtype, relu, clip)


def epilogue_call(buffers, strides, rows: int, cols: int, dtype: str, out_dtype: str, *, bias: bool, relu: bool,
                  residual: bool, clip, zero_point=None, out=None, dequantise: bool = False):
    """The device call of one EPILOGUE over tiles named as epilogue_intrin names them; `out`
    (address, row stride) writes elsewhere than Out."""
    lo, hi = (tirx.const(bound, dtype) for bound in clip) if clip is not None else (0, 0)
    out_addr, out_stride = out if out is not None else (buffers["Out"], strides["Out"][0])
    return device_call(
        "cgra_epilogue", flags=epilogue_flags(bias, relu, residual, clip, zero_point, dequantise),
        acc_dtype=dtype_code(dtype), out_dtype=dtype_code(out_dtype), m=rows, n=cols,
        acc_addr=buffers["Acc"], acc_stride=strides["Acc"][0],
        bias_addr=buffers.get("Bias", 0), out_addr=out_addr, out_stride=out_stride,
        residual_addr=buffers.get("Res", 0), residual_stride=strides["Res"][0] if residual else 0,
        clip_lo_bits=lo, clip_hi_bits=hi, scale_addr=buffers.get("Scale", 0),
        out_zero_point=zero_point or 0)


def epilogue_intrin(rows: int, cols: int, dtype: str, *, bias: bool, relu: bool, residual: bool = False,
                    clip=None, zero_point: int | None = None, body=None, out_dtype: str | None = None,
                    dequantise: bool = False, qadd=None, qadd_swapped: bool = False, scope: str = SPAD):
    """EPILOGUE over a rows x cols tile of the accumulator (`dtype`):
    out = requantise?(clip?(relu?(acc + bias? + residual?)), scale, zero_point), then with `body`
    (a FabricBody) a FABRIC runs it over the output tile in place. bias: a row of
    cols; residual: a rows x cols tile; clip: None or (lo, hi); zero_point: None, or an int8
    output requantised with a float32 scale row (an int32 accumulator multiplied by it, a float32
    one divided: a QuantizeLinear); out_dtype: None, or a
    16-bit float ("bfloat16", "float16") a float32 result is rounded to (nearest even), the bias
    and residual then in that dtype too (widened exactly into the sum); or, a 16-bit float `dtype`,
    "float32": the accumulator widened exactly, nothing else (a cast). dequantise: the requantised
    int8 result of an int32 accumulator becomes float32 (q - zp) * Scale[2j + 1], Scale then a row
    of 2 * cols, per channel (the requantisation's multiplier, the dequantisation's scale). qadd: a
    FABRIC_INT8 body (kernels/gemm/qadd_epilogue.py) a FABRIC then runs over the requantised int8 output
    tile in place and an int8 rows x cols tile QRes (input A: QRes when `qadd_swapped`, else the output)."""
    requant = zero_point is not None
    if qadd is not None and (not requant or dtype != "int32" or body is not None or dequantise or residual
                             or out_dtype is not None):
        raise ValueError("an EPILOGUE's QLinearAdd follows its requantisation of an int32 accumulator to int8, with "
                         "no body, residual or dequantisation")
    if dequantise and (not requant or dtype != "int32" or body is not None or out_dtype not in (None, "float32")):
        raise ValueError("an EPILOGUE dequantises the requantised int8 result of an int32 accumulator to float32 "
                         f"(no body), not {dtype} with zero point {zero_point} to {out_dtype}")
    half = out_dtype is not None and out_dtype != dtype and not dequantise
    if half and dtype in HALF_FLOATS and out_dtype == "float32":
        if bias or relu or residual or clip is not None or requant or body is not None:
            raise ValueError(f"an EPILOGUE only widens a {dtype} accumulator to float32: no other step")
        return intrinsic([Tile("Acc", (rows, cols), dtype)], Tile("Out", (rows, cols), "float32"), "epi",
                         lambda buffers, i, j: buffers["Acc"][i, j].astype("float32"),
                         lambda buffers, strides: epilogue_call(buffers, strides, rows, cols, dtype, "float32",
                                                                bias=False, relu=False, residual=False, clip=None),
                         scope=scope)
    if half and (dtype != "float32" or requant or body is not None or out_dtype not in HALF_FLOATS):
        raise ValueError(f"an EPILOGUE rounds a float32 sum to bfloat16 or float16 without requantisation or a "
                         f"body, not {dtype} to {out_dtype}")
    operand = out_dtype if half else dtype
    inputs = [Tile("Acc", (rows, cols), dtype)] + ([Tile("Bias", (cols,), operand)] if bias else []) \
        + ([Tile("Res", (rows, cols), operand)] if residual else []) \
        + ([Tile("Scale", ((2 if dequantise else 1) * cols,), "float32")] if requant else [])
    if qadd is not None:  # read in the value's order (the outer block's reads are matched in order)
        inputs = [Tile("QRes", (rows, cols), "int8")] + inputs if qadd_swapped else \
            inputs + [Tile("QRes", (rows, cols), "int8")]
    narrow = "int16" if dtype == "int64" else "int8"  # a requantisation's output
    output = Tile("Out", (rows, cols), "float32" if dequantise else narrow if requant else operand)

    def value(buffers, i, j):
        total = epilogue_value(buffers, i, j, dtype, bias=bias, relu=relu, residual=residual, clip=clip)
        if body is not None:
            total = body_value(body, total)
        if half:
            return total.astype(out_dtype)
        if not requant:
            return total
        if dequantise:
            quantised = requantise(total, buffers["Scale"][2 * j], zero_point, narrow)
            return dequantise_value(quantised, buffers["Scale"][2 * j + 1], zero_point)
        quantised = requantise(total, buffers["Scale"][j], zero_point, narrow)
        if qadd is None:
            return quantised
        other = buffers["QRes"][i, j]
        return int8_body_value(qadd, *((other, quantised) if qadd_swapped else (quantised, other)))

    def call(buffers, strides):
        return epilogue_call(buffers, strides, rows, cols, dtype, output.dtype, bias=bias, relu=relu,
                             residual=residual, clip=clip, zero_point=zero_point, dequantise=dequantise)

    def call_with_body(buffers, strides):  # then the body over the output tile, in place
        return [call(buffers, strides), fabric_call(body, rows, cols, buffers["Out"], strides["Out"][0],
                                                    buffers["Out"], strides["Out"][0])]

    def call_with_qadd(buffers, strides):  # then the add over the output tile, in place
        out, other = (buffers["Out"], strides["Out"][0]), (buffers["QRes"], strides["QRes"][0])
        a, b = (other, out) if qadd_swapped else (out, other)
        return [call(buffers, strides), fabric_call(qadd, rows, cols, *a, *out, (*b, 1))]

    implementation = call_with_qadd if qadd is not None else call if body is None else call_with_body
    return intrinsic(inputs, output, "epi", value, implementation, scope=scope)


#: ELTWISE function name -> (ISA func, the TIR expression of one output element).
ELTWISE_FUNCS = {
    "add": (EltwiseFunc.ADD, lambda a, b: a + b),
    "subtract": (EltwiseFunc.SUBTRACT, lambda a, b: a - b),
    "multiply": (EltwiseFunc.MULTIPLY, lambda a, b: a * b),
    "maximum": (EltwiseFunc.MAXIMUM, tirx.max),
    "minimum": (EltwiseFunc.MINIMUM, tirx.min),
}


def eltwise_call(func: str, dtype: str, rows: int, cols: int, a, b, out):
    """The device call of one ELTWISE: `a` and `b` (tile, row stride, column stride; 0 along a
    broadcast axis), `out` (tile, row stride)."""
    return device_call(
        "cgra_eltwise", func=int(ELTWISE_FUNCS[func][0]), dtype=dtype_code(dtype), rows=rows, cols=cols,
        a_addr=a[0], a_row_stride=a[1], a_col_stride=a[2], b_addr=b[0], b_row_stride=b[1], b_col_stride=b[2],
        out_addr=out[0], out_stride=out[1])


def eltwise_value(func: str, a, b):
    """One output element of ELTWISE `func`."""
    return ELTWISE_FUNCS[func][1](a, b)


def eltwise_intrin(rows: int, cols: int, func: str, dtype: str, *, a_full: tuple, b_full: tuple,
                   scope: str = SPAD):
    """ELTWISE: out[rows, cols] = func(A, B). `a_full` / `b_full` = (walks rows, walks cols) per
    operand: an axis it does not walk has extent 1 in its tile and is read with stride 0, so a
    broadcast row or column is loaded once per tile, not expanded in the scratchpad."""
    def operand(name, full):
        return Tile(name, (rows if full[0] else 1, cols if full[1] else 1), dtype)

    def read(buffer, full, i, j):
        return buffer[i if full[0] else 0, j if full[1] else 0]

    def value(buffers, i, j):
        return eltwise_value(func, read(buffers["A"], a_full, i, j), read(buffers["B"], b_full, i, j))

    def call(buffers, strides):
        a = (buffers["A"], strides["A"][0] if a_full[0] else 0, 1 if a_full[1] else 0)
        b = (buffers["B"], strides["B"][0] if b_full[0] else 0, 1 if b_full[1] else 0)
        return eltwise_call(func, dtype, rows, cols, a, b, (buffers["Out"], strides["Out"][0]))

    return intrinsic([operand("A", a_full), operand("B", b_full)], Tile("Out", (rows, cols), dtype), "elt",
                     value, call, scope=scope)


@dataclasses.dataclass(frozen=True)
class PoolWindow:
    """One POOL's window: `kind` "max" or "avg", kernel (kh, kw), strides, dilation, the valid
    rectangle (y_lo, y_hi, x_lo, x_hi) in window positions and, for "avg", the count rectangle."""

    kind: str
    kernel: tuple
    strides: tuple = (1, 1)
    dilation: tuple = (1, 1)
    valid: tuple = (0, 0, 0, 0)
    count: tuple | None = None

    @property
    def name(self) -> str:
        """The window's fields as a piece of an intrinsic's name, e.g. "max_k3x3_s2x2_d1x1_v1-9-1-9"."""
        def join(values, sep="x"):
            return sep.join(str(v) for v in values)
        count = f"_c{join(self.count, '-')}" if self.count is not None else ""
        return (f"{self.kind}_k{join(self.kernel)}_s{join(self.strides)}_d{join(self.dilation)}"
                f"_v{join(self.valid, '-')}{count}")

    def extent(self, out: int, axis: int) -> int:
        """Window rows (axis 0) or columns (axis 1) that `out` outputs read."""
        return (out - 1) * self.strides[axis] + (self.kernel[axis] - 1) * self.dilation[axis] + 1


def _inside(window: PoolWindow, rect: tuple, axis: int, extent: int, tap: int, position):
    """Whether tap `tap` of output `position` lies in `rect` along `axis`: True or False when it
    holds for every output 0..extent-1 (no test in the expression), else the TIR condition."""
    lo, hi = rect[2 * axis], rect[2 * axis + 1]
    step, spacing = window.strides[axis], window.dilation[axis]
    first, last = tap * spacing, (extent - 1) * step + tap * spacing
    if lo <= first and last < hi:
        return True
    if last < lo or first >= hi:
        return False
    at = position * step + tap * spacing
    terms = ([at >= lo] if first < lo else []) + ([at < hi] if last >= hi else [])
    return terms[0] if len(terms) == 1 else tirx.all(*terms)


def never_valid_taps(window: PoolWindow, out_shape: tuple) -> list:
    """(axis, tap) of every tap that lies outside the valid rectangle for all outputs of a tile of
    `out_shape`: `pool_value` leaves those out, so the tile would read less than its window (and
    te.create_prim_func folds such taps away where the intrinsic keeps the window), which a
    kernel cannot tensorize; it happens only for images smaller than the window."""
    position = tirx.Var("o", "int32")
    return [(axis, tap) for axis in (0, 1) for tap in range(window.kernel[axis])
            if _inside(window, window.valid, axis, out_shape[axis], tap, position) is False]


def _both(a, b):
    if a is False or b is False:
        return False
    if a is True:
        return b
    return a if b is True else tirx.all(a, b)


def _count(window: PoolWindow, axis: int, extent: int, position):
    """Taps along `axis` inside the count rectangle: an int, or an int32 TIR expression."""
    total, terms = 0, []
    for tap in range(window.kernel[axis]):
        inside = _inside(window, window.count, axis, extent, tap, position)
        if inside is True:
            total += 1
        elif inside is not False:
            terms.append(tirx.Select(inside, tirx.const(1, "int32"), tirx.const(0, "int32")))
    for term in terms:
        total = term if isinstance(total, int) and total == 0 else total + term
    return total


def lowest_value(dtype: str):
    """The dtype's lowest value as a TIR constant: -inf for float32, the minimum of an integer."""
    return tirx.const(float("-inf"), dtype) if dtype == "float32" else tirx.min_value(dtype)


def pool_value(load, y, x, c, window: PoolWindow, out_shape: tuple, dtype: str):
    """The pooled value of output (y, x, c) over a tile of `out_shape` = (oh, ow) outputs: taps
    ry-major; a tap outside the valid rectangle gives the dtype's lowest value (-inf) to a max and
    0 to a sum; an average divides the sum by the taps inside the count rectangle (at least 1).
    `load(py, px, c)` reads the window at a window position."""
    oh, ow = out_shape
    fallback = lowest_value(dtype) if window.kind == "max" else tirx.const(0, dtype)
    total = None
    for ry in range(window.kernel[0]):
        for rx in range(window.kernel[1]):
            py, px = y * window.strides[0] + ry * window.dilation[0], x * window.strides[1] + rx * window.dilation[1]
            valid = _both(_inside(window, window.valid, 0, oh, ry, y), _inside(window, window.valid, 1, ow, rx, x))
            term = load(py, px, c) if valid is True else fallback if valid is False else \
                tirx.Select(valid, load(py, px, c), fallback)
            total = term if total is None else tirx.max(total, term) if window.kind == "max" else total + term
    if window.kind == "max":
        return total
    count = _count(window, 0, oh, y) * _count(window, 1, ow, x)
    if isinstance(count, int):  # a sum over a one-tap count rectangle is the sum (TE drops "/ 1")
        return total if count <= 1 else total / tirx.const(float(count), dtype)
    return total / tirx.Cast(dtype, tirx.max(count, tirx.const(1, "int32")))


def pool_intrin(oh: int, ow: int, cols: int, window: PoolWindow, dtype: str, *, scope: str = SPAD):
    """POOL: out[oh, ow, cols] = `pool_value` over a window (in_h, in_w, cols) of the scratchpad."""
    data = Tile("A", (window.extent(oh, 0), window.extent(ow, 1), cols), dtype)
    count = window.count if window.count is not None else (0, 0, 0, 0)

    def value(buffers, y, x, c):
        return pool_value(lambda i, j, k: buffers["A"][i, j, k], y, x, c, window, (oh, ow), dtype)

    def call(buffers, strides):
        A, Out = buffers["A"], buffers["Out"]
        (sa0, sa1), (so0, so1) = strides["A"], strides["Out"]
        rectangles = {f"{name}_{corner}": value
                      for name, bounds in (("valid", window.valid), ("count", count))
                      for corner, value in zip(("y_lo", "y_hi", "x_lo", "x_hi"), bounds)}
        return device_call(
            "cgra_pool", flags=POOL_AVERAGE if window.kind == "avg" else 0, dtype=dtype_code(dtype),
            oh=oh, ow=ow, n=cols, kh=window.kernel[0], kw=window.kernel[1], a_addr=A,
            a_row_stride=sa0, a_col_stride=sa1, stride_y=window.strides[0], stride_x=window.strides[1],
            dilation_y=window.dilation[0], dilation_x=window.dilation[1], out_addr=Out,
            out_y_stride=so0, out_x_stride=so1, **rectangles)

    return intrinsic([data], Tile("Out", (oh, ow, cols), dtype), "acc", value, call, scope=scope)
