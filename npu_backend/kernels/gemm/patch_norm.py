"""A patch embedding's layer norm in the patch conv's epilogue: LayerNorm(reshape(conv(x) + b)) as one kernel.

Stage: partition (the pattern `cgra.conv2d_post_norm` and the spec checks); the program, the
tiling, the price and the schedule are post_norm.py's, the kernel definition patchify.py's. Swin
and ConvNeXt embed their image as

    layer_norm(reshape(conv2d(x, w, stride = kernel, out_layout NHWC) + b, (1, P, F)), gamma, beta)

(normalise/patch_embeddings.py writes the conv's output channels-last, a GEMM row per patch).
That is post_norm.py's case without the residual: each patch's F channels are one GEMM row, so a
tile of whole rows (tn = F) holds each patch's mean and variance, and after the EPILOGUE's sum
(acc + bias) the vector unit runs the layer norm kernel's own program on the tile. Saved: the
norm's launch, the conv's store of the sum and the norm's load of it (at 16 x 16 patches of 16
channels on cgra-8x8, Swin's and ConvNeXt's stems: 4,922 + 5,402 cycles apart).

Taken only for a patch conv (KernelSpec.patch_channels) of one image with an NHWC output, a
float32 norm over its channels, centred and scaled, and, as for every post-norm, F whole columns
of the PE array and whole-row tiles that fit the scratchpad (post_norm.require_whole_rows);
otherwise the reason (explain: tools/post_norm_reasons.py), and the conv and the norm run as
their own kernels. Not priced against the two kernels (post_norm_cost.check_post_norm): the GEMM
estimate sees one kernel row's depth of a patch conv's kh, so it called the fold dearer where
it was measured cheaper on every preset (3 x 64 x 64 px, 4 x 4 patches, 16 channels: cgra-4x4
23,486 -> 14,316 cycles, cgra-8x8 10,324 -> 6,540; 3 x 16 x 24, 32 channels, cgra-8x8 2,683 ->
2,147; tests/test_patch_norms.py measures it on each preset).
"""

from __future__ import annotations

import dataclasses
import math

from tvm.relax.dpl import is_op, wildcard

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of, static_shape

F32 = "float32"
#: The pattern's name: post_norm.SUFFIX after the conv2d root (post_norm.is_post_norm_pattern).
NAME = "cgra.conv2d_post_norm"
RMS_BETA = "_rms_beta"  # post_norm.RMS_BETA: the pattern of an RMSNorm plus beta


def patch_norm_graphs(roots) -> list[tuple]:
    """(name, pattern, annotations, root name) of layer_norm([reshape](conv2d [+ bias]))."""
    graphs = []
    for root in roots:
        if root.name != "conv2d":
            continue
        bias, gamma, beta = wildcard(), wildcard(), wildcard()
        with_bias = is_op("relax.add")(root.pattern, bias)
        value = with_bias | root.pattern
        reshape = is_op("relax.reshape")(value, wildcard())
        norm = is_op("relax.nn.layer_norm")(reshape | value, gamma, beta)
        roles = {"root": root.pattern, **root.roles, "bias": bias, "reshape": reshape, "norm_gamma": gamma,
                 "norm_beta": beta}
        graphs.append((NAME, norm, {**roles, "post_norm": norm}, root.name))
        # The RMSNorm plus beta of a centred patch conv (normalise/centred_patches.py).
        rms = is_op("relax.nn.rms_norm")(reshape | value, gamma)
        with_beta = is_op("relax.add")(rms, beta) | is_op("relax.add")(beta, rms)
        graphs.append((NAME + RMS_BETA, with_beta, {**roles, "post_norm": rms, "post_beta": with_beta}, root.name))
    return graphs


def with_patch_norm(spec, annotated: dict):
    """`spec` (the conv with its bias) with the layer norm of its output's channels; refuses
    what the kernel does not compute (the norm then runs on its own)."""
    norm = annotated["post_norm"]
    kind = "rms_norm_beta" if "post_beta" in annotated else "layer_norm"
    what = f"{kind} after the conv2d {spec.rhs_shape} on {spec.lhs_shape}"
    if not spec.patch_channels or spec.out_layout != "NHWC" or spec.lhs_shape[0] != 1 or spec.dtype != F32 or \
            spec.acc_dtype != F32 or spec.half_out or spec.half_via or spec.relu or spec.clip is not None or \
            spec.residual_shape or spec.scale_shape:
        raise UnsupportedOperator(f"{what}: fused after a float32 patch conv (kernel = stride, no padding) of one "
                                  "image with a channels-last output and a bias at most; the norm runs on its own")
    filters = spec.rhs_shape[0]
    dims = tuple(static_shape(norm) or ())
    axes = [int(a) % max(len(dims), 1) for a in norm.attrs.axes]
    if dtype_of(norm) != F32 or not dims or axes != [len(dims) - 1] or dims[-1] != filters or \
            math.prod(dims) != math.prod(spec.output_shape) or \
            (kind == "layer_norm" and not (bool(norm.attrs.center) and bool(norm.attrs.scale))) or \
            (kind != "layer_norm" and tuple(static_shape(annotated["post_beta"]) or ()) != dims):
        raise UnsupportedOperator(f"{what}: the epilogue normalises each patch's {filters} float32 channels, centred "
                                  "and scaled; the norm runs on its own")
    for role in ("norm_gamma", "norm_beta"):
        operand = annotated[role]
        if tuple(static_shape(operand) or ()) != (filters,) or dtype_of(operand) != F32:
            raise UnsupportedOperator(f"{what}: its {role.removeprefix('norm_')} is not {filters} float32 values")
    out = tuple(spec.output_shape["NCHW".index(axis)] for axis in spec.out_layout)  # as stored: NHWC
    callers = tuple((role, s) for role, s in spec.caller_shapes if role != "out")
    view = () if dims == out else (("out", dims),)  # the reshape: a view of the NHWC output
    return dataclasses.replace(spec, post_norm=(float(norm.attrs.epsilon), True, kind),
                               caller_shapes=callers + view)
