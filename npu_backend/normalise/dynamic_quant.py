"""Dynamically quantized matmuls (onnxruntime's `quantize_dynamic`: DynamicQuantizeLinear ->
MatMulInteger) as the NPU's int8 x int8 -> int32 matmul.

Stage: normalise (after constant folding, which leaves the weights' `astype(W, int32) - zp` one
int32 constant). In: a Relax IRModule. Out: the same module in which every

    matmul(astype(q, int32) - astype(z, int32), C, out_dtype=int32)
        q = quantize(x, s, z, out_dtype=uint8 | int8)   (s, z: 0-d tensors computed at run time)
        C an int32 constant whose values fit int8       (the centred weights)

is

    matmul(q8, int8(C), out_dtype=int32) + (128 - z) * colsum(C)        (uint8 q: q8 = q - 128)
    matmul(q,  int8(C), out_dtype=int32) - z * colsum(C)                 (int8 q)

where q8 = quantize(x, s, z - 128, out_dtype=int8), the int8 twin of the uint8 quantize (exact:
clip(round(x / s) + z, 0, 255) - 128 = clip(round(x / s) + z - 128, -128, 127)). Exact in int32:
sum_k (q8 + 128 - z) C = sum_k q8 C + (128 - z) sum_k C, both sides wrapping alike, and no real
layer comes near 2^31 (255 * 128 * K for K up to 65,000).

Why: MatMulInteger imports as an int32 x int32 matmul of the operands minus their zero points,
which no NPU kernel computes (the PE array multiplies int8), so a dynamically quantized BERT ran
all its integer matmuls on the host; as int8 x int8 they are the GEMM kernels of static QDQ
models (qdq.py). The run-time scale and zero point (DynamicQuantizeLinear's max / min over the
tensor, 0-d arithmetic) and the quantize itself stay where they were.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import dtype_of, shape_dims
from .chain_match import Chain
from .rewrite import as_pass, rewrite_functions

_MATMUL = tvm.ir.Op.get("relax.matmul")


def dynamic_quant_matmuls(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every dynamically quantized integer matmul as an int8 x int8 -> int32 one."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _MatMulIntegerRewriter))


dynamic_quant_pass = as_pass(dynamic_quant_matmuls, "cgra.DynamicQuantMatMuls", ops=("relax.matmul",))


@relax.expr_functor.mutator
class _MatMulIntegerRewriter(relax.PyExprMutator):
    def __init__(self, mod=None):
        super().__init__(mod)
        self.twins = {}  # the uint8 quantize's variable -> its int8 twin (q, k, v share one)

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_MATMUL)) or dtype_of(call) != "int32":
            return call
        chain = Chain(self)
        weight = chain.array(call.args[1])
        operand = _quantized_operand(chain, call.args[0])
        if weight is None or operand is None or weight.ndim != 2 or weight.dtype != np.int32:
            return call
        if weight.min() < -128 or weight.max() > 127:
            return call
        quantized, quantize, zero = operand
        data = self._int8_operand(quantized, quantize, zero)
        emit = self.builder_.emit
        product = emit(with_span(relax.op.matmul(data, relax.const(weight.astype(np.int8)), out_dtype="int32"),
                                 call.span))
        shift = 128 if dtype_of(quantize) == "uint8" else 0
        offset = emit(relax.op.subtract(relax.const(shift, "int32"), relax.op.astype(zero, "int32")))
        column_sums = relax.const(weight.sum(axis=0, dtype=np.int64).astype(np.int32))
        correction = emit(relax.op.multiply(offset, column_sums))
        return with_span(relax.op.add(product, correction), call.span)

    def _int8_operand(self, quantized, quantize, zero):
        """The int8 tensor the matmul reads: the quantize itself, or its int8 twin for uint8."""
        if dtype_of(quantize) == "int8":
            return quantized
        if quantized not in self.twins:
            zero8 = relax.op.astype(relax.op.subtract(relax.op.astype(zero, "int32"), relax.const(128, "int32")),
                                    "int8")
            twin = relax.op.quantize(quantize.args[0], quantize.args[1], self.builder_.emit(zero8),
                                     axis=int(quantize.attrs.axis), out_dtype="int8")
            self.twins[quantized] = self.builder_.emit(with_span(twin, quantize.span))
        return self.twins[quantized]


def _quantized_operand(chain: Chain, expr):
    """(the quantized tensor q, its quantize call, its 0-d zero point) of an
    `astype(q, int32) - astype(z, int32)` with q = quantize(x, s, z) to uint8 or int8, else None."""
    difference = chain.call(expr, "relax.subtract")
    if difference is None:
        return None
    widened, zero_widened = (chain.call(arg, "relax.astype") for arg in difference.args[:2])
    if widened is None or zero_widened is None or dtype_of(widened) != "int32":
        return None
    quantized = widened.args[0]
    quantize = chain.call(quantized, "relax.quantize")
    if quantize is None or dtype_of(quantize) not in ("uint8", "int8") or not isinstance(quantized, relax.Var):
        return None
    zero = zero_widened.args[0]
    if not chain.same_value(zero, quantize.args[2]) or shape_dims(zero) != [] or shape_dims(quantize.args[1]) != []:
        return None
    return quantized, quantize, zero
