"""A fused q / k / v projection laid out per head (Bloom's) as one laid out per part.

Stage: normalise (after lookup_tables.py, before norm_folds.py and attentions.py). In: a Relax
IRModule. Out: the same module in which

    y = matmul(x, W) [+ b]                      W a constant (K, H * P * D) (or its transpose)
    t = reshape(... reshape(y) ..., (..., H, P, D))
    part_i = take(t, i, axis=-2)                each of t's readers, i a constant scalar

(Bloom's query_key_value: per head its q, k and v, P = 3) becomes

    y' = matmul(x, W[:, perm]) [+ b[perm]]      the columns in (P, H, D) order
    part_i = strided_slice(reshape(y', (..., P * H, D)), [-2], [i * H], [(i + 1) * H])

so each part is a box of the projection's output that the attention kernel reads as its origin
(split_slices.py's form for GPT-2's c_attn), instead of a take: one gather kernel per part per
layer (3 x 1,184 cycles per layer of Bloom at 32 tokens on cgra-8x8).

Exact: the projection computes the same columns (each the same dot product and bias add), only
stored in another order; the slices read the same elements the takes read.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, static_shape
from .norm_folds import _Uses, _const, _rebuilt
from .rewrite import as_pass, op_name, replace_functions


def parts_first_projections(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every per-head fused projection read by its parts' takes laid out per part."""
    return relax.transform.DeadCodeElimination()(replace_functions(mod, _rewrite_function))


head_qkv_pass = as_pass(parts_first_projections, "cgra.HeadQKV", ops=("relax.take",))


def _part_takes(uses: _Uses, var, shape) -> list | None:
    """[(take var, index)] when every reader of `var` (shape (..., H, P, D)) takes one constant
    part along axis -2, each part once; else None."""
    readers, parts = uses.only(var), shape[-2]
    if not readers or len(readers) != parts:
        return None
    found = []
    for reader, value in readers:
        index = _const(value.args[1]) if op_name(value) == "relax.take" else None
        if index is None or index.ndim != 0 or value.attrs.axis is None or \
                int(value.attrs.axis) % len(shape) != len(shape) - 2:
            return None
        found.append((reader, int(index)))
    return found if sorted(i for _, i in found) == list(range(parts)) else None


def _projection(uses: _Uses, var, width: int):
    """(matmul var, matmul, bias add var or None, bias add or None) producing `var` through
    reshapes keeping the last axis `width`, each read by the next alone; else None."""
    value = uses.values.get(var)
    while op_name(value) == "relax.reshape" and isinstance(value.args[0], relax.Var) and \
            len(uses.only(value.args[0]) or ()) == 1 and (static_shape(value.args[0]) or (0,))[-1] == width:
        var = value.args[0]
        value = uses.values.get(var)
    add_var, add = None, None
    if op_name(value) == "relax.add":
        bias = [a for a in value.args if _const(a) is not None and _const(a).shape == (width,)]
        inner = [a for a in value.args if isinstance(a, relax.Var)]
        if len(bias) != 1 or len(inner) != 1 or len(uses.only(inner[0]) or ()) != 1:
            return None
        add_var, add, var = var, value, inner[0]
        value = uses.values.get(var)
    if op_name(value) != "relax.matmul" or _weight(uses, value.args[1]) is None:
        return None
    return var, value, add_var, add


def _weight(uses: _Uses, rhs):
    """(the constant, whether the matmul reads its transpose) of a matmul's right operand (a
    constant, or a variable bound to one's transpose that the matmul alone reads), else None."""
    if _const(rhs) is not None and _const(rhs).ndim == 2:
        return _const(rhs), False
    bound = uses.values.get(rhs) if isinstance(rhs, relax.Var) and len(uses.only(rhs) or ()) == 1 else None
    if op_name(bound) == "relax.permute_dims" and _const(bound.args[0]) is not None and \
            _const(bound.args[0]).ndim == 2 and \
            (bound.attrs.axes is None or [int(a) for a in bound.attrs.axes] == [1, 0]):
        return _const(bound.args[0]), True
    return None


def _rewrite_function(func: relax.Function):
    """`func` with its per-head fused projections laid out per part (module doc), or None."""
    uses = _Uses(func)
    replace, insert = {}, {}
    for var, value in uses.values.items():
        shape = static_shape(value)
        if op_name(value) != "relax.reshape" or shape is None or len(shape) < 3 or \
                not isinstance(value.args[0], relax.Var) or len(uses.only(value.args[0]) or ()) != 1:
            continue
        heads, parts, depth = shape[-3:]
        takes = _part_takes(uses, var, shape)
        found = _projection(uses, value.args[0], heads * parts * depth) if takes else None
        if found is None or parts < 2 or heads < 2:
            continue
        mm_var, mm, add_var, add = found
        perm = np.arange(heads * parts * depth).reshape(heads, parts, depth).transpose(1, 0, 2).reshape(-1)
        weight, transposed = _weight(uses, mm.args[1])
        if transposed:  # the transpose's binding reads the permuted constant
            replace[mm.args[1]] = relax.op.permute_dims(relax.const(weight[perm]), [1, 0])
        else:
            replace[mm_var] = relax.Call(mm.op, [mm.args[0], relax.const(weight[:, perm])], mm.attrs, mm.ty_args,
                                         mm.span)
        if add is not None:
            replace[add_var] = relax.op.add(*(relax.const(_const(a)[perm]) if _const(a) is not None else a
                                              for a in add.args))
        first, rows = takes[0][0], tuple(shape[:-3]) + (parts * heads, depth)
        var_class = relax.DataflowVar if isinstance(first, relax.DataflowVar) else relax.Var
        cut = var_class(f"{var.name}_parts", relax.TensorType(rows, dtype_of(value)))
        insert[first] = (cut, relax.op.reshape(value.args[0], rows))
        for take_var, index in takes:
            replace[take_var] = relax.op.strided_slice(cut, [len(shape) - 3], [index * heads], [(index + 1) * heads])
    return _rebuilt(func, replace, insert) if replace else None
