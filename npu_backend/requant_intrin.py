"""The requantising epilogue intrinsic: an int32 tile (+ bias) (relu) -> int8 on the vector unit.

Stage: schedule and tensorize. `requantise` is the TIR expression of the EPILOGUE's REQUANTISE
step, shared by the intrinsic's description and the kernels' TE compute (kernels.py) so that
tensorize sees one expression; `epilogue_requant_intrin` returns the (description,
implementation) pair for a rows x cols tile, registered in intrinsics.INTRINSICS under
"epilogue_requant". The arithmetic is onnxruntime's (docs/simulator.md): float32(x) * scale[j],
clamped to [-128 - zp, 127 - zp], rounded half to even, + zp.

This module imports nothing from intrinsics.py (which imports it for its table).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from cgra_sim.isa import EPILOGUE_BIAS, EPILOGUE_RELU, EPILOGUE_REQUANTISE, DType

_SPAD = "global.cgra_spad"  # intrinsics.SPAD
_INT32, _INT8 = int(DType.INT32), int(DType.INT8)


def requantise(value, scale, zero_point: int):
    """int32 `value` -> int8: nearbyint(clamp(float32(value) * scale, -128 - zp, 127 - zp)) + zp."""
    product = tirx.Cast("float32", value) * scale
    lo, hi = (tirx.const(float(bound), "float32") for bound in (-128 - zero_point, 127 - zero_point))
    clamped = tirx.min(tirx.max(product, lo), hi)
    return tirx.Cast("int8", tirx.nearbyint(clamped) + tirx.const(float(zero_point), "float32"))


def _relu(value, relu: bool):
    return tirx.max(value, tirx.const(0, "int32")) if relu else value


def epilogue_requant_intrin(rows: int, cols: int, bias: bool, relu: bool, zero_point: int,
                            scope: str = _SPAD):
    """Vector unit: out[i, j] = requantise(relu?(acc[i, j] + bias?[j]), scale[j], zero_point)
    with acc and bias int32, the scale row float32 and out int8."""
    flags = EPILOGUE_REQUANTISE | (EPILOGUE_BIAS if bias else 0) | (EPILOGUE_RELU if relu else 0)
    if not bias:
        return _without_bias(rows, cols, relu, zero_point, flags, scope)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, s: T.handle, o: T.handle) -> None:
        Acc = T.match_buffer(a, (rows, cols), "int32", offset_factor=1, scope=scope)
        Bias = T.match_buffer(b, (cols,), "int32", offset_factor=1, scope=scope)
        Scale = T.match_buffer(s, (cols,), "float32", offset_factor=1, scope=scope)
        Out = T.match_buffer(o, (rows, cols), "int8", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(Acc[0:rows, 0:cols], Bias[0:cols], Scale[0:cols])
            T.writes(Out[0:rows, 0:cols])
            for i, j in T.grid(rows, cols):
                with T.sblock("epi"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    Out[vi, vj] = requantise(_relu(Acc[vi, vj] + Bias[vj], relu), Scale[vj], zero_point)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, s: T.handle, o: T.handle) -> None:
        sa = T.int32()
        so = T.int32()
        Acc = T.match_buffer(a, (rows, cols), "int32", offset_factor=1, scope=scope, strides=[sa, 1])
        Bias = T.match_buffer(b, (cols,), "int32", offset_factor=1, scope=scope)
        Scale = T.match_buffer(s, (cols,), "float32", offset_factor=1, scope=scope)
        Out = T.match_buffer(o, (rows, cols), "int8", offset_factor=1, scope=scope, strides=[so, 1])
        with T.sblock("root"):
            T.reads(Acc[0:rows, 0:cols], Bias[0:cols], Scale[0:cols])
            T.writes(Out[0:rows, 0:cols])
            T.evaluate(T.call_extern(
                "int32", "cgra_epilogue", flags, _INT32, _INT8, rows, cols,
                Acc.data, Acc.elem_offset, sa, Bias.data, Bias.elem_offset,
                Out.data, Out.elem_offset, so, 0, 0, 0, 0, 0, Scale.data, Scale.elem_offset, zero_point))

    return desc, impl


def _without_bias(rows: int, cols: int, relu: bool, zero_point: int, flags: int, scope: str):
    """The requantising epilogue of a kernel with no bias: the bias operand is address 0."""

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, s: T.handle, o: T.handle) -> None:
        Acc = T.match_buffer(a, (rows, cols), "int32", offset_factor=1, scope=scope)
        Scale = T.match_buffer(s, (cols,), "float32", offset_factor=1, scope=scope)
        Out = T.match_buffer(o, (rows, cols), "int8", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(Acc[0:rows, 0:cols], Scale[0:cols])
            T.writes(Out[0:rows, 0:cols])
            for i, j in T.grid(rows, cols):
                with T.sblock("epi"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    Out[vi, vj] = requantise(_relu(Acc[vi, vj], relu), Scale[vj], zero_point)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, s: T.handle, o: T.handle) -> None:
        sa = T.int32()
        so = T.int32()
        Acc = T.match_buffer(a, (rows, cols), "int32", offset_factor=1, scope=scope, strides=[sa, 1])
        Scale = T.match_buffer(s, (cols,), "float32", offset_factor=1, scope=scope)
        Out = T.match_buffer(o, (rows, cols), "int8", offset_factor=1, scope=scope, strides=[so, 1])
        with T.sblock("root"):
            T.reads(Acc[0:rows, 0:cols], Scale[0:cols])
            T.writes(Out[0:rows, 0:cols])
            T.evaluate(T.call_extern(
                "int32", "cgra_epilogue", flags, _INT32, _INT8, rows, cols,
                Acc.data, Acc.elem_offset, sa, 0, 0, Out.data, Out.elem_offset, so,
                0, 0, 0, 0, 0, Scale.data, Scale.elem_offset, zero_point))

    return desc, impl
