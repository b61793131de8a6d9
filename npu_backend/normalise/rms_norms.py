"""A hand-written RMSNorm becomes `R.nn.rms_norm`.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which each

    w * (x * rsqrt(mean(x ** 2, axis=-1, keepdims=True) + eps))        (x ** 2 or x * x)

is `rms_norm(x, w, axes=[-1], epsilon=eps)`: Hugging Face's Llama, Qwen, Mistral, Gemma (whose
`1 + weight` fold_weights has already made one constant) and T5 norms as torch.export leaves
them, the operands of each add and multiply in either order, casts of a value to its own dtype
(`hidden_states.to(torch.float32)` on float32) looked through. The weight is a constant along the
last axis only (shape (D,) or (1, ..., 1, D)); without a weight multiply the weight is ones.

Why: as six operators, power, mean and rsqrt stayed on the host and the add and the two
multiplies between them ran as separate NPU kernels, so every norm crossed between host and NPU
several times; as one operator it is one kernel (the transformer-ops family).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import dtype_of, shape_dims
from .chain_match import Chain, last_axis_only
from .rewrite import as_pass, rewrite_functions

_MULTIPLY = tvm.ir.Op.get("relax.multiply")
_RMS_NORM = tvm.ir.Op.get("relax.nn.rms_norm")


def rms_norms_as_ops(mod: tvm.IRModule) -> tvm.IRModule:
    """Every hand-written RMSNorm of `mod` as one `R.nn.rms_norm` (the rest removed if unused)."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _RmsNormRewriter))


rms_norms_pass = as_pass(rms_norms_as_ops, "cgra.RmsNormsAsOps", ops=("relax.rsqrt",))


@relax.expr_functor.mutator
class _RmsNormRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_MULTIPLY)
                and dtype_of(call) in ("float32", "float16")):
            return call
        chain = Chain(self)
        norm = _weighted(chain, call)
        norm = _core(chain, call) if norm is None else norm
        return with_span(norm, call.span) if norm is not None else call


def _core(chain: Chain, call):
    """rms_norm(x, ones) for `x * rsqrt(mean(x ** 2, -1, keepdims) + eps)`, else None."""
    for x, scale in (call.args, reversed(call.args)):
        eps = _rsqrt_of_mean_square(chain, scale, x)
        width = _width(x)
        if eps is not None and width is not None and len(shape_dims(call) or ()) == len(shape_dims(x)):
            ones = relax.const(np.ones((width,), dtype_of(x)))
            return relax.op.nn.rms_norm(chain.uncast(x), ones, axes=[-1], epsilon=eps)
    return None


def _width(expr) -> int | None:
    """The static size of the last axis (the others may be symbolic: a sequence length), else None."""
    dims = shape_dims(expr)
    return dims[-1] if dims and isinstance(dims[-1], int) else None


def _rsqrt_of_mean_square(chain: Chain, expr, x) -> float | None:
    """eps when `expr` is rsqrt(mean(x ** 2, axis=-1, keepdims=True) + eps) of this `x`."""
    rsqrt = chain.call(expr, "relax.rsqrt")
    add = chain.call(rsqrt.args[0], "relax.add") if rsqrt is not None else None
    if add is None:
        return None
    for mean_expr, eps_expr in (add.args, reversed(add.args)):
        mean, eps = chain.call(mean_expr, "relax.mean"), chain.scalar(eps_expr)
        if mean is None or eps is None or not eps >= 0 or \
                not last_axis_only(mean.attrs.axis, len(shape_dims(mean) or ()), bool(mean.attrs.keepdims)):
            continue
        if _is_square_of(chain, mean.args[0], x):
            return eps
    return None


def _is_square_of(chain: Chain, expr, x) -> bool:
    """Whether `expr` is power(x, 2) or x * x."""
    power = chain.call(expr, "relax.power")
    if power is not None:
        return chain.scalar(power.args[1]) == 2.0 and chain.same_value(power.args[0], x)
    product = chain.call(expr, "relax.multiply")
    return product is not None and chain.same_value(product.args[0], x) and chain.same_value(product.args[1], x)


def _weighted(chain: Chain, call):
    """rms_norm(x, w) for `w * rms_norm(x, ones)` (either order) with a constant w along the last
    axis only, else None."""
    for norm_expr, weight_expr in (call.args, reversed(call.args)):
        norm = chain.call(chain.uncast(norm_expr), "relax.nn.rms_norm")
        weight = chain.array(weight_expr)
        if norm is None or weight is None or len(shape_dims(call) or ()) != len(shape_dims(norm) or ()) or \
                dtype_of(norm) != dtype_of(call) or weight.dtype.name != dtype_of(call):
            continue
        current, width = chain.array(norm.args[1]), _width(norm)
        if current is None or width is None or not np.all(current == 1) or weight.ndim > len(shape_dims(norm)) or \
                weight.size != width or (weight.ndim and weight.shape[-1] != width):
            continue
        return relax.op.nn.rms_norm(norm.args[0], relax.const(weight.reshape(width)), axes=[-1],
                                    epsilon=float(norm.attrs.epsilon))
    return None
