"""The vector unit's intrinsics: FILL, EPILOGUE, ELTWISE and POOL over scratchpad tiles.

Stage: schedule and tensorize. Each factory returns the (description, implementation) pair of one
intrinsic sized for a kernel's tile (builder.py). The expressions of an output element that a
kernel's TE compute must build identically for tensorize to match (`activation`, `requantise`,
`eltwise_value`; POOL's `pool_value` in pool_window.py) are defined here once and used by both.
"""

from __future__ import annotations

from tvm import tirx

from cgra_sim.isa import (EPILOGUE_BIAS, EPILOGUE_CLIP, EPILOGUE_RELU, EPILOGUE_REQUANTISE,
                          EPILOGUE_RESIDUAL, POOL_AVERAGE, EltwiseFunc)

from .builder import SPAD, Tile, intrinsic
from .pe_array import dtype_code
from .pool_window import PoolWindow, pool_value


def activation(value, dtype: str, relu: bool, clip):
    """relu, then clip to (lo, hi): the tail of an epilogue, in `dtype`."""
    if relu:
        value = tirx.max(value, tirx.const(0, dtype))
    if clip is not None:
        lo, hi = (tirx.const(bound, dtype) for bound in clip)
        value = tirx.min(tirx.max(value, lo), hi)
    return value


def requantise(value, scale, zero_point: int):
    """int32 `value` -> int8: nearbyint(clamp(float32(value) * scale, -128 - zp, 127 - zp)) + zp,
    onnxruntime's arithmetic (docs/simulator.md)."""
    product = tirx.Cast("float32", value) * scale
    lo, hi = (tirx.const(float(bound), "float32") for bound in (-128 - zero_point, 127 - zero_point))
    clamped = tirx.min(tirx.max(product, lo), hi)
    return tirx.Cast("int8", tirx.nearbyint(clamped) + tirx.const(float(zero_point), "float32"))


def fill_intrin(rows: int, cols: int, dtype: str, scope: str = SPAD):
    """FILL: zero a rows x cols accumulator tile (a reduction's init)."""
    def call(buffers, strides):
        C = buffers["C"]
        return tirx.call_extern("int32", "cgra_fill", dtype_code(dtype), C.data, C.elem_offset, rows, cols,
                                strides["C"][0], 0)

    return intrinsic([], Tile("C", (rows, cols), dtype), "init", lambda buffers, i, j: tirx.Cast(dtype, 0),
                     call, scope=scope)


def epilogue_flags(bias: bool, relu: bool, residual: bool, clip, zero_point) -> int:
    return ((EPILOGUE_BIAS if bias else 0) | (EPILOGUE_RELU if relu else 0)
            | (EPILOGUE_RESIDUAL if residual else 0) | (EPILOGUE_CLIP if clip is not None else 0)
            | (EPILOGUE_REQUANTISE if zero_point is not None else 0))


def epilogue_intrin(rows: int, cols: int, dtype: str, bias: bool, relu: bool, residual: bool = False,
                    clip=None, zero_point: int | None = None, scope: str = SPAD):
    """EPILOGUE over a rows x cols tile of the accumulator (`dtype`):
    out = requantise?(clip?(relu?(acc + bias? + residual?)), scale, zero_point). bias: a row of
    cols; residual: a rows x cols tile; clip: None or (lo, hi); zero_point: None, or an int8
    output requantised with a float32 scale row (int32 accumulators only)."""
    requant = zero_point is not None
    inputs = [Tile("Acc", (rows, cols), dtype)] + ([Tile("Bias", (cols,), dtype)] if bias else []) \
        + ([Tile("Res", (rows, cols), dtype)] if residual else []) \
        + ([Tile("Scale", (cols,), "float32")] if requant else [])
    output = Tile("Out", (rows, cols), "int8" if requant else dtype)

    def value(buffers, i, j):
        total = buffers["Acc"][i, j]
        total = total + buffers["Bias"][j] if bias else total
        total = total + buffers["Res"][i, j] if residual else total
        total = activation(total, dtype, relu, clip)
        return requantise(total, buffers["Scale"][j], zero_point) if requant else total

    def call(buffers, strides):
        def tile(name):  # a disabled operand is address 0
            return (buffers[name].data, buffers[name].elem_offset) if name in buffers else (0, 0)
        lo, hi = (tirx.const(bound, dtype) for bound in clip) if clip is not None else (0, 0)
        return tirx.call_extern(
            "int32", "cgra_epilogue", epilogue_flags(bias, relu, residual, clip, zero_point), dtype_code(dtype),
            dtype_code(output.dtype), rows, cols, *tile("Acc"), strides["Acc"][0], *tile("Bias"),
            *tile("Out"), strides["Out"][0], *tile("Res"), strides["Res"][0] if residual else 0, lo, hi,
            *tile("Scale"), zero_point or 0)

    return intrinsic(inputs, output, "epi", value, call, scope=scope)


#: ELTWISE function name -> (ISA func, the TIR expression of one output element).
ELTWISE_FUNCS = {
    "add": (EltwiseFunc.ADD, lambda a, b: a + b),
    "subtract": (EltwiseFunc.SUBTRACT, lambda a, b: a - b),
    "multiply": (EltwiseFunc.MULTIPLY, lambda a, b: a * b),
    "maximum": (EltwiseFunc.MAXIMUM, tirx.max),
    "minimum": (EltwiseFunc.MINIMUM, tirx.min),
}


def eltwise_value(func: str, a, b):
    """One output element of ELTWISE `func`."""
    return ELTWISE_FUNCS[func][1](a, b)


def eltwise_intrin(rows: int, cols: int, func: str, dtype: str, a_full: tuple, b_full: tuple,
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
        A, B, Out = buffers["A"], buffers["B"], buffers["Out"]
        return tirx.call_extern(
            "int32", "cgra_eltwise", int(ELTWISE_FUNCS[func][0]), dtype_code(dtype), rows, cols,
            A.data, A.elem_offset, strides["A"][0] if a_full[0] else 0, 1 if a_full[1] else 0,
            B.data, B.elem_offset, strides["B"][0] if b_full[0] else 0, 1 if b_full[1] else 0,
            Out.data, Out.elem_offset, strides["Out"][0])

    return intrinsic([operand("A", a_full), operand("B", b_full)], Tile("Out", (rows, cols), dtype), "elt",
                     value, call, scope=scope)


def pool_intrin(oh: int, ow: int, cols: int, window: PoolWindow, dtype: str, scope: str = SPAD):
    """POOL: out[oh, ow, cols] = `pool_value` over a window (in_h, in_w, cols) of the scratchpad."""
    data = Tile("A", (window.extent(oh, 0), window.extent(ow, 1), cols), dtype)
    rect = window.valid + (window.count if window.count is not None else (0, 0, 0, 0))

    def value(buffers, y, x, c):
        return pool_value(lambda i, j, k: buffers["A"][i, j, k], y, x, c, window, (oh, ow), dtype)

    def call(buffers, strides):
        A, Out = buffers["A"], buffers["Out"]
        (sa0, sa1), (so0, so1) = strides["A"], strides["Out"]
        return tirx.call_extern(
            "int32", "cgra_pool", POOL_AVERAGE if window.kind == "avg" else 0, dtype_code(dtype), oh, ow, cols,
            *window.kernel, A.data, A.elem_offset, sa0, sa1, *window.strides, *window.dilation,
            Out.data, Out.elem_offset, so0, so1, *rect)

    return intrinsic([data], Tile("Out", (oh, ow, cols), dtype), "acc", value, call, scope=scope)
