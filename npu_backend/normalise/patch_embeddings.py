"""A ViT's patch embedding flattened and transposed to tokens as the patch conv's channels-last output.

Stage: normalise (after position_embeddings.py, which moves the patches' position embedding into
the conv's residual add). In: a Relax IRModule. Out: the same module in which

    permute_dims(reshape(conv2d(x, w) [+ c1] [+ c2], (N, C, H * W)), [0, 2, 1])

(a conv2d over non-overlapping patches: kernel == stride, no padding, dilation 1, no groups,
NCHW data, OIHW weights, NCHW output, at most `patch_channels` input channels; c1, c2 float32
constants broadcast over its output, a bias (1, C, 1, 1) or the positions (1, C, H, W); each
value read by the next alone) is

    reshape(conv2d(x, w, out_layout="NHWC") [+ c1ᵀ] [+ c2ᵀ], (N, H * W, C))

c1ᵀ, c2ᵀ the constants transposed to (1, H, W, C) with numpy. ViT, DeiT, DINOv2 and CLIP write
their embeddings as conv2d(patches) + bias, flatten(2), transpose(1, 2): the transpose ran as a
layout copy kernel after the conv (544 of ViT's 62.7 k cycles at 64 x 64 px on cgra-8x8). The
conv kernel computes a patch a GEMM row and its channels a row of the tile
(kernels/gemm/patchify.py); stored channels-last, each row is a token: the reshape is a view.

Exact: every element is the same float32 sum of the same products plus the same constants, only
stored elsewhere. A conv of more channels, or with a stride unlike its kernel, keeps its
transpose (a dense conv2d of NCHW data storing NHWC takes the general layout kernel, slower
than the copy: nhwc_convs.py).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .norm_folds import _const, _Uses
from .rewrite import as_pass, op_name, replace_functions


def patch_embeddings_pass(patch_channels: int) -> tvm.transform.Pass:
    """The pass for convs of at most `patch_channels` input channels (kernels/common/spec.py
    PATCH_CHANNELS: the ones the patch GEMM takes, passed in by the stage)."""
    return as_pass(lambda mod: replace_functions(mod, lambda func: _rewrite_function(func, patch_channels)),
                   "cgra.PatchEmbeddings", ops=("relax.nn.conv2d",))


def _static(expr) -> tuple | None:
    dims = shape_dims(expr)
    return tuple(dims) if dims is not None and all(isinstance(d, int) for d in dims) else None


def _patch_conv(value, patch_channels: int) -> bool:
    """Whether `value` is a float32 conv2d over non-overlapping patches the patch GEMM takes."""
    if op_name(value) != "relax.nn.conv2d" or dtype_of(value) != "float32":
        return False
    attrs = value.attrs
    weight = _static(value.args[1])
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    return weight is not None and _static(value) is not None and layouts == ("NCHW", "OIHW", "NCHW") and \
        int(attrs.groups) == 1 and tuple(int(s) for s in attrs.strides) == weight[2:] and weight[3] > 1 and \
        not any(int(p) for p in attrs.padding) and all(int(d) == 1 for d in attrs.dilation) and \
        weight[1] <= patch_channels


def _chain(uses: _Uses, var, patch_channels: int):
    """(the conv2d call, its constant addends in order) when `var` is conv2d(...) [+ c]... each
    read by the next alone, else None."""
    addends = []
    for _ in range(4):
        value = uses.values.get(var)
        if _patch_conv(value, patch_channels):
            return value, addends[::-1]
        if op_name(value) != "relax.add" or len(uses.only(var) or ()) != 1:
            return None
        lhs, rhs = value.args
        inner, constant = (lhs, _const(rhs)) if _const(rhs) is not None else (rhs, _const(lhs))
        shape = _static(value)
        if constant is None or not isinstance(inner, relax.Var) or constant.dtype != np.float32 or \
                shape is None or constant.ndim > 4 or np.broadcast_shapes(constant.shape, shape) != shape:
            return None
        addends.append(constant.reshape((1,) * (4 - constant.ndim) + constant.shape))
        var = inner
    return None


def _rewrite_function(func: relax.Function, patch_channels: int):
    """`func` with its patch embeddings' transposes gone, or None when it has none."""
    uses = _Uses(func)
    replace = {}
    for var, value in uses.values.items():
        if op_name(value) != "relax.permute_dims" or value.attrs.axes is None or \
                [int(a) for a in value.attrs.axes] != [0, 2, 1] or not isinstance(value.args[0], relax.Var):
            continue
        flat = uses.values.get(value.args[0])
        if op_name(flat) != "relax.reshape" or len(uses.only(value.args[0]) or ()) != 1 or \
                not isinstance(flat.args[0], relax.Var) or len(uses.only(flat.args[0]) or ()) != 1:
            continue
        image, tokens = _static(flat.args[0]), _static(flat)
        if image is None or len(image) != 4 or tokens != (image[0], image[1], image[2] * image[3]):
            continue
        found = _chain(uses, flat.args[0], patch_channels)
        if found is None:
            continue
        conv, addends = found
        attrs = conv.attrs
        result = relax.op.nn.conv2d(conv.args[0], conv.args[1], strides=attrs.strides, padding=attrs.padding,
                                    dilation=attrs.dilation, groups=attrs.groups, data_layout="NCHW",
                                    kernel_layout="OIHW", out_layout="NHWC", out_dtype=attrs.out_dtype)
        for addend in addends:
            result = relax.op.add(result, relax.const(np.ascontiguousarray(addend.transpose(0, 2, 3, 1))))
        batch, channels, height, width = image
        replace[var] = relax.op.reshape(result, (batch, height * width, channels))
    return _rebuilt_values(func, replace) if replace else None


def _rebuilt_values(func: relax.Function, replace: dict) -> relax.Function:
    """`func` with the bindings of `replace`'s variables bound to their new (nested) values;
    Normalize binds the nested calls, DeadCodeElimination drops what they left unread."""
    blocks = []
    for block in func.body.blocks:
        bindings = [relax.VarBinding(b.var, replace[b.var]) if b.var in replace else b for b in block.bindings]
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(bindings))
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                          func.attrs, func.span)
