"""Concats, splits, reshapes (a flatten) and max pools between int16 quantized tensors on the int16
tensors themselves: qlayouts.py's rewrite for the 16x8 mode's activations (qdq16.py).

Stage: normalise (beside qlayouts.py). In: a Relax IRModule. Out: the same module in which every
quantize(op(dequantize(x, s, z)), s', z') of int16 tensors with per-tensor scales and zero
points, op a reshape, strided_slice, split item, max pool or concat, is op on the int16 tensors
(requantised where (s, z) differs from (s', z')). Exact for the same reasons as for int8:
quantize(dequantize(x, s, z), s, z) is x for every int16 x (|x - z| < 2^16, so the float32
product's relative error 2^-24 moves it by far less than half a step), the requantisation is
elementwise and monotone, and a max pool's padding is int16's lowest value. So the result equals
onnxruntime's float path bit for bit.

Why: an int16 QDQ CNN's flatten and max pool were a dequantize, a float32 op and a quantize each
(three host calls, the float tensor twice the bytes); now one int16 op.
"""

from __future__ import annotations

import tvm

from .qlayouts import _QuantizedLayouts
from .rewrite import rewrite_each


def quantized_layouts16(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with its layout ops and max pools between int16 quantized tensors on int16."""
    return rewrite_each(mod, lambda module, func: _QuantizedLayouts(module, func, "int16"))


quantized_layouts16_pass = tvm.transform.module_pass(lambda m, _ctx: quantized_layouts16(m), opt_level=0,
                                                     name="cgra.QuantizedLayouts16")
