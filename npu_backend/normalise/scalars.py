"""A scalar constant operand of an elementwise op becomes a constant of the other operand's rank.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which each
add / subtract / multiply / maximum / minimum of a tensor of rank 1..4 and a scalar constant
(shape (), e.g. ONNX's `Mul(x, 0.5)`, `Div` turned multiply, a `/ 255` preprocessing step) has
that constant reshaped to (1, ..., 1) of the tensor's rank: the same value by broadcasting.

Why: the NPU's DMA moves tensors of rank 1..4, so a rank-0 operand kept the op on the host; a
(1, ..., 1) operand is an ELTWISE broadcast, loaded once per tile and read with stride 0. The other operand's rank is what
counts, not its sizes: a tensor of symbolic shape (a prefill's (1, H, s, d) queries scaled by
1 / sqrt(d)) takes the same (1, ..., 1) operand; before, `static_shape` refused it and every such
multiply of a symbolic-length compile ran on the host.

A float32 multiplication by the constant 1.0 (HF's RoPE `cos * attention_scaling` with a scaling of
1, which a static compile folds into the constant table) is its other operand: exact, x * 1 is x
for every float32 x. A float32 negation (RoPE's rotate_half on a symbolic length, where
rotations.py has no constant sine to fold it into) is a multiplication by -1.0, an ELTWISE:
exact, -x for every float32 x (signed zeros and infinities included).

Also: a float32 division by a constant (a `/ 255` or a per-channel `/ std` preprocessing step,
hard-swish's `/ 6`) becomes a multiplication by the constant's float32 reciprocal, which the
ELTWISE kernel and the fabric's bodies compute (the NPU has no divider); within 1.5 ulp of the
division, exact for a power of two. A divisor with a zero, an infinity or a subnormal
reciprocal stays a division (on the host), and so does a division of a 0-d value (run-time scalar
arithmetic, as DynamicQuantizeLinear's scale: no NPU kernel takes it, and as a multiply it could
be 1 ulp off and move every value quantized with it).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import dtype_of, shape_dims, static_shape
from .rewrite import as_pass, rewrite_functions

_ELTWISE = {tvm.ir.Op.get(f"relax.{name}") for name in ("add", "subtract", "multiply", "maximum", "minimum")}
_DIVIDE = tvm.ir.Op.get("relax.divide")
_MULTIPLY = tvm.ir.Op.get("relax.multiply")
_NEGATIVE = tvm.ir.Op.get("relax.negative")


def float32_reciprocal(value):
    """1 / value in float32 (within 1.5 ulp of a division by value, exact for a power of two)
    when every reciprocal is a finite normal number; None otherwise (a zero, an infinity, or a
    divisor so large its reciprocal is subnormal and would lose precision)."""
    value = np.asarray(value, np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        reciprocal = np.float32(1) / value
    if not np.all(np.isfinite(reciprocal)) or not np.all(np.abs(reciprocal) >= np.finfo(np.float32).tiny):
        return None
    return reciprocal


def _as_multiply(call):
    """x / c -> x * (1 / c) for a float32 constant c with a float32_reciprocal (the NPU has no
    divider); else the call unchanged."""
    divisor = call.args[1]
    if not isinstance(divisor, tvm.ir.GenericConst) or str(divisor.ty.dtype) != "float32":
        return call
    if static_shape(call.args[0]) == ():
        return call
    reciprocal = float32_reciprocal(divisor.value.numpy())
    if reciprocal is None:
        return call
    return with_span(relax.Call(tvm.ir.Op.get("relax.multiply"), [call.args[0], relax.const(reciprocal, "float32")]),
                     call.span)


def scalar_operands_as_tensors(mod: tvm.IRModule) -> tvm.IRModule:
    return rewrite_functions(mod, _ScalarRewriter)


scalar_operands_pass = as_pass(scalar_operands_as_tensors, "cgra.ScalarOperandsAsTensors")


@relax.expr_functor.mutator
class _ScalarRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if isinstance(call, relax.Call) and call.op.same_as(_DIVIDE):
            call = _as_multiply(call)
        if isinstance(call, relax.Call) and call.op.same_as(_NEGATIVE) and dtype_of(call) == "float32":
            call = with_span(relax.op.multiply(call.args[0], relax.const(np.float32(-1))), call.span)
        if not (isinstance(call, relax.Call) and any(call.op.same_as(op) for op in _ELTWISE)):
            return call
        args = list(call.args)
        identity = _times_one(call)
        if identity is not None:
            return identity
        for index in (0, 1):
            other = shape_dims(args[1 - index])
            if isinstance(args[index], tvm.ir.GenericConst) and static_shape(args[index]) == () \
                    and other is not None and 1 <= len(other) <= 4:
                value = args[index].value.numpy().reshape((1,) * len(other))
                args[index] = relax.const(value, str(value.dtype))
                return with_span(relax.Call(call.op, args, call.attrs, call.ty_args), call.span)
        return call


def _times_one(call):
    """x for a float32 multiply(x, 1.0) or multiply(1.0, x) of x's shape, else None."""
    if not call.op.same_as(_MULTIPLY):
        return None
    for constant, other in ((call.args[1], call.args[0]), (call.args[0], call.args[1])):
        if isinstance(constant, tvm.ir.GenericConst) and str(constant.ty.dtype) == "float32" \
                and static_shape(constant) == () and float(constant.value.numpy()) == 1.0 \
                and dtype_of(other) == "float32" \
                and str(shape_dims(other)) == str(shape_dims(call)):
            return other
    return None
