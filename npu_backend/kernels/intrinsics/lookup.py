"""The vector unit's table lookup: LOOKUP, an int8 tile mapped through a 256-entry int8 table.

Stage: schedule and tensorize. `lookup_intrin` returns the (description, implementation) pair
of one LOOKUP over a rows x cols tile. In TIR the lookup is a select over the table's entries,

    for k < 256:  Out[i, j] = T[k] if A[i, j] + 128 == k else Out[i, j]

(k a reduction axis; exactly one k matches every int8 element, so Out needs no initial value):
every load's index is affine, which tensorize can match; `table[A[i, j] + 128]` nests a load in
an index, which it cannot. The kernel's TIR (kernels/elementwise/qlookup.py) is the same.
"""

from __future__ import annotations

from tvm import tirx

from cgra_codegen import device_call

from .builder import SPAD, Tile, intrinsic

TABLE_ENTRIES = 256


def lookup_intrin(rows: int, cols: int, *, scope: str = SPAD):
    """LOOKUP: Out[rows, cols] = T[A + 128], A and Out int8 tiles, T the int8 table."""
    inputs = [Tile("T", (TABLE_ENTRIES,), "int8"), Tile("A", (rows, cols), "int8")]

    def value(buffers, i, j, k):
        return tirx.if_then_else(buffers["A"][i, j].astype("int32") + 128 == k, buffers["T"][k],
                                 buffers["Out"][i, j])

    def call(buffers, strides):
        return device_call("cgra_lookup", rows=rows, cols=cols, a_addr=buffers["A"], a_stride=strides["A"][0],
                           table_addr=buffers["T"], out_addr=buffers["Out"], out_stride=strides["Out"][0])

    def reads(buffers, i, j, k):  # in the root block's order, as the kernel's block declares them
        return [buffers["Out"][i, j], buffers["T"][k], buffers["A"][i, j]]

    return intrinsic(inputs, Tile("Out", (rows, cols), "int8"), "lut", value, call, grid=(rows, cols, TABLE_ENTRIES),
                     kinds="SSR", accumulate=True, combine=lambda old, new: new, scope=scope, block_reads=reads)
