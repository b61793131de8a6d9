"""The ELTWISE tensor intrinsic: out = func(a, b) over a scratchpad tile, operands broadcast.

Stage: schedule and tensorize. An entry of `intrinsics.INTRINSICS` ("eltwise"): its TVMScript
description (what the vector unit computes, in TIR) and implementation (the `cgra_eltwise` call
the code generator lowers to the runtime's ELTWISE record). An operand broadcast along an axis
has extent 1 there in its tile and is read with stride 0, so a bias row or a per-channel column
is loaded once per tile, not expanded in the scratchpad. `eltwise_value` is the one expression
of an output element, shared with the kernel's TE compute (eltwise_kernel.py).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from cgra_sim.isa import DType, EltwiseFunc

from .lower.dma import SPAD


def _code(dtype: str) -> int:
    return int(DType.from_name(dtype))


#: ELTWISE function name -> (ISA func, the TIR expression of one output element).
ELTWISE_FUNCS = {
    "add": (EltwiseFunc.ADD, lambda a, b: a + b),
    "subtract": (EltwiseFunc.SUBTRACT, lambda a, b: a - b),
    "multiply": (EltwiseFunc.MULTIPLY, lambda a, b: a * b),
    "maximum": (EltwiseFunc.MAXIMUM, tirx.max),
    "minimum": (EltwiseFunc.MINIMUM, tirx.min),
}


def eltwise_value(func: str, a, b):
    """One output element of `func`: shared by the intrinsic's description and the kernel's TE
    compute, so tensorize sees one expression."""
    return ELTWISE_FUNCS[func][1](a, b)


def _operand_shape(rows: int, cols: int, full: tuple) -> tuple:
    """An ELTWISE operand tile: (rows, cols), with 1 along each axis it is broadcast on."""
    return (rows if full[0] else 1, cols if full[1] else 1)


def eltwise_intrin(rows: int, cols: int, func: str, dtype: str, a_full: tuple, b_full: tuple,
                   scope: str = SPAD):
    """Vector unit: out[rows, cols] = func(A, B). `a_full` / `b_full` = (walks rows, walks cols)
    per operand: an axis it does not walk has extent 1 in its tile and is read with stride 0."""
    a_shape, b_shape = _operand_shape(rows, cols, a_full), _operand_shape(rows, cols, b_full)
    (ar, ac), (br, bc) = a_full, b_full

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, o: T.handle) -> None:
        A = T.match_buffer(a, a_shape, dtype, offset_factor=1, scope=scope)
        B = T.match_buffer(b, b_shape, dtype, offset_factor=1, scope=scope)
        Out = T.match_buffer(o, (rows, cols), dtype, offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(A[0:a_shape[0], 0:a_shape[1]], B[0:b_shape[0], 0:b_shape[1]])
            T.writes(Out[0:rows, 0:cols])
            for i, j in T.grid(rows, cols):
                with T.sblock("elt"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    Out[vi, vj] = eltwise_value(func, A[vi if ar else 0, vj if ac else 0],
                                                B[vi if br else 0, vj if bc else 0])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, o: T.handle) -> None:
        sa = T.int32()
        sb = T.int32()
        so = T.int32()
        A = T.match_buffer(a, a_shape, dtype, offset_factor=1, scope=scope, strides=[sa, 1])
        B = T.match_buffer(b, b_shape, dtype, offset_factor=1, scope=scope, strides=[sb, 1])
        Out = T.match_buffer(o, (rows, cols), dtype, offset_factor=1, scope=scope, strides=[so, 1])
        with T.sblock("root"):
            T.reads(A[0:a_shape[0], 0:a_shape[1]], B[0:b_shape[0], 0:b_shape[1]])
            T.writes(Out[0:rows, 0:cols])
            T.evaluate(T.call_extern(
                "int32", "cgra_eltwise", int(ELTWISE_FUNCS[func][0]), _code(dtype), rows, cols,
                A.data, A.elem_offset, sa if ar else 0, 1 if ac else 0,
                B.data, B.elem_offset, sb if br else 0, 1 if bc else 0, Out.data, Out.elem_offset, so))

    return desc, impl
