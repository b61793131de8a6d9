"""Integer arithmetic on an attention mask (Bloom's ALiBi positions) as exact float32 arithmetic.

Stage: normalise (before masks.py). In: a Relax IRModule. Out: the same module in which every
`astype(e, "float32")` whose integer operand e is built only from

    an `attention_mask` input (an int32 / int64 parameter of that name)    values 0 or 1
    integer constants                                                    their values
    cumsum(a) along the last axis (n long, not exclusive)               n times a's range
    add, subtract, multiply of two such operands (broadcasting)         interval arithmetic
    reshape, expand_dims, squeeze, permute_dims                          a's range

is computed in float32 from the mask's {0, 1} twin M = astype(mask != 0, "float32") (masks.py
builds it on the NPU from the int64's words): the same ops on float32, the cumsum as M's rows
times the n x n upper triangle of ones (a float32 GEMM). Bloom writes its ALiBi positions as
`astype((cumsum(mask) - 1) * mask, float32)`: four int64 host ops (cumsum, subtract, multiply,
astype) between NPU kernels; now an elementwise NPU chain after one small GEMM.

The value-range contract: the mask holds 0 and 1 only (Hugging Face's documented contract for
`attention_mask`: "Mask values selected in [0, 1]"). Then M equals the mask, every value above is
an integer whose range the table bounds, and the rewrite applies only when every range stays
within 2^24 in magnitude: each float32 sum, difference and product of such integers is exact,
and so is the GEMM's (products 0 or 1, partial sums of integers at most n <= 2^24), in any
order. The result equals the int64 arithmetic's, cast, bit for bit. A mask with other values
(the contract broken) reads as its nonzero-ness.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, static_shape
from .chain_match import Chain
from .rewrite import as_pass, rewrite_functions

#: The input names whose values the contract bounds to 0 and 1.
MASK_NAMES = ("attention_mask",)
#: Integers float32 holds exactly: the largest range the rewrite accepts.
EXACT = 1 << 24
_LAYOUT = ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.permute_dims")
_ARITHMETIC = {"relax.add": lambda a, b: (a[0] + b[0], a[1] + b[1]),
               "relax.subtract": lambda a, b: (a[0] - b[1], a[1] - b[0]),
               "relax.multiply": lambda a, b: (min(x * y for x in a for y in b), max(x * y for x in a for y in b))}


def mask_positions_as_float(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every float32 cast of attention-mask integer arithmetic computed in float32."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _PositionRewriter))


mask_positions_pass = as_pass(mask_positions_as_float, "cgra.MaskPositions", ops=("relax.astype",))


def _is_mask(expr) -> bool:
    return isinstance(expr, relax.Var) and dtype_of(expr) in ("int32", "int64") and \
        any(expr.name.endswith(name) for name in MASK_NAMES) and static_shape(expr) is not None


@relax.expr_functor.mutator
class _PositionRewriter(relax.PyExprMutator):
    def __init__(self, mod=None):
        super().__init__(mod)
        self.twins = {}

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.astype" \
                or dtype_of(call) != "float32" or dtype_of(call.args[0]) not in ("int32", "int64"):
            return call
        plan = self.bound(Chain(self), call.args[0], 0)
        if plan is None or max(abs(plan[1][0]), abs(plan[1][1])) > EXACT:
            return call
        return plan[0]()

    def bound(self, chain: Chain, expr, depth: int):
        """(a thunk emitting `expr`'s float32 form, its value range) when `expr` is built as the
        module doc's table says, else None (nothing emitted until the whole chain is known)."""
        value = chain.value(expr)
        if depth > 16:
            return None
        if _is_mask(value):
            return (lambda: self.twin(value)), (0, 1)
        array = chain.array(value)
        if array is not None and array.dtype.kind in "iu" and array.size:
            return (lambda: relax.const(array.astype(np.float32))), (int(array.min()), int(array.max()))
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        name = value.op.name
        if name in _ARITHMETIC:
            a, b = (self.bound(chain, arg, depth + 1) for arg in value.args)
            if a is None or b is None:
                return None
            emit = lambda: self.builder_.emit(relax.Call(value.op, [a[0](), b[0]()], value.attrs))  # noqa: E731
            return emit, _ARITHMETIC[name](a[1], b[1])
        if name in _LAYOUT:
            a = self.bound(chain, value.args[0], depth + 1)
            return None if a is None else (
                (lambda: self.builder_.emit(relax.Call(value.op, [a[0](), *value.args[1:]], value.attrs))), a[1])
        if name == "relax.cumsum":
            return self.scan(chain, value, depth)
        return None

    def scan(self, chain: Chain, call, depth: int):
        """cumsum along the last axis as a GEMM by the upper triangle of ones, with its range."""
        shape, axis = static_shape(call), call.attrs.axis
        if shape is None or not shape or axis is None or int(axis) % len(shape) != len(shape) - 1 \
                or bool(call.attrs.exclusive) or (call.attrs.dtype is not None and str(call.attrs.dtype) not in
                                                  ("", "int32", "int64")):
            return None
        a = self.bound(chain, call.args[0], depth + 1)
        if a is None:
            return None
        n, rows = shape[-1], int(np.prod(shape[:-1]))

        def emit():
            flat = self.builder_.emit(relax.op.reshape(a[0](), (rows, n)))
            summed = self.builder_.emit(relax.op.matmul(flat, relax.const(np.triu(np.ones((n, n), np.float32))),
                                                        out_dtype="float32"))
            return self.builder_.emit(relax.op.reshape(summed, shape))

        return emit, (n * min(a[1][0], 0), n * max(a[1][1], 0))

    def twin(self, mask):
        """astype(astype(mask, bool), float32), emitted once: masks.py turns it into the NPU's
        {0, 1} twin, the one the padding mask's where reads too."""
        if mask not in self.twins:
            nonzero = self.builder_.emit(relax.op.astype(mask, "bool"))
            self.twins[mask] = self.builder_.emit(relax.op.astype(nonzero, "float32"))
        return self.twins[mask]
