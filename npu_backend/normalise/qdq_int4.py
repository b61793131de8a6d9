"""QDQ matmuls whose int8 weights fit 4 bits: the weights packed two per byte in DRAM.

Stage: normalise (called by qdq.py while it rewrites a QDQ matmul into integers). In: one QDQ
matmul layer read off the graph (qdq._Layer: int8 activation, (K, N) int8 weights with zero point
0, int32 bias, per-channel multiplier, output zero point). Out: where every weight lies in
[-8, 7] and the activation's shape is static (onnxruntime's `quantize_static(..., weight_type=QuantType.QInt4)` writes its INT4
initializers so; the importer reads them as int8 values), a call_tir of the layer's host PrimFunc
(`host_prim_func`, below: the reference any target builds) over the packed weights (cgra_sim.unpack4.pack_signed), which
normalise/int4_weights.py then swaps for the NPU kernel (UNPACK4_INT8, int8 GEMM, requantising
EPILOGUE): the weights cross DRAM at half a byte each. Elsewhere None, and qdq.py emits the
int8 x int8 chain as before.

The arithmetic is qdq.py's, unchanged: acc = x @ W + (b - xzp * sum(W)) in int32 (wrapping as
onnxruntime's does), y = rne(clamp(float32(acc) * M, -128 - yzp, 127 - yzp)) + yzp.

Why in a module of its own: qdq.py is the int8 QDQ path (another owner, near its size limit);
this is the 4-bit storage choice on top of it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from tvm import relax, te, tirx

from cgra_sim.unpack4 import pack_signed

from ..frontend.provenance import with_span
from ..relax_info import shape_dims


def fits_int4(weight: np.ndarray) -> bool:
    """Every value of the int8 weight lies in signed int4's range."""
    return weight.size > 0 and int(weight.min()) >= -8 and int(weight.max()) <= 7


def emit_int4_matmul(builder, data, layer, multiplier: np.ndarray, y_zero_point: int, span):
    """The int8 result of `layer` (a QDQ matmul; `data` its emitted int8 activation)
    from packed weights, emitted with `builder`, or None where the weights do not fit 4 bits or
    the activation's shape is not static. `multiplier` float32 (N,), qdq.py's M."""
    dims = shape_dims(data)
    # A relu before the requantisation is its clamp when y_zero_point is -128 (qdq.py takes a relu
    # only then) and every multiplier is positive: a negative sum gives -128 either way.
    relu_is_clamp = not layer.relu or (y_zero_point == -128 and bool(np.all(multiplier > 0)))
    if layer.op != "matmul" or not relu_is_clamp or not fits_int4(layer.weight) or dims is None \
            or not all(isinstance(d, int) for d in dims):
        return None
    k, n = layer.weight.shape
    m = int(np.prod(dims[:-1]))
    func = host_prim_func(QInt4Layer(m, k, n, int(y_zero_point)))
    gvar = builder.add_func(func, "qdq_int4_matmul")
    rows = data if len(dims) == 2 else builder.emit(relax.op.reshape(data, (m, k)))
    # sum((x - xzp) * w) + b = sum(x * w) + (b - xzp * sum(w)); int32 wraps as onnxruntime's does.
    bias = (0 if layer.bias is None else layer.bias.astype(np.int64)) \
        - layer.x_zero_point * layer.weight.astype(np.int64).sum(axis=0)
    bias = ((bias + 2**31) % 2**32 - 2**31).astype(np.int32)
    consts = [pack_signed(layer.weight), bias, np.broadcast_to(multiplier.astype(np.float32).reshape(-1), (n,)).copy()]
    call = relax.call_tir(gvar, [rows] + [relax.const(c) for c in consts], relax.TensorType((m, n), "int8"))
    call = with_span(call, span) if span is not None else call
    if len(dims) == 2:
        return call  # unemitted, as qdq.py returns its quantize: the caller binds it
    return relax.op.reshape(builder.emit(call), tuple(dims[:-1]) + (n,))


def added_functions(builder, mod) -> dict:
    """The PrimFuncs `builder` added (emit_int4_matmul's) that `mod` lacks, by GlobalVar."""
    known = {gvar.name_hint for gvar in mod.functions}
    return {gvar: func for gvar, func in builder.get().functions.items() if gvar.name_hint not in known
            and not isinstance(func, relax.Function)}


#: The PrimFunc attribute naming an int8 x int4 layer: [m, k, n, output zero point].
LAYER_ATTR = "cgra.qdq_int4"


@dataclasses.dataclass(frozen=True)
class QInt4Layer:
    """One int8 x int4 layer's sizes and output zero point."""

    m: int
    k: int
    n: int
    zero_point: int

    @property
    def packed_bytes(self) -> int:
        """Bytes of one output column's packed weights."""
        return -(-self.k // 2)


def host_prim_func(layer: QInt4Layer) -> tirx.PrimFunc:
    """The layer as plain host TensorIR, from the packed tensors (X, Q, B, M) -> Y, marked
    LAYER_ATTR: the signed nibble, the int32 sum, then the requantisation rounded half to even."""
    m, k, n, zp = layer.m, layer.k, layer.n, layer.zero_point
    x = te.placeholder((m, k), "int8", "X")
    q = te.placeholder((n, layer.packed_bytes), "int8", "Q")
    b = te.placeholder((n,), "int32", "B")
    s = te.placeholder((n,), "float32", "M")

    def weight(r, j):
        byte = q[j, r // 2].astype("int32")
        return ((byte << (28 - (r % 2) * 4)) >> 28)  # the nibble, sign-extended

    w = te.compute((k, n), weight, "W")
    r = te.reduce_axis((0, k), "r")
    acc = te.compute((m, n), lambda i, j: te.sum(x[i, r].astype("int32") * w[r, j], axis=r), "Acc")

    def requantise(i, j):
        scaled = (acc[i, j] + b[j]).astype("float32") * s[j]
        clamped = tirx.max(tirx.min(scaled, tirx.const(127 - zp, "float32")), tirx.const(-128 - zp, "float32"))
        return (tirx.nearbyint(clamped).astype("int32") + zp).astype("int8")

    y = te.compute((m, n), requantise, "Y")
    return te.create_prim_func([x, q, b, s, y]).with_attr(LAYER_ATTR, [m, k, n, zp])
