"""The special-function family: exp, tanh, erf, rsqrt and GELU's erf form on the vector unit.

Stage: partition (its patterns and spec), kernel definition, tiling and schedule. Input: a Relax
`exp`, `tanh`, `erf`, `rsqrt` or `nn.gelu` (the erf form, PyTorch's default) of a float32
tensor of rank 1..4, static or symbolic as the other one-input families (unary.py). One VFUNC
per tile computes the function by the float32 sequence cgra_sim/special.py specifies, within
special.ERROR_BOUNDS ulps of float64 (exp 1, tanh 1.5 and accurate near 0, erf 2.5, GELU 7,
rsqrt 1.5). GELU's tanh form stays with the fabric's smooth family (sigmoid.py).
"""

from __future__ import annotations

import dataclasses

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of
from ..family import OpFamily
from ..intrinsics import get_intrin
from ..intrinsics.row_ops import vfunc_value
from ..common.unary import (ReadsOperand, UnaryOperand, fastest_tiling, read_operand, schedule_unary,
                            single_op_patterns, unary_compute)

#: Relax op -> VFUNC function.
OPS = {"relax.exp": "exp", "relax.tanh": "tanh", "relax.erf": "erf", "relax.rsqrt": "rsqrt", "relax.nn.gelu": "gelu"}


@dataclasses.dataclass(frozen=True)
class SpecialSpec(ReadsOperand):
    func: str  # a VFUNC function: "exp", "tanh", "erf", "rsqrt", "gelu"
    operand: UnaryOperand
    param_roles: tuple = ("lhs",)
    source_ops: tuple = ()
    shape_args: tuple = ()
    dtype = "float32"
    op = "special"
    macs = 0
    acc_dtype = "float32"


def _patterns() -> list:
    return single_op_patterns({f"cgra.{func}": op for op, func in OPS.items()})


def special_spec(name: str, annotated: dict) -> SpecialSpec:
    """The spec of one special function of a float32 tensor (unary.py's view of it)."""
    func = name.removeprefix("cgra.")
    x = annotated["lhs"]
    if dtype_of(x) != "float32":
        raise UnsupportedOperator(f"{func} on {dtype_of(x) or 'an unknown dtype'}: the vector unit's VFUNC "
                                  "computes float32")
    op = str(annotated["root"].op.name).removeprefix("relax.")
    return SpecialSpec(func, read_operand(x, func), source_ops=(op,))


def special_tile_cycles(spec: SpecialSpec, arch: HardwareDescription):
    """cycles(elements) of a tile's VFUNC."""
    return lambda elements: cost.vfunc_cycles(arch, elements, spec.func)


def choose_special_tiling(spec: SpecialSpec, arch: HardwareDescription):
    """unary.fastest_tiling, a tile's work its VFUNC."""
    return fastest_tiling(spec, arch, special_tile_cycles(spec, arch))


def special_compute(spec: SpecialSpec, tiling):
    """unary.unary_compute with the function's VFUNC expression; a symbolic last tile cuts its rows and columns."""
    return unary_compute(spec, tiling, "vfn", lambda value: vfunc_value(spec.func, value),
                         {"cgra_vfunc": ("rows", "cols")})


def schedule_special(sch, spec: SpecialSpec, tiling, arch: HardwareDescription) -> None:
    """unary.schedule_unary onto one VFUNC a tile."""
    schedule_unary(sch, tiling, "vfn", get_intrin("vfunc", tiling.tm, tiling.tn, spec.func))


SPECIAL = OpFamily(
    name="special", ops=("special",), patterns=_patterns, spec_from_match=special_spec,
    choose_tiling=choose_special_tiling, compute=special_compute, schedule=schedule_special,
    host_ops={op: f"cgra.{func}" for op, func in OPS.items()}, checks_pe_dtype=False)
