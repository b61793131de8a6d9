"""A batch norm that no conv2d took becomes a per-channel scale and shift.

Stage: normalise (after fold_weights, which folds every batch norm that follows a conv2d with
constant weights into the conv). In: a Relax IRModule. Out: the same module in which each
remaining inference (training=False) `batch_norm(x, gamma, beta, mean, var)[0]` with constant
statistics (gamma 1 without `scale`, beta 0 without `center`) is
`x * scale + shift`, scale = gamma / sqrt(var + eps) and shift = beta - mean * scale computed
with numpy (float64, then rounded to x's float32, float16 or bfloat16), shaped to broadcast
along the norm's axis. (TVM's host batch norm on bfloat16 returns float32, which the next NPU
kernel refuses.)

Why: a standalone batch norm (after a pool, an add, at a network's input) has no NPU kernel;
a multiply and an add by per-channel constants are two ELTWISE kernels on the vector unit.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import dtype_of, static_shape
from .rewrite import rewrite_functions

_BATCH_NORM = tvm.ir.Op.get("relax.nn.batch_norm")
_FLOATS = ("float32", "float16", "bfloat16")


def batch_norms_as_scale_shift(mod: tvm.IRModule) -> tvm.IRModule:
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _NormRewriter))


@relax.expr_functor.mutator
class _NormRewriter(relax.PyExprMutator):
    def visit_tuple_getitem_(self, item):
        item = self.visit_expr_post_order(item)
        if not isinstance(item, relax.TupleGetItem) or item.index != 0:
            return item
        norm = item.tuple_value
        if isinstance(norm, relax.Var):
            norm = self.lookup_binding(norm)
        if not (isinstance(norm, relax.Call) and norm.op.same_as(_BATCH_NORM)) or bool(norm.attrs.training):
            return item  # training: the batch's own statistics, not the constants
        data = norm.args[0]
        stats = [_constant(arg) for arg in norm.args[1:5]]
        shape = static_shape(data)
        dtype = dtype_of(data)
        if any(s is None for s in stats) or shape is None or dtype not in _FLOATS:
            return item
        gamma, beta, mean, var = (s.astype(np.float64) for s in stats)
        gamma = gamma if bool(norm.attrs.scale) else np.ones_like(gamma)  # scale=False: no gamma
        beta = beta if bool(norm.attrs.center) else np.zeros_like(beta)  # center=False: no beta
        scale = gamma / np.sqrt(var + float(norm.attrs.epsilon))
        shift = beta - mean * scale
        axis = int(norm.attrs.axis) % len(shape)
        broadcast = tuple(shape[axis] if i == axis else 1 for i in range(len(shape)))
        scaled = self.builder_.emit(with_span(relax.op.multiply(
            data, relax.const(_rounded(scale, dtype).reshape(broadcast), dtype)), norm.span))
        return with_span(relax.op.add(scaled, relax.const(_rounded(shift, dtype).reshape(broadcast), dtype)), norm.span)


def _rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 `values` in `dtype` (bfloat16 through float32, as ml_dtypes casts: numpy has none)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return values.astype(np.float32).astype(ml_dtypes.bfloat16)
    return values.astype(dtype)


def _constant(expr):
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None
