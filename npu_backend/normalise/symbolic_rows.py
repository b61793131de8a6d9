"""An elementwise op on a (1, s, C) activation as the same op on its (s, C) rows.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which every
elementwise op (add, subtract, multiply, maximum, minimum; sigmoid, SiLU, relu, exp, tanh, GELU)
whose output is (1, ..., 1, s, C...), its only symbolic axis `s` after unit axes and followed by
static ones, computes on its operands reshaped to (s, C...) and is reshaped back. Operands of
lower rank (a (C,) bias, a (1, C) scale) are left as they are; an operand's view is emitted once,
and an op reading another rewritten op's result reads that op's (s, C...) result itself, so that
SiLU's `x * sigmoid(x)` still reads one tensor twice (sigmoid.py's pattern).

A layer norm or RMSNorm over the last axis of (1, s, C) whose input is a reshape of (s, C)
rows (a residual sum) computes on those rows the same way (`_norm_rows`): a decoder's final norm
then reads its last down projection's sum directly, which joins that GEMM's epilogue
(kernels/gemm/post_norm.py), and its beta's add reads the norm's rows (one kernel, not three).

An op whose output is (1.., P.., s, C..) with static axes P before the length (RoPE's (1, H, s, d)
against cos's (1, 1, s, d)) computes on (prod(P), s * prod(C)) views, each operand walking P or
broadcasting along it (`_flat_views`): the length in the trailing axis, which the kernels also
take symbolic; an operand of ones (a scalar, scalars.py: attention's 1 / sqrt(d) on the queries)
broadcasts as (1, 1). An op reading a GEMM's, convolution's or pool's result directly, or an
elementwise op left as it is, stays as it is: it may be part of that kernel's epilogue (a conv2d's
relu), which a reshape between them would break.

Why: the NPU's elementwise kernels take a symbolic axis 0 (rows) or trailing symbolic axes
(kernels/common/views.py); a sequence length after the batch axis of 1 (every transformer's
(1, s, hidden) residual add, SwiGLU's multiply and sigmoid) was "a symbolic axis after axis 0
that is not among the last axes" and ran on the host. The reshapes change no memory.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, tirx

from ..relax_info import shape_dims
from .rewrite import as_pass, rewrite_functions

#: The elementwise ops rewritten (those an NPU family takes with a symbolic axis 0).
ROW_OPS = ("relax.add", "relax.subtract", "relax.multiply", "relax.maximum", "relax.minimum", "relax.sigmoid",
           "relax.nn.silu", "relax.nn.relu", "relax.exp", "relax.tanh", "relax.nn.gelu", "relax.nn.gelu_tanh")
#: Norms over the last axis, rewritten when their input is a view of (s, C) rows (`_norm_rows`).
NORM_OPS = ("relax.nn.rms_norm", "relax.nn.layer_norm")
_OPS = {name: tvm.ir.Op.get(name) for name in ROW_OPS}
_NORMS = {name: tvm.ir.Op.get(name) for name in NORM_OPS}
_RESHAPE = tvm.ir.Op.get("relax.reshape")
#: Ops whose kernels fuse elementwise ops after them (epilogues): an op reading one stays as it is.
_ROOTS = ("relax.matmul", "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d", "relax.nn.conv1d_transpose",
          "relax.nn.conv2d_transpose", "relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d")


def symbolic_rows(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every elementwise op over (1, .., 1, s, C..) computed on (s, C..) views."""
    return rewrite_functions(mod, _RowsRewriter)


symbolic_rows_pass = as_pass(symbolic_rows, "cgra.SymbolicRows", ops=ROW_OPS + NORM_OPS)


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
        self.rope = _rope_vars(mod) if mod is not None else set()
        self.views = {}  # a variable -> its (s, C..) view (a rewritten op's own result, or a reshape)

    def visit_var_binding_(self, binding):
        value = binding.value
        if isinstance(value, relax.Call) and any(value.op.same_as(op) for op in _NORMS.values()):
            self._norm_rows(binding)
            return
        if not (isinstance(value, relax.Call) and any(value.op.same_as(op) for op in _OPS.values())):
            super().visit_var_binding_(binding)
            return
        if binding.var in self.rope:  # the rotary kernel takes it whole (rope_length.py)
            super().visit_var_binding_(binding)
            return
        dims = shape_dims(binding.var)
        axis = _row_axis(dims)
        args = [self.visit_expr(arg) for arg in value.args]
        if any(self._after_a_root(arg) for arg in args):  # an epilogue may take it (a conv2d's relu)
            super().visit_var_binding_(binding)
            return
        if axis is not None and all(self._viewable(arg, len(dims), axis) for arg in args):
            views = [None if len(shape_dims(arg)) < len(dims) else tuple(shape_dims(arg)[axis:]) for arg in args]
            out_view = tuple(dims[axis:])
        else:
            flat = _flat_views(dims, [shape_dims(arg) for arg in args])
            if flat is None:
                super().visit_var_binding_(binding)
                return
            out_view, views = flat
        rows = self.builder_.emit(relax.Call(value.op, [self._view(arg, view) for arg, view in zip(args, views)],
                                             value.attrs, value.ty_args, value.span))
        back = self.builder_.normalize(relax.op.reshape(rows, relax.ShapeExpr(dims)))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, back))
        self.views[(binding.var, _key(out_view))] = rows

    def _norm_rows(self, binding) -> None:
        """A norm over the last axis of (1, .., 1, s, C) whose input is a reshape of (s, C) rows
        (a residual stream's sum, which this pass computes on its rows) on those rows: the
        final norm after a decoder's last MLP then reads its sum directly, and the down
        projection's epilogue takes it as it does at a static length (kernels/gemm/post_norm.py).
        Any other norm stays as it is (the norm kernel takes the (1, s, C) form alike)."""
        value = binding.value
        dims = shape_dims(binding.var)
        axis = _row_axis(dims)
        data = self.visit_expr(value.args[0])
        axes = [int(a) % len(dims) for a in value.attrs.axes] if axis is not None else []
        rows = self._unviewed(data, tuple(dims[axis:])) if axes == [len(dims) - 1] and axis == len(dims) - 2 \
            else None
        if rows is None:
            super().visit_var_binding_(binding)
            return
        params = [self.visit_expr(arg) for arg in value.args[1:]]
        attrs = value.attrs
        if value.op.same_as(_NORMS["relax.nn.rms_norm"]):
            normed = relax.op.nn.rms_norm(rows, *params, axes=[-1], epsilon=attrs.epsilon)
        else:
            normed = relax.op.nn.layer_norm(rows, *params, axes=[-1], epsilon=attrs.epsilon,
                                            center=bool(attrs.center), scale=bool(attrs.scale))
        normed = self.builder_.emit(normed)
        back = self.builder_.normalize(relax.op.reshape(normed, relax.ShapeExpr(dims)))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, back))
        self.views[(binding.var, _key(dims[axis:]))] = normed

    def _after_a_root(self, arg) -> bool:
        """Whether `arg` is a GEMM's or pool's result, or an elementwise op's left as it is: the
        op may be part of that kernel's epilogue chain, which a reshape between would break."""
        value = self.lookup_binding(arg) if isinstance(arg, relax.Var) else None
        if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)):
            return False
        return value.op.name in _ROOTS or value.op.name in ROW_OPS

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

    def _view(self, arg, shape):
        """`arg` reshaped to `shape` (None: as it is), emitted once per variable and shape."""
        if shape is None:
            return arg
        key = (arg, _key(shape))
        if key in self.views:
            return self.views[key]
        source = self._unviewed(arg, shape)
        if source is not None:
            return source
        view = self.builder_.emit(relax.op.reshape(arg, relax.ShapeExpr(list(shape))))
        if isinstance(arg, relax.Var):
            self.views[key] = view
        return view

    def _unviewed(self, arg, shape):
        """The tensor of `shape` that `arg` is a chain of reshapes of (a linear's (s, C) result
        reshaped to (1, s, C)), else None: the op then reads the GEMM's result itself, and the
        GEMM's epilogue can take it (a residual add)."""
        node = arg
        for _ in range(4):
            value = self.lookup_binding(node) if isinstance(node, relax.Var) else None
            if not (isinstance(value, relax.Call) and value.op.same_as(_RESHAPE)):
                return None
            node = value.args[0]
            if _key(shape_dims(node) or ()) == _key(shape):
                return node
        return None


def _rope_vars(mod: tvm.IRModule) -> set:
    """The variables bound to RoPE's multiplies and add (add(multiply(x, cos), multiply(concat(slices
    of x), sin)), in either order): kernels/elementwise/rope.py takes them as one kernel at a
    symbolic length too, which a reshape between them would break (and GPT-J's, whose concat is
    reshaped, rotary_pairs.py makes that form)."""
    values = {}
    for func in mod.functions.values():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            values.update({b.var: b.value for block in func.body.blocks for b in block.bindings})

    def call(var, name):
        value = values.get(var)
        return value if isinstance(value, relax.Call) and getattr(value.op, "name", "") == name else None

    found = set()
    for var, value in values.items():
        if not (isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.add"):
            continue
        products = [call(arg, "relax.multiply") for arg in value.args]
        if None in products:
            continue
        rotated = [any(_swapped(arg, call) for arg in p.args) for p in products]
        if sorted(rotated) == [False, True]:
            found |= {var, *value.args}
    return found


def _swapped(arg, call) -> bool:
    """Whether `arg` is a concat, or a reshape of one (GPT-J's rotate_every_two: its pairs
    swapped as concat((odds, evens)) on a new last axis, reshaped back; rotary_pairs.py)."""
    reshape = call(arg, "relax.reshape")
    return call(arg, "relax.concat") is not None or (reshape is not None and
                                                     call(reshape.args[0], "relax.concat") is not None)


def _key(shape) -> str:
    return ",".join(str(d) for d in shape)


def _flat_views(out, operands):
    """(output view, operand views) for an op whose output is (1.., P.., s, C..), P static and not
    1 (RoPE's (1, H, s, d) against cos's (1, 1, s, d)): each operand walks the static axes P or
    broadcasts along all of them, and walks s and C: views (prod(P), s * prod(C)) and (1, s *
    prod(C)), the length in the trailing axis the elementwise kernels take symbolic. None when
    the op has another form."""
    if out is None or any(dims is None or len(dims) != len(out) for dims in operands):
        return None
    symbolic = [axis for axis, d in enumerate(out) if not isinstance(d, int)]
    if len(symbolic) != 1 or symbolic[0] == len(out) - 1 or not isinstance(out[symbolic[0]], tirx.Var):
        return None
    axis = symbolic[0]
    lead = next(a for a, d in enumerate(out) if d != 1)
    prefix, tail = tuple(out[lead:axis]), tuple(out[axis + 1:])
    if not prefix:
        return None
    length = out[axis] * math.prod(tail)
    views = []
    for dims in operands:
        if all(d == 1 for d in dims):  # a scalar as (1, ..., 1) (scalars.py): one element for all
            views.append((1, 1))
            continue
        own = tuple(dims[lead:axis])
        if any(d != 1 for d in dims[:lead]) or own not in (prefix, (1,) * len(prefix)) \
                or isinstance(dims[axis], int) or not dims[axis].same_as(out[axis]) or tuple(dims[axis + 1:]) != tail:
            return None
        views.append((math.prod(own), length))
    return (math.prod(prefix), length), views
