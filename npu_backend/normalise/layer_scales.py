"""A layer scale (a per-channel constant multiplying a linear layer's output) folded into the
linear's weights and bias.

Stage: normalise (after norm_folds.py). In: a Relax IRModule. Out: the same module in which
`gamma * (x @ W + b)` (through a reshape keeping the last axis; W a (K, N) constant or
`permute_dims` of an (N, K) one, b and gamma N constants, each intermediate read by the chain
alone) is `x @ (W * gamma) + b * gamma`.

Why: ConvNeXt's and CaiT-style blocks end in `x + gamma * linear(h)`; with gamma folded, the
residual add follows the linear's bias add and reshape directly, and the GEMM's epilogue takes it
(the `matmul_add_reshape_add` pattern) instead of a multiply step and an add kernel of its own.

Error: each product x_k (W_kn gamma_n) is rounded once more (W_kn gamma_n to float32) than PyTorch's
(x_k W_kn) summed and then scaled, and b_n gamma_n is computed in float64 and rounded once: each
output within (K + 2) 2^-24 sum_k |x_k W_kn gamma_n| + 2^-24 |b_n gamma_n| of PyTorch's, the GEMM's
own accumulation (tests/test_layer_scales.py).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .norm_folds import _bias_add, _const, _rebuilt, _Uses, _weight
from .rewrite import as_pass, op_name, replace_functions


def fold_layer_scales(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every constant per-channel scale of a linear layer's output in its weights."""
    return replace_functions(mod, _fold_function)


layer_scales_pass = as_pass(fold_layer_scales, "cgra.FoldLayerScales", ops=("relax.multiply",))


def _fold_function(func: relax.Function):
    """`func` with its layer scales folded, or None when it has none."""
    uses = _Uses(func)
    replace = {}
    for var, value in uses.values.items():
        found = _scaled_linear(uses, value) if op_name(value) == "relax.multiply" else None
        if found is None or any(key in replace for key in found[0]):
            continue
        targets, scaled_input = found
        replace.update(targets)
        replace[var] = scaled_input
    return _rebuilt(func, replace, {}) if replace else None


def _scaled_linear(uses: _Uses, multiply):
    """({var: new value} of the linear's weight and bias, the multiply's new value: its operand)
    when `multiply` scales a linear's output by a per-channel constant, else None."""
    if dtype_of(multiply) != "float32":
        return None
    for position in (0, 1):
        gamma, operand = _const(multiply.args[position]), multiply.args[1 - position]
        n = (shape_dims(operand) or (None,))[-1]
        if gamma is None or not isinstance(n, int) or gamma.size != n or gamma.shape[-1:] != (n,) or \
                shape_dims(multiply) != shape_dims(operand) or not isinstance(operand, relax.Var) or \
                len(uses.only(operand) or ()) != 1:
            continue
        bias_var = operand
        value = uses.values.get(operand)
        if op_name(value) == "relax.reshape" and isinstance(value.args[0], relax.Var) and \
                (shape_dims(value.args[0]) or (None,))[-1] == n:
            bias_var, value = value.args[0], uses.values.get(value.args[0])
        matmul_var = next((a for a in getattr(value, "args", ()) if isinstance(a, relax.Var) and
                           op_name(uses.values.get(a)) == "relax.matmul"), None) \
            if op_name(value) == "relax.add" else None
        if matmul_var is None or len(uses.only(bias_var) or ()) != 1:
            continue
        matmul = uses.values[matmul_var]
        weight = _weight(uses, matmul, matmul.args[0])
        bias = _bias_add(uses, matmul_var, n)
        if weight is None or bias is None or not bias[0].same_as(bias_var) or weight[1].shape[1] != n:
            continue
        return _folded(gamma.reshape(n).astype(np.float64), matmul_var, matmul, weight, bias), operand
    return None


def _folded(gamma, matmul_var, matmul, weight, bias) -> dict:
    """The new values of the weight (its transpose or the matmul) and the bias add."""
    kind, array, permute_var = weight
    scaled = (array.astype(np.float64) * gamma[None, :]).astype(np.float32)
    targets = {}
    if kind == "const":
        targets[matmul_var] = relax.op.matmul(matmul.args[0], relax.const(scaled), out_dtype="float32")
    else:
        targets[permute_var] = relax.op.permute_dims(relax.const(np.ascontiguousarray(scaled.T)))
    add_var, add, position = bias
    old = _const(add.args[position])
    args = [add.args[0], add.args[1]]
    args[position] = relax.const((old.astype(np.float64) * gamma.reshape(old.shape)).astype(np.float32))
    targets[add_var] = relax.op.add(*args)
    return targets
