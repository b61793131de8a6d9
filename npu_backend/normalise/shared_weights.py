"""A batched matmul whose constant right operand repeats one matrix reads that matrix once.

Stage: normalise (after no_op_broadcasts.py). In: a Relax IRModule. Out: the same module in which
`matmul(x, C)`, C a constant of rank >= 3 whose every leading index holds the same (K, N) matrix
M (checked element by element, bit for bit) and x's own leading axes already those of the
result, is `matmul(x, M)`.

Exact: each output row is the same row of x times the same matrix, summed in the same order.
Why: torch.export (under no_grad) writes a linear layer of a 3-D input as `matmul(expand(x),
expand(W.T))`, and fold_weights folds the weight's transpose and broadcast into one constant of
a copy per batch element (Swin's attention output projection: 16 windows, 16 copies). A matmul
of per-batch right operands is one GEMM per batch element, and its residual add stayed a
kernel of its own ("not yet after a batched matmul"); with the matrix shared, the windows'
rows are one GEMM whose epilogue takes the bias and the residual (Swin at 64 x 64 on cgra-8x8:
the projection and its add, 2,598 + 2,466 and 2,476 + 1,368 cycles, become one kernel each).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import static_shape
from .rewrite import as_pass, rewrite_functions

_MATMUL = tvm.ir.Op.get("relax.matmul")


def shared_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every batched matmul of a repeated constant matrix reading the matrix once."""
    return rewrite_functions(mod, _SharedWeights)


shared_weights_pass = as_pass(shared_weights, "cgra.SharedWeights", ops=("relax.matmul",))


def repeated_matrix(value: np.ndarray) -> np.ndarray | None:
    """The (K, N) matrix every leading index of `value` (rank >= 3) holds, or None when two
    differ (compared as bits: a NaN equals itself, -0.0 differs from +0.0)."""
    if value.ndim < 3:
        return None
    stacked = np.ascontiguousarray(value).reshape(-1, *value.shape[-2:])
    bits = stacked.view(np.uint8).reshape(stacked.shape[0], -1)
    return stacked[0].copy() if (bits == bits[0]).all() else None


@relax.expr_functor.mutator
class _SharedWeights(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_MATMUL)
                and isinstance(call.args[1], tvm.ir.GenericConst)):
            return call
        lhs_shape, out_shape = static_shape(call.args[0]), static_shape(call)
        if lhs_shape is None or out_shape is None or len(lhs_shape) < 2 or lhs_shape[:-2] != out_shape[:-2]:
            return call  # the constant's batch axes shape the result: it is no broadcast
        matrix = repeated_matrix(call.args[1].value.numpy())
        if matrix is None:
            return call
        return relax.Call(call.op, [call.args[0], relax.const(matrix)], call.attrs, span=call.span)
