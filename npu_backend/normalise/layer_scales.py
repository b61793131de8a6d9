"""A linear layer's output times a constant per-channel vector (a layer scale) folded into it.

Stage: normalise (before norm_folds.py). In: a Relax IRModule. Out: the same module in which

    y = ((x @ W [+ b]) [reshaped, keeping the last axis]) * lambda

(lambda a constant of the output's width n, shape (n,) or (1, ..., n), or a scalar; W a (K, n) constant or
`permute_dims` of an (n, K) one; every intermediate read by this chain alone; y not shifted by
a constant add, a batch norm's scale and shift, which the epilogue takes as written) is

    y = (x @ (W * lambda[None, :]) [+ b * lambda]) [reshaped]

DINOv2's, ConvNeXt's (and CaiT's, timm's ViTs') layer scale multiplies each block's attention
and MLP output by a learned vector before the residual add (ConvNeXt on cgra-8x8: 166,450 ->
162,256 cycles, a multiply step and 4 add kernels fewer); Whisper's (and BART's) attention scales its
query projection's output by head_dim^-0.5, a scalar. The GEMM's epilogue would take the multiply
as its per-channel scale, but then not the residual add after it (the tail's scale comes after
its residual, epilogue_tail.py): each add ran as an elementwise kernel of its own. Folded, the
layer's output is a plain linear's, and the residual add joins its epilogue as in ViT.

Error: each weight W_kn lambda_n and bias b_n lambda_n is rounded once in float32 (computed in
float64); the dot product's terms x_k W_kn lambda_n are then those PyTorch's (x @ W) lambda
computes up to one more float32 rounding each, within (K + 2) 2^-24 sum_k |x_k W_kn lambda_n|
+ 2^-24 |b_n lambda_n| of float64, as the unfolded GEMM's own accumulation
(tests/test_layer_scales.py).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .norm_folds import _Uses, _bias_add, _const, _rebuilt, _weight, refit_linear
from .rewrite import as_pass, op_name, replace_functions


def fold_layer_scales(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every constant per-channel multiply of a linear layer's output folded into its
    weights and bias."""
    return replace_functions(mod, _rewrite_function)


layer_scales_pass = as_pass(fold_layer_scales, "cgra.FoldLayerScales", ops=("relax.multiply",))


def _scale_row(value, width: int):
    """(the other operand, lambda as (width,)) when `value` multiplies a variable of its own shape
    by a constant whose only non-1 axis is the last, of `width` values; else None."""
    for operand, scale in (value.args, value.args[::-1]):
        array = _const(scale)
        if not isinstance(operand, relax.Var) or array is None or shape_dims(operand) != shape_dims(value):
            continue
        if array.dtype != np.float32 or array.ndim > len(shape_dims(value) or ()) or not np.isfinite(array).all():
            continue
        if array.size == 1:  # a scalar (Whisper's and BART's query scaling): every channel's
            return operand, np.full(width, array.reshape(()), np.float32)
        if array.size == width and array.shape[-1] == width:
            return operand, array.reshape(width)
    return None


def _linear_under(uses: _Uses, var, width: int):
    """(matmul var, matmul, weight, bias or None) of the linear layer `var` is (through one reshape
    keeping the last axis, and a constant bias add), each step read by the next alone."""
    value = uses.values.get(var)
    if op_name(value) == "relax.reshape" and isinstance(value.args[0], relax.Var) and \
            (shape_dims(value.args[0]) or (None,))[-1] == width and len(uses.only(value.args[0]) or ()) == 1:
        var, value = value.args[0], uses.values.get(value.args[0])
    if op_name(value) == "relax.add":
        for matmul_var in value.args:
            matmul = uses.values.get(matmul_var) if isinstance(matmul_var, relax.Var) else None
            bias = _bias_add(uses, matmul_var, width) if op_name(matmul) == "relax.matmul" else None
            if bias is not None and bias[0].same_as(var):
                weight = _weight(uses, matmul, matmul.args[0])
                return (matmul_var, matmul, weight, bias) if weight is not None else None
        return None
    if op_name(value) == "relax.matmul":
        weight = _weight(uses, value, value.args[0])
        return (var, value, weight, None) if weight is not None else None
    return None


def _shifted(uses: _Uses, var) -> bool:
    """Whether a reader of the scaled `var` adds a constant row to it: a batch norm's scale and
    shift, which the epilogue takes as they are (folded, the shift would be a second bias add)."""
    width = (shape_dims(var) or (None,))[-1]
    return any(op_name(value) == "relax.add" and any(_const(arg) is not None and _const(arg).size == width
                                                     for arg in value.args)
               for _, value in uses.only(var) or ())


def _fold(linear, scale, replace: dict) -> None:
    """Into `replace`: the linear's weight and bias scaled by `scale`."""
    scale = scale.astype(np.float64)
    refit_linear(linear, lambda w: w * scale[None, :], lambda b: b * scale.reshape(b.shape), replace)


def _rewrite_function(func: relax.Function):
    """`func` with its foldable layer scales folded, or None when it has none."""
    uses = _Uses(func)
    replace = {}
    for var, value in uses.values.items():
        width = (shape_dims(value) or (None,))[-1]
        if op_name(value) != "relax.multiply" or dtype_of(value) != "float32" or not isinstance(width, int):
            continue
        found = _scale_row(value, width)
        if found is None or len(uses.only(found[0]) or ()) != 1:
            continue
        linear = _linear_under(uses, found[0], width)
        if linear is None or linear[2][1].shape[1] != width or _shifted(uses, var):
            continue
        plan = {}
        _fold(linear, found[1], plan)
        if any(key in replace for key in plan):
            continue
        replace.update(plan)
        replace[var] = found[0]  # an alias CanonicalizeBindings removes
    return _rebuilt(func, replace, {}) if replace else None
