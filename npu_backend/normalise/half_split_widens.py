"""A 16-bit model's widening of each head-split part of a rounded projection, moved before the split.

Stage: normalise (after split_slices.py, which writes a fused q / k / v projection's split as
strided slices). In: a Relax IRModule. Out: the same module in which

    astype(layout(...layout(astype(z, h))), float32)       z float32 (a linear's biased sum),
                                                           layout: strided_slice, reshape,
                                                           permute_dims (one or more)

is `layout(...layout(astype(astype(z, h), float32)))`, the round trip `astype(astype(z, h),
float32)` bound once per z and every layout level shared by the parts that share it: widening
commutes with moving and selecting elements, exactly (each element is the same h value,
widened). HF's bfloat16 GPT-2 rounds its fused c_attn projection to h, splits it into q, k and v,
cuts each into heads and widens each for the attention (`.to(float32)` in the eager attention's
softmax path, the importer's float32 matmuls). Before: three slicing copies of h and three cast
kernels a layer (GPT-2 on cgra-8x8: 3 x 544 + 3 x 820 cycles). After: the projection's GEMM
rounds and widens back on store (kernels/gemm/half_bias.py's `_bias_rounded_wide`, as ViT's q / k
/ v) and the attention kernel reads its slices of the float32 rows itself, as it reads a float32
model's. half_casts.py does the same through reshapes and transposes only, before the split is
sliced.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..relax_info import dtype_of
from .half_casts import HALF_FLOATS, is_op
from .rewrite import as_pass, rewrite_functions

#: The ops that move or select elements without computing: a widening commutes with each.
_LAYOUTS = ("strided_slice", "reshape", "permute_dims")
_SLICE = tvm.ir.Op.get("relax.strided_slice")


def half_split_widens_moved(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with each widening of a layout of a rounded float32 value moved onto the rounding (module doc)."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _WidenMover))


half_split_widens_pass = as_pass(half_split_widens_moved, "cgra.HalfSplitWidens", ops=("relax.strided_slice",))


def _is_layout(value) -> bool:
    return isinstance(value, relax.Call) and (value.op.same_as(_SLICE) or
                                              any(is_op(value, name) for name in _LAYOUTS[1:]))


@relax.expr_functor.mutator
class _WidenMover(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.moved = {}  # a variable of the h chain -> its float32 counterpart, bound once

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not is_op(call, "astype") or str(call.attrs.dtype) != "float32" or dtype_of(call.args[0]) not in HALF_FLOATS:
            return call
        chain, expr = self._layouts(call.args[0])
        if not chain or not any(value.op.same_as(_SLICE) for _, value in chain):
            return call  # half_casts.py's case, or no layout: left as it is
        rounded = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        if not is_op(rounded, "astype") or dtype_of(rounded.args[0]) != "float32" or \
                str(rounded.attrs.dtype) != dtype_of(call.args[0]):
            return call
        if expr not in self.moved:
            self.moved[expr] = self.builder_.emit(relax.op.astype(expr, "float32"))
        wide = self.moved[expr]
        for var, value in reversed(chain[1:]):
            if var not in self.moved:
                self.moved[var] = self.builder_.emit(relax.Call(value.op, [wide, *value.args[1:]], value.attrs))
            wide = self.moved[var]
        value = chain[0][1]
        return relax.Call(value.op, [wide, *value.args[1:]], value.attrs)

    def _layouts(self, expr):
        """([(variable, layout call)] from `expr` inwards, the variable they start from)."""
        chain = []
        while isinstance(expr, relax.Var):
            value = self.lookup_binding(expr)
            if not _is_layout(value):
                break
            chain.append((expr, value))
            expr = value.args[0]
        return chain, expr
