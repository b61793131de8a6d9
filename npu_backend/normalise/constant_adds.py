"""Two constant adds in a row as one: (x + c1) + c2 = x + (c1 + c2).

Stage: normalise (after fold_constants). In: a Relax IRModule. Out: the same module in which
`add(add(x, c1), c2)` (float32, c1 and c2 constants in either operand position, the inner add
read by the outer alone, x not a constant) is `add(x, c)` with c = c1 + c2 computed in float64
and rounded once, broadcast as the two were (c's shape the broadcast of c1's and c2's; the
result's shape unchanged).

Why: BERT's (and RoBERTa's, ALBERT's, ELECTRA's) embeddings add the token-type and the position
embeddings to the word embeddings; with the default token types and positions both are
constants after folding, and each add ran as an elementwise kernel of its own (a DMA round trip
of the hidden states each: BERT at 32 tokens on cgra-8x8, 1,368 cycles an add).

Error: float32 addition is not associative. x + c rounds once where (x + c1) + c2 rounded twice,
and c itself is within half an ulp of c1 + c2: each result is within 2^-24 (|x + c1| + |c1 + c2| +
|x + c1 + c2|) of the two-add result, a few float32 roundings of the embedding sum
(tests/test_constant_adds.py).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .norm_folds import _Uses, _const, _rebuilt
from .rewrite import as_pass, op_name, replace_functions


def fold_constant_adds(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every add of a constant to an add of a constant one add."""
    return replace_functions(mod, _rewrite_function)


constant_adds_pass = as_pass(fold_constant_adds, "cgra.FoldConstantAdds", ops=("relax.add",))


def _constant_operand(value):
    """(the other operand, the constant's array) of an add of a float32 constant, else None."""
    if op_name(value) != "relax.add" or dtype_of(value) != "float32":
        return None
    for operand, constant in (value.args, value.args[::-1]):
        array = _const(constant)
        if array is not None and array.dtype == np.float32 and _const(operand) is None:
            return operand, array
    return None


def _rewrite_function(func: relax.Function):
    """`func` with its chained constant adds joined, or None when it has none."""
    uses = _Uses(func)
    replace, joined = {}, set()
    for var, value in uses.values.items():
        outer = _constant_operand(value)
        if outer is None or not isinstance(outer[0], relax.Var) or outer[0] in joined:
            continue
        inner = _constant_operand(uses.values.get(outer[0]))
        if inner is None or len(uses.only(outer[0]) or ()) != 1:
            continue
        total = inner[1].astype(np.float64) + outer[1].astype(np.float64)
        dims, out_dims = shape_dims(inner[0]), shape_dims(value)
        if dims is None or not all(isinstance(d, int) for d in (*dims, *out_dims)) or \
                np.broadcast_shapes(tuple(dims), total.shape) != tuple(out_dims) or not np.isfinite(total).all():
            continue  # the sum would broadcast x wider than it was, or an infinity appears
        replace[var] = relax.op.add(inner[0], relax.const(total.astype(np.float32)))
        joined.add(var)
    return _rebuilt(func, replace, {}) if replace else None
