"""The functional core: what each command does to the scratchpad and the host tensors.

Stage: simulator, step 3 (after validation, independent of timing). In: decoded, validated
commands (decode.py) and the scratchpad, a numpy uint8 array of `arch.spad_bytes`. Out: the
scratchpad and the host tensors, updated in place (DMA_STORE writes into the caller's arrays).
Every command is a few vectorised numpy operations on strided views; nothing loops per element.

Semantics (isa.py): DMA_LOAD copies the box from the tensor and writes 0 where it lies in the
halo (with DMA_FILL_LOWEST the dtype's lowest value, -inf for float32); DMA_STORE copies the box to the tensor and drops halo elements. GEMM computes
acc = (acc if ACCUMULATE else 0) + A @ B; for int8 the products and sums are exact (computed in
float64, exact while |sum| < 2**53, i.e. for any k < 2**39) and the int32 accumulator wraps
modulo 2**32 like two's-complement hardware; float32 uses numpy's float32 matmul. DEPTHWISE
computes acc = (acc if ACCUMULATE else 0) + the sum over taps of window * weight: int8 exactly in
int64, then wrapped; float32 one tap at a time in float32, ry-major, the order in which the
intrinsic's TIR description adds them. FILL writes a constant. EPILOGUE computes
out = acc (+ bias[j]) (+ residual[i, j]), then max(., 0) if RELU, then min(max(., lo), hi) if
CLIP; int32 sums wrap modulo 2**32, float32 ones round after each add. POOL takes, per tap in
ry-major order, the window element if the tap is valid, else the lowest value of the dtype
(-inf for float32) for max and 0 for the sum: max is exact in any order; the float32 sum adds
left to right from the first tap, as the intrinsic's TIR description does, then divides by the
float32 count.
CLIP; int32 sums wrap modulo 2**32, float32 ones round after each add. With REQUANTISE the int32
x becomes int8 as onnxruntime's QLinearConv / QGemm requantise (MlasRequantizeOutput): f =
float32(x) * scale[j] (int32 -> float32 and the product each rounded to nearest even), clamped
to [-128 - zp, 127 - zp] (a NaN becomes the lower bound, as SSE's max does), rounded half to
even, + zp; from a float32 accumulator the same with x / scale[j] (onnxruntime's QuantizeLinear);
with DEQUANTISE the int8 result q becomes float32(q - zp) * dscale[j] (DequantizeLinear).
ELTWISE computes out = func(a, b) with numpy's elementwise function in the operands'
dtype: integer results wrap (int8 modulo 2**8, int32 modulo 2**32), float32 ones round once;
maximum and minimum propagate NaN. REDUCE folds each row into its output element column by
column, left to right, rounding every step to float32 (SUM_SQUARES rounds the square, then the
sum); MAX propagates NaN. VFUNC computes t = a (* scale) (+ offset), each rounded, then the
function's specified float32 sequence (special.py); with a 16-bit dtype A is widened exactly
(unless VFUNC_FLOAT32_IN) and the result rounded to nearest even (held widened back with
VFUNC_FLOAT32_OUT). UNPACK4 writes float32(q - z) * s per
nibble (unpack4.py). LOOKUP writes table[a + 128] per int8 element (lookup.py). FABRIC evaluates its body node by node over the whole tile
(mapping/body.evaluate) with the same arithmetic.
bfloat16 and float16 (GEMM and DEPTHWISE inputs) are widened exactly to float32 and computed as
float32 is (a product of two is exact in float32); an EPILOGUE with a 16-bit float output adds its
bias and residual, held in that format, widened, and rounds the result to nearest even on store
(half_floats.py).
int16 (a GEMM's A, its B int8) accumulates in int64 exactly, and an EPILOGUE from an int64
accumulator requantises to int16 through float64 (int16.py); int64 sums wrap modulo 2**64.
Each command reads all its operands before it writes, so an in-place EPILOGUE is well defined.
"""

from __future__ import annotations

import numpy as np

from .int16 import gemm16x8, requantise16
from .lookup import execute_lookup
from .unpack4 import execute_unpack4

from .commands import (Command, DepthwiseCommand, DmaCommand, EltwiseCommand, EpilogueCommand, FabricCommand,
                       FillCommand, GemmCommand, PoolCommand, ReduceCommand, VfuncCommand)
from .isa import HALF_FLOATS, DType, EltwiseFunc, Op, ReduceFunc
from .mapping import body
from . import half_floats, special


def execute(commands: list[Command], spad: np.ndarray) -> None:
    """Runs `commands` in stream order on `spad` and the host tensors they name."""
    for cmd in commands:
        _EXECUTORS[cmd.op](cmd, spad)


def _halo_coordinates(cmd: DmaCommand) -> tuple[list[np.ndarray], np.ndarray]:
    """Per tensor dimension, the coordinate of every box point; and where they are in bounds."""
    box, shape = cmd.box, cmd.tensor.shape
    coords = [np.broadcast_to(box.coordinates(dim), box.extents) for dim in range(len(shape))]
    return coords, box.inbounds_mask(shape)


def _dma_load(cmd: DmaCommand, spad: np.ndarray) -> None:
    dst = cmd.region.view(spad)
    if cmd.halo_free:
        dst[...] = cmd.host_view
        return
    if cmd.host_points == 0:
        dst[...] = cmd.fill
        return
    if cmd.inner is not None:  # the usual halo: the fill, then the in-bounds sub-box in one copy
        dst[...] = cmd.fill
        dst[cmd.inner] = cmd.host_view
        return
    coords, inside = _halo_coordinates(cmd)
    clipped = tuple(np.clip(c, 0, size - 1) for c, size in zip(coords, cmd.tensor.shape))
    dst[...] = np.where(inside, cmd.tensor[clipped], cmd.fill)


def _dma_store(cmd: DmaCommand, spad: np.ndarray) -> None:
    src = cmd.region.view(spad)
    if cmd.halo_free:
        cmd.host_view[...] = src
        return
    if cmd.host_points == 0:
        return
    if cmd.inner is not None:
        cmd.host_view[...] = src[cmd.inner]
        return
    coords, inside = _halo_coordinates(cmd)
    cmd.tensor[tuple(c[inside] for c in coords)] = src[inside]


def _gemm(cmd: GemmCommand, spad: np.ndarray) -> None:
    a, b, acc = cmd.a.view(spad), cmd.b.view(spad), cmd.acc.view(spad)
    if cmd.dtype is DType.INT8:
        product = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.int64)
        if cmd.accumulate:
            product += acc
        acc[...] = product.astype(np.int32)  # int64 -> int32 keeps the low 32 bits
    elif cmd.dtype is DType.INT16:  # int16 x int8 into int64 (int16.py)
        product = gemm16x8(a, b)
        acc[...] = product + acc if cmd.accumulate else product
    else:  # float32, or 16-bit floats widened exactly (their products are exact in float32)
        product = np.matmul(_as_float32(a, cmd.dtype), _as_float32(b, cmd.dtype), dtype=np.float32)
        if cmd.accumulate:
            product += acc
        acc[...] = product


def _depthwise(cmd: DepthwiseCommand, spad: np.ndarray) -> None:
    window, b, acc = cmd.a.view(spad), cmd.b.view(spad), cmd.acc.view(spad)
    if cmd.dtype is DType.INT8:
        total = np.einsum("yxuvc,uvc->yxc", window.astype(np.int64), b.astype(np.int64))
        if cmd.accumulate:
            total += acc
        acc[...] = total.astype(np.int32)  # int64 -> int32 keeps the low 32 bits
        return
    total = acc.copy() if cmd.accumulate else np.zeros(acc.shape, np.float32)
    window, b = _as_float32(window, cmd.dtype), _as_float32(b, cmd.dtype)
    for ry in range(cmd.kh):
        for rx in range(cmd.kw):
            total += window[:, :, ry, rx, :] * b[ry, rx]
    acc[...] = total


def _as_float32(values: np.ndarray, dtype: DType) -> np.ndarray:
    """A float PE-array operand as float32: a 16-bit float's widened exactly, float32's as it is."""
    return half_floats.widen(values, dtype.numpy_name) if dtype in HALF_FLOATS else values


def _pool(cmd: PoolCommand, spad: np.ndarray) -> None:
    window, out = cmd.a.view(spad), cmd.out.view(spad)
    if not cmd.average:
        lowest = -np.inf if cmd.dtype is DType.FLOAT32 else np.iinfo(window.dtype).min
        out[...] = np.where(cmd.valid, window, window.dtype.type(lowest)).max(axis=(2, 3))
        return
    terms = np.where(cmd.valid, window, np.float32(0))
    total = terms[:, :, 0, 0].copy()
    for ry in range(cmd.kh):
        for rx in range(cmd.kw):
            if ry or rx:
                total += terms[:, :, ry, rx]
    out[...] = total / cmd.count


def _fill(cmd: FillCommand, spad: np.ndarray) -> None:
    cmd.region.view(spad)[...] = cmd.value


def _epilogue(cmd: EpilogueCommand, spad: np.ndarray) -> None:
    values = cmd.acc.view(spad)
    if cmd.widen is not None:  # a 16-bit float widened exactly to float32 (a cast; no other step)
        cmd.out.view(spad)[...] = _as_float32(values, cmd.widen)
        return
    half = cmd.half
    if cmd.bias is not None:  # a 16-bit float output's bias and residual are in its dtype, widened
        bias = cmd.bias.view(spad)
        values = values + (_as_float32(bias, half) if half else bias)  # (1, n) broadcasts over the rows
    if cmd.residual is not None:
        residual = cmd.residual.view(spad)
        values = values + (_as_float32(residual, half) if half else residual)  # int32 adds wrap, like the hardware
    if cmd.relu:
        values = np.maximum(values, values.dtype.type(0))
    if cmd.clip is not None:
        values = np.minimum(np.maximum(values, cmd.clip[0]), cmd.clip[1])
    if cmd.scale is not None:
        requant = requantise16 if cmd.out.dtype == np.int16 else quantise if values.dtype == np.float32 \
            else requantise
        scale = cmd.scale.view(spad)
        if cmd.dequantise:  # (multiplier, dequantisation scale) pairs
            values = dequantise(requant(values, scale[:, 0::2], cmd.zero_point), scale[:, 1::2], cmd.zero_point)
        else:
            values = requant(values, scale, cmd.zero_point)
    if half:
        values = half_floats.narrow(values, half.numpy_name)  # rounded to nearest even on store
    cmd.out.view(spad)[...] = values


#: ELTWISE func -> the numpy function (on arrays of one integer dtype numpy wraps, as the lanes do).
ELTWISE_FUNCS = {
    EltwiseFunc.ADD: np.add,
    EltwiseFunc.SUBTRACT: np.subtract,
    EltwiseFunc.MULTIPLY: np.multiply,
    EltwiseFunc.MAXIMUM: np.maximum,
    EltwiseFunc.MINIMUM: np.minimum,
}


def _eltwise(cmd: EltwiseCommand, spad: np.ndarray) -> None:
    a, b = cmd.a.view(spad), cmd.b.view(spad)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN on the lanes too, silently
        if cmd.dtype in HALF_FLOATS:  # widened, computed in float32, rounded to nearest even
            name = cmd.dtype.numpy_name
            value = ELTWISE_FUNCS[cmd.func](_as_float32(a, cmd.dtype), _as_float32(b, cmd.dtype), dtype=np.float32)
            cmd.out.view(spad)[...] = half_floats.narrow(value, name)
            return
        cmd.out.view(spad)[...] = ELTWISE_FUNCS[cmd.func](a, b, dtype=a.dtype)


def _reduce(cmd: ReduceCommand, spad: np.ndarray) -> None:
    a, out = cmd.a.view(spad), cmd.out.view(spad)
    total = out[:, 0].copy()
    with np.errstate(invalid="ignore", over="ignore"):
        for j in range(a.shape[1]):  # one column a step: every row's fold rounds as the lanes do
            column = a[:, j]
            if cmd.func is ReduceFunc.MAX:
                total = np.maximum(total, column)
            else:
                total = total + (column * column if cmd.func is ReduceFunc.SUM_SQUARES else column)
    out[:, 0] = total


def _vfunc(cmd: VfuncCommand, spad: np.ndarray) -> None:
    t = cmd.a.view(spad)
    if cmd.dtype in HALF_FLOATS and t.dtype != np.float32:  # a 16-bit A, widened exactly
        t = half_floats.widen(t, cmd.dtype.numpy_name)
    with np.errstate(all="ignore"):
        if cmd.scale is not None:
            t = t * cmd.scale
        if cmd.offset is not None:
            t = t + cmd.offset
    value = special.FUNCTIONS[cmd.func.name.lower()](t)
    if cmd.dtype in HALF_FLOATS:  # rounded to nearest even; a float32 out holds it widened back
        value = half_floats.narrow(value, cmd.dtype.numpy_name)
        if cmd.out.dtype == np.float32:
            value = half_floats.widen(value, cmd.dtype.numpy_name)
    cmd.out.view(spad)[...] = value


def _fabric(cmd: FabricCommand, spad: np.ndarray) -> None:
    b = cmd.b.view(spad) if cmd.b is not None else None
    if not cmd.int8:
        cmd.out.view(spad)[...] = body.evaluate(cmd.body, cmd.dtype.numpy_name, cmd.a.view(spad), b)
        return
    # FABRIC_INT8: int8 operands read as the body's dtype (exactly), its output rounded half to
    # even and saturated to int8.
    dtype = cmd.dtype.numpy_name
    value = body.evaluate(cmd.body, dtype, cmd.a.view(spad).astype(dtype), None if b is None else b.astype(dtype))
    cmd.out.view(spad)[...] = np.clip(np.rint(value), -128, 127).astype(np.int8)


def requantise(acc: np.ndarray, scale: np.ndarray, zero_point: int) -> np.ndarray:
    """int32 `acc` (m, n) -> int8 with float32 `scale` (1, n) or (n,) and an int8 zero point:
    rne(clamp(float32(acc) * scale, -128 - zp, 127 - zp)) + zp. The clamp comes first so that
    no value leaves the int32 range before rounding; with integer bounds that order cannot
    change a result. fmax / fmin send a NaN product to the lower bound."""
    product = acc.astype(np.float32) * scale.astype(np.float32, copy=False)
    lo, hi = np.float32(-128 - zero_point), np.float32(127 - zero_point)
    clamped = np.fmin(np.fmax(product, lo), hi)
    return (np.rint(clamped) + np.float32(zero_point)).astype(np.int8)


def quantise(x: np.ndarray, scale: np.ndarray, zero_point: int) -> np.ndarray:
    """float32 `x` (m, n) -> int8 with float32 `scale` (1, n) or (n,) and an int8 zero point, as
    onnxruntime's QuantizeLinear (MlasQuantizeLinear): rne(clamp(x / scale, -128 - zp, 127 - zp)) + zp,
    the quotient correctly rounded to float32 (x * (1 / scale) is not: it differs where x / scale
    lies within an ulp of a half step). fmax / fmin send a NaN quotient to the lower bound, as
    SSE's max does in onnxruntime's vector loop."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        quotient = x.astype(np.float32, copy=False) / scale.astype(np.float32, copy=False)
    lo, hi = np.float32(-128 - zero_point), np.float32(127 - zero_point)
    clamped = np.fmin(np.fmax(quotient, lo), hi)
    return (np.rint(clamped) + np.float32(zero_point)).astype(np.int8)


def dequantise(q: np.ndarray, scale: np.ndarray, zero_point: int) -> np.ndarray:
    """int8 `q` (m, n) -> float32 with float32 `scale` (1, n) and the int8 zero point, as
    onnxruntime's DequantizeLinear: float32(int32(q) - zp) * scale, the difference exact (it fits
    9 bits) and the product rounded once."""
    difference = q.astype(np.int32) - np.int32(zero_point)
    return difference.astype(np.float32) * scale.astype(np.float32, copy=False)


_EXECUTORS = {
    Op.DMA_LOAD: _dma_load,
    Op.DMA_STORE: _dma_store,
    Op.GEMM: _gemm,
    Op.FILL: _fill,
    Op.EPILOGUE: _epilogue,
    Op.DEPTHWISE: _depthwise,
    Op.POOL: _pool,
    Op.ELTWISE: _eltwise,
    Op.FABRIC: _fabric,
    Op.REDUCE: _reduce,
    Op.VFUNC: _vfunc,
    Op.UNPACK4: execute_unpack4,
    Op.LOOKUP: execute_lookup,
}
