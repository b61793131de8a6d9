"""A gate and an up projection of one input, multiplied after an activation, as one linear.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which

    act(linear(x, W_gate)) * linear(x, W_up)          act: SiLU (nn.silu or x * sigmoid(x)),
                                                      GELU's tanh or erf form

(either operand order; each linear `[reshape](matmul([reshape](x), permute_dims(W)))` with W a
float32 constant and no bias: Llama, Qwen2, Mistral, Gemma's MLPs; or the two halves, sliced
along the last axis, of one such linear's output: Phi-3's fused gate_up_proj) is

    y = matmul(flat(x), permute_dims(W)),  W[2j] = W_gate[j], W[2j + 1] = W_up[j]
    [reshape](act(strided_slice(y, [0::2])) * strided_slice(y, [1::2]))

A bfloat16 / float16 model's unit (TVM's importer: each linear matmul(x_h, W_h^T,
out_dtype="float32"), HF's activation rounded to h and widened back for the multiply) keeps its
rounding: `astype(astype(act(g), h), float32) * u` of two such linears (W and x in h) is the
same with `astype(astype(act(...), h), float32)` of the even columns, W interleaved in h (exact),
which the gated kernel rounds in its epilogue (kernels/gemm/gated.py).

which kernels/gemm/gated.py runs as one GEMM kernel: the input is read once for both
projections and the gate's activations stay in the scratchpad (they went through DRAM between
two kernels). Every output element is the same arithmetic as before (each column's dot product
is the same, the activation and the multiply too). Only where the chip runs the activation as
the kernel does (`fits(act)`: its function unit has it), else the model keeps its two kernels.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .chain_match import Chain
from .rewrite import as_pass, op_name, rewrite_each

_HALF_FLOATS = ("bfloat16", "float16")
_ACT_OPS = {"silu": relax.op.nn.silu, "gelu_tanh": relax.op.nn.gelu_tanh, "gelu": relax.op.nn.gelu}


def gated_linears_pass(fits):
    """The pass, rewriting only units whose activation `fits(act)` says the chip runs."""
    return as_pass(lambda mod: rewrite_each(mod, lambda m, _func: _GatedRewriter(m, fits)),
                   "cgra.GatedLinears", ops=("relax.matmul",))


@relax.expr_functor.mutator
class _GatedRewriter(relax.PyExprMutator):
    def __init__(self, mod, fits):
        super().__init__(mod)
        self.chain, self.fits = Chain(self), fits

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if op_name(call) == "relax.multiply" and dtype_of(call) == "float32":
            for gate, up in ((call.args[0], call.args[1]), (call.args[1], call.args[0])):
                fused = self._fused(gate, up, call)
                if fused is not None:
                    return fused
        return call

    def _fused(self, gate, up, call):
        via, gate = self._round_trip(gate)
        act, y = self._activation(gate)
        if act is None or not self.fits(act):
            return None
        pair = self._halves(y, up) if _dims(y) == _dims(up) else None
        if pair is None:
            return None
        flat, gate_weights, up_weights = pair
        weights = np.empty((2 * gate_weights.shape[0], gate_weights.shape[1]), gate_weights.dtype)
        weights[0::2], weights[1::2] = gate_weights, up_weights
        emit = self.builder_.emit
        constant = relax.const(weights, str(np.dtype(weights.dtype)))
        product = emit(relax.op.matmul(flat, emit(relax.op.permute_dims(constant)), out_dtype="float32"))
        width = weights.shape[0]
        halves = [emit(relax.op.strided_slice(product, [1], [start], [width], [2])) for start in (0, 1)]
        activated = emit(_ACT_OPS[act](halves[0]))
        if via:  # rounded to the 16-bit float and widened back, as the model does
            activated = emit(relax.op.astype(emit(relax.op.astype(activated, via)), "float32"))
        unit = relax.op.multiply(activated, halves[1])
        shape = shape_dims(call)  # its rows may be symbolic (a prefill's length)
        return unit if _dims(call) == _dims(product)[:1] + (str(width // 2),) else \
            relax.op.reshape(emit(unit), relax.ShapeExpr(shape))

    def _round_trip(self, gate):
        """(h, the rounded value) of `astype(astype(v, h), float32)`, v float32 and h a 16-bit float,
        else (None, gate)."""
        wide = self.chain.call(gate, "relax.astype")
        narrow = None if wide is None or str(wide.attrs.dtype) != "float32" else \
            self.chain.call(wide.args[0], "relax.astype")
        if narrow is None or str(narrow.attrs.dtype) not in _HALF_FLOATS or dtype_of(narrow.args[0]) != "float32":
            return None, gate
        return str(narrow.attrs.dtype), narrow.args[0]

    def _halves(self, y, up):
        """(the matmul's left operand, W_gate, W_up) of two linears of one input, or of the two
        halves (strided_slice of the last axis, [0, n) and [n, 2n)) of one linear's output
        (Phi-3's fused gate_up_proj, after split_slices.py), else None."""
        g, u = self._linear(y), self._linear(up)
        if g is not None and u is not None:
            if g[0].same_as(u[0]) and g[2].shape == u[2].shape and g[2].dtype == u[2].dtype and \
                    _dims(g[1]) == _dims(u[1]):
                return g[1], g[2], u[2]
            return None
        first, second = self.chain.call(y, "relax.strided_slice"), self.chain.call(up, "relax.strided_slice")
        if first is None or second is None or not first.args[0].same_as(second.args[0]):
            return None
        whole = self._linear(first.args[0])
        shape = shape_dims(first.args[0])
        if whole is None or shape is None or not isinstance(shape[-1], int) or shape[-1] % 2:
            return None
        half = shape[-1] // 2
        if _last_axis_range(first, shape) != (0, half) or _last_axis_range(second, shape) != (half, 2 * half):
            return None
        return whole[1], whole[2][:half], whole[2][half:]

    def _activation(self, expr):
        """(act, its operand) of a SiLU / GELU call `expr` is bound to, else (None, None)."""
        for name, act in (("relax.nn.silu", "silu"), ("relax.nn.gelu_tanh", "gelu_tanh"), ("relax.nn.gelu", "gelu")):
            found = self.chain.call(expr, name)
            if found is not None:
                return act, found.args[0]
        product = self.chain.call(expr, "relax.multiply")
        if product is not None:
            for x, sig in (product.args, reversed(product.args)):
                sigmoid = self.chain.call(sig, "relax.sigmoid")
                if sigmoid is not None and self.chain.same_value(sigmoid.args[0], x):
                    return "silu", x
        return None, None

    def _linear(self, expr):
        """(the input's source, the matmul's left operand, W) of a bias-free float32 linear
        `[reshape](matmul([reshape](x), permute_dims(W)))` of a constant 2-D W (float32, or a
        16-bit float as x is: TVM's importer's bfloat16 linear), else None."""
        reshaped = self.chain.call(expr, "relax.reshape")
        matmul = self.chain.call(reshaped.args[0] if reshaped is not None else expr, "relax.matmul")
        if matmul is None or dtype_of(matmul) != "float32" or len(shape_dims(matmul) or ()) != 2:
            return None
        permute = self.chain.call(matmul.args[1], "relax.permute_dims")
        if permute is None or (permute.attrs.axes is not None and [int(a) for a in permute.attrs.axes] != [1, 0]):
            return None
        weights = self.chain.array(permute.args[0])
        flat = matmul.args[0]
        if weights is None or weights.ndim != 2 or \
                str(np.dtype(weights.dtype)) not in ("float32", dtype_of(flat)) or dtype_of(flat) != dtype_of(permute):
            return None
        source = self.chain.call(flat, "relax.reshape")
        return (source.args[0] if source is not None else flat), flat, weights


def _dims(expr) -> tuple | None:
    """`expr`'s shape as text (a symbolic length by its variable's name), to compare."""
    dims = shape_dims(expr)
    return None if dims is None else tuple(str(d) for d in dims)


def _last_axis_range(call, shape) -> tuple | None:
    """(begin, end) of a step-1 strided_slice of the last axis of a tensor of `shape`, else None."""
    args = list(call.args[1:])
    out = shape_dims(call)
    if out is None or not isinstance(out[-1], int) or len(args) < 3 or not all(isinstance(a, relax.Tuple) for a in args[:3]):
        return None
    axes, begin = ([int(getattr(f, "value", f)) for f in a.fields] for a in args[:2])
    steps = [int(getattr(f, "value", f)) for f in args[3].fields] if len(args) > 3 and isinstance(args[3], relax.Tuple) else [1]
    if len(axes) != 1 or axes[0] % len(shape) != len(shape) - 1 or steps != [1] or begin[0] < 0:
        return None
    return begin[0], begin[0] + out[-1]
