"""A residual stream read only by layer norms carried centred: its layer norms become RMSNorms.

Stage: normalise (after norm_folds.py, before normed_linears.py). In: a Relax IRModule. Out: the
same module in which a residual stream, the variables

    x = take(T, ids, axis=0)  |  view(P)  |  reshape(x')  |  add(u, v)    u, v stream variables or linear
                                                              outputs: matmul(h, W) [+ b]
                                                              [reshaped], each read once; or
                                                              u a stream variable, v a constant
                                                              of values per channel (GPT-2's
                                                              position rows)

(view(P): memory.view of a constant P from its start, with P's rows as wide as the stream: the
first s rows of a position table at a symbolic length, position_tables.py's prefix; P's rows
centred as T's.)

whose every reader is a layer norm over the last axis or the stream itself, holds its values
minus their mean over the last axis: the table T, each such linear's weight columns W and bias
b centred (T - mean_c T, W - mean_n W, b - mean b: centring is linear, so the stream's adds keep
it centred; a constant added to it, GPT-2's position rows, centred over its channels too),
and each plain layer norm of it (gamma 1, beta 0: norm_folds.py has folded them)
an RMSNorm, which is the layer norm of a row whose mean is 0. A layer norm with its own gamma
and beta (the model's final one, its output) becomes `add(rms_norm(x, gamma), beta)`: at 32 x 64
on cgra-8x8 one RMSNorm kernel adding beta (1,597 cycles, kernels/rows/norms.py) against the layer
norm's 2,717.

Why: GPT-2, GPT-J, GPT-NeoX and Falcon read their residual stream only through layer norms (each layer's
one or two, and the final one). A layer norm in a GEMM's A panel (kernels/gemm/row_norm.py) costs
about 1,700 cycles a panel at 32 x 64 on cgra-8x8 (the mean, the centring and its correction
before RMSNorm's program), an RMSNorm about 570; GPT-J's and Falcon's one norm a layer feeds two
linears, too costly to run twice as a layer norm (normed_linears.py), cheap enough as an RMSNorm.

Error: the centred constants are computed in float64 and rounded once; the stream's values differ
from x - mean(x) by the roundings of the GEMMs' sums of the centred terms, and the RMSNorm skips
the layer norm's rounding of a mean it computes as about 0 (tests/test_centred_streams.py: within
1e-5 of the layer-norm model).
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .norm_folds import _bias_add, _const, _rebuilt, _Uses, _weight, refit_linear
from .rewrite import as_pass, op_name, replace_functions


def centre_streams(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every residual stream read only by layer norms carried centred (module doc)."""
    return replace_functions(mod, _rewrite_function)


centred_streams_pass = as_pass(centre_streams, "cgra.CentredStreams", ops=("relax.nn.layer_norm",))


def _width(var):
    """The static last (channel) axis of `var`, else None: only it must be static, since the
    centring is per channel; the sequence axis may be symbolic (a prefill compiled once)."""
    shape = shape_dims(var)
    return shape[-1] if shape and isinstance(shape[-1], int) else None


def _same_shape(a, b) -> bool:
    """Whether `a` and `b` have one shape, symbolic dimensions the same expression."""
    dims_a, dims_b = shape_dims(a), shape_dims(b)
    return dims_a is not None and dims_b is not None and len(dims_a) == len(dims_b) and \
        all(x == y if isinstance(x, int) and isinstance(y, int) else
            not isinstance(x, int) and not isinstance(y, int) and tvm_ffi.structural_equal(x, y)
            for x, y in zip(dims_a, dims_b))


def _is_norm_of(value, var) -> bool:
    """Whether `value` is a float32 layer norm of `var` over its last axis."""
    if op_name(value) != "relax.nn.layer_norm" or not value.args[0].same_as(var) or dtype_of(value) != "float32":
        return False
    rank = len(shape_dims(var) or ())
    return rank > 0 and [int(a) % rank for a in value.attrs.axes] == [rank - 1] and value.attrs.center


def _linear(uses: _Uses, var, width: int):
    """(matmul var, matmul, weight, bias) of the linear whose output `var` is (through a constant
    bias add and reshapes, each read once), else None."""
    while isinstance(var, relax.Var) and len(uses.only(var) or ()) == 1:
        value = uses.values.get(var)
        if op_name(value) == "relax.reshape" and _width(value.args[0]) == width:
            var = value.args[0]
        elif op_name(value) == "relax.add" and sum(_const(a) is not None for a in value.args) == 1:
            var = next(a for a in value.args if _const(a) is None)
        elif op_name(value) == "relax.matmul":
            weight = _weight(uses, value, value.args[0])
            if weight is None or weight[1].shape[1] != width:
                return None
            return var, value, weight, _bias_add(uses, var, width)
        else:
            return None
    return None


def _table(value, width: int):
    """The (V, width) float32 constant a take of rows reads, else None."""
    table = _const(value.args[0]) if op_name(value) == "relax.take" else None
    if table is None or table.dtype != np.float32 or table.ndim != 2 or table.shape[1] != width or \
            int(value.attrs.axis) % 2 != 0:
        return None
    return table


def _prefix_table(value, width: int):
    """The float32 constant a memory.view reads from its start, as (rows, `width`), else None."""
    table = _const(value.args[0])
    offset = value.args[3] if len(value.args) > 3 else 0
    while hasattr(offset, "value"):  # a PrimValue of an IntImm
        offset = offset.value
    if table is None or table.dtype != np.float32 or table.size % width or int(offset) != 0:
        return None
    return table.reshape(-1, width)


def _stream(uses: _Uses):
    """(stream variables, {linear output var: its _linear}) of the function's centrable streams."""
    candidates = {var for var, value in uses.values.items()
                  if op_name(value) in ("relax.reshape", "relax.add", "relax.take", "relax.memory.view")
                  and dtype_of(value) == "float32"
                  and isinstance(_width(var), int)}
    linears = {}
    changed = True
    while changed:
        changed = False
        for var in list(candidates):
            if not _produced(uses, var, candidates, linears) or not _read_by_norms(uses, var, candidates):
                candidates.discard(var)
                changed = True
    return candidates, linears


def _produced(uses: _Uses, var, candidates, linears) -> bool:
    """Whether `var`'s value keeps the stream centred given `candidates` (module doc)."""
    value, width = uses.values[var], _width(var)
    name = op_name(value)
    if name == "relax.take":
        return _table(value, width) is not None
    if name == "relax.memory.view":
        return _prefix_table(value, width) is not None
    if name == "relax.reshape":
        return value.args[0] in candidates and _width(value.args[0]) == width
    for position, arg in enumerate(value.args):
        if arg in candidates and _same_shape(arg, var):
            continue
        if _row_constant(arg, var) is not None and value.args[1 - position] in candidates:
            continue  # GPT-2's position rows added to its token rows: centred with them
        linear = _linear(uses, arg, width) if _same_shape(arg, var) else None
        if linear is None:
            return False
        linears[arg] = linear
    return True


def _row_constant(arg, var):
    """The float32 constant `arg` when adding it to a tensor of `var`'s shape gives that shape and
    it has a value per channel (its last axis `var`'s width), else None. Against a symbolic axis
    of `var` the constant's axis must be 1."""
    array = _const(arg)
    shape = tuple(shape_dims(var) or ())
    if array is None or array.dtype != np.float32 or not 0 < array.ndim <= len(shape) or \
            array.shape[-1] != shape[-1] or \
            any(a != 1 and a != (b if isinstance(b, int) else 1) for a, b in zip(array.shape[::-1], shape[::-1])):
        return None
    return array


def _read_by_norms(uses: _Uses, var, candidates) -> bool:
    """Whether every reader of `var` is a layer norm of it or a stream variable."""
    readers = uses.only(var)
    return readers is not None and all(reader in candidates or _is_norm_of(value, var) for reader, value in readers)


def _rewrite_function(func: relax.Function):
    """`func` with its streams centred and their layer norms RMSNorms (plus beta), or None."""
    uses = _Uses(func)
    stream, linears = _stream(uses)
    norms = {var: value for var, value in uses.values.items()
             if op_name(value) == "relax.nn.layer_norm" and value.args[0] in stream and _is_norm_of(value, value.args[0])}
    if not norms:
        return None
    replace, insert = {}, {}
    for var in stream:
        value = uses.values[var]
        if op_name(value) == "relax.take":
            table = _table(value, _width(var)).astype(np.float64)
            centred = relax.const((table - table.mean(axis=1, keepdims=True)).astype(np.float32))
            replace[var] = relax.op.take(centred, value.args[1], axis=0)
        elif op_name(value) == "relax.memory.view":
            table = _prefix_table(value, _width(var)).astype(np.float64)
            shape = _const(value.args[0]).shape
            centred = relax.const((table - table.mean(axis=-1, keepdims=True)).astype(np.float32).reshape(shape))
            replace[var] = relax.Call(value.op, [centred, *value.args[1:]], value.attrs, value.ty_args)
        elif op_name(value) == "relax.add" and any(_row_constant(arg, var) is not None for arg in value.args):
            replace[var] = relax.op.add(*(_centred(arg, var) for arg in value.args))
    used = {linear[0]: linear for arg, linear in linears.items() if _in_stream_add(uses, arg, stream)}
    for linear in used.values():
        refit_linear(linear, lambda w: w - w.mean(axis=1, keepdims=True), lambda b: b - b.mean(), replace)
    for var, value in norms.items():
        if _plain(value):
            replace[var] = relax.op.nn.rms_norm(value.args[0], value.args[1], axes=[-1], epsilon=value.attrs.epsilon)
        else:
            var_class = relax.DataflowVar if isinstance(var, relax.DataflowVar) else relax.Var
            inner = var_class(f"{var.name}_rms", var.ty)
            insert[var] = (inner, relax.op.nn.rms_norm(value.args[0], value.args[1], axes=[-1], epsilon=value.attrs.epsilon))
            replace[var] = relax.op.add(inner, value.args[2])
    return _rebuilt(func, replace, insert)


def _centred(arg, var):
    """A stream add's operand: a constant of values per channel centred over them (float64, rounded
    once); a stream variable as it is."""
    array = _row_constant(arg, var)
    if array is None:
        return arg
    wide = array.astype(np.float64)
    return relax.const((wide - wide.mean(axis=-1, keepdims=True)).astype(np.float32))


def _in_stream_add(uses: _Uses, arg, stream) -> bool:
    """Whether a linear output `arg` is read by an add of the stream (not only recorded on the way)."""
    return any(reader in stream for reader, _ in uses.only(arg) or ())


def _plain(value) -> bool:
    """A layer norm with gamma all 1 and beta all 0."""
    gamma, beta = _const(value.args[1]), _const(value.args[2])
    return gamma is not None and beta is not None and (gamma == 1).all() and (beta == 0).all() and value.attrs.scale
