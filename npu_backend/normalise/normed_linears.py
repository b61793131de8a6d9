"""Each linear layer reading a plain RMSNorm or layer norm gets the norm as its own left operand.

Stage: normalise (after norm_folds.py, qkv_merges.py and gated_linears.py, which decide which
linears read the norm). In: a Relax IRModule. Out: the same module in which a plain RMSNorm or
layer norm (gamma all ones, beta zeros: norm_folds.py has folded them into the linears) of
float32 rows of static shape, every reader of which is the left operand of a 2-D matmul
(directly, or through reshapes that keep the last axis), becomes, for each such matmul,

    matmul(norm(reshape(x, rows), ones [, zeros], eps), W)

so that the GEMM kernel's roots (`cgra.linear_rms_norm`, `cgra.matmul_layer_norm`, ...) take the
norm whole and normalise its own A panel (kernels/gemm/row_norm.py): Llama's and Qwen's
pre-attention and pre-MLP norms, read by the merged q / k / v projection and the merged gate / up
projection, reshaped from (1, s, d) to (s, d) between; GPT-2's and ViT's layer norms before
q / k / v and the MLP; GPT-J's and Falcon's one RMSNorm a layer (a layer norm of a centred
stream, centred_streams.py), read by q / k / v and the MLP. A norm read by more linears
(`MAX_READERS`: two RMSNorm readers, one layer norm reader) is left alone: each copy repeats
the program over the panel (a layer norm's about 1,700 cycles at 32 x 64 on cgra-8x8, more than
its own kernel saves twice), and a GEMM may still refuse its copy (its tiling, or a vector unit
its epilogue already keeps busy: kernels/gemm/row_norm.py), leaving two norm kernels where there
was one.
The model's final norm (its output) keeps its kernel.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from ..relax_info import dtype_of, shape_dims
from .rewrite import as_pass, op_name, replace_functions

#: The most linears one norm is copied into (module doc): an RMSNorm's program is cheap enough
#: to run in two (GPT-J's and Falcon's q / k / v and MLP after centred_streams.py).
MAX_READERS = {"relax.nn.rms_norm": 2, "relax.nn.layer_norm": 1}
#: The norms, with the plain values of their constants (gamma; beta).
_NORMS = {"relax.nn.rms_norm": (1.0,), "relax.nn.layer_norm": (1.0, 0.0)}


def norms_into_linears(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every plain norm read only by linears copied into each of them (module doc)."""
    return replace_functions(mod, _rewrite_function)


normed_linears_pass = as_pass(norms_into_linears, "cgra.NormsIntoLinears", ops=tuple(_NORMS))


def _readers(func: relax.Function) -> dict:
    """Every variable's reading bindings (var, value); a variable read elsewhere maps to None."""
    readers, escaped = {}, set()
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call):
                for arg in value.args:
                    if isinstance(arg, relax.Var):
                        readers.setdefault(arg, []).append((binding.var, value))
                    else:
                        relax.analysis.post_order_visit(arg, lambda e: escaped.add(e) if isinstance(e, relax.Var) else None)
            else:
                relax.analysis.post_order_visit(value, lambda e: escaped.add(e) if isinstance(e, relax.Var) else None)
    relax.analysis.post_order_visit(func.body.body, lambda e: escaped.add(e) if isinstance(e, relax.Var) else None)
    return {var: (None if var in escaped else users) for var, users in readers.items()}


def _plain_norm(value) -> bool:
    """Whether `value` is a float32 RMSNorm or layer norm over the last axis of a static shape,
    gamma all 1 (and beta all 0)."""
    name = op_name(value)
    if name not in _NORMS or dtype_of(value) != "float32":
        return False
    dims = shape_dims(value)
    constants = list(zip(value.args[1:], _NORMS[name]))
    if not dims or not all(isinstance(d, int) for d in dims[-1:]) or not _rows_static_or_one_length(dims) or \
            not all(isinstance(c, tvm.ir.GenericConst) and (c.value.numpy() == v).all() for c, v in constants):
        return False
    if name == "relax.nn.layer_norm" and not (value.attrs.center and value.attrs.scale):
        return False
    axes = [int(a) % len(dims) for a in value.attrs.axes]
    return axes == [len(dims) - 1]


def _rows_static_or_one_length(dims) -> bool:
    """Static rows, or one symbolic length among them (a prefill's (1, s, C): the GEMM's rows,
    symbolic_rows.py, which kernels/gemm/row_norm.py normalises as it does static ones)."""
    return sum(not isinstance(d, int) for d in dims) <= 1 and all(isinstance(d, (int, tirx.Var)) for d in dims)


def _matmuls(readers: dict, norm_var, width: int):
    """[(matmul var, matmul value, its left operand's var)] of the 2-D matmuls reading the norm's output as
    their left operand through reshapes keeping the last axis; None if anything else reads it."""
    found, pending = [], [norm_var]
    while pending:
        var = pending.pop()
        users = readers.get(var)
        if not users:
            return None
        for reader, value in users:
            dims = shape_dims(reader) or ()
            if op_name(value) == "relax.reshape" and dims and dims[-1] == width:
                pending.append(reader)
            elif op_name(value) == "relax.matmul" and value.args[0].same_as(var) and \
                    not value.args[1].same_as(var) and len(shape_dims(var) or ()) == 2 and \
                    len(shape_dims(value.args[1]) or ()) == 2:
                found.append((reader, value, var))
            else:
                return None
    return found


def _rewrite_function(func: relax.Function):
    """`func` with its plain norms copied into the linears reading them, or None."""
    readers, values = _readers(func), {}
    for block in func.body.blocks:
        for binding in block.bindings:
            values[binding.var] = binding.value
    insert = {}
    for var, value in values.items():
        if not _plain_norm(value):
            continue
        matmuls = _matmuls(readers, var, shape_dims(value)[-1])
        if not matmuls or len(matmuls) > MAX_READERS[op_name(value)] or \
                (len(matmuls) == 1 and values.get(matmuls[0][1].args[0]) is value):
            continue  # not all linears, too many, or one reading the norm directly already
        x = value.args[0]
        for matmul_var, matmul, lhs in matmuls:
            var_class = relax.DataflowVar if isinstance(matmul_var, relax.DataflowVar) else relax.Var
            rows = tuple(shape_dims(lhs))
            before, source = [], x
            if tuple(shape_dims(x) or ()) != rows:
                source = var_class(f"{matmul_var.name}_rows", lhs.ty)
                before.append((source, relax.op.reshape(x, rows)))
            norm_var = var_class(f"{matmul_var.name}_normed", lhs.ty)
            norm = relax.op.nn.rms_norm(source, value.args[1], axes=[-1], epsilon=value.attrs.epsilon) \
                if op_name(value) == "relax.nn.rms_norm" else \
                relax.op.nn.layer_norm(source, value.args[1], value.args[2], axes=[-1], epsilon=value.attrs.epsilon)
            before.append((norm_var, norm))
            new = relax.Call(matmul.op, [norm_var, matmul.args[1]], matmul.attrs, matmul.ty_args, matmul.span)
            insert[matmul_var] = (before, new)
    return _rebuilt(func, insert) if insert else None


def _rebuilt(func: relax.Function, insert: dict) -> relax.Function:
    """`func` with each of `insert`'s variables bound to its new value after the new bindings."""
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for binding in block.bindings:
            if binding.var in insert:
                before, value = insert[binding.var]
                bindings += [relax.VarBinding(v, e) for v, e in before]
                bindings.append(relax.VarBinding(binding.var, value))
            else:
                bindings.append(binding)
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(bindings))
    body = relax.SeqExpr(blocks, func.body.body)
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
