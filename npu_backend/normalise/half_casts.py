"""The casts PyTorch's bfloat16 / float16 models write, where the graph can do without them, exactly.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which

- an `astype` to the dtype its operand already has is that operand (HF's `.to(torch.float32)`
  of what TVM's importer already made float32: its matmul(out_dtype="float32") stores float32);
- `astype(take(C, i), float32)` of a 16-bit float constant table C, through reshapes, is
  `take(float32(C), i)` (an embedding lookup widened: widening is exact, so the table is widened
  once at compile time);
- `astype(where(m, C1, C2), float32)` of 16-bit float constants is `where(m, float32(C1),
  float32(C2))` (HF's attention mask min / 0 in the model's dtype, widened for the softmax): the
  float32 mask rewrites (masks.py) then build it on the NPU as they do a float32 model's;
- a layer norm of a 16-bit float x with 16-bit constant gamma and beta runs in float32 on x
  widened, the constants widened, the result rounded to x's dtype (PyTorch's CPU kernel's
  arithmetic; TVM's own layer norm refuses bfloat16), so the norm kernel takes it; so does a
  GELU, tanh, sigmoid, SiLU, exp, softmax or 2-d pool of a 16-bit float (the vector unit, the
  fabric and POOL compute them in float32 only; a max is exact either way, an average PyTorch
  also sums in float32 and rounds once);
- a float32 constant C of 16-bit float values added to `matmul(a_h, b_h, out_dtype="float32")` or a conv2d's
  (the bias TVM's importer widened: frontend/torch_import.py) is `astype(C_h, float32)`, exactly,
  so that the GEMM's pattern takes it as its bias in h and rounds the biased sum once on store
  where the model casts it to h (kernels/gemm/half_bias.py);
- `astype(matmul(a, b, out_dtype="float32"), h)` of 16-bit float a, b and h is
  `matmul(a, b, out_dtype=h)`: the GEMM rounds its float32 sum to h on store (its EPILOGUE's
  rounding store, kernels/gemm/epilogue.py's half_out), the same value the two ops compute;
- a layout op (permute_dims, reshape) of `astype(o, h)`, o a float32 batched matmul's result
  through layout ops (an attention's P V, HF's `attn_output.to(h)` before its head merge), is
  `astype(layout(o), h)`: a conversion commutes with moving elements, exactly, and the attention
  kernel then writes the merged (B, S, H, D) layout itself (kernels/attention/head_layouts.py)
  instead of a transposing copy of the 16-bit output running after the cast;
- `astype(layout(astype(z, h)), float32)` of a float32 z (a biased linear's output rounded to h,
  split into heads, widened for the attention: ViT's q, k and v) is `layout(astype(astype(z, h),
  float32))`: widening commutes with moving elements too, exactly; the two casts are one
  round-trip kernel and the attention kernel reads the head split itself.

Why: HF's bfloat16 Llama casts to float32 around every norm, softmax and activation, and TVM's
importer writes each bfloat16 linear as matmul(out_dtype="float32"); every astype ran on the host
(18 on a two-layer Llama, 29.9 k modelled host cycles against its 16.6 k NPU cycles). What these
rewrites leave are real conversions, which the cast kernel runs on the NPU (kernels/elementwise/cast.py).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .rewrite import as_pass, rewrite_functions

HALF_FLOATS = ("bfloat16", "float16")
_OPS = {name: tvm.ir.Op.get(f"relax.{name}") for name in ("astype", "take", "where", "matmul", "reshape",
                                                            "permute_dims", "add")}
_OPS["conv2d"] = tvm.ir.Op.get("relax.nn.conv2d")
_OPS["layer_norm"] = tvm.ir.Op.get("relax.nn.layer_norm")
#: One-input float functions the vector unit computes in float32 only.
_FLOAT32_UNARY = tuple(tvm.ir.Op.get(f"relax.{name}") for name in
                       ("nn.gelu", "nn.gelu_tanh", "tanh", "sigmoid", "nn.silu", "exp", "nn.softmax",
                        "nn.max_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d"))


def half_casts_folded(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with the casts of the module docstring folded away."""
    return rewrite_functions(mod, _CastRewriter)


half_casts_pass = as_pass(half_casts_folded, "cgra.HalfCasts", ops=("relax.astype", "relax.nn.layer_norm", "relax.nn.gelu",
                                                                      "relax.nn.gelu_tanh", "relax.tanh", "relax.sigmoid",
                                                                      "relax.nn.silu", "relax.exp", "relax.nn.softmax",
                                                                      "relax.nn.max_pool2d", "relax.nn.avg_pool2d",
                                                                      "relax.nn.adaptive_avg_pool2d"))


def is_op(expr, name: str) -> bool:
    """Whether `expr` is a call of relax.`name` (a name of `_OPS`: the half-format passes' ops)."""
    return isinstance(expr, relax.Call) and expr.op.same_as(_OPS[name])


def bound_through(mutator: relax.PyExprMutator, expr):
    """The value `expr` is bound to in `mutator`'s function (through aliases), else `expr`."""
    while isinstance(expr, relax.Var):
        bound = mutator.lookup_binding(expr)
        if bound is None:
            return expr
        expr = bound
    return expr


def _widened(expr):
    """A 16-bit float constant as a float32 one (exact), else None."""
    if isinstance(expr, tvm.ir.GenericConst) and dtype_of(expr) in HALF_FLOATS:
        import numpy as np

        return relax.const(expr.value.numpy().astype(np.float32), "float32")
    return None


def _narrowed(constant, dtype: str):
    """A float32 constant as a `dtype` one where every value is one of `dtype`'s (exact), else None."""
    import ml_dtypes
    import numpy as np

    value = constant.value.numpy()
    half = value.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16)
    if not np.array_equal(half.astype(np.float32), value):  # (a NaN is never equal: left alone)
        return None
    return relax.const(half, dtype)


def _float32_layer_norm(builder, call):
    """A 16-bit float layer norm with constant gamma and beta as PyTorch computes it: in float32
    (x and the constants widened exactly), the result rounded once to the 16-bit float; else the call."""
    x, gamma, beta = call.args
    dtype = dtype_of(x)
    gamma32, beta32 = _widened(gamma), _widened(beta)
    if dtype not in HALF_FLOATS or gamma32 is None or beta32 is None:
        return call
    wide = builder.emit(relax.op.astype(x, "float32"))
    normed = builder.emit(relax.op.nn.layer_norm(wide, gamma32, beta32, axes=call.attrs.axes,
                                                 epsilon=call.attrs.epsilon, center=call.attrs.center,
                                                 scale=call.attrs.scale))
    return relax.op.astype(normed, dtype)


@relax.expr_functor.mutator
class _CastRewriter(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.folds = {}  # (operand, dtype) -> the variable holding the folded cast, or None

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if is_op(call, "permute_dims") or is_op(call, "reshape"):
            return self._layout_before_cast(call)
        if is_op(call, "layer_norm"):
            return _float32_layer_norm(self.builder_, call)
        if is_op(call, "add"):
            return self._half_bias(call)
        if isinstance(call, relax.Call) and any(call.op.same_as(op) for op in _FLOAT32_UNARY) \
                and dtype_of(call.args[0]) in HALF_FLOATS:  # PyTorch's CPU kernels: in float32, rounded once
            wide = self._cast(call.args[0], "float32")
            inner = self.builder_.emit(relax.Call(call.op, [wide, *call.args[1:]], call.attrs))
            return relax.op.astype(inner, dtype_of(call.args[0]))
        if not is_op(call, "astype"):
            return call
        source, target = call.args[0], str(call.attrs.dtype)
        if dtype_of(source) == target:
            return source
        return self._cast(source, target, call)

    def _cast(self, source, target: str, call=None):
        """astype(source, target) folded (module doc), else `call` (or that astype, emitted)."""
        key = (source, target)
        if key not in self.folds:  # HF widens the embedding twice (the norm's input, the residual): one lookup
            folded = self._fold(source, dtype_of(source), target)
            self.folds[key] = None if folded is None else self.builder_.emit(folded)
        if self.folds[key] is not None:
            return self.folds[key]
        return call if call is not None else self.builder_.emit(relax.op.astype(source, target))

    def _half_bias(self, call):
        """add(matmul(a_h, b_h, out_dtype=float32), C) with C a float32 constant of h values as
        add(., astype(C_h, float32)) (module doc), else the call."""
        for index in (0, 1):
            matmul, constant = self._bound(call.args[1 - index]), call.args[index]
            if not isinstance(constant, tvm.ir.GenericConst) or dtype_of(constant) != "float32" \
                    or not (is_op(matmul, "matmul") or is_op(matmul, "conv2d")) or str(matmul.attrs.out_dtype) != "float32":
                continue
            half = {dtype_of(arg) for arg in matmul.args}
            if len(half) != 1 or not half <= set(HALF_FLOATS):
                continue
            narrowed = _narrowed(constant, half.pop())
            if narrowed is None:
                continue
            args = list(call.args)
            args[index] = self.builder_.emit(relax.op.astype(narrowed, "float32"))
            return relax.Call(call.op, args, call.attrs)
        return call

    def _layout_before_cast(self, call):
        """`layout(astype(o, h))` as `astype(layout(o), h)` where o is a float32 batched matmul's
        result through layout ops (module doc), else the call."""
        cast = self._bound(call.args[0])
        if not is_op(cast, "astype") or str(cast.attrs.dtype) not in HALF_FLOATS or dtype_of(cast.args[0]) != "float32":
            return call
        source = self._bound(cast.args[0])
        while is_op(source, "permute_dims") or is_op(source, "reshape"):
            source = self._bound(source.args[0])
        if not is_op(source, "matmul") or len(shape_dims(source) or ()) < 3:
            return call
        moved = self.builder_.emit(relax.Call(call.op, [cast.args[0], *call.args[1:]], call.attrs))
        return relax.op.astype(moved, str(cast.attrs.dtype))

    def _widen_before_layout(self, value):
        """`layout(astype(z, h))` widened to float32, z float32, as `layout(astype(astype(z, h),
        float32))` (module doc), else None."""
        layouts = []
        while is_op(value, "permute_dims") or is_op(value, "reshape"):
            layouts.append(value)
            value = self._bound(value.args[0])
        if not layouts or not is_op(value, "astype") or dtype_of(value.args[0]) != "float32":
            return None
        moved = relax.op.astype(layouts[-1].args[0], "float32")
        for layout in reversed(layouts):
            moved = relax.Call(layout.op, [self.builder_.emit(moved), *layout.args[1:]], layout.attrs)
        return moved

    def _bound(self, expr):
        """The call a variable is bound to, else the expression."""
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            return expr if bound is None else bound
        return expr

    def _fold(self, source, dtype: str, target: str):
        """The value astype(source, target) computes without the cast, or None."""
        value = self._bound(source)
        if dtype in HALF_FLOATS and target == "float32":
            widened = self._widen(value)
            return widened if widened is not None else self._widen_before_layout(value)
        if dtype == "float32" and target in HALF_FLOATS and is_op(value, "matmul") \
                and str(value.attrs.out_dtype) == "float32" \
                and all(dtype_of(arg) == target for arg in value.args):
            return relax.op.matmul(*value.args, out_dtype=target)
        return None

    def _widen(self, value):
        """`value` (a 16-bit float) computed in float32 from widened constants, or None: a take of
        a constant table under reshapes, or a where between two constants."""
        if is_op(value, "reshape"):
            inner = self._widen(self._bound(value.args[0]))
            return None if inner is None else relax.op.reshape(self.builder_.emit(inner), value.args[1])
        if is_op(value, "take"):
            table = _widened(value.args[0])
            return None if table is None else relax.op.take(table, value.args[1], axis=value.attrs.axis,
                                                              mode=value.attrs.mode)
        if is_op(value, "where"):
            high, low = _widened(value.args[1]), _widened(value.args[2])
            return None if high is None or low is None else relax.op.where(value.args[0], high, low)
        return None


def half_norm_ones_marked(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with the float32 weight of ones of each RMSNorm cast to a 16-bit float (HF's
    `weight * norm(x.float()).to(h)`, which rms_norms.py writes as multiply(g, astype(rms_norm(x,
    ones), h))) as `R.ones`: the norm kernel sees in its own pattern that it applies no float32
    weight (kernels/rows/half_norms.py), where a constant reaches it as a parameter."""
    return rewrite_functions(mod, _OnesMarker)


half_norm_ones_pass = as_pass(half_norm_ones_marked, "cgra.HalfNormOnes", ops=("relax.nn.rms_norm",))


@relax.expr_functor.mutator
class _OnesMarker(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not is_op(call, "astype") or str(call.attrs.dtype) not in HALF_FLOATS:
            return call
        norm = self.lookup_binding(call.args[0]) if isinstance(call.args[0], relax.Var) else call.args[0]
        if not (isinstance(norm, relax.Call) and norm.op.same_as(tvm.ir.Op.get("relax.nn.rms_norm"))):
            return call
        weight = norm.args[1]
        if not isinstance(weight, tvm.ir.GenericConst) or dtype_of(weight) != "float32" \
                or not (weight.value.numpy() == 1).all():
            return call
        ones = self.builder_.emit(relax.op.ones(relax.ShapeExpr(list(weight.value.numpy().shape)), "float32"))
        marked = self.builder_.emit(relax.op.nn.rms_norm(norm.args[0], ones, axes=norm.attrs.axes,
                                                         epsilon=norm.attrs.epsilon))
        return relax.op.astype(marked, str(call.attrs.dtype))
