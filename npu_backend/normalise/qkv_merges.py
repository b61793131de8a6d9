"""Attention's q, k and v projections of one input as one linear over their weights side by side.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which two or
more float32 linears of one input (Llama, Qwen2, Mistral, Gemma, GPT-J: q_proj, k_proj, v_proj
reading the same normed activations), each

    [add(b_i)](matmul(reshape(x), permute_dims(W_i)))  -> [reshape (1, S, n_i)] -> reshape (1, S, H_i, D)

(W_i a 2-D constant, b_i an optional constant bias, all or none of the group with one; each
output read only by its reshapes into heads of one size D), are

    y = [add(concat(b))](matmul(reshape(x), permute_dims(concat(W))))        (S, sum n_i)
    part_i = strided_slice(reshape(y, (1, S, sum n_i / D, D)), [2], [o_i / D], [(o_i + n_i) / D])

the form Phi-3's and GPT-NeoX's fused qkv projection already has after split_slices.py: the
part is a slice of a view of y, which the transposing copy, the RoPE kernel (its box's origin,
kernels/elementwise/rope.py) or the attention kernel reading it takes as a box.

A bfloat16 / float16 model's projections (BERT's, ViT's: TVM's importer and half_casts.py write
them so) round their biased float32 sum to h and widen it straight back,

    astype(astype(add(matmul(x_h, permute_dims(W_i)), astype(b_i, float32)), h), float32)

(b_i h values, W_i h); they merge the same way, the concatenated h bias widened and the merged
sum rounded and widened back once: kernels/gemm/half_bias.py's `cgra.linear_bias_rounded_wide`,
one GEMM kernel. Each column is rounded as before, so the parts hold the same bits.

Exact: every output column is the same dot product over the same input row, the bias add the
same float32 add; concatenating weights moves no value.
Why: the three projections were three GEMM kernels of N = 64, 32, 32 (Llama at 32 tokens on
cgra-8x8: 2,960 + 2 x 1,936 cycles per layer, 1.45-1.89x their ideal), each reading the input
again and each too narrow to fill the PE array's columns; one of N = 128 is 1.22x.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .rewrite import as_pass, bound_values, op_name, rewrite_functions

#: The 16-bit floats a projection's sum may be rounded to (module doc).
HALF_FLOATS = ("bfloat16", "float16")


def qkv_merged(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every group of head projections of one input as one linear (module doc)."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _MergeRewriter))


qkv_merges_pass = as_pass(qkv_merged, "cgra.QkvMerges", ops=("relax.matmul",))


class _Member:
    """One projection of a group: its weights (n, K), bias or None, and the bound variable of
    its reshape into heads (the call the rewrite replaces)."""

    def __init__(self, flat, weights, bias, heads_var, head_dim, rounded=None):
        self.flat, self.weights, self.bias = flat, weights, bias
        self.heads_var, self.head_dim = heads_var, head_dim
        self.rounded = rounded  # the 16-bit float the sum is rounded to and widened back from, or None


@relax.expr_functor.mutator
class _MergeRewriter(relax.PyExprMutator):
    def __init__(self, mod=None):
        super().__init__(mod)
        self.parts = {}  # heads variable -> (group index, member index)
        self.groups = []  # [list of _Member]
        self.merged = {}  # group index -> reshaped merged output (emitted at its first part)
        for func in (mod.functions.values() if mod is not None else ()):
            if isinstance(func, relax.Function) and "Composite" not in (func.attrs or {}):
                self._scan(func)

    def _scan(self, func):
        values, uses = bound_values(func)
        by_source = {}
        for var, value in values.items():
            member = _member(var, value, values, uses)
            if member is not None:
                source = values.get(member.flat)
                key = source.args[0] if op_name(source) == "relax.reshape" else member.flat
                by_source.setdefault(key, []).append(member)
        for members in by_source.values():
            if _mergeable(members):
                for index, member in enumerate(members):
                    self.parts[member.heads_var] = (len(self.groups), index)
                self.groups.append(members)

    def visit_var_binding_(self, binding):
        place = self.parts.get(binding.var)
        if place is None:
            super().visit_var_binding_(binding)
            return
        group, index = place
        if group not in self.merged:
            self.merged[group] = self._emit_merged(self.groups[group], shape_dims(binding.var))
        members = self.groups[group]
        head_dim = members[0].head_dim
        begin = sum(m.weights.shape[0] for m in members[:index]) // head_dim
        end = begin + members[index].weights.shape[0] // head_dim
        part = relax.op.strided_slice(self.merged[group], [2], [begin], [end])
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(part)))

    def _emit_merged(self, members, heads_shape):
        """The merged linear, emitted, viewed as (1, S, heads of all members, D)."""
        emit = self.builder_.emit
        weights = np.concatenate([m.weights for m in members])
        flat = self.visit_expr(members[0].flat)
        y = emit(relax.op.matmul(flat, emit(relax.op.permute_dims(relax.const(weights, str(weights.dtype)))),
                                 out_dtype="float32"))
        rounded = members[0].rounded
        if members[0].bias is not None:
            bias = relax.const(np.concatenate([m.bias for m in members]), rounded or "float32")
            y = emit(relax.op.add(y, emit(relax.op.astype(bias, "float32")) if rounded else bias))
        if rounded:  # the sum rounded once per column, as each projection did, and widened back
            y = emit(relax.op.astype(emit(relax.op.astype(y, rounded)), "float32"))
        head_dim = members[0].head_dim
        return emit(relax.op.reshape(y, relax.ShapeExpr([*heads_shape[:-2], weights.shape[0] // head_dim, head_dim])))


def _member(var, value, values, uses):
    """The _Member of a float32 linear (or a 16-bit one's rounded and widened back: module doc)
    bound to `var` whose output only a reshape into heads reads, else None."""
    bias, rounded = None, None
    inner = _rounded_sum(value, values, uses)
    if inner is not None:
        rounded, value = dtype_of(values[value.args[0]]), values[inner]
    if op_name(value) == "relax.add":
        matmul_var, bias_expr = _split_bias(value, values)
        if matmul_var is None or len(uses.get(matmul_var, ())) != 1:
            return None
        bias, value = bias_expr, values[matmul_var]
    if str(getattr(bias, "dtype", rounded or "float32")) != (rounded or "float32"):
        return None  # (a rounded sum's bias: h values widened; a float32 one's: float32)
    if op_name(value) != "relax.matmul" or dtype_of(value) != "float32" or len(shape_dims(value) or ()) != 2:
        return None
    permute = values.get(value.args[1])
    if op_name(permute) != "relax.permute_dims" or (permute.attrs.axes is not None and
                                                    [int(a) for a in permute.attrs.axes] != [1, 0]):
        return None
    weights = _array(permute.args[0])
    # float32, or a 16-bit float model's weights under TVM's matmul(..., out_dtype="float32")
    if weights is None or weights.ndim != 2 or str(weights.dtype) not in ("float32", "bfloat16", "float16") \
            or str(weights.dtype) != dtype_of(value.args[0]):
        return None
    if bias is not None and bias.shape != (weights.shape[0],):
        return None
    heads = _heads_reshape(var, values, uses)
    if heads is None:
        return None
    return _Member(value.args[0], weights, bias, heads[0], heads[1], rounded)


def _rounded_sum(value, values, uses):
    """The variable of the float32 sum in astype(astype(sum, h), float32) (h bfloat16 or float16),
    each read only by the next, else None."""
    if op_name(value) != "relax.astype" or dtype_of(value) != "float32" or not isinstance(value.args[0], relax.Var):
        return None
    half = values.get(value.args[0])
    if op_name(half) != "relax.astype" or dtype_of(half) not in HALF_FLOATS or len(uses.get(value.args[0], ())) != 1:
        return None
    inner = half.args[0]
    if not isinstance(inner, relax.Var) or dtype_of(inner) != "float32" or len(uses.get(inner, ())) != 1:
        return None
    return inner


def _split_bias(add, values):
    """(the matmul variable, the bias array) of add(matmul, const) in either order (the constant
    also as astype(const, float32), a 16-bit bias widened: the array then in its own dtype),
    else (None, None)."""
    for m, b in (add.args, reversed(add.args)):
        widened = values.get(b) if isinstance(b, relax.Var) else None
        array = _array(widened.args[0]) if op_name(widened) == "relax.astype" else _array(b)
        if isinstance(m, relax.Var) and op_name(values.get(m)) == "relax.matmul" and array is not None:
            return m, array
    return None, None


def _heads_reshape(var, values, uses):
    """(the variable, head size) of the reshape (1, S, n) -> (1, S, H, D) (or, static, (B, T, n) ->
    (B, T, H, D), B x T = S: Swin's windows of tokens) that alone reads `var` (through one reshape
    to (1, S, n)), else None."""
    shape = shape_dims(var)  # its rows may be a symbolic length (a prefill's)
    for _ in range(2):
        readers = uses.get(var, ())
        if len(readers) != 1 or op_name(values[readers[0]]) != "relax.reshape":
            return None
        var = readers[0]
        out = shape_dims(var)
        if out is None or shape is None:
            return None
        rows = str(shape[0]) if out[0] == 1 else _product(out[0], out[1])  # Swin's (windows, tokens, H, D)
        if len(out) == 4 and rows == str(shape[0]) and \
                all(isinstance(d, int) for d in (out[2], out[3], shape[1])) and out[2] * out[3] == shape[1]:
            return var, out[3]
    return None


def _product(windows, tokens) -> str | None:
    """windows x tokens as text, when both are static (else no match)."""
    return str(windows * tokens) if isinstance(windows, int) and isinstance(tokens, int) else None


def _array(expr):
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def _mergeable(members) -> bool:
    """Whether a group's projections can be one linear: two or more, one input shape, one head
    size, all with a bias or none."""
    if len(members) < 2:
        return False
    first = members[0]
    return all(_dims(m.flat) == _dims(first.flat) and m.head_dim == first.head_dim
               and (m.bias is None) == (first.bias is None) and m.rounded == first.rounded
               and m.weights.shape[1] == first.weights.shape[1] for m in members)


def _dims(expr) -> tuple | None:
    """`expr`'s shape as text (a symbolic length by its variable's name), to compare."""
    dims = shape_dims(expr)
    return None if dims is None else tuple(str(d) for d in dims)
