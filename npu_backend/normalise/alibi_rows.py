"""Bloom's ALiBi rows and padding row, built from the attention mask's {0, 1} twin, as two GEMMs.

Stage: normalise (after masks.py and causal_rows.py made the attention's mask row per head:
`add(pad, alibi)`). In: a Relax IRModule. Out: the same module in which

    pad   = (M - 1) * 2 * FLT_MAX                        masks.py's where(m, 0, -inf) of the twin M
    alibi = slopes * ((matmul(M, U) - 1) * M)            mask_positions.py's cumsum, HF's positions
    row   = pad + alibi                                   (views between them)

(U the upper triangle of ones, slopes a constant per head) is

    B = matmul(M, [U | 2^127 I]) + [-1 ... | -2^127 ...]     (N, 2S): c - 1 and (M - 1) 2^127
    row = matmul([[slope_h, 4]], B as (N, 2, S))             (N, H, S)

Exact, bit for bit: M holds 0 and 1 (the twin masks.py builds from the mask's words). Each of
B's sums has integer terms below 2^24 (c_j - 1, the cumsum less one) or one nonzero product
(M_j 2^127) and the bias: exact in any order. A kept key (M_j = 1) scores
fl(slope_h (c_j - 1)) + 4 * 0, the one rounding of HF's slope * ((c - 1) * 1) + 0; a padded one
(M_j = 0) 4 * -2^127 = -2^129, which overflows to -inf, as -inf + alibi did.

Why: the setup was six kernels of a few hundred cycles each (the cumsum's GEMM, c - 1, * M, the
slopes' broadcast product, the padding row's chain and the sum), all of them launch and DMA
latency on 1 x s rows: 1,617 cycles of Bloom's 80,554 at 32 tokens on cgra-8x8.
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..relax_info import dtype_of, static_shape
from .chain_match import Chain
from .rewrite import as_pass, rewrite_functions

FLT_MAX = float(np.finfo(np.float32).max)
#: The padded keys' value in B: times 4 it overflows float32 to -inf; exact beside 0 and 1.
HUGE = np.float32(2.0 ** 127)
_VIEWS = ("relax.reshape", "relax.expand_dims", "relax.squeeze")


def alibi_rows(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with Bloom's padding + ALiBi rows built as the module doc says."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _AlibiRewriter))


alibi_rows_pass = as_pass(alibi_rows, "cgra.AlibiRows", ops=("relax.matmul",))


def _base(chain: Chain, expr):
    """What `expr` is a view of (through reshapes, expand_dims, squeezes and variables)."""
    for _ in range(6):
        view = chain.call(expr, *_VIEWS)
        if view is None:
            break
        expr = view.args[0]
    value = chain.value(expr)  # the variable bound to a call, else the value (a parameter, a constant)
    return expr if isinstance(value, relax.Call) else value


def _operands(chain: Chain, call, name: str):
    """`call`'s operands (a, b) when it is a call of `name` (through views), else None."""
    found = chain.call(_base(chain, call), name)
    return tuple(found.args) if found is not None else None


def _same(chain: Chain, a, b) -> bool:
    """Whether `a` and `b` are views of one value: one variable, or variables bound to equal
    calls of one operand (the twin is built once for the positions and once for the padding)."""
    a, b = _base(chain, a), _base(chain, b)
    return a.same_as(b) or tvm_ffi.structural_equal(chain.value(a), chain.value(b))


def padding_of(chain: Chain, expr):
    """M for `expr` a view of (M - 1) * 2 * FLT_MAX (masks.py's padding row of its twin M)."""
    outer = _operands(chain, expr, "relax.multiply")
    inner = _operands(chain, outer[0], "relax.multiply") if outer and chain.scalar(outer[1]) == FLT_MAX else None
    less = _operands(chain, inner[0], "relax.subtract") if inner and chain.scalar(inner[1]) == 2.0 else None
    return _base(chain, less[0]) if less and chain.scalar(less[1]) == 1.0 else None


def alibi_of(chain: Chain, expr, twin):
    """The slopes (a float32 array, one a head) and the product's call for `expr` a view of
    slopes * ((matmul(M, U) - 1) * M), M `twin`, else None."""
    product = chain.call(_base(chain, expr), "relax.multiply")
    if product is None:
        return None
    for slopes, positions in (product.args, reversed(product.args)):
        array = chain.array(slopes)
        factors = _operands(chain, positions, "relax.multiply")
        if array is None or array.dtype != np.float32 or factors is None:
            continue
        for less, mask in (factors, reversed(factors)):
            minus = _operands(chain, less, "relax.subtract")
            if not _same(chain, mask, twin) or minus is None or chain.scalar(minus[1]) != 1.0:
                continue
            scan = _operands(chain, minus[0], "relax.matmul")
            u = chain.array(scan[1]) if scan else None
            if u is not None and _same(chain, scan[0], twin) and u.ndim == 2 and \
                    np.array_equal(u, np.triu(np.ones((u.shape[0], u.shape[0]), u.dtype))):
                return array, product, positions
    return None


@relax.expr_functor.mutator
class _AlibiRewriter(relax.PyExprMutator):
    def __init__(self, mod=None):
        super().__init__(mod)
        self.made = []  # (the twin's value, slopes, shape, the rows): every layer reads one

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.add" \
                or dtype_of(call) != "float32" or static_shape(call) is None:
            return call
        chain = Chain(self)
        for pad, alibi in (call.args, reversed(call.args)):
            twin = padding_of(chain, pad)
            found = alibi_of(chain, alibi, twin) if twin is not None else None
            if found is None:
                continue
            value, shape = chain.value(twin), tuple(static_shape(call))
            for seen, slopes, at, rows in self.made:
                if at == shape and np.array_equal(slopes, found[0]) and tvm_ffi.structural_equal(seen, value):
                    return rows
            made = self.rows(call, twin, found)
            if made is not None:
                self.made.append((value, found[0], shape, made))
                return made
        return call

    def rows(self, call, twin, found):
        """The two GEMMs for the add `call` (module doc), else None where the shapes do not fit."""
        slopes, product, positions = found
        shape, m_shape, p_shape = static_shape(product), static_shape(twin), static_shape(positions)
        if shape is None or m_shape is None or p_shape is None or dtype_of(twin) != "float32" or \
                len(shape) < 2 or len(p_shape) != len(shape) or slopes.ndim > len(shape):
            return None
        s = shape[-1]
        heads = [1] * (len(shape) - slopes.ndim) + list(slopes.shape)
        n = int(np.prod(m_shape)) // s
        h = int(np.prod(heads))
        head_axes = [i for i, d in enumerate(heads) if d != 1]
        batch_axes = [i for i, d in enumerate(p_shape) if d != 1][:-1]
        if int(np.prod(m_shape)) != n * s or p_shape[-1] != s or heads[-1] != 1 or len(head_axes) > 1 \
                or any(p_shape[i] != 1 for i in head_axes) or s >= 1 << 24 \
                or (head_axes and batch_axes and batch_axes[-1] > head_axes[0]) \
                or int(np.prod(shape)) != n * h * s or int(np.prod(static_shape(call))) != n * h * s:
            return None  # rows (N, H, S) in this order, the add's output a view of them
        emit = self.builder_.emit
        weights = np.concatenate([np.triu(np.ones((s, s), np.float32)), np.eye(s, dtype=np.float32) * HUGE], axis=1)
        bias = np.concatenate([np.full(s, -1, np.float32), np.full(s, -HUGE, np.float32)])
        sums = emit(relax.op.matmul(emit(relax.op.reshape(twin, (n, s))), relax.const(weights), out_dtype="float32"))
        stacked = emit(relax.op.reshape(emit(relax.op.add(sums, relax.const(bias))), (n, 2, s)))
        lhs = np.stack([slopes.reshape(h), np.full(h, 4, np.float32)], axis=1).astype(np.float32)
        rows = emit(relax.op.matmul(relax.const(lhs), stacked, out_dtype="float32"))
        return emit(relax.op.reshape(rows, static_shape(call)))
