"""The qchain family: a float elementwise chain between quantized tensors as one FABRIC_INT8 kernel.

Stage: partition (its patterns and spec), kernel definition, tiling and schedule. Input:

    quantize(chain(dequantize(x, sx, zx)), sy, zy)        x int8, per-tensor scales and zero points

the chain zero to MAX_DEPTH calls of the fabric's links (common/chains.py: add, subtract,
multiply, divide by a constant, maximum, minimum, clip, relu, leaky relu: a HardSigmoid, a
hard-swish), which onnxruntime computes in float between a DequantizeLinear and a
QuantizeLinear; normalise/qlinear.py gives the chain a dequantize of its own. Zero calls is a
requantisation from one scale and zero point to another (a concat's operand, normalise/
qlayouts.py). One FABRIC per tile
on a float32 body (FABRIC_INT8: int8 in, the output rounded half to even and saturated):

    (x - zx) * sx -> the chain -> * (1 / sy) + zy

instead of a dequantize and a quantize on the host around a float32 kernel. Against the host it
multiplies by the float32 reciprocal of sy and adds zy before rounding: the two differ where the
value lies within an ulp of a half step. A requantisation has 256 inputs: the kernel is taken
only when its body gives the host's quantize(dequantize(x)) for every one of them
(`exact_requantise`), so it is exact; otherwise the pair stays on the host.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from tvm.relax.dpl import is_const, is_op, wildcard

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import BODY_MAX_NODES
from cgra_sim.mapping import body as bodies

from ...errors import UnsupportedOperator
from ...normalise.scalars import float32_reciprocal
from ...relax_info import dtype_of
from ..common.chains import QLINEAR_PREFIX, chain_body, level_pattern, require_program
from ..common.spec import Tiling
from ..common.unary import ReadsOperand, UnaryOperand, fastest_tiling, read_operand, schedule_unary, unary_compute
from ..family import OpFamily
from ..intrinsics import get_intrin
from ..intrinsics.fabric import FabricBody, int8_body_value

PREFIX = QLINEAR_PREFIX + "_unary"
MAX_DEPTH = 6


@dataclasses.dataclass(frozen=True)
class QchainSpec(ReadsOperand):
    operand: UnaryOperand  # x (and the output), int8, as the kernel reads it (unary.py)
    body: tuple  # float32 nodes, FABRIC_INT8
    dtype: str = "int8"
    param_roles: tuple = ("lhs",)
    source_ops: tuple = ()
    shape_args: tuple = ()
    op = "qchain"
    macs = 0
    acc_dtype = property(lambda self: self.dtype)

    @property
    def int8_body(self) -> FabricBody:
        return FabricBody(self.body, "float32", int8=True)


def _patterns() -> list:
    graphs = []
    for depth in range(MAX_DEPTH, -1, -1):
        data = wildcard()
        x = is_op("relax.dequantize")(data, is_const(), is_const())
        roles, inner = {"lhs": data, "dq": x}, x
        for level in range(1, depth + 1):
            inner = roles[f"n{level}"] = level_pattern(inner, x)
        root = is_op("relax.quantize")(inner, is_const(), is_const())
        graphs.append((f"{PREFIX}{depth}", root, {"root": root, **roles}))
    return graphs


def _scalar(expr, dtype: str, what: str):
    value = expr.value.numpy() if hasattr(expr, "value") else None
    if value is None or value.size != 1 or value.dtype.name != dtype:
        raise UnsupportedOperator(f"a quantized chain's {what} is not a one-element {dtype} constant")
    return value.item()


def _shifted(nodes: tuple, offset: int, source: str) -> list:
    """`nodes` numbered from `offset`, their input "a" read from `source`."""
    def ref(operand):
        if operand == "a":
            return source
        match = re.fullmatch(r"n(\d+)", operand) if isinstance(operand, str) else None
        return f"n{int(match.group(1)) + offset}" if match else operand
    return [(op, ref(first), ref(second)) for op, first, second in nodes]


def qchain_spec(name: str, annotated: dict) -> QchainSpec:
    """The kernel of a matched quantized chain; raises UnsupportedOperator with the reason."""
    depth = int(name.removeprefix(PREFIX))
    x, dq, quantize = annotated["lhs"], annotated["dq"], annotated["root"]
    calls = [annotated[f"n{level}"] for level in range(1, depth + 1)]
    what = " -> ".join(str(call.op.name).removeprefix("relax.") for call in calls) or "a requantisation"
    if dtype_of(x) != "int8" or str(quantize.attrs.out_dtype) != "int8" or dtype_of(dq) != "float32":
        raise UnsupportedOperator(f"{what} between quantized tensors: the kernel reads and writes int8")
    reciprocal = float32_reciprocal(_scalar(quantize.args[1], "float32", "output scale"))
    if reciprocal is None:
        raise UnsupportedOperator(f"{what}: the output scale has no normal float32 reciprocal")
    scale, zero = _scalar(dq.args[1], "float32", "input scale"), _scalar(dq.args[2], "int8", "input zero point")
    body = ([("sub", "a", float(zero))] if zero else [])
    body += [("mul", f"n{len(body) - 1}" if body else "a", float(scale))] if scale != 1.0 else []
    source = f"n{len(body) - 1}" if body else "a"
    body += _shifted(chain_body(calls, "float32", what), len(body), source) if calls else []
    body += [("mul", f"n{len(body) - 1}" if body else "a", float(reciprocal))] if reciprocal != 1.0 else []
    out_zero = _scalar(quantize.args[2], "int8", "output zero point")
    body += [("add", f"n{len(body) - 1}" if body else "a", float(out_zero))] if out_zero else []
    if not body:
        raise UnsupportedOperator("a requantisation to the same scale and zero point computes its input unchanged")
    if not calls:
        exact_requantise(tuple(body), zero, scale, _scalar(quantize.args[1], "float32", "output scale"), out_zero)
    if len(body) > BODY_MAX_NODES:
        raise UnsupportedOperator(f"{what} with its dequantize and quantize is {len(body)} fabric operations; a "
                                  f"FABRIC body holds {BODY_MAX_NODES}")
    return QchainSpec(read_operand(x, what), tuple(body),
                      source_ops=("dequantize",) + tuple(str(c.op.name).removeprefix("relax.") for c in calls)
                      + ("quantize",))


def exact_requantise(body: tuple, zero: int, scale: float, out_scale: float, out_zero: int) -> None:
    """UnsupportedOperator unless the FABRIC_INT8 `body` gives the host's quantize(dequantize(x,
    scale, zero), out_scale, out_zero) (float32 (x - zero) * scale / out_scale, rounded half to
    even, + out_zero, saturated) for every int8 x."""
    x = np.arange(-128, 128, dtype=np.float32)
    with np.errstate(over="ignore"):
        got = np.clip(np.rint(bodies.evaluate(body, "float32", x)), -128, 127)
        real = (x - np.float32(zero)) * np.float32(scale)
        want = np.clip(np.rint(real / np.float32(out_scale)) + out_zero, -128, 127)
    wrong = np.flatnonzero(got != want)
    if wrong.size:
        raise UnsupportedOperator(f"requantising int8 from scale {scale}, zero point {zero} to {out_scale}, "
                                  f"{out_zero}: the fabric multiplies by 1 / scale where the host divides, and the "
                                  f"two round apart at x = {int(x[wrong[0]])}; it runs on the host, exactly")


def choose_qchain_tiling(spec: QchainSpec, arch: HardwareDescription) -> Tiling:
    program = require_program(spec.body, "float32", arch, " -> ".join(spec.source_ops))
    return fastest_tiling(spec, arch, lambda elements: cost.fabric_run_cycles(arch, program, elements, 2 * elements))


def qchain_compute(spec: QchainSpec, tiling: Tiling):
    body = spec.int8_body
    return unary_compute(spec, tiling, "fab", lambda value: int8_body_value(body, value),
                         {"cgra_fabric": ("rows", "cols")})


def schedule_qchain(sch, spec: QchainSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    del arch
    schedule_unary(sch, tiling, "fab", get_intrin("fabric", tiling.tm, tiling.tn, spec.int8_body))


QCHAIN = OpFamily(
    name="qchain", ops=("qchain",), patterns=_patterns, spec_from_match=qchain_spec,
    choose_tiling=choose_qchain_tiling, compute=qchain_compute, schedule=schedule_qchain,
    host_ops={}, checks_pe_dtype=False)
