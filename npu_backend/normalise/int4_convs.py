"""conv2d layers with 4-bit weights: the weights packed two per byte in DRAM, a host reference.

Stage: normalise (qdq.py calls `emit_int4_conv` while it rewrites a QDQ conv into integers;
`cgra-sim verify --op conv2d --weight-dtype int4` builds its layers here too). In: one conv2d
layer (NCHW data, OIHW weights, groups 1, any stride, padding, dilation) whose weights fit signed
int4. Out: a call_tir of the layer's host PrimFunc (`host_prim_func`: plain TensorIR, what any
target builds) over the packed weights, marked LAYER_ATTR, which normalise/int4_weights.py swaps
for the NPU kernel (kernels/gemm/int4_conv.py: per tile of output channels, DMA half a byte a
weight, UNPACK4 into the scratchpad, a GEMM per kernel tap).

Two arithmetics, as the int4 matmuls have:
- "int8" (QDQ, int8 activations x int4 weights, zero point 0): acc = sum int32(x) * w + B[f] in
  int32, Y = rne(clamp(float32(acc) * M[f], -128 - zp, 127 - zp)) + zp (qdq.py's; the padding
  holds `fill`, the activation's zero point. The DMA halo holds 0 or -128: for another zero point
  it holds -128 and an int32 correction R (F, OH, OW), (fill + 128) times the padded taps' weight
  sums (qdq_borders.border_correction), is added to acc, as qdq.py does for the int8 kernels).
- "float32" (weight-only: float32 activations): W = float32(u - 8) * S[f, r // block], u the
  unsigned nibble (the signed value + 8, MatMulNBits' default zero point), Y the float32 sum;
  `block` rows of a channel's reduction per scale (>= K: one scale per output channel).

Each output channel's K = KH * KW * C weights are packed in tap-major order, r = (ry * KW + rx) * C
+ c, row 2b in byte b's low nibble (pack_signed's layout), ceil(K / 2) bytes a channel: a tap's C
rows are consecutive in the unpacked (K, nt) tile, the B operand of that tap's GEMM. With K odd a
channel's last byte holds one nibble; with C odd a byte's two nibbles belong to two taps.

Why in a module of its own: qdq.py is the int8 QDQ path (near its size limit) and qdq_int4.py the
matmul's; this is the conv's 4-bit storage on top of the same rewrite.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from tvm import relax, te, tirx

from cgra_sim.unpack4 import pack_signed

from ..frontend.provenance import with_span
from ..relax_info import shape_dims
from .qdq_borders import border_correction
from .qdq_int4 import fits_int4

#: The PrimFunc attribute naming an int4 conv2d layer: `Int4ConvLayer.words()`.
LAYER_ATTR = "cgra.int4_conv"
MODES = ("int8", "float32")


@dataclasses.dataclass(frozen=True)
class Int4ConvLayer:
    """One conv2d's sizes (NCHW / OIHW, groups 1) and its arithmetic (module doc)."""

    mode: str  # "int8" or "float32"
    n: int
    c: int
    h: int
    w: int
    f: int
    kh: int
    kw: int
    stride: tuple = (1, 1)
    dilation: tuple = (1, 1)
    padding: tuple = (0, 0, 0, 0)  # top, left, bottom, right
    zero_point: int = 0  # int8: the output's
    fill: int = 0  # int8: the padding's value (the activation's zero point)
    block: int = 0  # float32: reduction rows per scale (0: the whole K, one scale a channel)

    @property
    def oh(self) -> int:
        top, _, bottom, _ = self.padding
        return (self.h + top + bottom - self.dilation[0] * (self.kh - 1) - 1) // self.stride[0] + 1

    @property
    def ow(self) -> int:
        _, left, _, right = self.padding
        return (self.w + left + right - self.dilation[1] * (self.kw - 1) - 1) // self.stride[1] + 1

    @property
    def corrected(self) -> bool:
        """An int8 layer padded with a zero point the halo cannot hold: -128 and a correction R."""
        return self.mode == "int8" and any(self.padding) and self.fill not in (0, -128)

    @property
    def halo(self) -> int:
        """The value the kernel's DMA halo (and the host PrimFunc's padding) holds."""
        return 0 if self.mode != "int8" else -128 if self.corrected else self.fill

    @property
    def k(self) -> int:
        return self.kh * self.kw * self.c

    @property
    def packed_bytes(self) -> int:
        """Bytes of one output channel's packed weights."""
        return -(-self.k // 2)

    @property
    def group(self) -> int:
        """Reduction rows per scale (float32)."""
        return self.k if self.block <= 0 or self.block >= self.k else self.block

    @property
    def groups(self) -> int:
        return -(-self.k // self.group)

    @property
    def macs(self) -> int:
        return self.n * self.f * self.oh * self.ow * self.k

    def words(self) -> list[int]:
        return [MODES.index(self.mode), self.n, self.c, self.h, self.w, self.f, self.kh, self.kw, *self.stride,
                *self.dilation, *self.padding, self.zero_point, self.fill, self.block]

    @staticmethod
    def from_words(words) -> "Int4ConvLayer":
        v = [int(x) for x in words]
        return Int4ConvLayer(MODES[v[0]], *v[1:8], tuple(v[8:10]), tuple(v[10:12]), tuple(v[12:16]), *v[16:19])


def tap_major(weight: np.ndarray) -> np.ndarray:
    """(F, C, KH, KW) OIHW values -> the (K, F) reduction rows in tap-major order (module doc)."""
    f = weight.shape[0]
    return np.ascontiguousarray(np.asarray(weight).transpose(2, 3, 1, 0).reshape(-1, f))


def pack_conv_weights(weight: np.ndarray, mode: str) -> np.ndarray:
    """(F, C, KH, KW) signed int4 values -> (F, ceil(K / 2)) packed bytes (int8 bits): signed
    nibbles for "int8", offset by 8 (unsigned, zero point 8) for "float32"."""
    rows = tap_major(weight).astype(np.int64)
    return pack_signed(rows if mode == "int8" else rows + 8)  # pack_signed keeps the low 4 bits


def host_prim_func(layer: Int4ConvLayer) -> tirx.PrimFunc:
    """The layer as plain host TensorIR over the packed tensors, marked LAYER_ATTR: int8
    (X, Q, B, M[, R]) -> Y, float32 (X, Q, S) -> Y (module doc)."""
    dtype = layer.mode
    x = te.placeholder((layer.n, layer.c, layer.h, layer.w), dtype, "X")
    q = te.placeholder((layer.f, layer.packed_bytes), "int8", "Q")
    (sh, sw), (dh, dw), (top, left, _, _) = layer.stride, layer.dilation, layer.padding
    fill = tirx.const(layer.halo, dtype)

    def nibble(f, r):
        byte = q[f, r // 2].astype("int32")
        return (byte << (28 - (r % 2) * 4)) >> 28  # sign-extended

    def data(b, c, y, x_):
        inside = tirx.all(y >= 0, y < layer.h, x_ >= 0, x_ < layer.w)
        return tirx.if_then_else(inside, x[b, c, y, x_], fill)

    ry, rx = te.reduce_axis((0, layer.kh), "ry"), te.reduce_axis((0, layer.kw), "rx")
    rc = te.reduce_axis((0, layer.c), "rc")
    shape = (layer.n, layer.f, layer.oh, layer.ow)
    if dtype == "int8":
        b = te.placeholder((layer.f,), "int32", "B")
        m = te.placeholder((layer.f,), "float32", "M")
        acc = te.compute(shape, lambda n, f, y, x_: te.sum(
            data(n, rc, y * sh + ry * dh - top, x_ * sw + rx * dw - left).astype("int32")
            * nibble(f, (ry * layer.kw + rx) * layer.c + rc), axis=[ry, rx, rc]), "Acc")
        zp = layer.zero_point
        r = te.placeholder((layer.f, layer.oh, layer.ow), "int32", "R") if layer.corrected else None

        def requantise(n, f, y, x_):
            total = acc[n, f, y, x_] + b[f] + (r[f, y, x_] if r is not None else 0)
            scaled = total.astype("float32") * m[f]
            clamped = tirx.max(tirx.min(scaled, tirx.const(127 - zp, "float32")), tirx.const(-128 - zp, "float32"))
            return (tirx.nearbyint(clamped).astype("int32") + zp).astype("int8")

        out = te.compute(shape, requantise, "Y")
        params = [x, q, b, m] + ([r] if r is not None else []) + [out]
    else:
        s = te.placeholder((layer.f, layer.groups), "float32", "S")

        def weight(f, r):
            u = (nibble(f, r) + 16) % 16  # the unsigned nibble
            return (u - 8).astype("float32") * s[f, r // layer.group]

        out = te.compute(shape, lambda n, f, y, x_: te.sum(
            data(n, rc, y * sh + ry * dh - top, x_ * sw + rx * dw - left)
            * weight(f, (ry * layer.kw + rx) * layer.c + rc), axis=[ry, rx, rc]), "Y")
        params = [x, q, s, out]
    return te.create_prim_func(params).with_attr(LAYER_ATTR, layer.words())


def layer_module(layer: Int4ConvLayer, consts: list, span=None):
    """main(x) = call_tir(host_prim_func(layer), [x, *consts]): a one-layer module (verify's)."""
    bb = relax.BlockBuilder()
    var = relax.Var("x", relax.TensorType((layer.n, layer.c, layer.h, layer.w), layer.mode))
    with bb.function("main", [var]):
        with bb.dataflow():
            out = bb.emit_output(call_layer(bb, layer, var, consts, span))
        bb.emit_func_output(out)
    return bb.get()


def function_name(layer: Int4ConvLayer) -> str:
    """The host PrimFunc's name: profiles and explain show the kernel as `call_tir <name>`."""
    return "qdq_int4_conv2d" if layer.mode == "int8" else "int4_conv2d"


def call_layer(builder, layer: Int4ConvLayer, data, consts: list, span=None):
    """The call_tir of `layer`'s host PrimFunc (added to `builder`) on `data` and `consts`."""
    gvar = builder.add_func(host_prim_func(layer), function_name(layer))
    call = relax.call_tir(gvar, [data] + [relax.const(c) for c in consts],
                          relax.TensorType((layer.n, layer.f, layer.oh, layer.ow), layer.mode))
    return with_span(call, span) if span is not None else call


def emit_int4_conv(builder, data, layer, multiplier: np.ndarray, y_zero_point: int, span):
    """The int8 result of a QDQ conv2d `layer` (qdq._Layer; `data` its int8 NCHW activation,
    emitted) from packed weights, or None where they do not fit 4 bits, a channel has one weight
    (packing saves nothing), the groups are not 1 or the image is not static."""
    if layer.op not in ("conv2d", "conv1d"):
        return None
    dims, attrs = shape_dims(data), layer.conv.attrs
    relu_is_clamp = not layer.relu or (y_zero_point == -128 and bool(np.all(multiplier > 0)))
    # One weight a channel (a 1x1 conv of one channel) packs into as many bytes as it has weights.
    if not relu_is_clamp or not fits_int4(layer.weight) or layer.weight[0].size < 2 or int(attrs.groups) != 1 \
            or dims is None or not all(isinstance(d, int) for d in dims):
        return None
    strides, padding, dilation = ([int(v) for v in attrs.strides], [int(p) for p in attrs.padding],
                                  [int(d) for d in attrs.dilation])
    if layer.op == "conv1d":  # one pixel high: (left, right) -> (0, left, 0, right)
        strides, padding, dilation = [1] + strides, [0, padding[0], 0, padding[1]], [1] + dilation
    padding = padding * 2 if len(padding) == 2 else padding
    f, c, kh, kw = layer.weight.shape
    conv = Int4ConvLayer("int8", dims[0], c, dims[2], dims[3], f, kh, kw, tuple(strides), tuple(dilation),
                         tuple(padding), int(y_zero_point), int(layer.x_zero_point))
    # sum((x - xzp) * w) + b = sum(x * w) + (b - xzp * sum(w)): the padding holds xzp, so it adds 0.
    bias = (0 if layer.bias is None else layer.bias.astype(np.int64)) \
        - layer.x_zero_point * layer.weight.astype(np.int64).sum(axis=(1, 2, 3))
    bias = ((bias + 2**31) % 2**32 - 2**31).astype(np.int32)
    consts = [pack_conv_weights(layer.weight, "int8"), np.broadcast_to(bias, (f,)).copy(),
              np.broadcast_to(multiplier.astype(np.float32).reshape(-1), (f,)).copy()]
    if conv.corrected:  # the padding's taps, held as -128 by the halo, corrected to the zero point
        consts.append(border_correction(layer.weight, conv.fill, (c, dims[2], dims[3]), conv.padding, conv.stride,
                                        conv.dilation, 1)[0])
    return call_layer(builder, conv, data, consts, span)
