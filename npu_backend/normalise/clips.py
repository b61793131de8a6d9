"""Clips in one form: the ONNX importer's elementwise maximum / minimum calls become R.clip.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which every
`call_tir` of a PrimFunc computing max(x, c) or min(x, c) elementwise against a scalar constant c
(of a static or a symbolic shape) is `R.clip(x, c, +max)` / `R.clip(x, -max, c)` (max: the
dtype's largest value, inf for floats), `clip(clip(x, a, b), c, d)` whose ranges overlap is
`clip(x, max(a, c), min(b, d))`, and `clip(relu(x), a, b)` with b >= 0 is `clip(x, max(a, 0), b)`.

Why: ONNX `Clip` (relu6 in MobileNetV2) imports as a topi maximum then a topi minimum
(`emit_te`), opaque PrimFunc calls that no partition pattern can read; PyTorch's relu6 and
hardtanh already import as `R.clip`. After this pass the patterns see one op with constant bounds
and fuse it into a kernel's epilogue; a clip left on the host is legalised to the same compare
pair. Both sides clip with lo <= hi, where min(max(x, lo), hi) == max(min(x, hi), lo).
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax, tirx

from ..frontend.provenance import merged_span, with_span
from ..relax_info import dtype_of
from .rewrite import as_pass, rewrite_functions

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
_CLIP = tvm.ir.Op.get("relax.clip")
_RELU = tvm.ir.Op.get("relax.nn.relu")
_COMPARES = {tirx.Max: "max", tirx.Min: "min"}


def canonicalize_clips(mod: tvm.IRModule) -> tvm.IRModule:
    """The module with its scalar maximum / minimum calls and clip chains as single R.clip calls."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _ClipRewriter))


def scalar_compare(func) -> str | None:
    """"max" or "min" if `func` is out[i...] = max|min(x[i...], c[()]) over x's whole shape, else None.
    Its parameters are x, c, out, with the symbolic sizes of a dynamic shape before out (the
    importer's `emit_te` passes them: (x, c, S, out) for an image of size S)."""
    if not isinstance(func, tirx.PrimFunc) or len(func.params) < 3 or \
            any(isinstance(size.ty, tirx.BufferType) for size in func.params[2:-1]):
        return None
    store = _single_store(func.body)
    if store is None or type(store.value) not in _COMPARES:
        return None
    x, c, out = func.params[0], func.params[1], func.params[-1]
    a, b = store.value.a, store.value.b
    loads = all(isinstance(v, tvm.ir.TensorLoad) for v in (a, b))
    if not (loads and a.source.same_as(x) and b.source.same_as(c) and store.buffer.same_as(out)
            and len(b.indices) == 0 and _same_indices(a.indices, store.indices)
            and list(x.ty.shape) == list(out.ty.shape) and str(x.ty.dtype) == str(out.ty.dtype)):
        return None
    return _COMPARES[type(store.value)]


def _single_store(stmt):
    """The one BufferStore under a nest of blocks and loops, or None if there is anything else."""
    while True:
        if hasattr(stmt, "block"):  # SBlockRealize
            if stmt.block.init is not None:
                return None
            stmt = stmt.block.body
        elif isinstance(stmt, tirx.For):
            stmt = stmt.body
        else:
            return stmt if isinstance(stmt, tirx.BufferStore) else None


def _same_indices(lhs, rhs) -> bool:
    return len(lhs) == len(rhs) and all(a.same_as(b) for a, b in zip(lhs, rhs))


def _scalar(expr):
    """The value of a 0-d float32/int32 constant, else None."""
    if not isinstance(expr, tvm.ir.GenericConst):
        return None
    ty = expr.ty
    if getattr(ty, "ndim", None) != 0 or str(ty.dtype) not in ("float32", "int32"):
        return None
    return expr.value.numpy().item()


def _range(dtype: str) -> tuple:
    """The whole range of `dtype`: the bound a one-sided compare leaves open."""
    if dtype.startswith("float"):
        return -math.inf, math.inf
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _bound(value, dtype: str):
    """A clip bound as R.clip takes it (a PrimExpr), float for float tensors, int otherwise."""
    if dtype.startswith("float"):
        return tirx.FloatImm("float64", float(value))
    return tirx.IntImm("int64", int(value))




def _bounds_of(call):
    """(lo, hi) of an R.clip call with constant bounds, else None."""
    lo, hi = call.args[1], call.args[2]
    if not all(isinstance(b, (tirx.IntImm, tirx.FloatImm)) for b in (lo, hi)):
        return None
    return lo.value, hi.value


@relax.expr_functor.mutator
class _ClipRewriter(relax.PyExprMutator):
    """Rewrites each call after its arguments (post order), so chains collapse as they are met."""

    def __init__(self, mod):
        super().__init__(mod)
        self.mod = mod

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if call.op.same_as(_CALL_TIR):
            call = self._clip_from_call_tir(call)
        if isinstance(call, relax.Call) and call.op.same_as(_CLIP):
            call = self._merged_clip(call)
        return call

    def _clip_from_call_tir(self, call):
        callee, args = call.args[0], call.args[1]
        if not (isinstance(callee, tvm.ir.GlobalVar) and isinstance(args, relax.Tuple)
                and len(args.fields) >= 2 and callee in self.mod.functions
                and len(args.fields) == len(self.mod[callee].params) - 1):  # the sizes after x and c
            return call
        compare, value = scalar_compare(self.mod[callee]), _scalar(args.fields[1])
        if compare is None or value is None or value != value:  # value != value: NaN
            return call
        dtype = dtype_of(args.fields[1])
        lowest, highest = _range(dtype)
        lo, hi = (value, highest) if compare == "max" else (lowest, value)
        return with_span(relax.op.clip(args.fields[0], _bound(lo, dtype), _bound(hi, dtype)), call.span)

    def _merged_clip(self, call):
        inner = call.args[0]
        if isinstance(inner, relax.Var):
            inner = self.lookup_binding(inner)
        if isinstance(inner, relax.Call) and inner.op.same_as(_RELU):
            return self._merged_relu(call, inner)
        if not (isinstance(inner, relax.Call) and inner.op.same_as(_CLIP)):
            return call
        outer_bounds, inner_bounds = _bounds_of(call), _bounds_of(inner)
        if outer_bounds is None or inner_bounds is None:
            return call
        lo, hi = max(outer_bounds[0], inner_bounds[0]), min(outer_bounds[1], inner_bounds[1])
        if not lo <= hi:  # disjoint ranges: the chain is a constant; leave it as written
            return call
        dtype = dtype_of(inner.args[0])
        merged = relax.op.clip(inner.args[0], _bound(lo, dtype), _bound(hi, dtype))
        return with_span(merged, merged_span(inner.span, call.span))  # both calls' model nodes


    def _merged_relu(self, call, relu):
        """clip(relu(x), lo, hi) = clip(x, max(lo, 0), hi) when hi >= 0: one op, which a kernel's
        epilogue fuses (it takes relu or clip, not both)."""
        bounds = _bounds_of(call)
        if bounds is None or not max(bounds[0], 0) <= bounds[1]:
            return call
        dtype = dtype_of(relu.args[0])
        merged = relax.op.clip(relu.args[0], _bound(max(bounds[0], 0), dtype), _bound(bounds[1], dtype))
        return with_span(merged, merged_span(relu.span, call.span))


def canonicalize_clips_pass() -> tvm.transform.Pass:
    """`canonicalize_clips` as a module pass, for the normalise stage's pass list."""
    return as_pass(canonicalize_clips, "cgra.CanonicalizeClips", ops=("relax.call_tir", "relax.clip"))
