"""The activation family: a standalone relu or clip on the vector unit's EPILOGUE.

Stage: partition (its patterns and spec), kernel definition, tiling and schedule. Input: a Relax
`nn.relu` or `clip` (constant bounds) of a float32 or int32 tensor of rank 1..4, its sizes static
or symbolic (unary.py), that no conv2d / matmul kernel fuses (a relu after an elementwise add, a
clip after a relu). The kernel reads the tensor as a compact view (unary.py), loads tm x tn tiles
by DMA, runs one EPILOGUE per tile (no bias, no residual: acc -> relu / clip -> out) and stores
the tile.
"""

from __future__ import annotations

import dataclasses

from tvm.relax.dpl import is_op, wildcard

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of
from ..common.chains import clip_bounds
from ..family import OpFamily
from ..intrinsics import get_intrin
from ..intrinsics.vector_unit import activation
from ..common.spec import Tiling
from ..common.unary import (ReadsOperand, UnaryOperand, fastest_tiling, read_operand, schedule_unary,
                    unary_compute)

DTYPES = ("float32", "int32")  # the EPILOGUE's accumulator dtypes


@dataclasses.dataclass(frozen=True)
class ActivationSpec(ReadsOperand):
    dtype: str
    operand: UnaryOperand  # x, as the kernel reads it (unary.py)
    relu: bool = False
    clip: tuple | None = None
    param_roles: tuple = ("lhs",)
    source_ops: tuple = ()
    shape_args: tuple = ()  # positions of symbolic sizes passed beside the tensors (KernelSpec's)
    op = "activation"
    macs = 0
    acc_dtype = property(lambda self: self.dtype)


def _patterns() -> list:
    x = wildcard()
    relu = is_op("relax.nn.relu")(x)
    clip = is_op("relax.clip")(x, wildcard(), wildcard())
    return [("cgra.relu", relu, {"root": relu, "lhs": x}), ("cgra.clip", clip, {"root": clip, "lhs": x})]


def activation_spec(name: str, annotated: dict) -> ActivationSpec:
    op = name.removeprefix("cgra.")
    dtype = dtype_of(annotated["lhs"])
    if dtype not in DTYPES:
        raise UnsupportedOperator(f"{op} on {dtype or 'an unknown dtype'}: the EPILOGUE computes "
                                  f"{' or '.join(DTYPES)}")
    clip = clip_bounds(annotated["root"], dtype) if op == "clip" else None
    return ActivationSpec(dtype, read_operand(annotated["lhs"], op), op == "relu", clip)


def choose_activation_tiling(spec: ActivationSpec, arch: HardwareDescription) -> Tiling:
    """unary.fastest_tiling, a tile's work its EPILOGUE."""
    return fastest_tiling(spec, arch, activation_tile_cycles(spec, arch))


def activation_tile_cycles(spec: ActivationSpec, arch: HardwareDescription):
    """cycles(elements) of a tile's EPILOGUE."""
    del spec
    return lambda elements: cost.vector_cycles(arch, 1, elements)


def activation_compute(spec: ActivationSpec, tiling: Tiling):
    return unary_compute(spec, tiling, "epi", lambda value: activation(value, spec.dtype, spec.relu, spec.clip),
                         {"cgra_epilogue": ("m", "n")})


def schedule_activation(sch, spec: ActivationSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    schedule_unary(sch, tiling, "epi", get_intrin("epilogue", tiling.tm, tiling.tn, spec.dtype, bias=False,
                                                  relu=spec.relu, residual=False, clip=spec.clip,
                                                  zero_point=None))


ACTIVATION = OpFamily(
    name="activation", ops=("activation",), patterns=_patterns, spec_from_match=activation_spec,
    choose_tiling=choose_activation_tiling, compute=activation_compute, schedule=schedule_activation,
    host_ops={"relax.nn.relu": "cgra.relu", "relax.clip": "cgra.clip"}, checks_pe_dtype=False)
