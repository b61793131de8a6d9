"""A conv2d over non-overlapping patches as a GEMM whose depth is a whole kernel row.

Stage: kernel definition (conv2d_compute's form for KernelSpec.patch_channels: kernel == stride,
no padding, dilation 1, no groups, NCHW / OIHW, static shapes); tiling and schedule are the
GEMM's (gemm.py). conv2d_compute reduces over (ry, rx) taps, one GEMM of depth C per tap: a
ViT's patch embedding (C = 3, a 16 x 16 kernel) ran 256 GEMMs of depth 3, each paying the
command's fill and drain for 3 steps of work (26.4 k cycles at 64 x 64 px on cgra-8x8, 2.1x its
MACs over the PEs). Here the depth of one GEMM is a kernel row's (column, channel) pairs,
k = rx * C + c: kh GEMMs of depth kw * C. The gather stays one DMA box per tile: its loops walk
the output rows and columns (steps of the kernel's height and width), the kernel columns and
the channels (the schedule splits k by C, so the box reads x[c, y * kh + ry, ox * kw + rx]); the
weights' box reads w[f, c, ry, rx] the same way. Depth chunks are multiples of C dividing kw * C
(gemm._k_candidates' step), so no chunk reaches past a patch. The output is NCHW, or NHWC: each
GEMM row (a patch) stored as a row of channels, the tokens a ViT's encoder reads. With a layer
norm of each patch's channels after it (patch_norm.py, one image), the accumulator is the
image's (P, F) rows and post_norm.py's program runs on the EPILOGUE's sum, as after a matmul.
"""

from __future__ import annotations

from tvm import te

from ..common.operands import kernel_prim_func, padded
from ..common.spec import SINGLE_BUFFERED, KernelSpec, Tiling
from .epilogue import epilogue_compute, epilogue_operands
from .post_norm import post_norm_epilogue, single_buffered, summed_spec


def patchify_compute(spec: KernelSpec, tiling: Tiling, pixel_order):
    """The PrimFunc: acc[b, p, f] = sum over (ry, k) of a_pad[b, ry, p, k] * b_pad[ry, k, f],
    k = rx * C + c; `pixel_order` is conv2d's (pixel(p) -> (y, x), row(y, x) -> p)."""
    _, channels, kh, kw = spec.rhs_shape
    batch = spec.lhs_shape[0]
    _, filters, oh, ow = spec.output_shape
    x = te.placeholder(spec.lhs_shape, spec.dtype, name="data")
    w = te.placeholder(spec.rhs_shape, spec.dtype, name="weight")
    pixel, pixel_row = pixel_order(spec, oh, ow)
    if spec.post_norm:
        return _normed_patches(spec, tiling, x, w, pixel, pixel_row)

    def gathered(b_, ry, p, k):
        y, x_ = pixel(p)
        return padded(x, spec.lhs_shape, (b_, k % channels, y * kh + ry, x_ * kw + k // channels), spec.image_fill)

    a_pad = te.compute((batch, kh, tiling.mp, tiling.kp), gathered, name="a_pad")
    b_pad = te.compute((kh, tiling.kp, tiling.np), lambda ry, k, f: padded(
        w, spec.rhs_shape, (f, k % channels, ry, k // channels)), name="b_pad")
    ry, rk = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, tiling.kp), name="rk")
    acc = te.compute((batch, tiling.mp, tiling.np), lambda b_, p, f: te.sum(
        a_pad[b_, ry, p, rk].astype(spec.acc_dtype) * b_pad[ry, rk, f].astype(spec.acc_dtype), axis=[ry, rk]),
        name="acc")
    if spec.out_layout == "NHWC":  # a stored row per GEMM row (normalise/patch_embeddings.py)
        out_shape = (batch, oh, ow, filters)
        operands = epilogue_operands(spec, out_shape)
        epi = epilogue_compute(spec, acc, tiling, operands, out_index=lambda b_, p, f: (b_, *pixel(p), f))
        out = te.compute(out_shape, lambda b_, y, ox, f: epi[b_, pixel_row(y, ox), f], name="out")
        return kernel_prim_func(spec, {"lhs": x, "rhs": w, **operands}, out)
    out_shape = (batch, filters, oh, ow)
    operands = epilogue_operands(spec, out_shape)
    epi = epilogue_compute(spec, acc, tiling, operands, out_index=lambda b_, p, f: (b_, f, *pixel(p)))
    out = te.compute(out_shape, lambda b_, f, y, ox: epi[b_, pixel_row(y, ox), f], name="out")
    return kernel_prim_func(spec, {"lhs": x, "rhs": w, **operands}, out)


def _normed_patches(spec: KernelSpec, tiling: Tiling, x, w, pixel, pixel_row):
    """The PrimFunc of one image's patches with the layer norm of each patch's channels
    (patch_norm.py): acc[p, f] as patchify_compute's without the batch axis (the program's
    steps are 2-D, post_norm.py), its sum (block post_summed) normed into `epi`, stored NHWC."""
    _, channels, kh, kw = spec.rhs_shape
    _, filters, oh, ow = spec.output_shape
    a_pad = te.compute((kh, tiling.mp, tiling.kp), lambda ry, p, k: padded(
        x, spec.lhs_shape, (0, k % channels, pixel(p)[0] * kh + ry, pixel(p)[1] * kw + k // channels),
        spec.image_fill), name="a_pad")
    b_pad = te.compute((kh, tiling.kp, tiling.np), lambda ry, k, f: padded(
        w, spec.rhs_shape, (f, k % channels, ry, k // channels)), name="b_pad")
    ry, rk = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, tiling.kp), name="rk")
    acc = te.compute((tiling.mp, tiling.np), lambda p, f: te.sum(
        a_pad[ry, p, rk].astype(spec.acc_dtype) * b_pad[ry, rk, f].astype(spec.acc_dtype), axis=[ry, rk]),
        name="acc")
    out_shape = (1, oh, ow, filters)
    operands = epilogue_operands(spec, out_shape)
    summed = epilogue_compute(summed_spec(spec), acc, tiling, operands, out_index=lambda p, f: (0, *pixel(p), f),
                              name="post_summed")
    epi = post_norm_epilogue(spec, summed, tiling, operands)
    out = te.compute(out_shape, lambda b_, y, ox, f: epi[pixel_row(y, ox), f], name="out")
    func = kernel_prim_func(spec, {"lhs": x, "rhs": w, **operands}, out)
    return func.with_attr(SINGLE_BUFFERED, single_buffered(spec))
