"""A split's part is a slice, and a slice then a reshape that cuts the sliced axis is a reshape
then a slice.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which
- `split(y, sections, axis)[i]` (static sections) is `strided_slice(y, [axis], [b_i], [e_i])`;
- a slice of a slice is one slice (with steps too), and a unit-step slice of a transpose that
  only slices and splits read is a transpose of a slice;
- `reshape(strided_slice(y, [a], [b], [e]), s)` where s only cuts axis a of the slice into
  (n, q), q dividing b, e and y's axis a, is `strided_slice(reshape(y, y's shape cut the same
  way), [a], [b / q], [e / q])`.

Exact: both move the same elements to the same places (a reshape of a compact tensor is a view).
Why: a split is a host call (the NPU's kernels have one output); its parts as slices are NPU
copies (ShuffleNet's channel split, Phi-3's gate / up: the host call and its crossings gone,
ShuffleNet at 64 px on cgra-8x8 873 k -> 829 k cycles host time counted), or boxes of the
kernels that read them. A fused q / k / v projection (GPT-2's c_attn, GPT-NeoX, Phi-3) is cut
into its three parts and each into heads, (S, 3 C) -> 3 x (S, C) -> (S, H, D), then
transposed; the parts' slices were copy kernels of their own. As a reshape of the projection's output (a view) and a slice, each part is a slice the transposing
copy or the RoPE kernel after it reads as its box's origin (kernels/layout/layout.py's
`permute_dims(strided_slice(x))`, kernels/elementwise/rope.py): no host call, no slice copy.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

from ..relax_info import shape_dims
from .rewrite import as_pass, rewrite_functions

_SPLIT = tvm.ir.Op.get("relax.split")
_SLICE = tvm.ir.Op.get("relax.strided_slice")
_RESHAPE = tvm.ir.Op.get("relax.reshape")
_PERMUTE = tvm.ir.Op.get("relax.permute_dims")


def split_slices_rewritten(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with split parts as slices and reshapes moved before the slices they cut."""
    return rewrite_functions(mod, _SliceRewriter)


split_slices_pass = as_pass(split_slices_rewritten, "cgra.SplitSlices", ops=("relax.split", "relax.strided_slice"))


def split_bounds(call, index: int) -> tuple[int, int, int] | None:
    """(axis, begin, end) of part `index` of a split of a static axis (the others may be
    symbolic: a prefill's fused q / k / v projection), else None."""
    shape = shape_dims(call.args[0])
    if not shape:
        return None
    axis = int(call.attrs.axis) % len(shape)
    if not isinstance(shape[axis], int):
        return None
    sections = call.attrs.indices_or_sections
    if isinstance(sections, (int, tvm.tirx.IntImm)):
        count = int(sections)
        if count <= 0 or shape[axis] % count:
            return None
        cuts = [shape[axis] // count * k for k in range(1, count)]
    else:
        cuts = [int(c) for c in sections]
    edges = [0] + [min(max(c, 0), shape[axis]) for c in cuts] + [shape[axis]]
    if not 0 <= index < len(edges) - 1:
        return None
    return axis, edges[index], max(edges[index], edges[index + 1])


def unit_slice(call) -> tuple[int, int, int] | None:
    """(axis, begin, end) of a strided_slice of one static axis, step 1, constant in-range bounds."""
    shape, out = shape_dims(call.args[0]), shape_dims(call)
    args = list(call.args[1:])
    if not shape or out is None or len(args) < 3 or not all(isinstance(a, relax.Tuple) for a in args[:3]):
        return None
    axes, begin = _ints(args[0]), _ints(args[1])
    steps = _ints(args[3]) if len(args) > 3 and isinstance(args[3], relax.Tuple) else [1]
    if len(axes) != 1 or steps != [1] or not _static_at(shape, out, axes):
        return None
    axis = axes[0] % len(shape)
    start = begin[0] + shape[axis] if begin[0] < 0 else begin[0]
    start = min(max(start, 0), shape[axis])
    return axis, start, start + out[axis]


def _ints(expr) -> list:
    return [int(getattr(f, "value", f)) for f in expr.fields]


def _constant_part(data, axis: int, begin: int, end: int):
    """The part [begin, end) along `axis` of a constant split: a constant (FoldConstant leaves a
    split of a constant alone, its result being a tuple; GPT-J's sin / cos halves of its folded
    position table were a host call)."""
    array = data.value.numpy()
    index = [slice(None)] * array.ndim
    index[axis] = slice(begin, end)
    return relax.const(array[tuple(index)].copy(), str(array.dtype))


def _slice(data, axis: int, begin: int, end: int):
    return relax.op.strided_slice(data, [axis], [begin], [end])


def readers_of(mod: tvm.IRModule) -> dict:
    """Variable -> the operators of the bindings that read it ("" for anything but an operator
    call: a tuple item, a function's result)."""
    readers: dict = {}
    for func in mod.functions.values():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                op = value.op.name if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) else ""
                for var in relax.analysis.free_vars(value):
                    readers.setdefault(var, []).append(op)
        for var in relax.analysis.free_vars(func.body.body):
            readers.setdefault(var, []).append("")
    return readers


def sliced_only(mod: tvm.IRModule) -> set:
    """The variables every reader of which is a strided_slice or a split (a transpose only cut
    into parts)."""
    cuts = ("relax.strided_slice", "relax.split")
    return {var for var, ops in readers_of(mod).items() if all(op in cuts for op in ops)}


@relax.expr_functor.mutator
class _SliceRewriter(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self._sliced_only = sliced_only(mod)
        self._original = {}  # a rewritten binding's variable -> the one it replaces

    def visit_var_binding_(self, binding):
        super().visit_var_binding_(binding)
        self._original[self.visit_expr(binding.var)] = binding.var

    def visit_tuple_getitem_(self, item):
        item = self.visit_expr_post_order(item)
        value = self.lookup_binding(item.tuple_value) if isinstance(item.tuple_value, relax.Var) else item.tuple_value
        if isinstance(value, relax.Call) and value.op.same_as(_SPLIT):
            bounds = split_bounds(value, int(item.index))
            if bounds is not None and isinstance(value.args[0], tvm.ir.GenericConst):
                return _constant_part(value.args[0], *bounds)
            if bounds is not None and isinstance(value.args[0], relax.Var):
                return self._slice_through(self.builder_.normalize(_slice(value.args[0], *bounds)))
        return item

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if isinstance(call, relax.Call) and call.op.same_as(_SLICE) and isinstance(call.args[0], relax.Var):
            return self._slice_through(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_RESHAPE) and isinstance(call.args[0], relax.Var)):
            return call
        inner = self.lookup_binding(call.args[0])
        if not (isinstance(inner, relax.Call) and inner.op.same_as(_SLICE)):
            return call
        # (axes other than the sliced one may be symbolic: a prefill's length)
        bounds, data_shape = unit_slice(inner), _dims(inner.args[0])
        sliced, target = _dims(inner), _dims(call)
        if bounds is None or data_shape is None or target is None:
            return call
        axis, begin, end = bounds
        cut = target[axis + 1] if len(target) == len(sliced) + 1 and axis + 1 < len(target) else 0
        if (not isinstance(cut, int) or not cut or not isinstance(target[axis], int)
                or not _same(target[:axis], sliced[:axis]) or not _same(target[axis + 2:], sliced[axis + 1:])
                or target[axis] * cut != sliced[axis] or begin % cut or data_shape[axis] % cut):
            return call
        whole = data_shape[:axis] + (data_shape[axis] // cut, cut) + data_shape[axis + 1:]
        viewed = self.builder_.emit(relax.op.reshape(inner.args[0], whole))
        return _slice(viewed, axis, begin // cut, begin // cut + target[axis])

    def _slice_through(self, call):
        """A unit-step slice of a slice as one slice of the first's operand; a slice of a
        transpose as the transpose of a slice (the slice first, nearer the tensor it cuts)."""
        box = unit_box(call)
        inner = self.lookup_binding(call.args[0])
        if isinstance(inner, relax.Call) and inner.op.same_as(_SLICE) and (box is None or unit_box(inner) is None):
            return strided_composed(inner, call)
        if box is None or not isinstance(inner, relax.Call):
            return call
        if inner.op.same_as(_SLICE):
            first = unit_box(inner)
            if first is None:
                return call
            merged = dict(first)
            for axis, (begin, end) in box.items():
                start = first.get(axis, (0, 0))[0]
                merged[axis] = (start + begin, start + end)
            return _box(inner.args[0], merged)
        cut_only = self._original.get(call.args[0], call.args[0]) in self._sliced_only
        if inner.op.same_as(_PERMUTE) and isinstance(inner.args[0], relax.Var) and cut_only:
            axes = permute_axes(inner)
            if axes is None:
                return call
            part = self.builder_.emit(_box(inner.args[0], {axes[a]: bounds for a, bounds in box.items()}))
            return relax.op.permute_dims(self._merged(part), axes)
        return call

    def _merged(self, part):
        """`part` (a slice just emitted) merged into the slice it cuts, if it cuts one."""
        value = self.lookup_binding(part)
        inner = self.lookup_binding(value.args[0]) if isinstance(value.args[0], relax.Var) else None
        if isinstance(inner, relax.Call) and inner.op.same_as(_SLICE):
            return self.builder_.emit(self._slice_through(value))
        return part


def unit_box(call) -> dict | None:
    """{axis: (begin, end)} of a strided_slice with unit steps and constant bounds along static
    axes, else None."""
    shape, out = shape_dims(call.args[0]), shape_dims(call)
    args = list(call.args[1:])
    if not shape or out is None or len(args) < 3 or not all(isinstance(a, relax.Tuple) for a in args[:3]):
        return None
    axes, begin = _ints(args[0]), _ints(args[1])
    steps = _ints(args[3]) if len(args) > 3 and isinstance(args[3], relax.Tuple) else [1] * len(axes)
    if any(step != 1 for step in steps) or len(set(a % len(shape) for a in axes)) != len(axes) \
            or not _static_at(shape, out, axes):
        return None
    box = {}
    for axis, start in zip(axes, begin):
        axis %= len(shape)
        start = min(max(start + shape[axis] if start < 0 else start, 0), shape[axis])
        box[axis] = (start, start + out[axis])
    return box


def _dims(expr):
    """The shape as a tuple (ints, symbolic dims as their expressions), or None."""
    dims = shape_dims(expr)
    return None if dims is None else tuple(dims)


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x == y if isinstance(x, int) and isinstance(y, int)
                                    else not isinstance(x, int) and not isinstance(y, int)
                                    and tvm_ffi.structural_equal(x, y) for x, y in zip(a, b))


def _static_at(shape, out, axes) -> bool:
    """Whether the slice's operand and result are static along `axes` (symbolic elsewhere)."""
    return len(out) == len(shape) and all(isinstance(shape[a % len(shape)], int)
                                          and isinstance(out[a % len(shape)], int) for a in axes)


def strided_box(call) -> dict | None:
    """{axis: (begin, step, count)} of a strided_slice with positive steps and constant bounds,
    else None. The axes it cuts static, others may be symbolic (GPT-J's rotate_every_two at a
    symbolic length: every other dim of a head's slice, its positions axis s)."""
    shape, out = shape_dims(call.args[0]), shape_dims(call)
    args = list(call.args[1:])
    if shape is None or out is None or len(args) < 3 or not all(isinstance(a, relax.Tuple) for a in args[:3]):
        return None
    axes, begin = _ints(args[0]), _ints(args[1])
    steps = _ints(args[3]) if len(args) > 3 and isinstance(args[3], relax.Tuple) else [1] * len(axes)
    if any(step <= 0 for step in steps) or len(set(a % len(shape) for a in axes)) != len(axes) \
            or not _static_at(shape, out, axes) or 0 in [out[a % len(shape)] for a in axes]:
        return None
    box = {}
    for axis, start, step in zip(axes, begin, steps):
        axis %= len(shape)
        box[axis] = (min(max(start + shape[axis] if start < 0 else start, 0), shape[axis]), step, out[axis])
    return box


def strided_composed(inner, outer):
    """A slice (`outer`) of a slice (`inner`), either with steps, as one slice of the inner's
    operand: along an axis both cut, begin b1 + b2 * s1 and step s1 * s2 (Swin's patch merging
    takes every other row, then every other column of those: one box). `outer` if either has
    bounds computed at run time."""
    first, second = strided_box(inner), strided_box(outer)
    if first is None or second is None:
        return outer
    merged = dict(first)
    for axis, (begin, step, count) in second.items():
        start, stride, _ = first.get(axis, (0, 1, count))
        merged[axis] = (start + begin * stride, stride * step, count)
    axes = sorted(merged)
    return relax.op.strided_slice(inner.args[0], axes, [merged[a][0] for a in axes],
                                  [merged[a][0] + (merged[a][2] - 1) * merged[a][1] + 1 for a in axes],
                                  [merged[a][1] for a in axes])


def permute_axes(call) -> list[int] | None:
    """The axis order of a permute_dims of known rank."""
    shape = shape_dims(call)
    if shape is None:
        return None
    given = call.attrs.axes
    return list(reversed(range(len(shape)))) if given is None else [int(a) % len(shape) for a in given]


def _box(data, box: dict):
    axes = sorted(box)
    return relax.op.strided_slice(data, axes, [box[a][0] for a in axes], [box[a][1] for a in axes])
