"""An attention's score scale that is no power of two folds into the query projection's weights.

Stage: normalise (after attentions.py has written each attention in its normal form, before
qkv_merges.py merges the projections). In: a Relax IRModule. Out: the same module in which

    s = multiply(matmul(view(linear(x)), kᵀ), c)

`view` reshapes and transposes each read only by the next, `linear` x W [+ b] with constant W
(as stored or `permute_dims` of an (N, K) constant, read by this matmul alone) and b, `c` a
positive scalar constant that is no power of two, is `s = matmul(view(x W' [+ b']), kᵀ)` with
W' = W c and b' = b c, each rounded once from float64.

Why: the attention kernel multiplies by a power-of-two scale inside its exp or once per K / V
head, but by any other (Swin's head dim of 8: 8^-1/2) it scales each item's Q tile on the
vector unit, which the softmax keeps busy (kernels/attention/rows.py: a VFUNC of tq x d every
item, 34 cycles of Swin's 16 x 8 tiles on cgra-8x8, 48 items). In the weights it costs nothing.
Not bit-exact: q c is rounded once in the GEMM instead of q, then q c, rounded apart (the
scores S = (q c) kᵀ computed by PyTorch as (q kᵀ) c differ by a rounding either way); within a
few float32 ulps of the scores (tests/test_query_scales.py against float64).
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from .norm_folds import _const, _rebuilt, _Uses
from .rewrite import as_pass, op_name, replace_functions

_VIEWS = ("relax.reshape", "relax.permute_dims")


def query_scales(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every such score scale folded into its query projection."""
    mod = replace_functions(mod, _rewrite_function)
    return relax.transform.CanonicalizeBindings()(mod)


query_scales_pass = as_pass(query_scales, "cgra.QueryScales", ops=("relax.multiply",))


def folded_scale(value) -> float | None:
    """The scalar `c` of a float32 constant of one element that is positive, finite and no power
    of two (a power of two the attention kernel applies exactly for free), else None."""
    array = _const(value)
    if array is None or array.dtype != np.float32 or array.size != 1:
        return None
    c = float(array.reshape(()))
    if not (math.isfinite(c) and c > 0) or math.frexp(c)[0] == 0.5:
        return None
    return c


def _rewrite_function(func: relax.Function):
    """`func` with its scales folded, or None when none is."""
    uses = _Uses(func)
    replace = {}
    for var, value in uses.values.items():
        if op_name(value) != "relax.multiply" or len(value.args) != 2:
            continue
        scores, scale = value.args
        c = folded_scale(scale)
        matmul = uses.values.get(scores) if isinstance(scores, relax.Var) else None
        if c is None or op_name(matmul) != "relax.matmul" or uses.only(scores) != [(var, value)]:
            continue
        edits = _query_linear(uses, matmul.args[0], c)
        if edits is not None and not set(edits) & set(replace):
            replace.update(edits)
            replace[var] = scores  # s is the scores themselves (CanonicalizeBindings folds the alias)
    return _rebuilt(func, replace, {}) if replace else None


def _query_linear(uses: _Uses, q, c: float) -> dict | None:
    """{binding var: new value} scaling the linear that `q` views (each view read once), or None."""
    while isinstance(q, relax.Var) and op_name(uses.values.get(q)) in _VIEWS and len(uses.only(q) or ()) == 1:
        q = uses.values[q].args[0]
    if not isinstance(q, relax.Var) or len(uses.only(q) or ()) != 1:
        return None
    value, edits = uses.values.get(q), {}
    if op_name(value) == "relax.add":
        at = [i for i, arg in enumerate(value.args) if _const(arg) is not None]
        product = value.args[1 - at[0]] if len(at) == 1 else None
        if product is None or not isinstance(product, relax.Var) or len(uses.only(product) or ()) != 1:
            return None
        args = list(value.args)
        args[at[0]] = _scaled(_const(args[at[0]]), c)
        edits[q] = relax.Call(value.op, args, value.attrs, span=value.span)
        value, q = uses.values.get(product), product
    if op_name(value) != "relax.matmul":
        return None
    weight = _weight_edit(uses, value, q, c)
    return None if weight is None else {**edits, **weight}


def _weight_edit(uses: _Uses, matmul, var, c: float) -> dict | None:
    """The edit scaling `matmul`'s constant right operand: the constant itself, or the (N, K)
    constant under a permute_dims read by this matmul alone."""
    w = matmul.args[1]
    if _const(w) is not None:
        args = [matmul.args[0], _scaled(_const(w), c)]
        return {var: relax.Call(matmul.op, args, matmul.attrs, span=matmul.span)}
    transpose = uses.values.get(w) if isinstance(w, relax.Var) else None
    if op_name(transpose) != "relax.permute_dims" or _const(transpose.args[0]) is None or \
            uses.only(w) != [(var, matmul)]:
        return None
    return {w: relax.Call(transpose.op, [_scaled(_const(transpose.args[0]), c)], transpose.attrs,
                          span=transpose.span)}


def _scaled(array: np.ndarray, c: float) -> relax.Constant:
    """`array` times `c`, each element rounded once to float32 from float64."""
    return relax.const((array.astype(np.float64) * c).astype(np.float32))
