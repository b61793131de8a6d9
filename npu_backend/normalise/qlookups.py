"""Functions of one quantized tensor as 256-entry tables: a QLinearSigmoid, a requantised SiLU or
hard-swish.

Stage: normalise (after qlayouts.py, before qlinear.py, which would otherwise give a SiLU's or a
hard-swish's multiply dequantizes of its own). In: a Relax IRModule. Out: the same module in which
every int8 quantize whose value is a function of one int8 tensor x alone, through a sigmoid or
through a requantisation of its own inside the chain,

    y = quantize(sigmoid(dequantize(x, sx, zx)), sy, zy)                       (QLinearSigmoid)
    y = quantize(dequantize(x) * dequantize(quantize(sigmoid(dequantize(x)))), sy, zy)  (SiLU)
    y = quantize(dequantize(x) * dequantize(quantize(hard_sigmoid(dequantize(x)))), sy, zy)
                                                     (hard-swish: MobileNetV3's HardSigmoid, QDQ, Mul)

(and any other chain of dequantize, quantize, sigmoid, add, subtract, multiply, divide, maximum,
minimum, relu and clip of x and scalar constants with a sigmoid or an inner quantize in it) is

    y = take(T, astype(x, "int32") + 128)        T: 256 int8, T[k] = the chain at x = k - 128

which the qlookup family runs as one LOOKUP per tile (kernels/elementwise/qlookup.py) and the
host computes as well, exactly. x has 256 values, so the table is the chain itself, evaluated
here in numpy as onnxruntime computes it in float and quantises: dequantize (x - zx) * sx in
float32, the sigmoid correctly rounded to float32 (float64, then rounded), the float32 ops (a
HardSigmoid's alpha * x, + beta, clip: two roundings, as onnxruntime's Eigen loop), quantize
rint(v / sy) + zy (half to even) saturated. Checked against onnxruntime 1.31's QLinearSigmoid (a
table from MlasComputeLogistic) and QLinearMul over all 256 inputs for 300 random scale sets each:
equal bit for bit (tests/test_qlookups.py keeps a sample, and the hard-swish's), which is what Arm
Ethos-U and TFLite do with their int8 LUT activations. Where the sigmoid ran as a float kernel
between a host dequantize and quantize, and the multiply as a kernel of its own, the SiLU is now
one pass over int8; the hard-swish, a quantized chain kernel and a QLinearMul kernel before (the
chain's FABRIC multiplies by 1 / sy, a step off where the value lies within an ulp of a half
step), is one LOOKUP, exact (MobileNetV3-Small at 64 x 64 on cgra-8x8: 19 of each, 58 k cycles,
now 19 LOOKUPs, 14 k). A chain of one level (a HardSigmoid alone, a requantisation) stays the
qchain kernel's.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx

from ..frontend.provenance import with_span
from .rewrite import as_pass, one_value, op_name, rewrite_each

_INPUTS = np.arange(-128, 128)
_BINARY = {"relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
           "relax.divide": np.divide, "relax.maximum": np.maximum, "relax.minimum": np.minimum}
#: The ops whose tables are exact but which the NPU otherwise computes only in float: a chain
#: without one (or an inner quantize) stays for the qchain / qlinear kernels (qlinear.py).
_TRANSCENDENTAL = ("relax.sigmoid",)


def sigmoid_float32(values: np.ndarray) -> np.ndarray:
    """The float32 sigmoid of float32 `values`, correctly rounded (float64, then rounded once)."""
    return (1.0 / (1.0 + np.exp(-values.astype(np.float64)))).astype(np.float32)


class _Table:
    """The values a chain takes over the 256 values of one int8 tensor `x`."""

    def __init__(self, x, values: np.ndarray, lut: bool):
        self.x, self.values, self.lut = x, values, lut


@relax.expr_functor.mutator
class _Lookups(relax.PyExprMutator):
    """At each int8 quantize that is a function of one int8 tensor through a sigmoid, emits the
    table lookup."""

    def __init__(self, mod, func):
        super().__init__(mod)
        self.values, self.tables = {}, {}
        for block in func.body.blocks:
            self.values.update({b.var: b.value for b in block.bindings})

    def visit_var_binding_(self, binding):
        call = binding.value
        table = self._table(binding.var) if op_name(call) == "relax.quantize" else None
        if table is None or not table.lut or table.values.dtype != np.int8:
            super().visit_var_binding_(binding)
            return
        index = self.builder_.emit(with_span(relax.op.add(relax.op.astype(self.visit_expr(table.x), "int32"),
                                                          relax.const(128, "int32")), call.span))
        value = with_span(relax.op.take(relax.const(table.values), index, axis=0), call.span)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))

    def _table(self, expr):
        """The _Table of `expr` (a Var bound in this function, or a scalar constant: None x), or
        None where it is not a function of one int8 tensor."""
        if expr not in self.tables:
            self.tables[expr] = self._evaluate(expr)
        return self.tables[expr]

    def _evaluate(self, expr):
        if isinstance(expr, tvm.ir.GenericConst):
            value = expr.value.numpy()
            return _Table(None, value.reshape(()), False) if value.size == 1 else None
        call = self.values.get(expr)
        name = op_name(call)
        if name == "relax.dequantize":
            return self._dequantize(call)
        if name == "relax.clip":
            return self._clip(call)
        operands = [self._table(arg) for arg in call.args] if isinstance(call, relax.Call) else [None]
        if not operands or None in operands:
            return None
        sources = {id(t.x): t.x for t in operands if t.x is not None}
        if len(sources) != 1:
            return None
        x, lut = next(iter(sources.values())), any(t.lut for t in operands) or name in _TRANSCENDENTAL
        values = self._apply(call, name, [t.values for t in operands])
        return None if values is None else _Table(x, values, lut)

    def _dequantize(self, call):
        data, scale, zero = call.args[0], one_value(call.args[1], "float32"), one_value(call.args[2], "int8")
        if scale is None or zero is None or str(call.attrs.out_dtype) != "float32" \
                or str(getattr(data.ty, "dtype", "")) != "int8":
            return None
        inner = self._table(data) if data in self.values else None
        if inner is not None and inner.x is not None and inner.values.dtype == np.int8:
            source, x = inner.values, inner.x  # a function of x already (a quantize inside the chain)
        else:
            source, x, inner = _INPUTS, data, None
        values = (source.astype(np.float32) - np.float32(zero)) * np.float32(scale)
        return _Table(x, values, inner is not None)  # a requantised function of x: two kernels otherwise

    def _clip(self, call):
        """clip(v, lo, hi) of a float32 function of x with constant bounds (a HardSigmoid's), as the
        host computes it: min(max(v, lo), hi) in float32 (no NaN reaches it from 256 int8 values)."""
        inner = self._table(call.args[0])
        bounds = [arg.value if isinstance(arg, (tirx.IntImm, tirx.FloatImm)) else None for arg in call.args[1:3]]
        if inner is None or inner.x is None or inner.values.dtype != np.float32 or None in bounds \
                or not np.float32(bounds[0]) <= np.float32(bounds[1]):
            return None
        lo, hi = (np.float32(b) for b in bounds)
        return _Table(inner.x, np.minimum(np.maximum(inner.values, lo), hi), inner.lut)

    @staticmethod
    def _apply(call, name: str, operands: list):
        """The op of `call` over the operands' values (float32 arithmetic, as the host's), else None."""
        with np.errstate(all="ignore"):
            if name == "relax.quantize":
                values, scale, zero = operands
                if str(call.attrs.out_dtype) != "int8" or values.dtype != np.float32 or scale.ndim or zero.ndim \
                        or scale.dtype != np.float32 or zero.dtype != np.int8:
                    return None
                return np.clip(np.rint(values / scale) + np.float32(zero), -128, 127).astype(np.int8)
            if any(v.dtype != np.float32 for v in operands):
                return None
            if name == "relax.sigmoid":
                return sigmoid_float32(operands[0])
            if name == "relax.nn.relu":
                return np.maximum(operands[0], np.float32(0))
            if name in _BINARY and len(operands) == 2:
                return _BINARY[name](*operands).astype(np.float32)
        return None


def quantized_lookups(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with its int8 functions of one quantized tensor through a sigmoid as table lookups
    (see the module doc)."""
    return rewrite_each(mod, _Lookups)


quantized_lookups_pass = as_pass(quantized_lookups, "cgra.QuantizedLookups", ops=("relax.dequantize",))
