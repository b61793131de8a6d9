"""Slices to a symbolic length, resolved with the length's bounds.

Stage: normalise (its first rewrite, outside the pass list: it raises UnsupportedOperator). In: a
Relax IRModule. Out: the same module in which, for a function with a symbolic dimension, every shape
expression is simplified under its variables' bounds (the function's `tir_var_lower_bound` /
`tir_var_upper_bound`, which torch.export's `Dim("s", min=2, max=256)` sets, then compile's
`shape_bounds`; a dimension is never negative), every `strided_slice` axis counted from the end
counted from 0, and every `strided_slice` whose output extent Relax left as `min` / `max` arithmetic
(or whose symbolic begin or end TVM's lowering would turn into such arithmetic), but which is
provably inside its tensor for every allowed length, is marked `assume_inbound`, so that its extent
is `end - begin`. A binary elementwise op whose operands' shapes still cannot be proved to broadcast
is refused: UnsupportedOperator naming the op, the shapes and the bounds that would decide it.

Why: Relax infers a slice's extent without the bounds. Hugging Face's packed-sequence check
(`torch.diff(position_ids, prepend=position_ids[:, :1] - 1)`, every decoder given `input_ids`
alone) slices to `(1, min(1, s))` and `(1, min(s, min(1, s) + s))`; the encoders' position ids
(`self.position_ids[:, :s]` of a (1, 512) buffer: DistilBERT, ALBERT) to `(1, min(s, 512))`. The
subtract or add that meets the plain `(1, s)` then has no shape: a cumsum that no target builds
("non-symbolic shape is not supported"), an add TVM refuses with an InternalError. With s >= 2
and s <= 256 each of those extents is s. And TVM lowers a slice with a symbolic begin or end
taking a negative axis as written: "Check failed: axis < src_tensor_dim (-1 vs. 2)" (the
packed-sequence check's `torch.diff(dim=-1)`).
"""

from __future__ import annotations

import tvm
from tvm import relax, sym, tirx

from ..errors import UnsupportedOperator
from ..frontend.provenance import with_span
from ..relax_info import expression_name, shape_dims
from .rewrite import with_updates

_SLICE = tvm.ir.Op.get("relax.strided_slice")
#: Broadcasting elementwise ops whose result has no shape when their operands' cannot be compared.
_BINARY = frozenset(f"relax.{name}" for name in (
    "add", "subtract", "multiply", "divide", "floor_divide", "power", "maximum", "minimum", "equal", "not_equal",
    "less", "less_equal", "greater", "greater_equal", "bitwise_and", "bitwise_or", "logical_and", "logical_or",
    "where"))


def resolve_bounded_shapes(mod: tvm.IRModule, shape_bounds: dict | None = None) -> tvm.IRModule:
    """`mod` with the shapes of its functions with symbolic dimensions resolved under their bounds
    (module docstring); `shape_bounds` ({"s": 256}) gives upper bounds the functions do not carry.
    Raises UnsupportedOperator for an elementwise op whose operands' shapes stay undecided."""
    updates = {}
    for gvar, func in mod.functions.items():
        if not isinstance(func, relax.Function) or not _symbolic_params(func):
            continue
        rewritten = _BoundedShapes(mod, _analyzer(func, shape_bounds or {})).visit_expr(func)
        _refuse_undecided(rewritten, gvar.name_hint, _bounds_text(func, shape_bounds or {}))
        if not rewritten.same_as(func):
            updates[gvar] = rewritten
    return with_updates(mod, updates)


def _symbolic_params(func) -> list:
    """The symbolic dimension variables of `func`'s parameters' shapes."""
    return list(relax.analysis.defined_symbolic_vars(func)) if func.params else []


def _analyzer(func, shape_bounds: dict):
    """An analyzer that knows each of `func`'s symbolic variables' range."""
    analyzer = sym.Analyzer()
    for var in _symbolic_params(func):
        lower, upper = _bounds(func, var, shape_bounds)
        if upper is not None:
            analyzer.bind(var, tvm.ir.Range(tirx.const(lower, str(var.ty)), tirx.const(upper + 1, str(var.ty))))
        else:
            analyzer.update(var, sym.ConstIntBound(lower, sym.ConstIntBound.POS_INF))
    return analyzer


def _bounds(func, var, shape_bounds: dict) -> tuple[int, int | None]:
    """(lowest, highest or None) value of the dimension variable `var` in `func`."""
    attrs = func.attrs or {}
    lower = attrs.get("tir_var_lower_bound", {}).get(var.name, 0)
    upper = attrs.get("tir_var_upper_bound", {}).get(var.name, shape_bounds.get(var.name))
    return max(int(lower), 0), None if upper is None else int(upper)


def _bounds_text(func, shape_bounds: dict) -> str:
    parts = []
    for var in _symbolic_params(func):
        lower, upper = _bounds(func, var, shape_bounds)
        parts.append(f"{lower} <= {var.name}" + (f" <= {upper}" if upper is not None else " (no upper bound)"))
    return ", ".join(parts)


@relax.expr_functor.mutator
class _BoundedShapes(relax.PyExprMutator):
    def __init__(self, mod, analyzer):
        super().__init__(mod)
        self.analyzer = analyzer

    def visit_shape_expr_(self, op):
        values = [self.analyzer.simplify(value) for value in op.values]
        if all(new.same_as(old) or str(new) == str(old) for new, old in zip(values, op.values)):
            return op
        return relax.ShapeExpr(values)

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_SLICE)):
            return call
        axes = _axes_from_zero(call)
        clamped = self._clamped_to_extent(call)
        if clamped is not None and self._inbound(clamped):
            call = clamped
        inbound = bool(call.attrs.assume_inbound) or (
            (self._unresolved(call) or _symbolic_ends(call)) and self._inbound(call))
        if axes is None and clamped is None and inbound == bool(call.attrs.assume_inbound):
            return call
        strides = call.args[4] if len(call.args) > 4 else None
        return with_span(relax.op.strided_slice(call.args[0], axes if axes is not None else call.args[1],
                                                *call.args[2:4], strides=strides, assume_inbound=inbound), call.span)

    def _clamped_to_extent(self, call):
        """The slice with its constant begins and ends along a symbolic axis as offsets from 0
        inside the axis: a negative one counted from the end, one past the end (PyTorch's
        `x[:, 1:]` exports an end of 2**63 - 1) the extent itself; None when nothing changes or
        an offset could leave the axis. MobileBERT's trigram embedding slices its (1, s, 32)
        embeddings to `[:, 1:]` and `[:, :-1]`, pads each back to s rows and concatenates the
        three: with the slices' extents left as min / max arithmetic the concat had no shape and
        no target could build it ("CodeGenVM cannot emit")."""
        dims = shape_dims(call.args[0])
        fields = [getattr(arg, "fields", None) for arg in call.args[1:4]]
        if dims is None or None in fields:
            return None
        axes, begins, ends = (list(f) for f in fields)
        changed = False
        for i, axis in enumerate(axes):
            extent = dims[int(axis) % len(dims)]
            if isinstance(extent, int):
                continue
            for values in (begins, ends):
                value = values[i]
                if not isinstance(value, tirx.IntImm):
                    continue
                if int(value) < 0:
                    values[i], changed = extent + int(value), True
                elif self.analyzer.can_prove(tirx.const(int(value), "int64") >= extent) and int(value) > 0:
                    values[i], changed = extent, True
        if not changed:
            return None
        strides = call.args[4] if len(call.args) > 4 else None
        return relax.op.strided_slice(call.args[0], axes, begins, ends, strides=strides,
                                      assume_inbound=bool(call.attrs.assume_inbound))

    def _unresolved(self, call) -> bool:
        """Whether the call's inferred extents simplify further under the bounds."""
        dims = shape_dims(call)
        return dims is not None and any(not isinstance(d, int) and str(self.analyzer.simplify(d)) != str(d)
                                        for d in dims)

    def _inbound(self, call) -> bool:
        """Whether every sliced axis has stride 1 and 0 <= begin <= end <= extent for every length."""
        dims = shape_dims(call.args[0])
        fields = [getattr(arg, "fields", None) for arg in call.args[1:5]]
        if dims is None or None in fields[:3]:
            return False
        axes, begins, ends = fields[:3]
        strides = fields[3] if len(call.args) > 4 else [1] * len(axes)
        for axis, begin, end, stride in zip(axes, begins, ends, strides):
            if not isinstance(stride, (int, tirx.IntImm)) or int(stride) != 1:
                return False
            extent = dims[int(axis) % len(dims)]
            if not self.analyzer.can_prove(tirx.all(0 <= begin, begin <= end, end <= extent)):
                return False
        return True


def _symbolic_ends(call) -> bool:
    """Whether a begin or end of the slice is symbolic (its lowering computes the extent again,
    as min / max arithmetic, unless the slice assumes it is inside the tensor)."""
    return any(not isinstance(value, tirx.IntImm) for arg in call.args[2:4] for value in getattr(arg, "fields", ()))


def _axes_from_zero(call):
    """The slice's axes counted from 0 when one counts from the end (TVM's lowering of a slice
    with a symbolic begin or end takes axis -1 as written: "Check failed: axis <
    src_tensor_dim (-1 vs. 2)"), else None."""
    dims, axes = shape_dims(call.args[0]), getattr(call.args[1], "fields", None)
    if dims is None or axes is None or not all(isinstance(axis, tirx.IntImm) for axis in axes) \
            or all(int(axis) >= 0 for axis in axes):
        return None
    return [int(axis) % len(dims) for axis in axes]


def _refuse_undecided(func, name: str, bounds: str) -> None:
    """UnsupportedOperator for the first broadcasting op of `func` whose result has no shape while
    its operands have one, one of them a clamped extent (a slice's min / max the bounds did not
    resolve): the shapes could not be compared for every length."""
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in _BINARY):
                continue
            operands = [shape_dims(arg) for arg in value.args if isinstance(arg, relax.Expr)]
            if shape_dims(binding.var) is not None or any(shape is None for shape in operands) \
                    or not any(_clamped(d) for shape in operands for d in shape):
                continue  # no shape for another reason (h and w, equal at run time or not): left to run
            shapes = " and ".join("(" + ", ".join(expression_name(d).replace("T.", "") for d in shape) + ")"
                                  for shape in operands)
            var = next((str(v) for shape in operands for d in shape if not isinstance(d, int)
                        for v in tirx.analysis.undefined_vars(d)), "s")
            raise UnsupportedOperator(
                f"{value.op.name.replace('relax.', '')} in {name}: its operands' shapes {shapes} agree for some "
                f"lengths only, and the bounds ({bounds}) do not decide it (the model slices to its length). "
                f"Export with bounds under which they agree (torch.export.Dim('{var}', min=2, max=N) with N no larger "
                f"than the constant the length is sliced from, or compile(..., shape_bounds={{'{var}': N}})); "
                "a Hugging Face decoder given input_ids alone can be given an attention_mask input instead")


def _clamped(dim) -> bool:
    """Whether a symbolic extent holds a min or max (a slice clamped to its tensor)."""
    return not isinstance(dim, int) and any(word in str(dim) for word in ("min(", "max("))
