"""Golden IR of the intrinsic generator (kernels/intrinsics/builder.py): what it builds for a GEMM
and for a requantising EPILOGUE equals these TVMScript functions, written out by hand the way
each variant was once written (one function per variant). The generator is what tensorize
matches kernels against; a change here changes every kernel."""

from __future__ import annotations

import tvm
from tvm.script import tirx as T

from npu_backend.kernels.intrinsics import INTRINSICS, SPAD


@T.prim_func(s_tir=True)
def gemm_desc(a: T.handle, b: T.handle, c: T.handle) -> None:
    A = T.match_buffer(a, (8, 16), "int8", offset_factor=1, scope=SPAD)
    B = T.match_buffer(b, (16, 4), "int8", offset_factor=1, scope=SPAD)
    C = T.match_buffer(c, (8, 4), "int32", offset_factor=1, scope=SPAD)
    with T.sblock("root"):
        T.reads(C[0:8, 0:4], A[0:8, 0:16], B[0:16, 0:4])
        T.writes(C[0:8, 0:4])
        for i, j, k in T.grid(8, 4, 16):
            with T.sblock("update"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi, vk]) * T.Cast("int32", B[vk, vj])


@T.prim_func(s_tir=True)
def gemm_impl(a: T.handle, b: T.handle, c: T.handle) -> None:
    sa = T.int32()
    sb = T.int32()
    sc = T.int32()
    A = T.match_buffer(a, (8, 16), "int8", offset_factor=1, scope=SPAD, strides=[sa, 1])
    B = T.match_buffer(b, (16, 4), "int8", offset_factor=1, scope=SPAD, strides=[sb, 1])
    C = T.match_buffer(c, (8, 4), "int32", offset_factor=1, scope=SPAD, strides=[sc, 1])
    with T.sblock("root"):
        T.reads(C[0:8, 0:4], A[0:8, 0:16], B[0:16, 0:4])
        T.writes(C[0:8, 0:4])
        T.evaluate(T.call_extern("int32", "cgra_gemm", 1, 1, 8, 4, 16, A.data, A.elem_offset, sa,
                                 B.data, B.elem_offset, sb, C.data, C.elem_offset, sc))


@T.prim_func(s_tir=True)
def requant_desc(a: T.handle, b: T.handle, s: T.handle, o: T.handle) -> None:
    Acc = T.match_buffer(a, (4, 8), "int32", offset_factor=1, scope=SPAD)
    Bias = T.match_buffer(b, (8,), "int32", offset_factor=1, scope=SPAD)
    Scale = T.match_buffer(s, (8,), "float32", offset_factor=1, scope=SPAD)
    Out = T.match_buffer(o, (4, 8), "int8", offset_factor=1, scope=SPAD)
    with T.sblock("root"):
        T.reads(Acc[0:4, 0:8], Bias[0:8], Scale[0:8])
        T.writes(Out[0:4, 0:8])
        for i, j in T.grid(4, 8):
            with T.sblock("epi"):
                vi, vj = T.axis.remap("SS", [i, j])
                Out[vi, vj] = T.Cast("int8", T.nearbyint(T.min(T.max(
                    T.Cast("float32", T.max(Acc[vi, vj] + Bias[vj], 0)) * Scale[vj], T.float32(-125.0)),
                    T.float32(130.0))) + T.float32(-3.0))


@T.prim_func(s_tir=True)
def requant_impl(a: T.handle, b: T.handle, s: T.handle, o: T.handle) -> None:
    sa = T.int32()
    so = T.int32()
    Acc = T.match_buffer(a, (4, 8), "int32", offset_factor=1, scope=SPAD, strides=[sa, 1])
    Bias = T.match_buffer(b, (8,), "int32", offset_factor=1, scope=SPAD)
    Scale = T.match_buffer(s, (8,), "float32", offset_factor=1, scope=SPAD)
    Out = T.match_buffer(o, (4, 8), "int8", offset_factor=1, scope=SPAD, strides=[so, 1])
    with T.sblock("root"):
        T.reads(Acc[0:4, 0:8], Bias[0:8], Scale[0:8])
        T.writes(Out[0:4, 0:8])
        T.evaluate(T.call_extern(
            "int32", "cgra_epilogue", 19, 2, 1, 4, 8, Acc.data, Acc.elem_offset, sa, Bias.data, Bias.elem_offset,
            Out.data, Out.elem_offset, so, 0, 0, 0, 0, 0, Scale.data, Scale.elem_offset, -3))


def _same(built, golden):
    """Structurally equal, whatever each function's name (its global_symbol)."""
    tvm.ir.assert_structural_equal(built.without_attr("global_symbol"), golden.without_attr("global_symbol"),
                                   map_free_vars=True)


def test_gemm_intrinsic_is_the_golden_one():
    desc, impl = INTRINSICS["gemm"].factory(8, 4, 16, "int8", "int32")
    _same(desc, gemm_desc)
    _same(impl, gemm_impl)


def test_requantising_epilogue_with_bias_and_relu_is_the_golden_one():
    desc, impl = INTRINSICS["epilogue"].factory(4, 8, "int32", bias=True, relu=True, residual=False, clip=None, zero_point=-3)
    _same(desc, requant_desc)
    _same(impl, requant_impl)
