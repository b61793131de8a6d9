"""A requantising conv2d whose int8 result is one operand of a QLinearAdd: the add in its epilogue.

Stage: partition (the chain's pattern tail, the KernelSpec fields) and kernel definition (the TE
value the EPILOGUE intrinsic is tensorized onto). The normalise stage writes a QDQ ResNet's residual
add as onnxruntime's fixed-point QLinearAdd (normalise/qlinear.py) of two int8 tensors, one of them
(a) the second conv's requantised output:

    a = quantize(multiply(astype(conv [+ bias] [relu]), M), 1.0, za)                  (the EPILOGUE's)
    c = astype(clip(((astype(a) - za) * MA + (astype(r) - zr) * MR + R) >> S + zc, -128, 127), int8)

r the other branch (the block's input, or the downsampling conv's output). Alone, the add is a
kernel of its own (the qlinear family): a stores and loads again, one more launch per block
(ResNet-50 at 64 x 64: 16 kernels, 195,712 cycles on cgra-8x8). Here the conv's kernel loads r's
tile beside its accumulator, its EPILOGUE requantises the tile to a (in the output tile), and one
FABRIC_INT8 over the output tile in place runs the qlinear family's int32 body on a and r
(saturated to int8 on store): the same commands, the same arithmetic, bit for bit; only c leaves
the scratchpad. The body's input A is the operand with the larger multiplier, as the qlinear
family orders it (TVM's simplifier orders the terms so, and tensorize matches that order).

Only with CompileOptions.fuse_chains (the pattern's name holds chains.CHAIN_MARK), like any FABRIC
in an epilogue: the FABRIC takes the PE array between two tiles' GEMMs, where the add's own kernel
overlaps its fabric runs with its DMA. bench_quantized cgra-8x8, int8 cycles without -> with:
mobilenet_v3_small 328,325 -> 329,419, resnet18 2,923,540 -> 2,933,072 (24 kernels, not 32).
"""

from __future__ import annotations

import dataclasses

from tvm.relax.dpl import is_const, is_op, wildcard

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of, require_static_shape
from ..intrinsics.fabric import FabricBody, int8_body_value

#: The add's constants: the conv side's ("q_"), the other branch's ("r_"), the sum's.
CONSTANTS = ("q_zero", "q_multiplier", "r_zero", "r_multiplier", "rounding", "shift", "c_zero")


def qadd_tail(requant) -> tuple:
    """[(the pattern after `requant`, its annotations)]: the conv's value first in the add, then second."""
    other = wildcard()
    consts = {f"qadd_{name}": is_const() for name in CONSTANTS}

    def scaled(x, side):
        return is_op("relax.multiply")(is_op("relax.subtract")(is_op("relax.astype")(x), consts[f"qadd_{side}_zero"]),
                                       consts[f"qadd_{side}_multiplier"])

    tails = []
    for pair in ((scaled(requant, "q"), scaled(other, "r")), (scaled(other, "r"), scaled(requant, "q"))):
        total = is_op("relax.add")(is_op("relax.add")(*pair), consts["qadd_rounding"])
        value = is_op("relax.add")(is_op("relax.right_shift")(total, consts["qadd_shift"]), consts["qadd_c_zero"])
        clip = is_op("relax.clip")(value, wildcard(), wildcard())
        root = is_op("relax.astype")(clip)
        tails.append((root, {"residual": other, "qadd": root, "qadd_clip": clip, **consts}))
    return tails


def _constant(expr, role: str) -> int:
    value = expr.value.numpy() if hasattr(expr, "value") else None
    if value is None or value.size != 1 or value.dtype.name != "int32":
        raise UnsupportedOperator(f"the epilogue's QLinearAdd {role} is not a one-element int32 constant")
    return int(value.item())


def with_qadd(spec, annotated: dict, out_shape: tuple):
    """`spec` (requantising to int8) ending in the QLinearAdd with the "residual" role's int8 tensor
    of the output's shape `out_shape`. Raises UnsupportedOperator where the kernel cannot."""
    conv = spec.op == "conv2d" and spec.compute_name != "conv2d_layout"
    if not conv or spec.grouped or spec.symbols or spec.residual_shape or spec.dequantise \
            or spec.acc_dtype != "int32" or spec.requant_zero_point is None or spec.fabric_body:
        raise UnsupportedOperator("a QLinearAdd is fused after a static requantising NCHW conv2d of one group (a "
                                  "matmul's is not tested yet); the add runs as its own kernel")
    residual, clip = annotated["residual"], annotated["qadd_clip"]
    if dtype_of(residual) != "int8" or dtype_of(annotated["qadd"]) != "int8":
        raise UnsupportedOperator("the epilogue's QLinearAdd reads and writes int8")
    if tuple(require_static_shape(residual, "QLinearAdd operand", UnsupportedOperator)) != tuple(out_shape):
        raise UnsupportedOperator(f"the QLinearAdd's other operand is not of the output's shape {tuple(out_shape)}")
    if (float(clip.args[1].value), float(clip.args[2].value)) != (-128.0, 127.0):
        raise UnsupportedOperator("QLinearAdd saturates to int8's range, [-128, 127]")
    values = {name: _constant(annotated[f"qadd_{name}"], name) for name in CONSTANTS}
    if values["q_zero"] != spec.requant_zero_point or not 0 <= values["shift"] < 32:
        raise UnsupportedOperator("the QLinearAdd reads the requantised output with another zero point, or shifts "
                                  "by more than 31")
    swapped = values["r_multiplier"] > values["q_multiplier"]  # input A: the larger multiplier's (module doc)
    first, second = ("r", "q") if swapped else ("q", "r")
    body = (("sub", "a", values[f"{first}_zero"]), ("mul", "n0", values[f"{first}_multiplier"]),
            ("sub", "b", values[f"{second}_zero"]), ("mul", "n2", values[f"{second}_multiplier"]),
            ("add", "n1", "n3"), ("add", "n4", values["rounding"]), ("shr", "n5", values["shift"]),
            ("add", "n6", values["c_zero"]))
    return dataclasses.replace(spec, residual_shape=tuple(out_shape), qadd_body=body, qadd_swapped=swapped)


def qadd_body(spec) -> FabricBody | None:
    """The FABRIC_INT8 body of the spec's epilogue QLinearAdd, else None."""
    return FabricBody(spec.qadd_body, "int32", int8=True) if spec.qadd_body else None


def qadd_value(body: FabricBody, swapped: bool, requantised, other):
    """The add's int8 output: the body on (the requantised output, the other operand), A the larger
    multiplier's: the expression the EPILOGUE intrinsic's description builds (vector_unit.py)."""
    return int8_body_value(body, *((other, requantised) if swapped else (requantised, other)))
