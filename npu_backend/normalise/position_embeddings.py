"""A ViT's position embedding added to [CLS token; patches] as two adds: a constant and the
patch embedding conv's epilogue.

Stage: normalise (after constant_adds.py). In: a Relax IRModule. Out: the same module in which

    add(concat([c, ..., x], axis), p)          c, ... and p constants, p of the concat's shape

(the concat read by the add alone) is concat([c + p_c, ..., x + p_x], axis), p_c, ..., p_x p's
parts along the axis: c + p_c is a constant (numpy float32, the same rounding), and x + p_x is moved
under the reshapes and transposes x is made of (each read by the next alone) as p_x reshaped and
transposed back: add(permute_dims(reshape(y)), p_x) = permute_dims(reshape(y + p_y)). ViT, DeiT,
DINOv2 and CLIP write their embeddings as conv2d(patches) + bias, flatten, transpose, concat with
the CLS (and DeiT's distillation) token, + position embeddings: the add ran as an elementwise
kernel over the whole sequence; now it is the conv2d kernel's residual add, in its epilogue.

Exact: every element gets the same float32 addition of the same two values, only elsewhere.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .norm_folds import _Uses, _const, _rebuilt
from .rewrite import as_pass, op_name, replace_functions

_LAYOUT = ("relax.reshape", "relax.permute_dims")


def split_position_embeddings(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every constant add to a concat of a constant and an activation split between them."""
    return replace_functions(mod, _rewrite_function)


position_embeddings_pass = as_pass(split_position_embeddings, "cgra.PositionEmbeddings", ops=("relax.concat",))


def _static(expr) -> tuple | None:
    dims = shape_dims(expr)
    return tuple(dims) if dims is not None and all(isinstance(d, int) for d in dims) else None


def _under_layout(uses: _Uses, var, addend: np.ndarray):
    """(the first layout binding's var or None, the var under the layout ops, the addend in its
    shape): walking down reshapes and permute_dims each read by the next alone."""
    first = None
    for _ in range(8):
        value = uses.values.get(var)
        if op_name(value) not in _LAYOUT or not isinstance(value.args[0], relax.Var) or \
                len(uses.only(value.args[0]) or ()) != 1 or _static(value.args[0]) is None:
            break
        source = value.args[0]
        if op_name(value) == "relax.permute_dims":
            axes = [int(a) for a in value.attrs.axes] if value.attrs.axes is not None else \
                list(range(addend.ndim))[::-1]
            addend = np.transpose(addend, np.argsort(axes))
        else:
            addend = addend.reshape(_static(source))
        var, first = source, var
    return first, var, addend


def _reads(func: relax.Function, var) -> int:
    """How many times `var` is read in `func` (a concat's operands sit in a tuple, which _Uses
    counts as read elsewhere)."""
    count = [0]

    def visit(expr):
        if isinstance(expr, relax.Var) and expr.same_as(var):
            count[0] += 1

    for block in func.body.blocks:
        for binding in block.bindings:
            relax.analysis.post_order_visit(binding.value, visit)
    relax.analysis.post_order_visit(func.body.body, visit)
    return count[0]


def _rewrite_function(func: relax.Function):
    """`func` with its position embeddings split, or None when it has none."""
    uses = _Uses(func)
    replace, insert = {}, {}
    for var, value in uses.values.items():
        if op_name(value) != "relax.add" or dtype_of(value) != "float32":
            continue
        for concat_var, constant in (value.args, value.args[::-1]):
            concat = uses.values.get(concat_var) if isinstance(concat_var, relax.Var) else None
            p = _const(constant)
            if op_name(concat) != "relax.concat" or p is None or p.dtype != np.float32 or \
                    p.shape != _static(value) or _static(concat_var) != p.shape or \
                    len(uses.only(concat_var) or ()) != 1 or not hasattr(concat.args[0], "fields"):
                continue
            *tokens, patches = list(concat.args[0].fields)
            if not tokens or any(_const(t) is None for t in tokens) or not isinstance(patches, relax.Var) or \
                    _reads(func, patches) != 1 or _static(patches) is None:
                continue
            axis = int(concat.attrs.axis) % p.ndim
            *heads, tail = np.split(p, np.cumsum([_const(t).shape[axis] for t in tokens]), axis=axis)
            first, base, addend = _under_layout(uses, patches, tail)
            if any(key in replace or key in insert for key in (var, concat_var, first)):
                continue
            class_of = relax.DataflowVar if isinstance(base, relax.DataflowVar) else relax.Var
            shifted = class_of(f"{base.name}_positioned", base.ty)
            fields = [relax.const(_const(t) + head) for t, head in zip(tokens, heads)]
            if first is None:  # the patches are the concat's operand itself
                insert[concat_var] = (shifted, relax.op.add(base, relax.const(addend)))
                fields.append(shifted)
            else:
                layout = uses.values[first]
                insert[first] = (shifted, relax.op.add(base, relax.const(np.ascontiguousarray(addend))))
                replace[first] = relax.Call(layout.op, [shifted, *layout.args[1:]], layout.attrs)
                fields.append(patches)
            replace[concat_var] = relax.op.concat(fields, axis=concat.attrs.axis)
            replace[var] = concat_var  # an alias CanonicalizeBindings removes
            break
    return _rebuilt(func, replace, insert) if replace else None
