"""Tests of the copy -> DMA pass (npu_backend.lower.dma): which guarded copies become a DMA box.

A guard is accepted only when every conjunct provably equals an in-bounds test of one host index;
then the DMA halo (zero fill, or the dtype's lowest value for a max pool's padding) computes the
same thing. Anything else must be refused, because a DMA
that silently differs from the TIR would give a wrong number.
"""

from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from tvm import s_tir
from tvm.script import tirx as T

from cgra_codegen import device_call_positions
from cgra_sim.isa import DMA_FILL_LOWEST
from npu_backend.lower.dma import lower_copies_to_dma
from npu_backend.errors import UnsupportedCopy

HALO = slice(4, 12)  # box words after origin[4]: pad_lo[4], pad_hi[4]


def dma_boxes(func, flags=None):
    """The (name, box words) of every DMA call the pass makes of `func`; `flags`, a list, receives
    each load's flags."""
    mod = tvm.IRModule({"main": func})
    for apply in (s_tir.transform.ConvertBlocksToOpaque(),
                  s_tir.transform.CompactBufferAllocation(), s_tir.transform.LowerOpaqueBlock()):
        mod = apply(mod)
    calls = []

    def visit(call):
        if getattr(call.op, "name", "") == "tirx.call_extern" and str(call.args[0].value).startswith("cgra_dma"):
            name = str(call.args[0].value)
            positions = device_call_positions(name)
            calls.append((name, [int(call.args[i]) for i in positions["box"]]))
            if flags is not None and "flags" in positions:
                flags.append(int(call.args[positions["flags"][0]]))
    tvm_ffi.structural_walk(lower_copies_to_dma(mod["main"]).body, [(tvm.ir.Call, visit)])
    return calls


# A 12-element load that starts 2 elements before an 8-element tensor: halo 2 below, 2 above.

@T.prim_func(s_tir=True)
def plain_guard(A: T.Buffer((8,), "float32")):
    S = T.alloc_buffer((12,), "float32", scope="global.cgra_spad")
    for i in range(12):
        with T.sblock("load"):
            v = T.axis.spatial(12, i)
            S[v] = T.if_then_else(2 <= v and v - 2 < 8, A[v - 2], T.float32(0))


@T.prim_func(s_tir=True)
def rewritten_guard(A: T.Buffer((8,), "float32")):
    # The form TE gives a dilated convolution: "1 <= (p % 12) // 2" is "p >= 2" on p's range.
    S = T.alloc_buffer((12,), "float32", scope="global.cgra_spad")
    for i in range(12):
        with T.sblock("load"):
            v = T.axis.spatial(12, i)
            S[v] = T.if_then_else(1 <= v % 12 // 2 and v < 10, A[v - 2], T.float32(0))


@T.prim_func(s_tir=True)
def dilated_guard(A: T.Buffer((8,), "float32")):
    # "i + 2 * j >= 2" as TE's simplifier leaves it for a dilated conv: "i // 2 + j >= 1".
    S = T.alloc_buffer((4, 3), "float32", scope="global.cgra_spad")
    for i, j in T.grid(4, 3):
        with T.sblock("load"):
            vi, vj = T.axis.remap("SS", [i, j])
            S[vi, vj] = T.if_then_else(1 <= vi // 2 + vj, A[vi + vj * 2 - 2], T.float32(0))


@T.prim_func(s_tir=True)
def wrong_guard(A: T.Buffer((8,), "float32")):
    # "p >= 3" zeroes one in-bounds element: no DMA halo does that.
    S = T.alloc_buffer((12,), "float32", scope="global.cgra_spad")
    for i in range(12):
        with T.sblock("load"):
            v = T.axis.spatial(12, i)
            S[v] = T.if_then_else(3 <= v and v < 10, A[v - 2], T.float32(0))


@T.prim_func(s_tir=True)
def unguarded(A: T.Buffer((8,), "float32")):
    S = T.alloc_buffer((12,), "float32", scope="global.cgra_spad")
    for i in range(12):
        with T.sblock("load"):
            v = T.axis.spatial(12, i)
            S[v] = T.if_then_else(2 <= v, A[v - 2], T.float32(0))


@pytest.mark.parametrize("func", [plain_guard, rewritten_guard], ids=["plain", "rewritten"])
def test_in_bounds_guard_becomes_the_dma_halo(func):
    [(name, words)] = dma_boxes(func)
    assert name == "cgra_dma_load"
    assert words[:4] == [-2, 0, 0, 0]  # origin
    assert words[HALO] == [2, 0, 0, 0, 2, 0, 0, 0]  # pad_lo, pad_hi
    assert words[12:16] == [12, 0, 1, 1]  # extent 12 along dim 0, step 1, spad stride 1


def test_guard_checked_point_by_point_becomes_the_dma_halo():
    [(name, words)] = dma_boxes(dilated_guard)
    assert words[:4] == [-2, 0, 0, 0]
    assert words[HALO] == [2, 0, 0, 0, 0, 0, 0, 0]
    assert words[12:20] == [4, 0, 1, 3, 3, 0, 2, 1]  # i: step 1 in A, 3 in S; j: step 2 in A


@T.prim_func(s_tir=True)
def lowest_fill(A: T.Buffer((8,), "int8")):
    # A max pool's padding: the halo holds int8's lowest value.
    S = T.alloc_buffer((12,), "int8", scope="global.cgra_spad")
    for i in range(12):
        with T.sblock("load"):
            v = T.axis.spatial(12, i)
            S[v] = T.if_then_else(2 <= v and v - 2 < 8, A[v - 2], T.int8(-128))


@T.prim_func(s_tir=True)
def other_fill(A: T.Buffer((8,), "float32")):
    S = T.alloc_buffer((12,), "float32", scope="global.cgra_spad")
    for i in range(12):
        with T.sblock("load"):
            v = T.axis.spatial(12, i)
            S[v] = T.if_then_else(2 <= v and v - 2 < 8, A[v - 2], T.float32(1))


def test_a_halo_of_the_lowest_value_sets_the_loads_fill_flag():
    flags = []
    [(_, words)] = dma_boxes(lowest_fill, flags)
    assert flags == [DMA_FILL_LOWEST] and words[HALO] == [2, 0, 0, 0, 2, 0, 0, 0]
    flags.clear()
    dma_boxes(plain_guard, flags)
    assert flags == [0]


@pytest.mark.parametrize("func, message", [
    (other_fill, "pads with 1.0: the DMA engine fills its halo with zero or the element type's lowest value"),
    (wrong_guard, "is not an in-bounds test"),
    (unguarded, "reaches outside dimension 0"),
], ids=["other fill", "wrong", "unguarded"])
def test_guard_that_is_not_the_halo_is_refused(func, message):
    with pytest.raises(UnsupportedCopy, match=message):
        dma_boxes(func)
