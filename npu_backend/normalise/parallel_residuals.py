"""A parallel block's two branch outputs added to its residual one add each: (a + m) + x = a + (m + x).

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which

    s = add(A, B)      A, B each a linear layer's output (a matmul, then at most a constant
    y = add(s, x)      bias add and reshapes, each read once), s read by y alone (through
                       reshapes), x in either operand position, all of one float32 shape

becomes `y = add(A, add(B, x))`, B the linear bound first. GPT-J's, GPT-NeoX's and Falcon's
parallel blocks compute x + attn(ln(x)) + mlp(ln(x)) as (attn + mlp) + x (Falcon: (mlp + attn)
+ x): the first add joins the later GEMM's epilogue, but the second ran as an elementwise
kernel of its own (a DMA round trip of the hidden states: 1,368 cycles a layer at 32 tokens on
cgra-8x8). Added to the earlier linear's output instead, the residual joins that GEMM's epilogue
and the later one adds the sum: both adds in epilogues, no kernel left.

Error: float32 addition is not associative. Each result is within 2^-24 (|A + B| + |B + x| +
2 |y|) of the two-add result (tests/test_parallel_residuals.py).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .norm_folds import _const, _rebuilt, _Uses
from .rewrite import as_pass, op_name, replace_functions


def reassociate_parallel_residuals(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every residual added to the sum of two linears' outputs added to one of them."""
    return replace_functions(mod, _rewrite_function)


parallel_residuals_pass = as_pass(reassociate_parallel_residuals, "cgra.ParallelResiduals", ops=("relax.add",))


def _linear_position(uses: _Uses, order: dict, var):
    """The binding position of the matmul whose output `var` is (through a constant bias add
    and reshapes, each read once), or None."""
    while isinstance(var, relax.Var) and len(uses.only(var) or ()) == 1:
        value = uses.values.get(var)
        name = op_name(value)
        if name == "relax.matmul":
            return order[var]
        if name == "relax.reshape":
            var = value.args[0]
        elif name == "relax.add" and sum(_const(arg) is not None for arg in value.args) == 1:
            var = next(arg for arg in value.args if _const(arg) is None)
        else:
            return None
    return None


def _branches(uses: _Uses, order: dict, value):
    """(residual x, sum s) of an add of a residual to a sum of two linears' outputs read by it alone."""
    if op_name(value) != "relax.add" or dtype_of(value) != "float32":
        return None
    for s, x in (value.args, value.args[::-1]):
        inner = _through_reshapes(uses, s)
        if op_name(inner) == "relax.add" and isinstance(x, relax.Var) and not any(x.same_as(arg) for arg in inner.args):
            return x, inner
    return None


def _through_reshapes(uses: _Uses, var):
    """The value `var` is a view of through reshapes (Falcon's flatten and unflatten of the sum),
    each variable on the way read once; None if one is read more often."""
    while isinstance(var, relax.Var) and len(uses.only(var) or ()) == 1:
        value = uses.values.get(var)
        if op_name(value) != "relax.reshape":
            return value
        var = value.args[0]
    return None


def _same_dims(a, b) -> bool:
    """Whether two shapes (ints or symbolic dims, as shape_dims gives them) are known equal."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x == y if isinstance(x, int) and isinstance(y, int) else
               not isinstance(x, int) and not isinstance(y, int) and tvm_ffi.structural_equal(x, y) for x, y in zip(a, b))


def _rewrite_function(func: relax.Function):
    """`func` with its parallel blocks' residual adds reassociated, or None when it has none."""
    uses = _Uses(func)
    order = {var: position for position, var in enumerate(uses.values)}
    replace, insert = {}, {}
    for var, value in uses.values.items():
        found = _branches(uses, order, value)
        if found is None:
            continue
        x, inner = found
        dims = [shape_dims(e) for e in (value, x, *inner.args)]
        positions = [_linear_position(uses, order, arg) for arg in inner.args]
        if None in positions or any(not _same_dims(d, dims[0]) for d in dims) or \
                any(dtype_of(arg) != "float32" for arg in (x, *inner.args)):
            continue
        first, later = inner.args if positions[0] < positions[1] else inner.args[::-1]
        var_class = relax.DataflowVar if isinstance(var, relax.DataflowVar) else relax.Var
        with_residual = var_class(f"{var.name}_residual", x.ty)
        insert[var] = (with_residual, relax.op.add(first, x))
        replace[var] = relax.op.add(later, with_residual)
    return _rebuilt(func, replace, insert) if replace else None
