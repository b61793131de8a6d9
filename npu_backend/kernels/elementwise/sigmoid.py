"""The smooth-activation family: sigmoid, SiLU and GELU's tanh form on the PE fabric.

Stage: partition (its patterns and spec), kernel definition, tiling and schedule. Input: a Relax
`sigmoid`, `nn.silu`, `multiply(x, sigmoid(x))` (SiLU as ONNX writes it, either order) or
`nn.gelu_tanh` of a float32 tensor of rank 1..4, static or symbolic (unary.py). The vector unit
has none of them and the fabric has no exp or divider: each runs as three FABRIC bodies of adds,
multiplies, max and min over the tile (exp by a polynomial and squarings, the reciprocal by Newton steps:
cgra_sim/mapping/sigmoid.py), GELU with one more before them, SiLU and GELU with an ELTWISE
multiply after (intrinsics/smooth.py). The result is within 3.1e-5 relative of float32's sigmoid
(1e-5 for |x| < 10), bit-exact to the numpy model of the same arithmetic. GELU's erf form (PyTorch's
default `nn.gelu`) is the vector unit's VFUNC (special.py): erf needs more than these bodies, and
the tanh form differs from it by up to 5e-4, more than the 1e-4 the results promise.

The kernel reads x as a compact view (unary.py), loads tm x tn tiles by DMA, runs the passes per
tile in the output tile and stores it: one pass over DRAM for the whole activation.
"""

from __future__ import annotations

import dataclasses

from tvm.relax.dpl import is_op, wildcard

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription
from cgra_sim.mapping.body import reads_b
from cgra_sim.mapping.sigmoid import passes

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of
from ..common.chains import require_program
from ..family import OpFamily
from ..intrinsics import get_intrin
from ..intrinsics.smooth import smooth_value
from ..common.unary import (ReadsOperand, UnaryOperand, fastest_tiling, read_operand, schedule_unary,
                            single_op_patterns, unary_compute)

PREFIX = "cgra.smooth."


@dataclasses.dataclass(frozen=True)
class SmoothSpec(ReadsOperand):
    kind: str  # "sigmoid", "silu", "gelu_tanh"
    operand: UnaryOperand  # x (and the output), as the kernel reads it (unary.py)
    param_roles: tuple = ("lhs",)
    source_ops: tuple = ()
    shape_args: tuple = ()  # positions of symbolic sizes passed beside the tensors (KernelSpec's)
    dtype = "float32"
    op = "smooth"
    macs = 0
    acc_dtype = "float32"


def _patterns() -> list:
    patterns = []
    for order in ("x_first", "sigmoid_first"):
        x = wildcard()
        sig = is_op("relax.sigmoid")(x)
        root = is_op("relax.multiply")(x, sig) if order == "x_first" else is_op("relax.multiply")(sig, x)
        patterns.append((f"{PREFIX}silu", root, {"root": root, "lhs": x}))
    ops = {"silu": "relax.nn.silu", "gelu_tanh": "relax.nn.gelu_tanh", "sigmoid": "relax.sigmoid"}
    return patterns + single_op_patterns({f"{PREFIX}{kind}": op for kind, op in ops.items()})


def smooth_spec(name: str, annotated: dict) -> SmoothSpec:
    kind = name.removeprefix(PREFIX)
    x = annotated["lhs"]
    dtype = dtype_of(x)
    if dtype != "float32":
        raise UnsupportedOperator(f"{kind} on {dtype or 'an unknown dtype'}: the fabric computes it in float32 "
                                  "(a quantised model's sigmoid runs on the host)")
    operand = read_operand(x, kind)
    op = str(annotated["root"].op.name).removeprefix("relax.")
    ops = ("sigmoid", "multiply") if op == "multiply" else (op,)
    return SmoothSpec(kind, operand, source_ops=ops)


def choose_smooth_tiling(spec: SmoothSpec, arch: HardwareDescription):
    """unary.fastest_tiling, a tile's work being every body's mapped run in turn (and the
    vector unit's multiply): each body must map onto the chip's fabric."""
    return fastest_tiling(spec, arch, smooth_tile_cycles(spec, arch))


def smooth_tile_cycles(spec: SmoothSpec, arch: HardwareDescription):
    """cycles(elements) of a tile's work: every body's mapped FABRIC run in turn, and the vector
    unit's multiply (silu, gelu)."""
    programs = [require_program(nodes, "float32", arch, spec.kind) for nodes in passes(spec.kind)]
    multiplies = spec.kind != "sigmoid"

    def tile_cycles(elements: int) -> int:  # scratchpad bytes: each input read and the output written
        work = sum(cost.fabric_run_cycles(arch, p, elements, (12 if reads_b(nodes) else 8) * elements)
                   for p, nodes in zip(programs, passes(spec.kind)))
        return work + (cost.eltwise_cycles(arch, elements, 2 * elements) if multiplies else 0)

    return tile_cycles


def smooth_compute(spec: SmoothSpec, tiling):
    return unary_compute(spec, tiling, "smooth", lambda value: smooth_value(spec.kind, value),
                         {"cgra_fabric": ("rows", "cols"), "cgra_eltwise": ("rows", "cols")})


def schedule_smooth(sch, spec: SmoothSpec, tiling, arch: HardwareDescription) -> None:
    schedule_unary(sch, tiling, "smooth", get_intrin("smooth", tiling.tm, tiling.tn, spec.kind))


SMOOTH = OpFamily(
    name="smooth", ops=("smooth",), patterns=_patterns, spec_from_match=smooth_spec,
    choose_tiling=choose_smooth_tiling, compute=smooth_compute, schedule=schedule_smooth,
    host_ops={"relax.sigmoid": f"{PREFIX}sigmoid", "relax.nn.silu": f"{PREFIX}silu",
              "relax.nn.gelu_tanh": f"{PREFIX}gelu_tanh"},
    checks_pe_dtype=False)
