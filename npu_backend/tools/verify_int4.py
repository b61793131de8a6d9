"""`cgra-sim verify --op conv2d --weight-dtype int4`: a conv2d with 4-bit weights against numpy.

Stage: tools (command line; verify.py calls it). In: verify's arguments and the conv2d's sizes.
Out: verify's Case: a one-layer module of normalise/int4_convs.py's host PrimFunc over random
packed weights (which the compiler swaps for kernels/gemm/int4_conv.py's NPU kernel), its input
and numpy's result:
- `--dtype int8`: signed int4 weights (a QDQ model's, zero point 0), an int32 bias (unless
  --no-bias), a per-channel float32 multiplier and an output zero point: the integer sum and
  rne(clamp(float32(acc) * M, -128 - zp, 127 - zp)) + zp, exactly. The padding holds the
  activation's zero point (random: 0 or -128, the halo's values, or another, corrected).
- `--dtype float32`: float32 activations times (u - 8) * s, s one float32 scale per --block-size
  rows of a channel's (KH, KW, C) reduction (0: one per channel), within 1e-5 of the output's
  scale (float32 summation order). No bias, no relu (as MatMulNBits' verify).
"""

from __future__ import annotations

import numpy as np

from cgra_cli.arguments import UsageError


def conv_numpy(x: np.ndarray, weight: np.ndarray, stride, dilation, padding, fill) -> np.ndarray:
    """NCHW x OIHW conv2d in numpy (int64 for integers, float64 for floats): a sum over taps."""
    top, left, bottom, right = padding
    wide = np.int64 if x.dtype.kind == "i" else np.float64
    xp = np.pad(x.astype(wide), ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=fill)
    f, _, kh, kw = weight.shape
    (sh, sw), (dh, dw) = stride, dilation
    oh = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((x.shape[0], f, oh, ow), wide)
    for ry in range(kh):
        for rx in range(kw):
            patch = xp[:, :, ry * dh: ry * dh + sh * (oh - 1) + 1: sh, rx * dw: rx * dw + sw * (ow - 1) + 1: sw]
            out += np.einsum("nchw,fc->nfhw", patch, weight[:, :, ry, rx].astype(wide))
    return out


def conv2d_int4_case(args, shape, stride, pad, dilation, case_type):
    """verify's Case of a conv2d with int4 weights (module doc)."""
    from ..normalise.int4_convs import Int4ConvLayer, function_name, layer_module, pack_conv_weights, tap_major

    n, c, h, w, f, kh, kw = shape
    if args.groups != 1 or args.layout.upper() not in ("NCHW", "NCHW,OIHW"):
        raise UsageError("--weight-dtype int4 conv2d: NCHW data, OIHW weights, --groups 1")
    if args.dtype not in ("int8", "float32") or args.block_size < 0:
        raise UsageError(f"--weight-dtype int4 conv2d takes --dtype int8 or float32 and a --block-size >= 0 "
                         f"(got {args.dtype}, {args.block_size})")
    rng = np.random.default_rng(n * 1000003 + c * 1009 + f * 101 + kh if args.seed is None else args.seed)
    values = rng.integers(-8, 8, (f, c, kh, kw))
    k = c * kh * kw
    if args.dtype == "int8":
        fill = int(rng.choice([0, -128, int(rng.integers(-128, 128))]))  # the halo's values, or a correction
        layer = Int4ConvLayer("int8", n, c, h, w, f, kh, kw, stride, dilation, pad, int(rng.integers(-20, 20)), fill)
        x = rng.integers(-128, 128, (n, c, h, w)).astype(np.int8)
        bias = rng.integers(-2000, 2000, f).astype(np.int32) if not args.no_bias else np.zeros(f, np.int32)
        scale = (rng.uniform(0.5, 2.0, f) / (8 * np.sqrt(k) * 64)).astype(np.float32)
        acc = conv_numpy(x, values, stride, dilation, pad, fill) + bias.reshape(1, -1, 1, 1)
        zp = layer.zero_point
        ref = (np.rint(np.clip(acc.astype(np.float32) * scale.reshape(1, -1, 1, 1), -128 - zp, 127 - zp))
               + zp).astype(np.int8)
        consts = [pack_conv_weights(values, "int8"), bias, scale]
        if layer.corrected:
            from ..normalise.qdq_borders import border_correction

            consts.append(border_correction(values, fill, (c, h, w), pad, stride, dilation, 1)[0])
    else:
        layer = Int4ConvLayer("float32", n, c, h, w, f, kh, kw, stride, dilation, pad, block=args.block_size)
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        scales = (rng.standard_normal((f, layer.groups)) * 0.05).astype(np.float32)
        rows = tap_major(values).astype(np.float32) * scales[:, np.arange(k) // layer.group].T  # (K, F)
        weight = rows.reshape(kh, kw, c, f).transpose(3, 2, 0, 1)
        ref = conv_numpy(x, weight, stride, dilation, pad, 0.0).astype(np.float32)
        consts = [pack_conv_weights(values, "float32"), scales]
    return case_type(layer_module(layer, consts), [x], ref, layer.macs, "call_tir " + function_name(layer),
                     args.dtype == "int8")
