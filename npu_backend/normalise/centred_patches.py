"""A conv whose output only a layer norm over its channels reads computes that output centred:
the norm is an RMSNorm, plus beta.

Stage: normalise (after nhwc_convs.py and padding_taps.py, which settle the convs' layouts and
weights). In: a Relax IRModule. Out: the same module in which

    v = conv2d(x, W, groups 1, out_layout NHWC)  [+ b]  [reshape keeping the last axis]
    y = layer_norm(v, gamma, beta, axes [-1])                  v's every step read once

becomes, with W and b constants centred over the output channels (float64, rounded once),

    v = conv2d(x, W - mean_o W)  [+ (b - mean b)]  [reshape]
    y = add(rms_norm(v, gamma, axes [-1]), beta)

Centring is linear: the conv's output for each pixel is then its output minus its mean over
the channels, and a layer norm of a row whose mean is 0 is its RMSNorm (the same eps) times
gamma plus beta (centred_streams.py does this for a residual stream's linears).

Why: Swin's and ConvNeXt's patch embeddings normalise their 16 channels per patch in the patch
conv's epilogue (kernels/gemm/patch_norm.py), where the layer norm's program (REDUCE sum, the
mean, x - mean, its rounding corrected, then the variance's) kept the vector unit busier than
the conv's loads and GEMMs: the RMSNorm's program is about half of it.

Error: the GEMM sums the centred terms (each pixel's mean is no longer subtracted after a
rounding of the uncentred sum, which is better when the mean is large against the spread), and
the RMSNorm skips the mean the layer norm computed as about 0 (tests/test_centred_patches.py:
within 1e-5 of float64).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .norm_folds import _const, _rebuilt, _Uses
from .rewrite import as_pass, op_name, replace_functions


def centre_patches(mod, columns: int = 1, patch_channels: int = 8):
    """`mod` with every patch conv (kernel = stride, no padding, one NCHW image of at most
    `patch_channels` channels, output channels a multiple of `columns`: what the patch conv's
    epilogue normalises, kernels/gemm/patch_norm.py) read only by a layer norm over its
    channels centred (module doc). Any other conv keeps its layer norm, and `explain` its reason."""
    return replace_functions(mod, lambda func: _rewrite_function(func, columns, patch_channels))


def centred_patches_pass(columns: int | None, patch_channels: int):
    """The pass for a chip of `columns` PE-array columns (None: no chip, no rewrite)."""
    return as_pass(lambda mod: mod if columns is None else centre_patches(mod, columns, patch_channels),
                   "cgra.CentredPatches", ops=("relax.nn.layer_norm",))


def _rewrite_function(func: relax.Function, columns: int, patch_channels: int):
    uses = _Uses(func)
    replace, insert = {}, {}
    for var, value in uses.values.items():
        chain = _conv_chain(uses, value) if op_name(value) == "relax.nn.layer_norm" else None
        if chain is None or not _patch_conv(chain[0][1], columns, patch_channels):
            continue
        (conv_var, conv, weight), bias = chain
        wide = weight.astype(np.float64)
        centred = (wide - wide.mean(axis=0, keepdims=True)).astype(np.float32)
        replace[conv_var] = relax.Call(conv.op, [conv.args[0], relax.const(centred)], conv.attrs, conv.ty_args)
        if bias is not None:
            add_var, add, position, array = bias
            wide = array.astype(np.float64)
            args = list(add.args)
            args[position] = relax.const((wide - wide.mean()).astype(np.float32).reshape(array.shape))
            replace[add_var] = relax.op.add(*args)
        var_class = relax.DataflowVar if isinstance(var, relax.DataflowVar) else relax.Var
        inner = var_class(f"{var.name}_rms", var.ty)
        insert[var] = (inner, relax.op.nn.rms_norm(value.args[0], value.args[1], axes=[-1],
                                                   epsilon=value.attrs.epsilon))
        replace[var] = relax.op.add(inner, value.args[2])
    return _rebuilt(func, replace, insert) if replace else None


def _conv_chain(uses: _Uses, norm):
    """((conv var, conv, weight), bias or None) of the conv the layer norm `norm` reads (module
    doc), bias (add var, add, the constant's position, the constant); else None."""
    v = norm.args[0]
    dims = shape_dims(v) or ()
    if not dims or not isinstance(dims[-1], int) or dtype_of(norm) != "float32" or not norm.attrs.center or \
            [int(a) % len(dims) for a in norm.attrs.axes] != [len(dims) - 1]:
        return None
    channels, bias = dims[-1], None
    while isinstance(v, relax.Var) and len(uses.only(v) or ()) == 1:
        value = uses.values.get(v)
        name = op_name(value)
        if name == "relax.reshape" and bias is None and (shape_dims(value.args[0]) or [None])[-1] == channels:
            v = value.args[0]
        elif name == "relax.add" and bias is None:
            position = next((i for i, a in enumerate(value.args) if _channel_row(a, channels) is not None), None)
            if position is None:
                return None
            bias = (v, value, position, _channel_row(value.args[position], channels))
            v = value.args[1 - position]
        elif name == "relax.nn.conv2d":
            weight = _const(value.args[1])
            attrs = value.attrs
            if weight is None or weight.dtype != np.float32 or int(attrs.groups) != 1 or \
                    str(attrs.out_layout) != "NHWC" or str(attrs.kernel_layout) != "OIHW" or \
                    weight.shape[0] != channels or dtype_of(value) != "float32":
                return None
            return (v, value, weight), bias
        else:
            return None
    return None


def _patch_conv(conv, columns: int, patch_channels: int) -> bool:
    """Whether `conv` is a patch conv of one NCHW image whose output channels fill whole columns."""
    attrs, data, weight = conv.attrs, shape_dims(conv.args[0]) or (), _const(conv.args[1]).shape
    return str(attrs.data_layout) == "NCHW" and len(data) == 4 and data[0] == 1 and \
        weight[1] <= patch_channels and weight[0] % columns == 0 and weight[3] > 1 and \
        [int(s) for s in attrs.strides] == list(weight[2:]) and not any(int(p) for p in attrs.padding) and \
        [int(d) for d in attrs.dilation] == [1, 1]


def _channel_row(arg, channels: int):
    """The float32 constant `arg` when it holds a value per channel (last axis `channels`, every
    other axis 1), else None."""
    array = _const(arg)
    if array is None or array.dtype != np.float32 or array.ndim == 0 or array.shape[-1] != channels or \
            any(d != 1 for d in array.shape[:-1]):
        return None
    return array
