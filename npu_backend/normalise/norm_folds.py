"""A pre-norm's gamma and beta folded into the linear layers that read it.

Stage: normalise (after rms_norms.py). In: a Relax IRModule. Out: the same module in which a
`layer_norm(x, gamma, beta)` or `rms_norm(x, gamma)` with constant gamma (and beta), every use of
whose output is the left operand of a matmul by a constant weight W (directly, or through a
reshape that keeps the last axis; W a (K, N) constant or `permute_dims` of an (N, K) one), is

    norm(x, 1, 0) @ (gamma[:, None] * W) + (beta @ W + bias)

(FlashNorm's folding): the norm kernel loses its multiply by gamma and its add of beta (kernels/
rows/norms.py takes a norm whose gamma is ones and beta zeros as the plain kind), the GEMMs keep
their cost, and a beta @ W with no bias to join becomes a bias add, which the GEMM's EPILOGUE
takes. Pre-norm transformers (Llama, Qwen, Gemma, GPT-2, ViT, CLIP, Whisper) have such norms
before attention and MLP. A post-norm's output (BERT's) is also added to a linear layer's output
y = x @ V + c (the residual stream); with gamma free of zeros that add becomes

    gamma * (x @ (V / gamma) + (c + beta) / gamma + norm(x, 1, 0))

whose multiply by gamma is a per-channel scale the GEMM's epilogue takes (epilogue_tail.py). A
norm read by anything else (the model's output) keeps its gamma and beta.

Error: the products x_hat_k gamma_k W_kn are rounded once in float32 instead of twice (the fold's
gamma W rounds once, as PyTorch's x_hat gamma did), and beta @ W + bias is computed in float64 and
rounded once: each output differs from PyTorch's by a few float32 roundings of the terms of its
dot product, within (K + 2) 2^-24 sum_k |x_hat_k gamma_k W_kn| + 2^-24 |beta @ W + bias|, as
the unfolded GEMM's own accumulation; the residual form divides and multiplies by gamma, two
more roundings of each term (tests/test_norm_folds.py).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .rewrite import as_pass, op_name, replace_functions

_NORMS = ("relax.nn.layer_norm", "relax.nn.rms_norm")


def fold_norm_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with the gamma and beta of every norm read only by linear layers folded into them."""
    return replace_functions(mod, _fold_function)


norm_folds_pass = as_pass(fold_norm_weights, "cgra.FoldNormWeights", ops=_NORMS)


def _const(expr) -> np.ndarray | None:
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


class _Uses:
    """Every function variable's users: (binding var, value) of each binding reading it, and
    whether anything else (a tuple, the function's result, a nested expression) reads it."""

    def __init__(self, func: relax.Function):
        self.values, self.users, self.elsewhere = {}, {}, set()
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                self.values[binding.var] = value
                if isinstance(value, relax.Call):
                    for arg in value.args:
                        self._read(arg, binding.var, value)
                else:
                    self._escape(value)
        self._escape(func.body.body)

    def _read(self, arg, var, value):
        if isinstance(arg, relax.Var):
            self.users.setdefault(arg, []).append((var, value))
        else:
            self._escape(arg)

    def _escape(self, expr):
        relax.analysis.post_order_visit(expr, lambda e: self.elsewhere.add(e) if isinstance(e, relax.Var) else None)

    def only(self, var) -> list:
        """The bindings reading `var`, or None when something else reads it too."""
        return None if var in self.elsewhere else self.users.get(var, [])


def _readers(uses: _Uses, norm_var, width: int):
    """(linears, residuals) reading the norm's output (directly or through reshapes keeping the
    last axis): the matmul bindings taking it as their left operand, each with its (K, N) weight,
    and the adds of it to a linear layer's output (`_residual_side`); None if anything else reads it."""
    linears, residuals, pending = [], [], [norm_var]
    while pending:
        var = pending.pop()
        readers = uses.only(var)
        if not readers:
            return None
        for reader, value in readers:
            name = op_name(value)
            if name == "relax.reshape" and (shape_dims(reader) or (None,))[-1] == width:
                pending.append(reader)
                continue
            weight = _weight(uses, value, var) if name == "relax.matmul" else None
            side = _residual_side(uses, reader, value, var) if name == "relax.add" else None
            if weight is None and side is None:
                return None
            if weight is not None:
                linears.append((reader, value, weight))
            else:
                residuals.append(side)
    return linears, residuals


def _residual_side(uses: _Uses, add_var, add, norm_var):
    """(add var, add value, matmul var, matmul value, weight, (bias var, bias add, position)) when
    `add` sums the norm's output (of the add's own shape) and a linear layer's (a matmul by a
    constant weight, plus a constant bias, through a reshape), each read by this chain alone."""
    dims = shape_dims(add) or ()
    if dtype_of(add) != "float32" or dims != shape_dims(norm_var) or not all(isinstance(d, int) for d in dims):
        return None  # symbolic: the epilogue's tail (its reshape) is static only, the scale would run alone
    other = add.args[1] if add.args[0].same_as(norm_var) else add.args[0]
    if other.same_as(norm_var) or not isinstance(other, relax.Var) or len(uses.only(other) or ()) != 1:
        return None
    value = uses.values.get(other)
    if op_name(value) == "relax.reshape" and isinstance(value.args[0], relax.Var) and \
            len(uses.only(value.args[0]) or ()) == 1:
        other, value = value.args[0], uses.values.get(value.args[0])
    if op_name(value) != "relax.add":
        return None
    for matmul_var in value.args:
        matmul = uses.values.get(matmul_var) if isinstance(matmul_var, relax.Var) else None
        if op_name(matmul) != "relax.matmul":
            continue
        weight = _weight(uses, matmul, matmul.args[0])
        bias = _bias_add(uses, matmul_var, (shape_dims(add) or (None,))[-1])
        if weight is not None and bias is not None and bias[0].same_as(other):
            return add_var, add, matmul_var, matmul, weight, bias
    return None


def _weight(uses: _Uses, matmul, lhs):
    """(kind, array (K, N), permute var or None) of a matmul(lhs, W) by a constant 2-D weight."""
    if not matmul.args[0].same_as(lhs) or matmul.args[1].same_as(lhs) or dtype_of(matmul) != "float32":
        return None
    rhs = matmul.args[1]
    array = _const(rhs)
    if array is not None and array.ndim == 2:
        return ("const", array, None)
    bound = uses.values.get(rhs) if isinstance(rhs, relax.Var) else None
    source = _const(bound.args[0]) if op_name(bound) == "relax.permute_dims" else None
    axes = bound.attrs.axes if source is not None else None
    if source is None or source.ndim != 2 or (axes is not None and [int(a) for a in axes] != [1, 0]):
        return None
    if len(uses.only(rhs) or ()) != 1:  # a transposed weight read by another matmul too: not ours to scale
        return None
    return ("permuted", source.T, rhs)


def refit_linear(linear, weight_of, bias_of, replace: dict) -> None:
    """Into `replace`: a linear (matmul var, matmul, _weight's (kind, W (K, N), permute var), _bias_add's
    bias or None) with weight `weight_of(W)` and bias `bias_of(b)`, both computed on float64 copies
    and rounded once to float32 (layer_scales.py scales them, centred_streams.py centres them)."""
    matmul_var, matmul, (kind, weight, permute_var), bias = linear
    new = weight_of(weight.astype(np.float64)).astype(np.float32)
    if kind == "const":
        replace[matmul_var] = relax.op.matmul(matmul.args[0], relax.const(new), out_dtype="float32")
    else:
        replace[permute_var] = relax.op.permute_dims(relax.const(np.ascontiguousarray(new.T)))
    if bias is not None:
        add_var, add, position = bias
        args = [add.args[0], add.args[1]]
        args[position] = relax.const(bias_of(_const(add.args[position]).astype(np.float64)).astype(np.float32))
        replace[add_var] = relax.op.add(*args)


def _bias_add(uses: _Uses, matmul_var, n: int):
    """(add var, add value, position of the constant) when the matmul's one reader adds a
    constant bias of n values (shape (n,) or (1, ..., n)), else None."""
    readers = uses.only(matmul_var)
    if readers is None or len(readers) != 1 or op_name(readers[0][1]) != "relax.add":
        return None
    var, add = readers[0]
    for position in (0, 1):
        bias = _const(add.args[position])
        if add.args[1 - position].same_as(matmul_var) and bias is not None and bias.dtype == np.float32 \
                and bias.size == n and bias.shape[-1] == n:
            return var, add, position
    return None


def _fold_function(func: relax.Function):
    """`func` with its foldable norms folded, or None when it has none."""
    uses = _Uses(func)
    replace, insert = {}, {}
    for var, value in uses.values.items():
        name = op_name(value)
        if name not in _NORMS or dtype_of(value) != "float32":
            continue
        width = (shape_dims(value) or (None,))[-1]
        gamma = _const(value.args[1])
        beta = _const(value.args[2]) if name == "relax.nn.layer_norm" else np.zeros_like(gamma)
        if not isinstance(width, int) or gamma is None or beta is None or gamma.shape != (width,) or \
                beta.shape != (width,) or (np.all(gamma == 1) and np.all(beta == 0)):
            continue
        if name == "relax.nn.layer_norm" and not (value.attrs.center and value.attrs.scale):
            continue
        readers = _readers(uses, var, width)
        if readers is None or not readers[0] or any(w[1].shape[0] != width for _, _, w in readers[0]):
            continue
        if readers[1] and not (np.all(gamma != 0) and np.all(np.isfinite(1 / gamma.astype(np.float64)))) or \
                {side[2] for side in readers[1]} & {reader for reader, _, _ in readers[0]}:
            continue  # a residual side divided by gamma; or a linear of the norm's own output
        plan = _fold_linears(uses, readers[0], gamma, beta)
        _fold_residuals(readers[1], gamma, beta, *plan)
        if any(key in replace or key in insert for part in plan for key in part):
            continue  # a linear another norm's fold rewrites too
        replace.update(plan[0])
        insert.update(plan[1])
        ones = relax.const(np.ones(width, np.float32))
        replace[var] = (relax.op.nn.rms_norm(value.args[0], ones, axes=value.attrs.axes, epsilon=value.attrs.epsilon)
                        if name == "relax.nn.rms_norm" else
                        relax.op.nn.layer_norm(value.args[0], ones, relax.const(np.zeros(width, np.float32)),
                                               axes=value.attrs.axes, epsilon=value.attrs.epsilon))
    return _rebuilt(func, replace, insert) if replace else None


def _fold_residuals(residuals: list, gamma, beta, replace: dict, insert: dict) -> None:
    """Into `replace` and `insert`: each residual add y + norm (y = x @ W + b, the norm post-norm
    BERT's, read by the next norm) as gamma (x @ (W / gamma) + (b + beta) / gamma + plain norm),
    the multiply by gamma a per-channel scale the GEMM's epilogue takes."""
    g64 = gamma.astype(np.float64)
    for add_var, add, matmul_var, matmul, (kind, weight, permute_var), (bias_var, bias_add, position) in residuals:
        scaled = (weight.astype(np.float64) / g64[None, :]).astype(np.float32)
        if kind == "const":
            replace[matmul_var] = relax.op.matmul(matmul.args[0], relax.const(scaled), out_dtype="float32")
        else:
            replace[permute_var] = relax.op.permute_dims(relax.const(np.ascontiguousarray(scaled.T)))
        old = _const(bias_add.args[position])
        new = (old.astype(np.float64) + beta.reshape(old.shape)) / g64.reshape(old.shape)
        args = [bias_add.args[0], bias_add.args[1]]
        args[position] = relax.const(new.astype(np.float32))
        replace[bias_var] = relax.op.add(*args)
        var_class = relax.DataflowVar if isinstance(add_var, relax.DataflowVar) else relax.Var
        inner = var_class(f"{add_var.name}_sum", add_var.ty)
        insert[add_var] = (inner, add)
        replace[add_var] = relax.op.multiply(inner, relax.const(gamma))


def _fold_linears(uses: _Uses, linears: list, gamma, beta):
    """({var: new value}, {var: (new var, its value)} inserted before var) folding gamma into each
    linear's weight and beta @ W into its bias (or a bias add of its own)."""
    replace, insert = {}, {}
    for matmul_var, matmul, (kind, weight, permute_var) in linears:
        scaled = (weight.astype(np.float64) * gamma[:, None]).astype(np.float32)
        if kind == "const":
            new_matmul = relax.op.matmul(matmul.args[0], relax.const(scaled), out_dtype="float32")
        else:
            replace[permute_var] = relax.op.permute_dims(relax.const(np.ascontiguousarray(scaled.T)))
            new_matmul = matmul
        shift = beta.astype(np.float64) @ weight.astype(np.float64)
        if not np.any(beta):
            replace[matmul_var] = new_matmul
            continue
        bias = _bias_add(uses, matmul_var, weight.shape[1])
        if bias is not None:
            add_var, add, position = bias
            old = _const(add.args[position])
            new_bias = relax.const((old.astype(np.float64) + shift.reshape(old.shape)).astype(np.float32))
            args = [add.args[0], add.args[1]]
            args[position] = new_bias
            replace[add_var] = relax.op.add(*args)
            replace[matmul_var] = new_matmul
        else:  # no bias to join: the matmul's variable becomes matmul + beta @ W
            var_class = relax.DataflowVar if isinstance(matmul_var, relax.DataflowVar) else relax.Var
            inner = var_class(f"{matmul_var.name}_folded", matmul_var.ty)
            insert[matmul_var] = (inner, new_matmul)
            replace[matmul_var] = relax.op.add(inner, relax.const(shift.astype(np.float32)))
    return replace, insert


def _rebuilt(func: relax.Function, replace: dict, insert: dict) -> relax.Function:
    """`func` with the bindings of `replace`'s variables bound to their new values, `insert`'s
    bindings placed before them (the variables, and so their readers, unchanged)."""
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for binding in block.bindings:
            var = binding.var
            if var in insert:
                inner, value = insert[var]
                bindings.append(relax.VarBinding(inner, value))
            bindings.append(relax.VarBinding(var, replace[var]) if var in replace else binding)
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(bindings))
    body = relax.SeqExpr(blocks, func.body.body)
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
