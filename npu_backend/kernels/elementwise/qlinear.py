"""The qlinear family: an integer add between quantized tensors as one FABRIC_INT8 kernel.

Stage: partition (its pattern and spec), kernel definition, tiling and schedule. Input: the
fixed-point QLinearAdd the normalise stage writes (normalise/qlinear.py),

    astype(clip(((astype(a) - za) * MA + (astype(b) - zb) * MB + R) >> S + zc, -128, 127), int8)

of two int8 tensors of one shape, its 0-d constants bound inside the kernel. The kernel is the
elementwise family's (eltwise.py: the operands read through one compact view, tiles of tm x tn
double-buffered), each tile one FABRIC whose int32 body

    n0 = a - za, n1 = n0 * MA, n2 = b - zb, n3 = n2 * MB, n4 = n1 + n3, n5 = n4 + R, n6 = n5 >> S, n7 = n6 + zc

reads the int8 tiles sign-extended and stores its value saturated to int8 (FABRIC_INT8): int8
in, int8 out, nothing on the host between the quantized layers.
"""

from __future__ import annotations

import dataclasses

from tvm import te
from tvm.relax.dpl import is_const, is_op, wildcard

from cgra_sim.arch import HardwareDescription

from ...errors import UnsupportedOperator
from ...normalise.scalars import float32_reciprocal
from ...relax_info import dtype_of
from ..common.chains import QLINEAR_PREFIX, require_program
from ..common.operands import prim_func
from ..common.spec import Tiling
from ..common.views import symbolic_shape, view_extents
from ..family import OpFamily
from ..intrinsics import get_intrin
from ..intrinsics.fabric import FabricBody, int8_body_value
from .eltwise import PREFIX as ELTWISE_PREFIX
from .eltwise import EltwiseSpec, choose_eltwise_tiling, eltwise_spec_from_match, tile_two_operands
from .eltwise import _loader, _walked  # noqa: PLC2701 (the elementwise family's view helpers)

NAME = QLINEAR_PREFIX + "_add"
MUL = QLINEAR_PREFIX + "_mul"
#: The constants of the pattern, in the body's order.
CONSTANTS = ("a_zero", "a_multiplier", "b_zero", "b_multiplier", "rounding", "shift", "c_zero")


@dataclasses.dataclass(frozen=True)
class QlinearSpec(EltwiseSpec):
    """An EltwiseSpec (the view of the two int8 operands) with the FABRIC body it runs."""

    body: tuple = ()
    swapped: bool = False  # the body's input A is the right operand (rhs), B the left
    body_dtype: str = "int32"  # QLinearAdd: int32 (fixed point); QLinearMul: float32
    op = "qlinear"
    compute_name = "qlinear"

    @property
    def int8_body(self) -> FabricBody:
        return FabricBody(self.body, self.body_dtype, int8=True)


def _patterns() -> list:
    a, b = wildcard(), wildcard()
    consts = {name: is_const() for name in CONSTANTS}

    def scaled(x, zero, multiplier):
        return is_op("relax.multiply")(is_op("relax.subtract")(is_op("relax.astype")(x), consts[zero]),
                                       consts[multiplier])

    total = is_op("relax.add")(is_op("relax.add")(scaled(a, "a_zero", "a_multiplier"),
                                                  scaled(b, "b_zero", "b_multiplier")), consts["rounding"])
    value = is_op("relax.add")(is_op("relax.right_shift")(total, consts["shift"]), consts["c_zero"])
    clip = is_op("relax.clip")(value, wildcard(), wildcard())
    root = is_op("relax.astype")(clip)
    return [(NAME, root, {"root": root, "lhs": a, "rhs": b, "clip": clip, **consts}), _mul_pattern()]


def _mul_pattern():
    """quantize(multiply(dequantize(a), dequantize(b))): QLinearMul (normalise/qlinear.py gives it
    dequantizes of its own)."""
    a, b = wildcard(), wildcard()
    dq_a, dq_b = (is_op("relax.dequantize")(x, is_const(), is_const()) for x in (a, b))
    product = is_op("relax.multiply")(dq_a, dq_b)
    root = is_op("relax.quantize")(product, is_const(), is_const())
    return MUL, root, {"root": root, "lhs": a, "rhs": b, "dq_lhs": dq_a, "dq_rhs": dq_b, "product": product}


def _scalar(expr, dtype: str, what: str):
    value = expr.value.numpy() if hasattr(expr, "value") else None
    if value is None or value.size != 1 or value.dtype.name != dtype:
        raise UnsupportedOperator(f"QLinearMul's {what} is not a one-element {dtype} constant")
    return value.item()


def _mul_spec(annotated: dict) -> QlinearSpec:
    """QLinearMul on the fabric: the float32 body (a - za) * sa * ((b - zb) * sb) * (1 / sc) + zc,
    rounded half to even and saturated on store. Against the host's quantize (x / sc, rounded,
    then + zc) it multiplies by the float32 reciprocal of sc and adds zc before rounding: the two
    differ where the product lies within an ulp of a half step."""
    lhs, rhs, quantize = annotated["lhs"], annotated["rhs"], annotated["root"]
    if dtype_of(lhs) != "int8" or dtype_of(rhs) != "int8" or str(quantize.attrs.out_dtype) != "int8":
        raise UnsupportedOperator("QLinearMul on the fabric reads and writes int8 (FABRIC_INT8)")
    reciprocal = float32_reciprocal(_scalar(quantize.args[1], "float32", "output scale"))
    if reciprocal is None:
        raise UnsupportedOperator("QLinearMul's output scale has no normal float32 reciprocal")
    scales = [_scalar(annotated[role].args[1], "float32", "input scale") for role in ("dq_lhs", "dq_rhs")]
    zeros = [_scalar(annotated[role].args[2], "int8", "input zero point") for role in ("dq_lhs", "dq_rhs")]
    base = eltwise_spec_from_match(ELTWISE_PREFIX + "multiply", {"lhs": lhs, "rhs": rhs})
    if base.tail or base.symbol is not None or not (all(base.lhs_full) or all(base.rhs_full)):
        raise UnsupportedOperator(f"QLinearMul of shapes {base.lhs_shape} and {base.rhs_shape}: the NPU kernel "
                                  "takes static shapes, one operand of the output's shape")
    swapped = not all(base.lhs_full)
    order = (1, 0) if swapped else (0, 1)
    body, inputs = [], []
    for source, index in zip(("a", "b"), order):
        value = source
        if zeros[index]:
            body.append(("sub", value, float(zeros[index])))
            value = f"n{len(body) - 1}"
        if scales[index] != 1.0:
            body.append(("mul", value, float(scales[index])))
            value = f"n{len(body) - 1}"
        inputs.append(value)
    body.append(("mul", *inputs))  # no x - 0, x * 1, x + 0: TVM's arithmetic would fold them away
    if reciprocal != 1.0:
        body.append(("mul", f"n{len(body) - 1}", float(reciprocal)))
    zero = _scalar(quantize.args[2], "int8", "output zero point")
    if zero:
        body.append(("add", f"n{len(body) - 1}", float(zero)))
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return QlinearSpec(**{**fields, "func": "qlinear_mul"}, body=tuple(body), swapped=swapped,
                       body_dtype="float32")


def _constant(expr, role: str) -> int:
    value = expr.value.numpy() if hasattr(expr, "value") else None
    if value is None or value.size != 1 or value.dtype.name != "int32":
        raise UnsupportedOperator(f"QLinearAdd's {role} is not a one-element int32 constant")
    return int(value.item())


def qlinear_spec(name: str, annotated: dict) -> QlinearSpec:
    """The kernel of a matched fixed-point QLinearAdd or QLinearMul; raises UnsupportedOperator
    with the reason."""
    if name == MUL:
        return _mul_spec(annotated)
    lhs, rhs = annotated["lhs"], annotated["rhs"]
    if dtype_of(lhs) != "int8" or dtype_of(rhs) != "int8" or dtype_of(annotated["root"]) != "int8":
        raise UnsupportedOperator("QLinearAdd on the fabric reads and writes int8 (FABRIC_INT8)")
    clip = annotated["clip"]
    if (float(clip.args[1].value), float(clip.args[2].value)) != (-128.0, 127.0):
        raise UnsupportedOperator("QLinearAdd saturates to int8's range, [-128, 127]")
    values = {role: _constant(annotated[role], role) for role in CONSTANTS}
    if not 0 <= values["shift"] < 32:
        raise UnsupportedOperator(f"QLinearAdd shifts by {values['shift']}: the fabric shifts by 0..31")
    base = eltwise_spec_from_match(ELTWISE_PREFIX + "add", {"lhs": lhs, "rhs": rhs})
    if base.lhs_shape != base.rhs_shape or base.tail or base.symbol is not None:
        raise UnsupportedOperator(f"QLinearAdd of shapes {base.lhs_shape} and {base.rhs_shape}: the NPU kernel "
                                  "adds two static tensors of one shape")
    # The body's input A is the operand with the larger multiplier: TVM's simplifier orders the
    # terms of the kernel's TE compute so (it folds the immediates where no step can overflow),
    # and tensorize matches the description's reads in that order.
    swapped = values["b_multiplier"] > values["a_multiplier"]
    first, second = ("b", "a") if swapped else ("a", "b")
    body = (("sub", "a", values[f"{first}_zero"]), ("mul", "n0", values[f"{first}_multiplier"]),
            ("sub", "b", values[f"{second}_zero"]), ("mul", "n2", values[f"{second}_multiplier"]),
            ("add", "n1", "n3"), ("add", "n4", values["rounding"]), ("shr", "n5", values["shift"]),
            ("add", "n6", values["c_zero"]))
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return QlinearSpec(**{**fields, "func": "qlinear_add"}, body=body, swapped=swapped)


def choose_qlinear_tiling(spec: QlinearSpec, arch: HardwareDescription) -> Tiling:
    """The elementwise family's tiles (int8 operands), once the body maps onto the fabric."""
    require_program(spec.body, spec.body_dtype, arch, spec.func)
    return choose_eltwise_tiling(spec, arch)


def qlinear_compute(spec: QlinearSpec, tiling: Tiling):
    """out = saturate(body(a, b)) over the view, rows and columns padded to whole tiles."""
    extents, padded = view_extents(spec, tiling)
    operands = {}
    for role, name, full in (("lhs", "a_pad", spec.lhs_full), ("rhs", "b_pad", spec.rhs_full)):
        view = tuple(e if walks else 1 for e, walks in zip(extents, full))
        tensor = te.placeholder(view, "int8", name=role)
        shape = tuple(extent if walks else 1 for extent, walks in zip(padded, full))
        operands[role] = (tensor, te.compute(shape, _loader(tensor, view), name=name))
    (lhs, a_pad), (rhs, b_pad) = operands["lhs"], operands["rhs"]
    body = spec.int8_body
    def value(*i):
        a, b = a_pad(*_walked(i, spec.lhs_full)), b_pad(*_walked(i, spec.rhs_full))
        return int8_body_value(body, *((b, a) if spec.swapped else (a, b)))

    elt = te.compute(padded, value, name="elt")
    out = te.compute(extents, lambda *i: elt(*i), name="out")
    caller = {"lhs": spec.lhs_shape, "rhs": spec.rhs_shape, "out": spec.output_shape}
    views = {role: symbolic_shape(spec, shape, rank=len(spec.output_shape)) for role, shape in caller.items()} \
        if any(tuple(shape) != tuple(spec.view(role)) for role, shape in caller.items()) else None
    return prim_func(spec.param_roles, {"lhs": lhs, "rhs": rhs}, out, views, spec.shape_args)


def schedule_qlinear(sch, spec: QlinearSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """Tiles of tm x tn; per tile the two int8 operand tiles are loaded and one FABRIC_INT8 computes it."""
    del arch
    row_inner = tile_two_operands(sch, tiling)
    b_full = spec.lhs_full if spec.swapped else spec.rhs_full  # the operand the body reads as B
    sch.tensorize(row_inner, get_intrin("fabric", tiling.tm, tiling.tn, spec.int8_body, b_full=b_full[-2:]))


QLINEAR = OpFamily(
    name="qlinear", ops=("qlinear",), patterns=_patterns, spec_from_match=qlinear_spec,
    choose_tiling=choose_qlinear_tiling, compute=qlinear_compute, schedule=schedule_qlinear,
    host_ops={"relax.right_shift": NAME}, checks_pe_dtype=False)
