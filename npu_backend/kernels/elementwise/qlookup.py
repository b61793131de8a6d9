"""The qlookup family: an int8 function of one quantized tensor as one LOOKUP per tile.

Stage: partition (its pattern and spec), kernel definition, tiling and schedule. Input: the
table lookup the normalise stage writes for a QLinearSigmoid or a requantised SiLU
(normalise/qlookups.py),

    take(T, astype(x, "int32") + 128)        x int8 (rank 1..4, static), T a constant of 256 int8

The kernel loads T into the scratchpad once, then per tm x tn tile of x (read as (rows, cols),
unary.py) loads the tile, runs one LOOKUP (cgra_sim/lookup.py: an element a vector lane a cycle)
and stores the int8 result: int8 in, int8 out, nothing on the host and no float pass.
"""

from __future__ import annotations

import dataclasses

import tvm.script
from tvm.relax.dpl import is_const, is_op, wildcard

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of
from ..common.spec import Tiling
from ..common.unary import ReadsOperand, UnaryOperand, fastest_tiling, read_operand
from ..family import OpFamily
from ..intrinsics import SPAD, get_intrin
from ..intrinsics.lookup import TABLE_ENTRIES

NAME = "cgra.qlookup"


@dataclasses.dataclass(frozen=True)
class QlookupSpec(ReadsOperand):
    operand: UnaryOperand  # x (and the output), int8, as the kernel reads it (unary.py)
    dtype: str = "int8"
    param_roles: tuple = ("table", "lhs")
    source_ops: tuple = ()
    shape_args: tuple = ()
    op = "qlookup"
    macs = 0
    acc_dtype = "int8"


def _patterns() -> list:
    # The table arrives as the kernel's tensor argument (partition binds only 0-d constants).
    x, table, offset = wildcard(), wildcard(), is_const()
    index = is_op("relax.add")(is_op("relax.astype")(x), offset)
    root = is_op("relax.take")(table, index)
    return [(NAME, root, {"root": root, "lhs": x, "table": table, "offset": offset})]


def qlookup_spec(name: str, annotated: dict) -> QlookupSpec:
    """The kernel of a matched table lookup; raises UnsupportedOperator with the reason."""
    del name
    x, table, offset, take = annotated["lhs"], annotated["table"], annotated["offset"], annotated["root"]
    shape = [int(d) if isinstance(d, int) or hasattr(d, "value") else None for d in getattr(table.ty, "shape", [])]
    shift = offset.value.numpy() if hasattr(offset, "value") else None
    if dtype_of(x) != "int8" or dtype_of(table) != "int8" or shape != [TABLE_ENTRIES]:
        raise UnsupportedOperator("a table lookup on the NPU maps int8 through 256 int8 entries (LOOKUP)")
    if shift is None or shift.size != 1 or int(shift.item()) != 128 or int(take.attrs.axis) != 0:
        raise UnsupportedOperator("LOOKUP indexes its table at x + 128 along the table's one axis")
    operand = read_operand(x, "a table lookup")
    if operand.extents:
        raise UnsupportedOperator("a table lookup of a symbolic shape: the qlookup kernel takes static shapes")
    return QlookupSpec(operand, source_ops=("take",))


def choose_qlookup_tiling(spec: QlookupSpec, arch: HardwareDescription) -> Tiling:
    return fastest_tiling(spec, arch, lambda elements: cost.lookup_cycles(arch, elements))


_KERNEL = """
# from tvm.script import tirx as T
@T.prim_func(s_tir=True)
def main({params}):
    T.func_attr({{"tirx.noalias": True}})
    table_spad = T.sblock_alloc_buffer((256,), "int8", scope="{spad}")
    for k in range(256):
        with T.sblock("table"):
            v_k = T.axis.spatial(256, k)
            table_spad[v_k] = table[v_k]
    for io, jo in T.grid({row_tiles}, {col_tiles}):
        with T.sblock("tile"):
            v_io, v_jo = T.axis.remap("SS", [io, jo])
            T.reads(table_spad[0:256], lhs[v_io * {tm}:v_io * {tm} + {tm}, v_jo * {tn}:v_jo * {tn} + {tn}])
            T.writes(out[v_io * {tm}:v_io * {tm} + {tm}, v_jo * {tn}:v_jo * {tn} + {tn}])
            a_pad = T.sblock_alloc_buffer(({tm}, {tn}), "int8", scope="{spad}")
            lut = T.sblock_alloc_buffer(({tm}, {tn}), "int8", scope="{spad}")
            for i, j in T.grid({tm}, {tn}):
                with T.sblock("a_pad"):
                    v_i, v_j = T.axis.remap("SS", [i, j])
                    a_pad[v_i, v_j] = T.if_then_else(v_io * {tm} + v_i < {rows} and v_jo * {tn} + v_j < {cols},
                                                     lhs[v_io * {tm} + v_i, v_jo * {tn} + v_j], T.int8(0))
            for i, j, k in T.grid({tm}, {tn}, 256):
                with T.sblock("lut"):
                    v_i, v_j, v_k = T.axis.remap("SSR", [i, j, k])
                    T.reads(lut[v_i, v_j], table_spad[v_k], a_pad[v_i, v_j])
                    T.writes(lut[v_i, v_j])
                    lut[v_i, v_j] = T.if_then_else(T.Cast("int32", a_pad[v_i, v_j]) + 128 == v_k, table_spad[v_k],
                                                   lut[v_i, v_j])
            for i, j in T.grid({tm}, {tn}):
                with T.sblock("out"):
                    v_i, v_j = T.axis.remap("SS", [i, j])
                    T.where(v_io * {tm} + i < {rows} and v_jo * {tn} + j < {cols})
                    out[v_io * {tm} + v_i, v_jo * {tn} + v_j] = lut[v_i, v_j]
"""


def qlookup_compute(spec: QlookupSpec, tiling: Tiling):
    """out = T[x + 128] over x's (rows, cols) view in tm x tn tiles, written tiled in TVMScript
    (each tile's scratchpad buffers its own), the lookup as intrinsics/lookup.py's select over the
    table's entries."""
    operand = spec.operand
    shapes = {"table": (TABLE_ENTRIES,), "lhs": (operand.rows, operand.cols)}
    params = ", ".join(f'{role}: T.Buffer({shapes[role]}, "int8")' for role in spec.param_roles)
    params += f', out: T.Buffer({shapes["lhs"]}, "int8")'
    func = tvm.script.from_source(_KERNEL.format(
        params=params, spad=SPAD, tm=tiling.tm, tn=tiling.tn, row_tiles=tiling.mp // tiling.tm,
        col_tiles=tiling.np // tiling.tn, rows=operand.rows, cols=operand.cols))
    caller = operand.shape if operand.shape != shapes["lhs"] else None
    if caller:
        func = func.with_attr("cgra.arg_shapes", [list(caller if role in ("lhs",) else ())
                                                  for role in list(spec.param_roles)] + [list(caller)])
    return func


def schedule_qlookup(sch, spec: QlookupSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """The kernel is written tiled (qlookup_compute): per tile the input loaded, one LOOKUP, the
    output stored; the table loaded once before the tiles."""
    del spec, tiling, arch
    result = sch.get_sblock("lut")
    rows, cols, _ = sch.get_loops(result)[-3:]
    sch.tensorize(rows, get_intrin("lookup", int(sch.get(rows).extent), int(sch.get(cols).extent)))


QLOOKUP = OpFamily(
    name="qlookup", ops=("qlookup",), patterns=_patterns, spec_from_match=qlookup_spec,
    choose_tiling=choose_qlookup_tiling, compute=qlookup_compute, schedule=schedule_qlookup,
    checks_pe_dtype=False)  # a take left on the host is the layout family's to explain
