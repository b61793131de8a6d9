"""A bfloat16 / float16 model's RMSNorm or layer norm, read only by one linear, written as its left operand.

Stage: normalise (after normed_linears.py, which does this for float32's plain norms). In: a
Relax IRModule. Out: the same module in which HF's 16-bit RMSNorm, as rms_norms.py and
half_casts.py write it,

    n = multiply(g, astype(rms_norm(x, ones), h))     (g on either side: a constant row of h values)

of float32 rows x, whose one reader is the left operand of a 2-D matmul (directly or through
reshapes keeping the last axis; MAX_READERS), becomes

    matmul(multiply(g, astype(rms_norm(reshape(x, rows), R.ones), h)), W)

so that the GEMM's roots `cgra.<matmul | linear>_rms_norm_half...` take the norm whole and run
it on their A panel with both roundings (kernels/gemm/half_row_norm.py): Llama's pre-attention
and pre-MLP norms, read by the merged q / k / v and gate / up projections. The values are the
norm kernel's: the same float32 normalisation, the same rounding to h, the same product by g
rounded, only no longer stored and loaded between two kernels. A float32 model has no such
chain: it is left as it was.

A 16-bit layer norm as half_casts.py writes PyTorch's, `astype(layer_norm(astype(x_h, float32) or
x, gamma, beta), h)` with float32 constants gamma and beta (widened), the same way: the linear
reads `astype(layer_norm(astype(reshape(x_h, rows), float32), gamma, beta), h)`, its GEMM the
layer norm kernel's half program (ViT's pre-MLP norms; its q / k / v projections stay three).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .normed_linears import _matmuls, _readers, _rebuilt, _rows_static_or_one_length
from .rewrite import as_pass, op_name, replace_functions

HALF_FLOATS = ("bfloat16", "float16")
#: The most linears one norm is copied into. One: the half program (two more commands than
#: float32's, and gamma's row) run twice costs more than its own kernel once (Llama's gate and
#: up, read apart where the chip's function unit has no SiLU: cgra-4x4, 2 x 2,300 cycles a layer
#: against 2,685), and a norm read by one linear is the common case (merged q / k / v, gate / up).
MAX_READERS = 1


def half_norms_into_linears(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every 16-bit RMSNorm read only by a linear written as its left operand (module doc)."""
    return relax.transform.DeadCodeElimination()(replace_functions(mod, _rewrite_function))


half_normed_linears_pass = as_pass(half_norms_into_linears, "cgra.HalfNormsIntoLinears",
                                   ops=("relax.nn.rms_norm", "relax.nn.layer_norm"))


def half_layer_norm(value, values: dict):
    """(x, gamma, beta, the layer_norm call, h, widened) when `value` is astype(layer_norm(
    astype(x_h, float32) or x, gamma, beta), h) with constant float32 gamma and beta of shape (K,)
    (module doc), else None."""
    if op_name(value) != "relax.astype" or str(value.attrs.dtype) not in HALF_FLOATS:
        return None
    norm = values.get(value.args[0], value.args[0])
    if op_name(norm) != "relax.nn.layer_norm" or dtype_of(norm) != "float32" or \
            not (bool(norm.attrs.center) and bool(norm.attrs.scale)):
        return None
    dims, x = shape_dims(norm), norm.args[0]
    source = values.get(x, x)
    wide = op_name(source) == "relax.astype" and dtype_of(source.args[0]) == str(value.attrs.dtype)
    x = source.args[0] if wide else x
    if not dims or not isinstance(dims[-1], int) or not _rows_static_or_one_length(dims) or \
            [int(a) % len(dims) for a in norm.attrs.axes] != [len(dims) - 1] or \
            not all(isinstance(c, tvm.ir.GenericConst) and dtype_of(c) == "float32" and
                    tuple(c.value.numpy().shape) == (dims[-1],) for c in norm.args[1:]):
        return None
    return x, norm, str(value.attrs.dtype), wide


def half_rms_norm(value, values: dict):
    """(x, gamma as an h constant of shape (K,), epsilon, h) when `value` is multiply(g,
    astype(rms_norm(x, ones), h)) (module doc), else None."""
    if op_name(value) != "relax.multiply" or dtype_of(value) not in HALF_FLOATS:
        return None
    half = dtype_of(value)
    for gamma, cast in (value.args, reversed(value.args)):
        cast = values.get(cast, cast)
        if op_name(cast) != "relax.astype" or str(cast.attrs.dtype) != half:
            continue
        norm = values.get(cast.args[0], cast.args[0])
        if op_name(norm) != "relax.nn.rms_norm" or dtype_of(norm) != "float32" or not _ones(values.get(norm.args[1],
                                                                                                      norm.args[1])):
            continue
        dims = shape_dims(norm)
        if not dims or not isinstance(dims[-1], int) or not _rows_static_or_one_length(dims) or \
                [int(a) % len(dims) for a in norm.attrs.axes] != [len(dims) - 1] or \
                tuple(shape_dims(value) or ()) != tuple(dims):
            continue
        row = _gamma_row(gamma, half, dims[-1])
        if row is not None:
            return norm.args[0], row, float(norm.attrs.epsilon), half
    return None


def _ones(weight) -> bool:
    """Whether the norm's weight is ones: HF's, marked R.ones (half_casts.py), or a constant."""
    if op_name(weight) == "relax.ones":
        return True
    return isinstance(weight, tvm.ir.GenericConst) and bool((weight.value.numpy() == 1).all())


def _gamma_row(gamma, half: str, width: int):
    """`gamma` as a (width,) constant of dtype `half` when it is one value a column, else None."""
    if not isinstance(gamma, tvm.ir.GenericConst) or dtype_of(gamma) != half:
        return None
    value = gamma.value.numpy()
    if value.size != width or (value.ndim and value.shape[-1] != width):
        return None
    return relax.const(value.reshape(width), half)


def _rewrite_function(func: relax.Function):
    """`func` with its 16-bit RMSNorms written into the linears reading them, or None."""
    readers, values = _readers(func), {}
    for block in func.body.blocks:
        for binding in block.bindings:
            values[binding.var] = binding.value
    insert = {}
    for var, value in values.items():
        rms, layer = half_rms_norm(value, values), half_layer_norm(value, values)
        if rms is None and layer is None:
            continue
        matmuls = _matmuls(readers, var, shape_dims(value)[-1])
        if not matmuls or len(matmuls) > MAX_READERS:
            continue
        for matmul_var, matmul, lhs in matmuls:
            insert[matmul_var] = _copy(rms, matmul_var, matmul, lhs) if rms else \
                _copy_layer_norm(layer, matmul_var, matmul, lhs)
    return _rebuilt(func, insert) if insert else None


def _copy(found: tuple, matmul_var, matmul, lhs) -> tuple:
    """(new bindings, new matmul) of the norm `found` copied as `matmul`'s left operand."""
    x, gamma, eps, half = found
    var_class = relax.DataflowVar if isinstance(matmul_var, relax.DataflowVar) else relax.Var
    rows, width = tuple(shape_dims(lhs)), shape_dims(lhs)[-1]
    before, source = [], x
    if tuple(shape_dims(x) or ()) != rows:
        source = var_class(f"{matmul_var.name}_rows", relax.TensorType(rows, dtype_of(x)))
        before.append((source, relax.op.reshape(x, rows)))
    ones = var_class(f"{matmul_var.name}_ones", relax.TensorType((width,), "float32"))
    normed = var_class(f"{matmul_var.name}_normed", relax.TensorType(rows, "float32"))
    rounded = var_class(f"{matmul_var.name}_rounded", lhs.ty)
    scaled = var_class(f"{matmul_var.name}_scaled", lhs.ty)
    before += [(ones, relax.op.ones(relax.ShapeExpr([width]), "float32")),
               (normed, relax.op.nn.rms_norm(source, ones, axes=[-1], epsilon=eps)),
               (rounded, relax.op.astype(normed, half)),
               (scaled, relax.op.multiply(gamma, rounded))]
    new = relax.Call(matmul.op, [scaled, matmul.args[1]], matmul.attrs, matmul.ty_args, matmul.span)
    return before, new


def _copy_layer_norm(found: tuple, matmul_var, matmul, lhs) -> tuple:
    """(new bindings, new matmul) of the 16-bit layer norm `found` copied as `matmul`'s left operand."""
    x, norm, half, wide = found
    var_class = relax.DataflowVar if isinstance(matmul_var, relax.DataflowVar) else relax.Var
    rows = tuple(shape_dims(lhs))
    before, source = [], x
    if tuple(shape_dims(x) or ()) != rows:
        source = var_class(f"{matmul_var.name}_rows", relax.TensorType(rows, dtype_of(x)))
        before.append((source, relax.op.reshape(x, rows)))
    if wide:
        widened = var_class(f"{matmul_var.name}_wide", relax.TensorType(rows, "float32"))
        before.append((widened, relax.op.astype(source, "float32")))
        source = widened
    normed = var_class(f"{matmul_var.name}_normed", relax.TensorType(rows, "float32"))
    rounded = var_class(f"{matmul_var.name}_rounded", lhs.ty)
    before += [(normed, relax.op.nn.layer_norm(source, norm.args[1], norm.args[2], axes=[-1],
                                               epsilon=norm.attrs.epsilon)),
               (rounded, relax.op.astype(normed, half))]
    new = relax.Call(matmul.op, [rounded, matmul.args[1]], matmul.attrs, matmul.ty_args, matmul.span)
    return before, new
