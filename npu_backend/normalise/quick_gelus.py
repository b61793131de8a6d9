"""OpenAI's quick GELU, x * sigmoid(c x) (CLIP, c = 1.702), as a SiLU between two linears.

Stage: normalise (after norm_folds.py). In: a Relax IRModule. Out: the same module in which
`y = h * sigmoid(h * c)` (c a positive scalar constant, either operand order), every use of which
is the left operand of a matmul by a constant weight W (directly, or through reshapes keeping the
last axis), is

    y' = silu(h * c),  y' @ (W / c)

since silu(c h) = c h sigmoid(c h). The multiply by c is the per-channel scale of the linear
before it and the SiLU its epilogue's activation (epilogue_tail.py); 1 / c folds into the next
linear's weights, as norm_folds.py folds a norm's gamma. CLIP's MLP thus runs as its two linears
instead of two linears, a sigmoid and a multiply kernel.

Error: silu(t) / c against h sigmoid(t) is the function unit's SiLU (within 3.5 ulp of float64)
against its sigmoid and a float32 multiply, and each weight W / c is rounded once: a few float32
roundings of each term of the next linear's dot product.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .norm_folds import _const, _fold_linears, _readers, _rebuilt, _Uses
from .rewrite import as_pass, op_name, replace_functions


def quick_gelus_as_silus(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every quick GELU read only by linear layers a SiLU, 1 / c in their weights."""
    return replace_functions(mod, _rewrite_function)


quick_gelus_pass = as_pass(quick_gelus_as_silus, "cgra.QuickGelus", ops=("relax.sigmoid",))


def _scaled_sigmoid(uses: _Uses, value):
    """(h, the var of h * c, c) when `value` is h * sigmoid(h * c), c a positive scalar, else None."""
    if op_name(value) != "relax.multiply":
        return None
    for h, s in (value.args, value.args[::-1]):
        inner = uses.values.get(s) if isinstance(s, relax.Var) else None
        if inner is None or op_name(inner) != "relax.sigmoid" or not isinstance(inner.args[0], relax.Var):
            continue
        scaled_var = inner.args[0]
        scaled = uses.values.get(scaled_var)
        if scaled is None or op_name(scaled) != "relax.multiply" or not any(a.same_as(h) for a in scaled.args):
            continue
        other = scaled.args[1] if scaled.args[0].same_as(h) else scaled.args[0]
        c = _const(other)
        if c is not None and c.size == 1 and np.isfinite(c).all() and float(c.reshape(())) > 0:
            return h, scaled_var, float(c.reshape(()))
    return None


def _rewrite_function(func: relax.Function):
    """`func` with its foldable quick GELUs rewritten, or None when it has none."""
    uses = _Uses(func)
    replace, insert = {}, {}
    for var, value in uses.values.items():
        found = _scaled_sigmoid(uses, value) if dtype_of(value) == "float32" else None
        width = (shape_dims(value) or (None,))[-1]
        if found is None or not isinstance(width, int):
            continue
        _, scaled_var, c = found
        readers = _readers(uses, var, width)
        if readers is None or not readers[0] or readers[1] or any(w[1].shape[0] != width for _, _, w in readers[0]):
            continue
        gamma = np.full(width, 1.0 / np.float64(c))
        plan = _fold_linears(uses, readers[0], gamma, np.zeros(width))
        if any(key in replace or key in insert for part in plan for key in part):
            continue
        replace.update(plan[0])
        insert.update(plan[1])
        h = found[0]
        # c as a row of the width: the per-channel scale the epilogue of the linear before takes
        replace[scaled_var] = relax.op.multiply(h, relax.const(np.full(width, c, np.float32)))
        replace[var] = relax.op.nn.silu(scaled_var)
    return _rebuilt(func, replace, insert) if replace else None
