"""Reading an operator chain backwards from its last call, for the rewrites that recognise a
hand-written operator (RMSNorm, GELU, PyTorch's safe softmax) as the one Relax op it computes.

Stage: normalise (rms_norms.py, gelus.py, softmaxes.py). The rewrites are PyExprMutators that
visit bindings in order: `Chain(mutator)` looks a variable up in the mutator's builder, so it
sees the operands as already rewritten (a norm made of a norm core and a weight multiply).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of


class Chain:
    """What the variables of the function being rewritten are bound to."""

    def __init__(self, mutator: relax.PyExprMutator):
        self.mutator = mutator

    def value(self, expr):
        """The expression `expr` is bound to (through variables bound to variables), else `expr`."""
        for _ in range(8):
            if not isinstance(expr, relax.Var):
                return expr
            bound = self.mutator.lookup_binding(expr)
            if bound is None:
                return expr
            expr = bound
        return expr

    def call(self, expr, *names: str):
        """The call of one of the operators `names` ("relax.rsqrt") `expr` is bound to, else None."""
        value = self.value(expr)
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in names:
            return value
        return None

    def array(self, expr) -> np.ndarray | None:
        """The numpy value of a constant (or a variable bound to one), else None."""
        value = self.value(expr)
        return value.value.numpy() if isinstance(value, tvm.ir.GenericConst) else None

    def scalar(self, expr) -> float | None:
        """The value of a one-element float constant (any rank: (), (1, 1, 1)), else None."""
        array = self.array(expr)
        if array is None or array.size != 1 or array.dtype.kind != "f":
            return None
        return float(array.reshape(()))

    def same_value(self, a, b) -> bool:
        """Whether `a` and `b` are one value: the same variable, through casts to its own dtype."""
        return self.uncast(a).same_as(self.uncast(b))

    def uncast(self, expr):
        """`x` for an `astype(x)` to x's own dtype (a no-op cast), through any number of them."""
        for _ in range(4):
            cast = self.call(expr, "relax.astype")
            if cast is None or dtype_of(cast.args[0]) != dtype_of(cast):
                return expr
            expr = cast.args[0]
        return expr


def last_axis_only(attrs_axis, rank: int, keepdims: bool) -> bool:
    """Whether a reduction's axes are exactly the last one, kept (mean(x, -1, keepdims=True))."""
    if attrs_axis is None or not keepdims or rank < 1:
        return False
    axes = [int(a) for a in attrs_axis]
    return len(axes) == 1 and axes[0] % rank == rank - 1
