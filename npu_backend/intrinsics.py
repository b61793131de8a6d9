"""The CGRA tensor intrinsics: one table, from which TensorIntrins are made on demand.

Stage: schedule and tensorize. Each entry of `INTRINSICS` ties an ISA opcode to a factory that
returns the TVMScript description (what the hardware computes, in TIR) and implementation (the
`call_extern` the code generator lowers into a runtime call that records that opcode). Their
numpy semantics live in the simulator's functional core; `tests/test_intrinsics.py` runs every
entry through all three.

Intrinsics are sized per kernel (PE-array passes of `rows x cols x depth`, vector ops over a
whole tile), so they are registered under names that carry their shape and dtypes. `scope`
exists so the tests can build a description for the host and run it as the TIR reference.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from tvm import tirx
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from cgra_sim.isa import (EPILOGUE_BIAS, EPILOGUE_CLIP, EPILOGUE_RELU, EPILOGUE_RESIDUAL, GEMM_ACCUMULATE,
                          DType, Op)

from .pool_intrinsic import PoolWindow, pool_intrin
from .eltwise_intrin import eltwise_intrin
from .requant_intrin import epilogue_requant_intrin

SPAD = "global.cgra_spad"


def _relu(value, dtype: str):
    return T.max(value, T.Cast(dtype, 0))


def _code(dtype: str) -> int:
    return int(DType.from_name(dtype))


def gemm_intrin(rows: int, cols: int, depth: int, dtype: str, acc_dtype: str, scope: str = SPAD):
    """One PE-array pass: acc[rows, cols] += A[rows, depth] @ B[depth, cols] on scratchpad tiles."""

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (rows, depth), dtype, offset_factor=1, scope=scope)
        B = T.match_buffer(b, (depth, cols), dtype, offset_factor=1, scope=scope)
        C = T.match_buffer(c, (rows, cols), acc_dtype, offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:rows, 0:cols], A[0:rows, 0:depth], B[0:depth, 0:cols])
            T.writes(C[0:rows, 0:cols])
            for i, j, k in T.grid(rows, cols, depth):
                with T.sblock("update"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    C[vi, vj] = C[vi, vj] + T.Cast(acc_dtype, A[vi, vk]) * T.Cast(acc_dtype, B[vk, vj])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa = T.int32()
        sb = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (rows, depth), dtype, offset_factor=1, scope=scope, strides=[sa, 1])
        B = T.match_buffer(b, (depth, cols), dtype, offset_factor=1, scope=scope, strides=[sb, 1])
        C = T.match_buffer(c, (rows, cols), acc_dtype, offset_factor=1, scope=scope, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(C[0:rows, 0:cols], A[0:rows, 0:depth], B[0:depth, 0:cols])
            T.writes(C[0:rows, 0:cols])
            T.evaluate(T.call_extern(
                "int32", "cgra_gemm", GEMM_ACCUMULATE, _code(dtype), rows, cols, depth,
                A.data, A.elem_offset, sa, B.data, B.elem_offset, sb, C.data, C.elem_offset, sc))

    return desc, impl


def window_sum(load_a, load_b, y, x, c, window, acc_dtype: str):
    """The depthwise sum at output (y, x, c): taps ry-major, each term cast to `acc_dtype`, added
    left to right (the order the simulator adds them in). `window` = (kh, kw, sh, sw, dh, dw);
    `load_a(iy, ix, c)` and `load_b(ry, rx, c)` read the input window and the weights. Shared by
    the intrinsic's description and the kernel's TE compute, so tensorize sees one expression."""
    kh, kw, sh, sw, dh, dw = window
    total = None
    for ry in range(kh):
        for rx in range(kw):
            term = load_a(y * sh + ry * dh, x * sw + rx * dw, c).astype(acc_dtype) * \
                load_b(ry, rx, c).astype(acc_dtype)
            total = term if total is None else total + term
    return total


def window_extent(out: int, kernel: int, stride: int, dilation: int) -> int:
    """Input rows (or columns) a window of `out` outputs reads."""
    return (out - 1) * stride + (kernel - 1) * dilation + 1


def depthwise_intrin(oh: int, ow: int, cols: int, window: tuple, dtype: str, acc_dtype: str,
                     scope: str = SPAD):
    """One PE-array pass, a PE per output: acc[oh, ow, cols] = the depthwise window sum over an
    input tile (in_h, in_w, cols) and weights (kh, kw, cols). `window` = (kh, kw, sh, sw, dh, dw)."""
    kh, kw, sh, sw, dh, dw = window
    in_h, in_w = window_extent(oh, kh, sh, dh), window_extent(ow, kw, sw, dw)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (in_h, in_w, cols), dtype, offset_factor=1, scope=scope)
        B = T.match_buffer(b, (kh, kw, cols), dtype, offset_factor=1, scope=scope)
        C = T.match_buffer(c, (oh, ow, cols), acc_dtype, offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(A[0:in_h, 0:in_w, 0:cols], B[0:kh, 0:kw, 0:cols])
            T.writes(C[0:oh, 0:ow, 0:cols])
            for y, x, ch in T.grid(oh, ow, cols):
                with T.sblock("acc"):
                    vy, vx, vc = T.axis.remap("SSS", [y, x, ch])
                    C[vy, vx, vc] = window_sum(lambda i, j, k: A[i, j, k], lambda i, j, k: B[i, j, k],
                                               vy, vx, vc, window, acc_dtype)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        sa0 = T.int32()
        sa1 = T.int32()
        sb0 = T.int32()
        sb1 = T.int32()
        sc0 = T.int32()
        sc1 = T.int32()
        A = T.match_buffer(a, (in_h, in_w, cols), dtype, offset_factor=1, scope=scope, strides=[sa0, sa1, 1])
        B = T.match_buffer(b, (kh, kw, cols), dtype, offset_factor=1, scope=scope, strides=[sb0, sb1, 1])
        C = T.match_buffer(c, (oh, ow, cols), acc_dtype, offset_factor=1, scope=scope, strides=[sc0, sc1, 1])
        with T.sblock("root"):
            T.reads(A[0:in_h, 0:in_w, 0:cols], B[0:kh, 0:kw, 0:cols])
            T.writes(C[0:oh, 0:ow, 0:cols])
            T.evaluate(T.call_extern(
                "int32", "cgra_depthwise", 0, _code(dtype), oh, ow, cols, kh, kw,
                A.data, A.elem_offset, sa0 * sh, sa1 * sw, sa0 * dh, sa1 * dw,
                B.data, B.elem_offset, sb0, sb1, C.data, C.elem_offset, sc0, sc1))

    return desc, impl


def fill_intrin(rows: int, cols: int, dtype: str, scope: str = SPAD):
    """Vector unit: zero a rows x cols accumulator tile (the reduction's init)."""

    @T.prim_func(s_tir=True)
    def desc(c: T.handle) -> None:
        C = T.match_buffer(c, (rows, cols), dtype, offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:rows, 0:cols])
            for i, j in T.grid(rows, cols):
                with T.sblock("init"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    C[vi, vj] = T.Cast(dtype, 0)

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        sc = T.int32()
        C = T.match_buffer(c, (rows, cols), dtype, offset_factor=1, scope=scope, strides=[sc, 1])
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:rows, 0:cols])
            T.evaluate(T.call_extern("int32", "cgra_fill", _code(dtype), C.data, C.elem_offset,
                                     rows, cols, sc, 0))

    return desc, impl


def _activation(value, dtype: str, relu: bool, clip):
    """relu, then clip to (lo, hi): the tail every epilogue variant shares (and kernels.py's)."""
    if relu:
        value = _relu(value, dtype)
    if clip is not None:
        value = T.min(T.max(value, tirx.const(clip[0], dtype)), tirx.const(clip[1], dtype))
    return value


def _clip_args(clip, dtype: str):
    """The clip_lo_bits / clip_hi_bits arguments: constants of the acc dtype, or 0 and 0."""
    if clip is None:
        return 0, 0
    return tirx.const(clip[0], dtype), tirx.const(clip[1], dtype)


def _epilogue_flags(bias: bool, relu: bool, residual: bool, clip) -> int:
    return ((EPILOGUE_BIAS if bias else 0) | (EPILOGUE_RELU if relu else 0)
            | (EPILOGUE_RESIDUAL if residual else 0) | (EPILOGUE_CLIP if clip is not None else 0))


def epilogue_intrin(rows: int, cols: int, dtype: str, bias: bool, relu: bool, residual: bool = False,
                    clip=None, scope: str = SPAD):
    """Vector unit: out = clip?(relu?(acc + bias? + residual?)) over a rows x cols tile; bias is a
    row of cols, residual a rows x cols tile, clip None or the (lo, hi) bounds."""
    flags = _epilogue_flags(bias, relu, residual, clip)
    if residual:
        return epilogue_residual_intrin(rows, cols, dtype, bias, relu, clip, flags, scope)
    lo, hi = _clip_args(clip, dtype)

    def value(acc, bias_row, vi, vj):
        return _activation(acc[vi, vj] + bias_row[vj], dtype, relu, clip)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, o: T.handle) -> None:
        Acc = T.match_buffer(a, (rows, cols), dtype, offset_factor=1, scope=scope)
        Bias = T.match_buffer(b, (cols,), dtype, offset_factor=1, scope=scope)
        Out = T.match_buffer(o, (rows, cols), dtype, offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(Acc[0:rows, 0:cols], Bias[0:cols])
            T.writes(Out[0:rows, 0:cols])
            for i, j in T.grid(rows, cols):
                with T.sblock("epi"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    Out[vi, vj] = value(Acc, Bias, vi, vj)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, o: T.handle) -> None:
        sa = T.int32()
        so = T.int32()
        Acc = T.match_buffer(a, (rows, cols), dtype, offset_factor=1, scope=scope, strides=[sa, 1])
        Bias = T.match_buffer(b, (cols,), dtype, offset_factor=1, scope=scope)
        Out = T.match_buffer(o, (rows, cols), dtype, offset_factor=1, scope=scope, strides=[so, 1])
        with T.sblock("root"):
            T.reads(Acc[0:rows, 0:cols], Bias[0:cols])
            T.writes(Out[0:rows, 0:cols])
            T.evaluate(T.call_extern(
                "int32", "cgra_epilogue", flags, _code(dtype), _code(dtype), rows, cols,
                Acc.data, Acc.elem_offset, sa, Bias.data, Bias.elem_offset,
                Out.data, Out.elem_offset, so, 0, 0, 0, lo, hi, 0, 0, 0))

    return (desc, impl) if bias else _epilogue_without_bias(rows, cols, dtype, relu, clip, flags, scope)


def _epilogue_without_bias(rows: int, cols: int, dtype: str, relu: bool, clip, flags: int, scope: str):
    """The epilogue of a kernel with no bias: two buffers, the bias operand is address 0."""
    lo, hi = _clip_args(clip, dtype)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, o: T.handle) -> None:
        Acc = T.match_buffer(a, (rows, cols), dtype, offset_factor=1, scope=scope)
        Out = T.match_buffer(o, (rows, cols), dtype, offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(Acc[0:rows, 0:cols])
            T.writes(Out[0:rows, 0:cols])
            for i, j in T.grid(rows, cols):
                with T.sblock("epi"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    Out[vi, vj] = _activation(Acc[vi, vj], dtype, relu, clip)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, o: T.handle) -> None:
        sa = T.int32()
        so = T.int32()
        Acc = T.match_buffer(a, (rows, cols), dtype, offset_factor=1, scope=scope, strides=[sa, 1])
        Out = T.match_buffer(o, (rows, cols), dtype, offset_factor=1, scope=scope, strides=[so, 1])
        with T.sblock("root"):
            T.reads(Acc[0:rows, 0:cols])
            T.writes(Out[0:rows, 0:cols])
            T.evaluate(T.call_extern(
                "int32", "cgra_epilogue", flags, _code(dtype), _code(dtype), rows, cols,
                Acc.data, Acc.elem_offset, sa, 0, 0, Out.data, Out.elem_offset, so, 0, 0, 0, lo, hi, 0, 0, 0))

    return desc, impl


def epilogue_residual_intrin(rows: int, cols: int, dtype: str, bias: bool, relu: bool, clip,
                             flags: int, scope: str):
    """The epilogue with a residual tile (rows x cols, own row stride), after the bias if any."""
    lo, hi = _clip_args(clip, dtype)
    if not bias:
        return _epilogue_residual_without_bias(rows, cols, dtype, relu, clip, flags, scope)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, r: T.handle, o: T.handle) -> None:
        Acc = T.match_buffer(a, (rows, cols), dtype, offset_factor=1, scope=scope)
        Bias = T.match_buffer(b, (cols,), dtype, offset_factor=1, scope=scope)
        Res = T.match_buffer(r, (rows, cols), dtype, offset_factor=1, scope=scope)
        Out = T.match_buffer(o, (rows, cols), dtype, offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(Acc[0:rows, 0:cols], Bias[0:cols], Res[0:rows, 0:cols])
            T.writes(Out[0:rows, 0:cols])
            for i, j in T.grid(rows, cols):
                with T.sblock("epi"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    Out[vi, vj] = _activation(Acc[vi, vj] + Bias[vj] + Res[vi, vj], dtype, relu, clip)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, r: T.handle, o: T.handle) -> None:
        sa = T.int32()
        sr = T.int32()
        so = T.int32()
        Acc = T.match_buffer(a, (rows, cols), dtype, offset_factor=1, scope=scope, strides=[sa, 1])
        Bias = T.match_buffer(b, (cols,), dtype, offset_factor=1, scope=scope)
        Res = T.match_buffer(r, (rows, cols), dtype, offset_factor=1, scope=scope, strides=[sr, 1])
        Out = T.match_buffer(o, (rows, cols), dtype, offset_factor=1, scope=scope, strides=[so, 1])
        with T.sblock("root"):
            T.reads(Acc[0:rows, 0:cols], Bias[0:cols], Res[0:rows, 0:cols])
            T.writes(Out[0:rows, 0:cols])
            T.evaluate(T.call_extern(
                "int32", "cgra_epilogue", flags, _code(dtype), _code(dtype), rows, cols,
                Acc.data, Acc.elem_offset, sa, Bias.data, Bias.elem_offset,
                Out.data, Out.elem_offset, so, Res.data, Res.elem_offset, sr, lo, hi, 0, 0, 0))

    return desc, impl


def _epilogue_residual_without_bias(rows: int, cols: int, dtype: str, relu: bool, clip, flags: int,
                                    scope: str):
    lo, hi = _clip_args(clip, dtype)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, r: T.handle, o: T.handle) -> None:
        Acc = T.match_buffer(a, (rows, cols), dtype, offset_factor=1, scope=scope)
        Res = T.match_buffer(r, (rows, cols), dtype, offset_factor=1, scope=scope)
        Out = T.match_buffer(o, (rows, cols), dtype, offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(Acc[0:rows, 0:cols], Res[0:rows, 0:cols])
            T.writes(Out[0:rows, 0:cols])
            for i, j in T.grid(rows, cols):
                with T.sblock("epi"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    Out[vi, vj] = _activation(Acc[vi, vj] + Res[vi, vj], dtype, relu, clip)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, r: T.handle, o: T.handle) -> None:
        sa = T.int32()
        sr = T.int32()
        so = T.int32()
        Acc = T.match_buffer(a, (rows, cols), dtype, offset_factor=1, scope=scope, strides=[sa, 1])
        Res = T.match_buffer(r, (rows, cols), dtype, offset_factor=1, scope=scope, strides=[sr, 1])
        Out = T.match_buffer(o, (rows, cols), dtype, offset_factor=1, scope=scope, strides=[so, 1])
        with T.sblock("root"):
            T.reads(Acc[0:rows, 0:cols], Res[0:rows, 0:cols])
            T.writes(Out[0:rows, 0:cols])
            T.evaluate(T.call_extern(
                "int32", "cgra_epilogue", flags, _code(dtype), _code(dtype), rows, cols,
                Acc.data, Acc.elem_offset, sa, 0, 0, Out.data, Out.elem_offset, so,
                Res.data, Res.elem_offset, sr, lo, hi, 0, 0, 0))

    return desc, impl


@dataclasses.dataclass(frozen=True)
class Intrinsic:
    op: Op  # the ISA command its implementation records
    factory: Callable  # (*shape_and_dtypes) -> (desc, impl)


INTRINSICS = {
    "gemm": Intrinsic(Op.GEMM, gemm_intrin),
    "depthwise": Intrinsic(Op.DEPTHWISE, depthwise_intrin),
    "fill": Intrinsic(Op.FILL, fill_intrin),
    "epilogue": Intrinsic(Op.EPILOGUE, epilogue_intrin),
    "pool": Intrinsic(Op.POOL, pool_intrin),
    "eltwise": Intrinsic(Op.ELTWISE, eltwise_intrin),
    "epilogue_requant": Intrinsic(Op.EPILOGUE, epilogue_requant_intrin),
}


def intrin_name(kind: str, *params) -> str:
    return "cgra." + kind + "." + ".".join(_param_name(p) for p in params)


def _param_name(param) -> str:
    """A parameter in an intrinsic's name; a clip's (lo, hi) as "clip_lo_hi", an ELTWISE
    operand's (walks rows, walks cols) as "full_True_False", a pooling window as its fields."""
    if isinstance(param, PoolWindow):
        return param.name
    if isinstance(param, tuple) and all(isinstance(v, bool) for v in param):
        return "full_" + "_".join(str(v) for v in param)
    if isinstance(param, tuple):
        return "clip_" + "_".join(repr(float(v)) for v in param)
    return str(param)


def get_intrin(kind: str, *params) -> str:
    """Register (once) and return the name of the `kind` intrinsic for these parameters."""
    name = intrin_name(kind, *params)
    try:
        TensorIntrin.get(name)
    except Exception:  # not registered yet: TensorIntrin.get raises when the name is unknown
        TensorIntrin.register(name, *INTRINSICS[kind].factory(*params))
    return name
