"""The quantize family: a float32 tensor quantized to int8 (onnxruntime's QuantizeLinear) on the NPU.

Stage: partition (its pattern and spec), kernel definition, tiling and schedule. Input:

    quantize(x, s, zp, out_dtype="int8")        x float32 (rank 1..4, static), s and zp 0-d constants

(a QDQ model's input quantize, after its embedding or feature extractor; normalise/qdq.py gives a
uint8 quantize its int8 twin, which this kernel computes). Per tm x tn tile of x (read as
(rows, cols), unary.py): the float32 tile loaded, one EPILOGUE that quantises it (the requantising
EPILOGUE from a float32 accumulator: rne(clamp(x / s, -128 - zp, 127 - zp)) + zp, the quotient
correctly rounded, as onnxruntime's MlasQuantizeLinear divides), the int8 tile stored. The scale
row the EPILOGUE reads is s in every column, written once by a FILL. Bit-exact to onnxruntime:
the division, not a product by 1 / s, which differs where x / s lies within an ulp of a half step.
Before: the quantize ran on the host (text_cnn's input, 3,531 modelled cycles on cgra-8x8).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm.script
from tvm import tirx
from tvm.relax.dpl import is_const, is_op, wildcard

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of
from ..common.spec import Tiling
from ..common.unary import ReadsOperand, UnaryOperand, fastest_tiling, read_operand
from ..family import OpFamily
from ..intrinsics import SPAD, get_intrin

NAME = "cgra.quantize"


@dataclasses.dataclass(frozen=True)
class QuantizeSpec(ReadsOperand):
    operand: UnaryOperand  # x (and the output), as the kernel reads it (unary.py)
    scale: float  # the quantize's scale, a float32 value
    zero_point: int  # int8
    dtype: str = "float32"
    param_roles: tuple = ("lhs",)
    source_ops: tuple = ()
    shape_args: tuple = ()
    op = "quantize"
    macs = 0
    acc_dtype = "float32"


def _patterns() -> list:
    x = wildcard()
    root = is_op("relax.quantize")(x, is_const(), is_const())
    return [(NAME, root, {"root": root, "lhs": x})]


def _scalar(expr, dtype: str):
    """The one value of a 0-d (or one-element) constant of `dtype`, else None."""
    value = expr.value.numpy() if hasattr(expr, "value") else None
    return value.reshape(-1)[0].item() if value is not None and value.size == 1 and value.dtype.name == dtype else None


def quantize_spec(name: str, annotated: dict) -> QuantizeSpec:
    """The kernel of a matched quantize; raises UnsupportedOperator with the reason it cannot."""
    del name
    call, x = annotated["root"], annotated["lhs"]
    if dtype_of(x) != "float32" or str(call.attrs.out_dtype) != "int8":
        raise UnsupportedOperator(f"quantize of {dtype_of(x)} to {call.attrs.out_dtype}: the NPU quantizes "
                                  "float32 to int8 (a uint8 one through its int8 twin, normalise/qdq.py)")
    scale, zero_point = _scalar(call.args[1], "float32"), _scalar(call.args[2], "int8")
    if scale is None or zero_point is None:
        raise UnsupportedOperator("quantize with a scale or zero point per channel: the NPU's quantize takes "
                                  "one float32 scale and one int8 zero point for the tensor")
    if not np.isfinite(scale) or scale <= 0:
        raise UnsupportedOperator(f"quantize with scale {scale}: the NPU divides by a positive finite scale")
    operand = read_operand(x, "a quantize")
    if operand.extents:
        raise UnsupportedOperator("a quantize of a symbolic shape: the quantize kernel takes static shapes")
    return QuantizeSpec(operand, float(scale), int(zero_point), source_ops=("quantize",))


def choose_quantize_tiling(spec: QuantizeSpec, arch: HardwareDescription) -> Tiling:
    return fastest_tiling(spec, arch, lambda elements: cost.vector_cycles(arch, 1, elements))


_KERNEL = """
# from tvm.script import tirx as T
@T.prim_func(s_tir=True)
def main(lhs: T.Buffer(({rows}, {cols}), "float32"), out: T.Buffer(({rows}, {cols}), "int8")):
    T.func_attr({{"tirx.noalias": True}})
    scale_spad = T.sblock_alloc_buffer((1, {tn}), "float32", scope="{spad}")
    for i, j in T.grid(1, {tn}):
        with T.sblock("scale"):
            v_i, v_j = T.axis.remap("SS", [i, j])
            scale_spad[v_i, v_j] = T.float32({scale!r})
    for io, jo in T.grid({row_tiles}, {col_tiles}):
        with T.sblock("tile"):
            v_io, v_jo = T.axis.remap("SS", [io, jo])
            T.reads(scale_spad[0, 0:{tn}], lhs[v_io * {tm}:v_io * {tm} + {tm}, v_jo * {tn}:v_jo * {tn} + {tn}])
            T.writes(out[v_io * {tm}:v_io * {tm} + {tm}, v_jo * {tn}:v_jo * {tn} + {tn}])
            a_pad = T.sblock_alloc_buffer(({tm}, {tn}), "float32", scope="{spad}")
            q = T.sblock_alloc_buffer(({tm}, {tn}), "int8", scope="{spad}")
            for i, j in T.grid({tm}, {tn}):
                with T.sblock("a_pad"):
                    v_i, v_j = T.axis.remap("SS", [i, j])
                    a_pad[v_i, v_j] = T.if_then_else(v_io * {tm} + v_i < {rows} and v_jo * {tn} + v_j < {cols},
                                                     lhs[v_io * {tm} + v_i, v_jo * {tn} + v_j], T.float32(0))
            for i, j in T.grid({tm}, {tn}):
                with T.sblock("quantize"):
                    v_i, v_j = T.axis.remap("SS", [i, j])
                    q[v_i, v_j] = T.Cast("int8", T.nearbyint(T.min(T.max(a_pad[v_i, v_j] / scale_spad[0, v_j],
                                                                          T.float32({lo!r})), T.float32({hi!r})))
                                         + T.float32({zp!r}))
            for i, j in T.grid({tm}, {tn}):
                with T.sblock("out"):
                    v_i, v_j = T.axis.remap("SS", [i, j])
                    T.where(v_io * {tm} + i < {rows} and v_jo * {tn} + j < {cols})
                    out[v_io * {tm} + v_i, v_jo * {tn} + v_j] = q[v_i, v_j]
"""


def quantize_compute(spec: QuantizeSpec, tiling: Tiling):
    """out = quantize(x) over x's (rows, cols) view in tm x tn tiles, written tiled in TVMScript
    (each tile's scratchpad buffers its own), the element as vector_unit.requantise of a float32
    value writes it, the scale row filled once before the tiles."""
    operand = spec.operand
    func = tvm.script.from_source(_KERNEL.format(
        spad=SPAD, tm=tiling.tm, tn=tiling.tn, row_tiles=tiling.mp // tiling.tm, col_tiles=tiling.np // tiling.tn,
        rows=operand.rows, cols=operand.cols, scale=float(np.float32(spec.scale)),
        lo=float(-128 - spec.zero_point), hi=float(127 - spec.zero_point), zp=float(spec.zero_point)))
    if operand.shape != (operand.rows, operand.cols):
        func = func.with_attr("cgra.arg_shapes", [list(operand.shape), list(operand.shape)])
    return func


def schedule_quantize(sch, spec: QuantizeSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """The kernel is written tiled (quantize_compute): the scale row one FILL, then per tile the
    input loaded, one quantising EPILOGUE, the output stored."""
    del arch
    scale = sch.get_sblock("scale")
    sch.tensorize(sch.get_loops(scale)[0], get_intrin("fill", 1, tiling.tn, "float32",
                                                      value=tirx.const(float(np.float32(spec.scale)), "float32")))
    rows, _ = sch.get_loops(sch.get_sblock("quantize"))[-2:]
    sch.tensorize(rows, get_intrin("epilogue", tiling.tm, tiling.tn, "float32", bias=False, relu=False,
                                   zero_point=spec.zero_point))


QUANTIZE = OpFamily(
    name="quantize", ops=("quantize",), patterns=_patterns, spec_from_match=quantize_spec,
    choose_tiling=choose_quantize_tiling, compute=quantize_compute, schedule=schedule_quantize,
    checks_pe_dtype=False)
