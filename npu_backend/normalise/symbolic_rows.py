"""An elementwise op on a (1, s, C) activation as the same op on its (s, C) rows.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which every
elementwise op (add, subtract, multiply, maximum, minimum; sigmoid, SiLU, relu, exp, tanh, GELU)
whose output is (1, ..., 1, s, C...), its only symbolic axis `s` after unit axes and followed by
static ones, computes on its operands reshaped to (s, C...) and is reshaped back. Operands of
lower rank (a (C,) bias, a (1, C) scale) are left as they are; an operand's view is emitted once,
and an op reading another rewritten op's result reads that op's (s, C...) result itself, so that
SiLU's `x * sigmoid(x)` still reads one tensor twice (sigmoid.py's pattern).

Why: the NPU's elementwise kernels take a symbolic axis 0 (rows) or trailing symbolic axes
(kernels/common/views.py); a sequence length after the batch axis of 1 (every transformer's
(1, s, hidden) residual add, SwiGLU's multiply and sigmoid) was "a symbolic axis after axis 0
that is not among the last axes" and ran on the host. The reshapes change no memory.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from ..relax_info import shape_dims
from .rewrite import as_pass, rewrite_functions

#: The elementwise ops rewritten (those an NPU family takes with a symbolic axis 0).
ROW_OPS = ("relax.add", "relax.subtract", "relax.multiply", "relax.maximum", "relax.minimum", "relax.sigmoid",
           "relax.nn.silu", "relax.nn.relu", "relax.exp", "relax.tanh", "relax.nn.gelu", "relax.nn.gelu_tanh")
_OPS = {name: tvm.ir.Op.get(name) for name in ROW_OPS}


def symbolic_rows(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every elementwise op over (1, .., 1, s, C..) computed on (s, C..) views."""
    return rewrite_functions(mod, _RowsRewriter)


symbolic_rows_pass = as_pass(symbolic_rows, "cgra.SymbolicRows", ops=ROW_OPS)


def _row_axis(dims) -> int | None:
    """The axis of the only symbolic dimension of `dims` when every axis before it is 1, it is
    not axis 0 and a static axis follows it; else None."""
    if dims is None:
        return None
    symbolic = [axis for axis, d in enumerate(dims) if not isinstance(d, int)]
    if len(symbolic) != 1:
        return None
    axis = symbolic[0]
    if axis == 0 or axis == len(dims) - 1 or not isinstance(dims[axis], tirx.Var):
        return None
    return axis if all(d == 1 for d in dims[:axis]) else None


@relax.expr_functor.mutator
class _RowsRewriter(relax.PyExprMutator):
    def __init__(self, mod=None):
        super().__init__(mod)
        self.views = {}  # a variable -> its (s, C..) view (a rewritten op's own result, or a reshape)

    def visit_var_binding_(self, binding):
        value = binding.value
        if not (isinstance(value, relax.Call) and any(value.op.same_as(op) for op in _OPS.values())):
            super().visit_var_binding_(binding)
            return
        dims = shape_dims(binding.var)
        axis = _row_axis(dims)
        args = [self.visit_expr(arg) for arg in value.args]
        if axis is None or not all(self._viewable(arg, len(dims), axis) for arg in args):
            super().visit_var_binding_(binding)
            return
        rows = self.builder_.emit(relax.Call(value.op, [self._view(arg, len(dims), axis) for arg in args],
                                             value.attrs, value.ty_args, value.span))
        back = self.builder_.normalize(relax.op.reshape(rows, relax.ShapeExpr(dims)))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, back))
        self.views[binding.var] = rows

    @staticmethod
    def _viewable(arg, rank: int, axis: int) -> bool:
        """An operand of the op's rank (its leading axes 1, as the output's), or a shorter static
        one that does not reach the unit axes."""
        dims = shape_dims(arg)
        if dims is None:
            return False
        if len(dims) == rank:
            return all(d == 1 for d in dims[:axis])
        return len(dims) <= rank - axis and all(isinstance(d, int) for d in dims)

    def _view(self, arg, rank: int, axis: int):
        dims = shape_dims(arg)
        if len(dims) < rank:
            return arg
        if arg in self.views:
            return self.views[arg]
        view = self.builder_.emit(relax.op.reshape(arg, relax.ShapeExpr(dims[axis:])))
        if isinstance(arg, relax.Var):
            self.views[arg] = view
        return view
