"""The zero-point padding of an int8 conv2d as a DMA halo of -128 and a constant correction.

Stage: normalise (called by qdq.py for a QDQ conv2d that pads an input whose zero point zp is
neither 0 nor -128). QLinearConv pads its input with zp (the real value 0). The conv2d kernel's
DMA fills its halo with 0 or with int8's lowest value, -128 (DMA_FILL_LOWEST, kernels/gemm/
conv2d.py's conv2d(pad(x, -128))), not with zp; so the layer convolves pad(x, -128) and adds

    correction[f, y, x] = (zp + 128) * sum of w[f, c, ry, rx] over the taps (c, ry, rx) of output
                          pixel (y, x) that fall in the padding

an int32 constant of the output's shape, zero inside, which the kernel's epilogue adds as a
residual: sum((pad(x, zp) - zp) * w) = sum((pad(x, -128) - zp) * w) + correction, exactly (int32
wraps alike). Instead of a host pad of the whole image before every such conv.
"""

from __future__ import annotations

import numpy as np


def border_correction(weight: np.ndarray, x_zero_point: int, image: tuple, padding: tuple, strides: tuple,
                      dilation: tuple, groups: int) -> np.ndarray:
    """The int32 correction (1, F, OH, OW) of a conv2d of `weight` (OIHW, int8) over an image of
    `image` = (C, H, W) padded by `padding` = (top, left, bottom, right)."""
    channels, height, width = image
    top, left, bottom, right = padding
    mask = np.ones((channels, height + top + bottom, width + left + right), np.int64)
    mask[:, top:top + height, left:left + width] = 0  # 1 in the padding
    filters, per_group, kh, kw = weight.shape
    (sh, sw), (dh, dw) = strides, dilation
    oh = (mask.shape[1] - dh * (kh - 1) - 1) // sh + 1
    ow = (mask.shape[2] - dw * (kw - 1) - 1) // sw + 1
    outputs_per_group = filters // groups
    out = np.zeros((filters, oh, ow), np.int64)
    for ry in range(kh):
        for rx in range(kw):
            window = mask[:, ry * dh:ry * dh + sh * (oh - 1) + 1:sh, rx * dw:rx * dw + sw * (ow - 1) + 1:sw]
            for group in range(groups):
                taps = window[group * per_group:(group + 1) * per_group]
                rows = slice(group * outputs_per_group, (group + 1) * outputs_per_group)
                out[rows] += np.einsum("chw,fc->fhw", taps, weight[rows, :, ry, rx].astype(np.int64))
    out *= x_zero_point + 128
    return ((out + 2**31) % 2**32 - 2**31).astype(np.int32)[None]
