"""The cast family: a standalone astype between float32 and bfloat16 / float16 on the vector unit's EPILOGUE.

Stage: partition (its pattern and spec), kernel definition, tiling and schedule. Input: a Relax
`astype` of a float32 tensor to bfloat16 or float16 (rounded to nearest even, ties to even,
overflowing to infinity: the EPILOGUE's rounding store), or of a bfloat16 / float16 tensor to
float32 (widened exactly: an EPILOGUE whose accumulator is the 16-bit tile, stream version 12),
rank 1..4, static or symbolic sizes (common/unary.py), that no other kernel fuses. This is the
cast PyTorch's bfloat16 models write around every norm and softmax (HF computes those in
float32): before it, each ran on the host. The kernel reads the tensor as a compact view
(unary.py), loads tm x tn tiles by DMA, runs one EPILOGUE per tile and stores the tile in the
other dtype. Bit-exact to numpy's model of the conversion (cgra_sim/half_floats.py: widen, narrow).
"""

from __future__ import annotations

import dataclasses

from tvm import te
from tvm.relax.dpl import is_op, wildcard

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of
from ..family import OpFamily
from ..intrinsics import get_intrin
from ..common.operands import padded, prim_func
from ..common.spec import Tiling
from ..common.unary import ReadsOperand, UnaryOperand, fastest_tiling, read_operand, schedule_unary, unary_compute
from .eltwise import tile_two_operands

HALF_FLOATS = ("bfloat16", "float16")
#: (input dtype, output dtype) pairs the EPILOGUE converts.
CASTS = tuple((wide, half) for half in HALF_FLOATS for wide in ("float32",)) + \
    tuple((half, "float32") for half in HALF_FLOATS)


@dataclasses.dataclass(frozen=True)
class CastSpec(ReadsOperand):
    """One cast kernel: `dtype` the input's (the EPILOGUE's accumulator), `out_dtype` the output's."""

    dtype: str
    out_dtype: str
    operand: UnaryOperand  # x, as the kernel reads it (unary.py)
    via: str | None = None  # a round trip: float32 rounded to this 16-bit float, widened back
    param_roles: tuple = ("lhs",)
    source_ops: tuple = ()
    shape_args: tuple = ()  # positions of symbolic sizes passed beside the tensors (KernelSpec's)
    op = "cast"
    macs = 0
    acc_dtype = property(lambda self: self.dtype)


def _patterns() -> list:
    """A round trip float32 -> 16-bit -> float32 (HF's activation cast back for the next op) as one
    kernel first, then one cast."""
    x, y = wildcard(), wildcard()
    inner = is_op("relax.astype")(x)
    trip = is_op("relax.astype")(inner)
    root = is_op("relax.astype")(y)
    return [("cgra.cast_round_trip", trip, {"root": trip, "inner": inner, "lhs": x}),
            ("cgra.cast", root, {"root": root, "lhs": y})]


def cast_spec(name: str, annotated: dict) -> CastSpec:
    """The kernel a matched astype would become; raises UnsupportedOperator saying why it stays
    on the host."""
    source, target = dtype_of(annotated["lhs"]), str(annotated["root"].attrs.dtype)
    if name == "cgra.cast_round_trip":
        via = str(annotated["inner"].attrs.dtype)
        if (source, via, target) not in (("float32", half, "float32") for half in HALF_FLOATS):
            raise UnsupportedOperator(f"astype from {source} to {via} to {target}: the round-trip kernel rounds "
                                      "float32 to bfloat16 / float16 and widens it back")
        operand = read_operand(annotated["lhs"], "astype")
        if operand.extents:
            raise UnsupportedOperator("a round trip of astypes on a symbolic shape: the round-trip kernel takes "
                                      "static shapes (each astype runs as its own cast kernel)")
        return CastSpec(source, target, operand, via=via)
    if (source, target) not in CASTS:
        raise UnsupportedOperator(f"astype from {source or 'an unknown dtype'} to {target}: the EPILOGUE converts "
                                  "float32 to bfloat16 / float16 (rounded to nearest even) and back (exactly)")
    return CastSpec(source, target, read_operand(annotated["lhs"], "astype"))


def choose_cast_tiling(spec: CastSpec, arch: HardwareDescription) -> Tiling:
    """unary.fastest_tiling, a tile's work its EPILOGUE, its tiles sized as float32 ones (the
    wider of the two dtypes: the input and output tiles each fit as float32)."""
    return fastest_tiling(dataclasses.replace(spec, dtype="float32"), arch,
                          lambda elements: cost.vector_cycles(arch, 1, elements))


def cast_compute(spec: CastSpec, tiling: Tiling):
    """One EPILOGUE's block "epi" a tile; a round trip's rounding EPILOGUE "epi" into a 16-bit
    scratchpad tile, then the widening one "wide" out of it."""
    if spec.via is None:
        return unary_compute(spec, tiling, "epi", lambda value: value.astype(spec.out_dtype),
                             {"cgra_epilogue": ("m", "n")})
    operand = spec.operand
    extents, whole = (operand.rows, operand.cols), (tiling.mp, tiling.np)
    x = te.placeholder(extents, spec.dtype, name="lhs")
    a_pad = te.compute(whole, lambda *i: padded(x, extents, i), name="a_pad")
    rounded = te.compute(whole, lambda *i: a_pad(*i).astype(spec.via), name="epi")
    wide = te.compute(whole, lambda *i: rounded(*i).astype(spec.out_dtype), name="wide")
    out = te.compute(extents, lambda *i: wide(*i), name="out")
    caller = operand.shape if operand.shape != extents else None
    return prim_func(spec.param_roles, {"lhs": x}, out, caller and {"lhs": caller, "out": caller}, spec.shape_args)


def _epilogue(tiling: Tiling, source: str, target: str) -> str:
    return get_intrin("epilogue", tiling.tm, tiling.tn, source, bias=False, relu=False, residual=False, clip=None,
                      zero_point=None, out_dtype=target)


def schedule_cast(sch, spec: CastSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """unary.schedule_unary onto one EPILOGUE; a round trip's two EPILOGUEs on one input tile,
    its 16-bit tile between them in the scratchpad."""
    del arch
    if spec.via is None:
        schedule_unary(sch, tiling, "epi", _epilogue(tiling, spec.dtype, spec.out_dtype))
        return
    # The widened tile ("wide") is the store's input; the first EPILOGUE ("epi") and A per tile.
    row_inner = tile_two_operands(sch, tiling, "wide", ("epi", "a_pad"))
    sch.tensorize(sch.get_loops(sch.get_sblock("epi"))[2], _epilogue(tiling, spec.dtype, spec.via))
    sch.tensorize(row_inner, _epilogue(tiling, spec.via, spec.out_dtype))


CAST = OpFamily(
    name="cast", ops=("cast",), patterns=_patterns, spec_from_match=cast_spec,
    choose_tiling=choose_cast_tiling, compute=cast_compute, schedule=schedule_cast,
    host_ops={"relax.astype": "cgra.cast"}, checks_pe_dtype=False)
