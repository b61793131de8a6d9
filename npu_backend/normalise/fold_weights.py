"""Fold inference batch norm into conv2d weights, and constant arithmetic on weights, with numpy.

Stage: normalise. Input: a Relax IRModule as the importers leave it. Output: the same module with

    y = batch_norm(conv2d(x, W), gamma, beta, mean, var)[0]        (inference, all constant)
 -> y = add(conv2d(x, W * s), beta - mean * s),  s = gamma / sqrt(var + eps)

(`s` reshaped to the weight's output-channel axis, the bias to the output's channel axis: (1, C, 1, 1)
for NCHW), and every call of a `NUMPY_OPS` operator (numpy_ops.py) whose tensor arguments are all constants
replaced by its value (bias reshapes, transposed Gemm weights, the isnan/where ONNX's Clip
leaves around its bounds).

Why not FoldBatchnormToConv2D + FoldConstant: FoldConstant compiles and runs every constant
subexpression through TVM, seconds per model (tens of seconds for PyTorch's MobileNetV2). numpy
computes the same float32 operations with the same IEEE rounding (add, multiply, divide and sqrt
are correctly rounded in both) in milliseconds, so the folded weights are bit-identical.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr import _update_type

from ..frontend.provenance import with_span
from ..relax_info import dtype_of, static_shape
from .arrays import aligned_empty, read_only_view, shared_const
from .numpy_ops import FLOAT, NUMPY_OPS
from .rewrite import values_and_users, with_updates


def fold_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """Every Relax function of `mod` (not composites or primitives) with its constants folded."""
    updates = {}
    for gvar, func in mod.functions.items():
        if not isinstance(func, relax.Function) or _is_kernel(func):
            continue
        func = relax.analysis.remove_all_unused(func)  # the unused mean/var outputs of batch_norm
        updates[gvar] = _WeightFolder(mod, func).visit_expr(func)
    return with_updates(mod, updates)


def folded_or(constants: dict, var, visit):
    """The constant `var` was folded to, else `visit(var)`: a use of a folded variable."""
    folded = constants.get(var)
    return folded if folded is not None else visit(var)


def _is_kernel(func) -> bool:
    attrs = func.attrs or {}
    return "Composite" in attrs or int(attrs.get("Primitive", 0)) != 0


@relax.expr_functor.mutator
class _WeightFolder(relax.PyExprMutator):
    """Drops the bindings it folds; uses of a folded variable become the constant."""

    def __init__(self, mod, func):
        super().__init__(mod)
        self.constants = {}  # var -> relax constant it was folded to
        self.folded_norms = set()  # batch_norm vars whose conv2d took the scale and shift
        self.bias_of = {}  # var of batch_norm(...)[0] -> (conv2d var, bias constant, norm's span)
        self.values, self.users = values_and_users(func)

    def visit_var_(self, op):
        return folded_or(self.constants, op, super().visit_var_)

    def visit_dataflow_var_(self, op):
        return folded_or(self.constants, op, super().visit_dataflow_var_)

    def visit_var_binding_(self, binding):
        var, value = binding.var, binding.value
        if var in self.folded_norms:
            return
        if var in self.bias_of:
            conv, bias, span = self.bias_of[var]
            # The bias add stands for the batch norm: it carries the norm's model node.
            self._emit(var, with_span(relax.op.add(conv, bias), span))
            return
        if self._fold_batch_norm_into(var, value):
            return
        if self._transposed_weight(var, value):  # kept, and hidden from FoldConstant
            weight = self.visit_expr(value.args[0])
            self._emit(var, with_span(relax.op.call_pure_packed(KEPT_TRANSPOSE, weight, ty_args=value.ty), value.span))
            return
        folded = self._evaluate(value)
        if folded is not None:
            self.constants[var] = folded
            return
        super().visit_var_binding_(binding)

    def _transposed_weight(self, var, value) -> bool:
        """A transpose of a 2-D constant that only matmuls read as their right operand (ONNX's
        Gemm with transB, a Linear layer): left in place, the matmul kernel reads the weight as
        stored. Folding it would copy the weight transposed: for AlexNet's classifier, 150 MB
        and a second of strided copying. It is emitted as an opaque call that FoldConstant
        cannot evaluate, and `restore_kept_transposes` makes it a permute_dims again."""
        if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                and value.op.name == "relax.permute_dims"
                and isinstance(self.constants.get(value.args[0], value.args[0]), tvm.ir.GenericConst)
                and len(static_shape(value) or ()) == 2):
            return False
        users = self.users.get(var, [])
        return bool(users) and all(
            isinstance(self.values.get(user), relax.Call) and getattr(self.values[user].op, "name", "") == "relax.matmul"
            and self.values[user].args[1].same_as(var) and not self.values[user].args[0].same_as(var)
            for user in users)

    def _emit(self, var, value):
        self.builder_.emit_normalized(relax.VarBinding(var, self.builder_.normalize(value)))

    def _constant(self, expr):
        """The numpy value of a constant argument (or of a variable folded to one), else None."""
        expr = self.constants.get(expr, expr)
        if isinstance(expr, relax.Var) and isinstance(self.values.get(expr), tvm.ir.GenericConst):
            expr = self.values[expr]  # a variable bound to a constant (PyTorch's exports bind scalars)
        if isinstance(expr, tvm.ir.GenericConst):
            return read_only_view(expr.value)
        if isinstance(expr, (tvm.tirx.FloatImm, tvm.tirx.IntImm)):
            return np.array(expr.value, dtype=str(expr.ty))
        if isinstance(expr, relax.ShapeExpr) and all(isinstance(d, tvm.tirx.IntImm) for d in expr.values):
            return np.array([int(d) for d in expr.values], dtype=np.int64)  # full's shape
        return None

    def _constant_of(self, expr):
        """The numpy value of `expr` when it is a constant, or a variable bound (anywhere in the
        function, before or after the current binding) to constant arithmetic fold_weights knows."""
        value = self._constant(expr)
        if value is not None or not isinstance(expr, relax.Var):
            return value
        bound = self.values.get(expr)
        if not isinstance(bound, relax.Call) or not isinstance(bound.op, tvm.ir.Op):
            return None
        entry = NUMPY_OPS.get(bound.op.name)
        if entry is None or static_shape(bound) is None or len(bound.args) < entry[0]:
            return None
        arrays = [self._argument(arg, self._constant_of) for arg in bound.args[:entry[0]]]
        if any(a is None for a in arrays):
            return None
        result = entry[1](bound, *arrays)
        return result if result is not None and result.dtype.name == dtype_of(bound) else None

    @staticmethod
    def _argument(expr, constant):
        """`constant(expr)`, or for a tuple (concat's operand) the tuple of its fields' values."""
        if isinstance(expr, relax.Tuple):
            fields = tuple(constant(field) for field in expr.fields)
            return None if any(field is None for field in fields) else fields
        return constant(expr)

    def _evaluate(self, call):
        """The constant `call` computes when it is a `NUMPY_OPS` call of constants, else None."""
        if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
            return None
        entry = NUMPY_OPS.get(call.op.name)
        if entry is None or static_shape(call) is None:
            return None
        count, fn = entry
        arrays = [self._argument(arg, self._constant) for arg in call.args[:count]]
        if len(call.args) < count or any(a is None for a in arrays):
            return None
        result = fn(call, *arrays)
        # Fold only when numpy gives exactly the type Relax inferred: no silent promotion.
        if result is None or result.dtype.name != dtype_of(call) or result.shape != static_shape(call):
            return None
        return shared_const(result, dtype_of(call))

    def _fold_batch_norm_into(self, conv_var, conv):
        """At a conv2d binding followed only by an inference batch norm (with at most a constant
        bias add between them, PyTorch's Conv2d(bias=True)): emit the conv2d with scaled weights
        and plan the bias add for the batch norm's output. True if it did."""
        plan = self._batch_norm_plan(conv_var, conv)
        if plan is None:
            return False
        norm_var, outputs, weight, bias, skipped = plan
        folded = relax.Call(conv.op, [self.visit_expr(conv.args[0]), weight], conv.attrs, span=conv.span)
        # Same shapes as the conv2d it replaces: its type, given, spares the builder inferring
        # it again (TVM's conv2d type inference, about 0.5 ms a call: 64 ms on DenseNet-121).
        _update_type(folded, conv.ty)
        self._emit(conv_var, folded)
        self.folded_norms |= {norm_var} | skipped
        for out in outputs:
            self.bias_of[out] = (conv_var, bias, self.values[norm_var].span)
        return True

    def _batch_norm_plan(self, conv_var, conv):
        """(batch_norm var, its [0] vars, folded weight, bias, folded bias-add vars) or None when
        the pattern is not exact."""
        if not (isinstance(conv, relax.Call) and getattr(conv.op, "name", "") == "relax.nn.conv2d"):
            return None
        weight = self._constant(conv.args[1])
        if weight is None or not isinstance(conv_var, relax.DataflowVar):
            return None
        norm_var, conv_bias, skipped = self._next_user(conv_var), None, set()
        if norm_var is not None and _op_name(self.values.get(norm_var)) == "relax.add":
            conv_bias = self._bias_operand(self.values[norm_var], conv_var)
            if conv_bias is None:
                return None
            skipped, norm_var = {norm_var}, self._next_user(norm_var)
        norm = self.values.get(norm_var)
        if norm_var is None or _op_name(norm) != "relax.nn.batch_norm" or not isinstance(norm_var, relax.DataflowVar):
            return None
        outputs = [u for u in self.users.get(norm_var, []) if _is_first_item(self.values.get(u), norm_var)]
        if not outputs or len(outputs) != len(self.users.get(norm_var, [])):
            return None  # the batch norm's statistics are used: keep it
        stats = [self._constant(arg) for arg in norm.args[1:5]]
        folded = _fold_scale_shift(conv.attrs, norm.attrs, weight, stats, dtype_of(conv), conv_bias)
        if folded is None:
            return None
        dtype = dtype_of(conv)
        return norm_var, outputs, shared_const(folded[0], dtype), shared_const(folded[1], dtype), skipped

    def _next_user(self, var):
        """The one binding that uses `var` (a dataflow var), or None."""
        users = self.users.get(var, [])
        return users[0] if len(users) == 1 and isinstance(var, relax.DataflowVar) else None

    def _bias_operand(self, add, conv_var):
        """The constant other operand of add(conv, b) or add(b, conv), else None."""
        lhs, rhs = add.args
        other = rhs if lhs.same_as(conv_var) else lhs if rhs.same_as(conv_var) else None
        return self._constant_of(other) if other is not None else None


def _fold_scale_shift(conv_attrs, norm_attrs, weight, stats, dtype, conv_bias=None):
    """(weight * s, beta - mean * s) shaped for the layouts, computed in the conv's dtype (the
    order of FoldBatchnormToConv2D), or None when the batch norm is not a foldable inference one.
    With the conv's own bias b (an array broadcasting along the output's channel axis), the shift
    is (b - mean) * s + beta. A bfloat16 conv's are computed in float32 and rounded once (numpy
    has no bfloat16 arithmetic of its own; TVM's host batch norm on bfloat16 returns float32)."""
    out_layout = str(conv_attrs.out_layout or conv_attrs.data_layout)
    kernel_layout = str(conv_attrs.kernel_layout)
    if dtype == "bfloat16" and weight.dtype.name == dtype:
        widened = [None if s is None else s.astype(np.float32) for s in stats]
        bias = None if conv_bias is None else conv_bias.astype(np.float32)
        folded = _fold_scale_shift(conv_attrs, norm_attrs, weight.astype(np.float32), widened, "float32", bias)
        return None if folded is None else tuple(part.astype(weight.dtype) for part in folded)
    if (any(s is None for s in stats) or bool(norm_attrs.training) or dtype not in FLOAT
            or weight.dtype.name != dtype or sorted(out_layout) != sorted("NCHW")
            or sorted(kernel_layout) != sorted("OIHW")
            or int(norm_attrs.axis) % len(out_layout) != out_layout.index("C")):
        return None
    gamma, beta, mean, var = (s.astype(dtype) for s in stats)
    channels = weight.shape[kernel_layout.index("O")]
    if any(s.shape != (channels,) for s in (gamma, beta, mean, var)):
        return None
    if not bool(norm_attrs.scale):
        gamma = np.ones_like(gamma)
    if not bool(norm_attrs.center):
        beta = np.zeros_like(beta)
    scale = gamma / np.sqrt(var + np.array(float(norm_attrs.epsilon), dtype=dtype))
    if conv_bias is None:
        shift = beta - mean * scale
    else:
        bias = _per_channel(conv_bias, out_layout, channels, dtype)
        if bias is None:
            return None
        shift = (bias - mean) * scale + beta
    scaled = np.multiply(weight, scale.reshape(_channel_shape(kernel_layout, "O", channels)),
                         out=aligned_empty(weight.shape, weight.dtype))
    return scaled, shift.reshape(_channel_shape(out_layout, "C", channels))


def _per_channel(bias, out_layout: str, channels: int, dtype: str):
    """A bias broadcast along the output's channel axis only, as (channels,), else None."""
    if bias.dtype.name != dtype or bias.ndim > len(out_layout):
        return None
    aligned = bias.reshape((1,) * (len(out_layout) - bias.ndim) + bias.shape)
    axis = out_layout.index("C")
    if any(extent != 1 for i, extent in enumerate(aligned.shape) if i != axis) or \
            aligned.shape[axis] not in (1, channels):
        return None
    return np.broadcast_to(aligned.reshape(-1), (channels,)).copy()


def _op_name(value) -> str:
    return value.op.name if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) else ""


def _channel_shape(layout: str, axis: str, channels: int) -> tuple:
    return tuple(channels if letter == axis else 1 for letter in layout)


def _is_first_item(value, tuple_var) -> bool:
    return isinstance(value, relax.TupleGetItem) and value.tuple_value.same_as(tuple_var) and value.index == 0




#: The opaque stand-in for a transpose fold_weights keeps (`_WeightFolder._transposed_weight`)
#: until FoldConstant has run.
KEPT_TRANSPOSE = "cgra.kept_transpose"


def restore_kept_transposes(mod: tvm.IRModule) -> tvm.IRModule:
    """Every KEPT_TRANSPOSE call back to the permute_dims it stands for."""
    updates = {gvar: _TransposeRestorer(mod).visit_expr(func) for gvar, func in mod.functions.items()
               if isinstance(func, relax.Function)}
    return with_updates(mod, updates)


@relax.expr_functor.mutator
class _TransposeRestorer(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", "") == "relax.call_pure_packed" and isinstance(call.args[0], relax.ExternFunc) \
                and str(call.args[0].global_symbol) == KEPT_TRANSPOSE:
            return with_span(relax.op.permute_dims(call.args[1]), call.span)  # the model node it came from
        return call
