"""The fabric family: a chain of elementwise operations on one tensor, run as one dataflow body
on the PE fabric (the FABRIC command).

Stage: partition (its patterns and spec), kernel definition, tiling and schedule. Input: a chain
of up to MAX_DEPTH Relax calls, each taking the previous one's result (the first: the chain's
input x) and a one-element constant or x itself: add, subtract, multiply, divide by a constant, maximum,
minimum, clip, relu and leaky relu. That covers the activations the vector unit has no command
for, as the ONNX and PyTorch importers write them: LeakyRelu, HardSwish (x * clip(x + 3, 0, 6) / 6),
HardSigmoid (clip(alpha x + beta, 0, 1)), and any affine chain between layers. The chain becomes a
body of at most 16 nodes (cgra_sim/mapping/body.py): clip is a max and a min, relu a max with 0,
leaky relu a multiply and a max (or, for alpha outside [0, 1], max(x, 0) + alpha min(x, 0)),
c - e a multiply by -1 and an add (exact), and x / c a multiply by the float32 nearest 1 / c
(within 1.5 ulp of the division: the fabric has no divider). The chip maps the body onto its
PEs as a modulo schedule; a chain whose body does not map stays on the host with that reason.

Taken only where the vector unit cannot do the same in one command: two or more operations, or
one it lacks (leaky relu, a division, c - x). A lone add, multiply, maximum, minimum, relu or
clip stays with the eltwise and activation families. The patterns are one per depth, tried
deepest first (FuseOpsByPattern runs each over the whole module before the next), so a chain is
taken whole. The kernel reads x as a compact view (unary.py: static or symbolic sizes), loads tm x tn tiles by DMA, runs
one FABRIC per tile and stores it: one pass over the data for the whole chain, where the vector
unit's kernels would make one pass per operation.
"""

from __future__ import annotations

import dataclasses

from tvm.relax.dpl import wildcard

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of
from ..common.chains import CHAIN_MARK, VECTOR_UNIT_OPS, chain_body, constant_first_subtract, level_pattern, require_program
from ..family import OpFamily
from ..intrinsics import get_intrin
from ..intrinsics.fabric import FabricBody, body_value
from ..common.spec import Tiling
from ..common.unary import (ReadsOperand, UnaryOperand, fastest_tiling, read_operand, same_operand, schedule_unary,
                    unary_compute)

PREFIX = "cgra.fabric" + CHAIN_MARK
MAX_DEPTH = 8  # calls in a chain (a body has at most BODY_MAX_NODES nodes)
DTYPES = ("float32", "int32")


@dataclasses.dataclass(frozen=True)
class FabricSpec(ReadsOperand):
    dtype: str
    operand: UnaryOperand  # x (and the output), as the kernel reads it (unary.py)
    body: tuple  # cgra_sim.mapping.body nodes
    param_roles: tuple = ("lhs",)
    source_ops: tuple = ()
    shape_args: tuple = ()  # positions of symbolic sizes passed beside the tensors (KernelSpec's)
    op = "fabric"
    macs = 0
    acc_dtype = property(lambda self: self.dtype)


def _patterns() -> list:
    """One pattern per depth, deepest first: level k is an elementwise call whose chain operand
    is level k - 1 (level 0: x, role "lhs") and whose other operand is a constant or x."""
    graphs = []
    for depth in range(MAX_DEPTH, 0, -1):
        x = wildcard()
        roles, inner = {"lhs": x}, x
        for level in range(1, depth + 1):
            inner = roles[f"n{level}"] = level_pattern(inner, x)  # the last level is the root (no role twice)
        graphs.append((f"{PREFIX}{depth}", inner, roles))
    return graphs


def fabric_spec(name: str, annotated: dict) -> FabricSpec:
    depth = int(name.removeprefix(PREFIX))
    # explain asks about one host call with just its root and operands
    x, calls = annotated["lhs"], [annotated[f"n{level}"] if f"n{level}" in annotated else annotated["root"]
                                  for level in range(1, depth + 1)]
    ops = [str(call.op.name) for call in calls]
    what = " -> ".join(op.removeprefix("relax.") for op in ops)
    dtype = dtype_of(x)
    if dtype not in DTYPES:
        raise UnsupportedOperator(f"{what} on {dtype or 'an unknown dtype'}: the PE fabric computes "
                                  f"{' or '.join(DTYPES)}")
    operand = read_operand(x, what)
    same_operand(x, calls[-1], what)
    if depth == 1 and ops[0] in VECTOR_UNIT_OPS and not constant_first_subtract(calls[0]):
        raise UnsupportedOperator(f"{what} alone is one vector-unit command (the eltwise and activation kernels)")
    body = chain_body(calls, dtype, what)
    return FabricSpec(dtype, operand, body, source_ops=tuple(op.removeprefix("relax.") for op in ops))


def choose_fabric_tiling(spec: FabricSpec, arch: HardwareDescription) -> Tiling:
    """The tiles of unary.fastest_tiling, the body's cycles on a tile from its mapping. The body must
    map onto the chip's fabric."""
    return fastest_tiling(spec, arch, fabric_tile_cycles(spec, arch))


def fabric_tile_cycles(spec: FabricSpec, arch: HardwareDescription):
    """cycles(elements) of the body's FABRIC run over a tile, from its mapping on the chip's fabric
    (each element read and written once)."""
    program = require_program(spec.body, spec.dtype, arch, " -> ".join(spec.source_ops))
    size = DType.from_name(spec.dtype).itemsize
    return lambda elements: cost.fabric_run_cycles(arch, program, elements, 2 * elements * size)


def fabric_compute(spec: FabricSpec, tiling):
    body = FabricBody(spec.body, spec.dtype)
    return unary_compute(spec, tiling, "fab", lambda value: body_value(body, value), {"cgra_fabric": ("rows", "cols")})


def schedule_fabric(sch, spec: FabricSpec, tiling, arch: HardwareDescription) -> None:
    schedule_unary(sch, tiling, "fab", get_intrin("fabric", tiling.tm, tiling.tn, FabricBody(spec.body, spec.dtype)))


FABRIC = OpFamily(
    name="fabric", ops=("fabric",), patterns=_patterns, spec_from_match=fabric_spec,
    choose_tiling=choose_fabric_tiling, compute=fabric_compute, schedule=schedule_fabric,
    host_ops={"relax.nn.leakyrelu": f"{PREFIX}1", "relax.divide": f"{PREFIX}1"}, checks_pe_dtype=False)
