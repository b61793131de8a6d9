"""A QDQ layer's output dequantized to float32 (a quantized classifier's last DequantizeLinear) with
its two per-channel scales in one interleaved table, so that the GEMM kernel's EPILOGUE dequantises.

Stage: normalise (after qdq.py and every folding pass: the takes below must stay takes). In: a
Relax module in which qdq.py wrote a layer as

    s = multiply(astype(acc, "float32"), M)      M: (N,) float32 constant, acc (..., N) int32
    q = quantize(s, 1.0, zp)                     int8, read by the dequantize alone
    y = dequantize(q, ys, zp)                    float32, ys and zp one value each

Out: the same with M and ys read from one constant T of shape (N, 2), T[j] = (M[j], ys):

    s = multiply(astype(acc, "float32"), take(T, 0, axis=1))
    y = dequantize(quantize(s, 1.0, zp), take(T, 1, axis=1), zp, axis=-1)

the same values (ys broadcast per channel). A conv2d's multiplier, a (1, F, 1, 1) row, is read as
reshape(take(T, 0, axis=1), (1, F, 1, 1)) and the quantize and dequantize run along its channel
axis (axis=1 of NCHW): a YOLO's or SqueezeNet's last conv dequantises in its EPILOGUE too. Why: the EPILOGUE's dequantising form
(EPILOGUE_DEQUANTISE, docs/command-stream.md) reads channel j's multiplier and dequantisation scale
at 2j and 2j + 1 of one row; the matmul kernel's chain pattern (kernels/gemm/dequant_epilogue.py)
takes T as that row, one DMA, and the model has no float op left on the host. Where the pattern is
refused the two takes of a constant run on the host (N values each).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import static_shape
from .rewrite import as_pass, one_value, op_name, rewrite_each, values_and_users


@relax.expr_functor.mutator
class _DequantizedOutputs(relax.PyExprMutator):
    """At each dequantize of a requantising chain's int8 result, the chain with the table."""

    def __init__(self, mod, func):
        super().__init__(mod)
        self.values, self.users = values_and_users(func)

    def visit_var_binding_(self, binding):
        plan = None if self._requantised(binding.var) else self._plan(binding.value)
        if plan is None:
            super().visit_var_binding_(binding)
            return
        value = self._emit(*plan, binding.value.span)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))

    def _only(self, var, op: str):
        """The call of `op` bound to `var`, if `var` has exactly one use."""
        value = self.values.get(var)
        return value if op_name(value) == op and len(self.users.get(var, [])) == 1 else None

    def _plan(self, call):
        """(acc, M, ys, zp, the multiply's and quantize's spans) of a dequantize ending the chain, else None."""
        if op_name(call) != "relax.dequantize" or str(call.attrs.out_dtype) != "float32":
            return None
        quantize = self._only(call.args[0], "relax.quantize")
        scaled = self._only(quantize.args[0], "relax.multiply") if quantize is not None else None
        if scaled is None or str(quantize.attrs.out_dtype) != "int8" or one_value(quantize.args[1], "float32") != 1.0:
            return None
        zero_point, y_scale = one_value(quantize.args[2], "int8"), one_value(call.args[1], "float32")
        if zero_point is None or y_scale is None or one_value(call.args[2], "int8") != zero_point:
            return None
        cast, multiplier = self.values.get(scaled.args[0], scaled.args[0]), scaled.args[1]
        acc = cast.args[0] if op_name(cast) == "relax.astype" else None
        values = multiplier.value.numpy() if isinstance(multiplier, tvm.ir.GenericConst) else None
        shape = static_shape(acc) if acc is not None else None
        if shape is None or len(shape) < 2 or str(acc.ty.dtype) != "int32" or values is None \
                or values.dtype != np.float32:
            return None
        axis = _channel_axis(shape, values.shape)
        if axis is None or (values.ndim > 1 and not self._one_group_conv(acc)):
            return None
        return acc, values, axis, np.float32(y_scale), zero_point, scaled.span, quantize.span

    def _one_group_conv(self, acc) -> bool:
        """Whether `acc` is a conv2d of one group (+ its bias adds): the only conv the dequantising
        EPILOGUE kernel takes (kernels/gemm/dequant_epilogue.py). Any other producer (a depthwise
        conv2d) would keep the rewrite's table takes on the host beside the dequantize."""
        value = self.values.get(acc)
        for _ in range(4):
            if op_name(value) != "relax.add":
                break
            value = self.values.get(value.args[0])
        return op_name(value) == "relax.nn.conv2d" and int(value.attrs.groups) == 1

    def _requantised(self, var) -> bool:
        """Whether every reader of `var` (a dequantize's result) quantizes it again (qlayouts.py's
        requantisation of a concat operand to the concat's scale): that kernel reads int8, which
        a float32 store here would quadruple (SqueezeNet: +492 cycles)."""
        readers = [self.values.get(user) for user in self.users.get(var, [])]
        return bool(readers) and all(op_name(reader) == "relax.quantize" for reader in readers)

    def _emit(self, acc, multiplier, axis: int, y_scale, zero_point: int, multiply_span, quantize_span, span):
        def emit(value, where):
            return self.builder_.emit(with_span(value, where) if where is not None else value)

        row = multiplier.reshape(-1)
        table = relax.const(np.stack([row, np.full_like(row, y_scale)], axis=1))
        part = [emit(relax.op.take(table, relax.const(column, "int64"), axis=1), span) for column in (0, 1)]
        # a conv2d's row broadcasts as (1, F, 1, 1): a view of the taken column (no copy)
        factor = part[0] if multiplier.ndim == 1 else emit(relax.op.reshape(part[0], multiplier.shape), span)
        scaled = emit(relax.op.multiply(relax.op.astype(self.visit_expr(acc), "float32"), factor), multiply_span)
        zp = relax.const(zero_point, "int8")
        quantized = emit(relax.op.quantize(scaled, relax.const(1.0, "float32"), zp, axis=axis, out_dtype="int8"),
                         quantize_span)
        value = relax.op.dequantize(quantized, part[1], zp, axis=axis, out_dtype="float32")
        return with_span(value, span) if span is not None else value


def _channel_axis(shape, row_shape) -> int | None:
    """The output axis a requantisation row of `row_shape` runs along (-1 for a matmul's (N,), the
    channel axis of a conv2d's (1, F, 1, 1)); None for any other broadcast."""
    if row_shape == (shape[-1],):
        return -1
    if len(row_shape) != len(shape):
        return None
    carriers = [axis for axis, extent in enumerate(row_shape) if extent != 1]
    if not carriers:  # one channel: any axis of extent 1 gives the same values; NCHW's C where it can
        carriers = [1] if shape[1] == 1 else [axis for axis, extent in enumerate(shape) if extent == 1][-1:]
    if len(carriers) != 1 or row_shape[carriers[0]] != shape[carriers[0]]:
        return None
    return carriers[0] - len(shape)


def dequantized_outputs(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with each requantised layer's dequantize reading the interleaved table (module doc)."""
    return rewrite_each(mod, _DequantizedOutputs)


dequantized_outputs_pass = as_pass(dequantized_outputs, "cgra.DequantizedOutputs", ops=("relax.dequantize",))
