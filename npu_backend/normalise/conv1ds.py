"""A one-dimensional convolution as a two-dimensional one, one pixel high.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which every
`conv1d` with NCW data, OIW weights and NCW output (any stride, padding, dilation and groups, a
symbolic width included) is a `conv2d` of the data with a unit height axis inserted
(`expand_dims`, a view on the host), and its result has that axis taken out again (`squeeze`).

Why: the NPU's kernels are conv2d's (GEMM, depthwise); a conv1d had none and ran on the host.
Audio front ends (Wav2Vec2, HuBERT, Whisper: strided conv1d over the waveform or the mel
frames), SqueezeBERT (grouped 1x1 conv1d for every dense layer) and Mamba's depthwise conv1d
left 2-30% of their MACs on the host (85% for SqueezeBERT).

The elementwise ops the conv2d kernels fuse into their epilogue (a bias or residual add, relu,
clip, GELU, SiLU, sigmoid) are widened with it when they read the conv's result: add(conv1d(x, w), b) becomes
squeeze(add(conv2d(x', w'), b')), b' the bias with the same unit axis, so the add still fuses.
A conv1d reading a widened value takes it as it is, so a stack of conv1d layers has no squeeze
and expand_dims between them. What nothing reads any more goes with DeadCodeElimination.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import shape_dims
from .rewrite import as_pass, rewrite_functions

_CONV1D = tvm.ir.Op.get("relax.nn.conv1d")
#: What the conv2d kernels' epilogue fuses, widened with the conv: op -> the positions of its
#: tensor operands.
_EPILOGUE_OPS = {"relax.add": (0, 1), "relax.nn.relu": (0,), "relax.clip": (0,),
                 # the epilogue tail's activations (kernels/gemm/epilogue_tail.py: Whisper's GELU
                 # after each of its two conv1ds ran as a kernel of its own behind the squeeze)
                 "relax.nn.gelu": (0,), "relax.nn.gelu_tanh": (0,), "relax.nn.silu": (0,), "relax.sigmoid": (0,)}
_HEIGHT = 2  # where the unit axis goes: NCW -> NC1W, OIW -> OI1W


def conv1ds_as_conv2ds(mod: tvm.IRModule) -> tvm.IRModule:
    return rewrite_functions(mod, _Conv1dRewriter)


conv1ds_as_conv2ds_pass = as_pass(conv1ds_as_conv2ds, "cgra.Conv1dsAsConv2ds", ops=("relax.nn.conv1d",))


@relax.expr_functor.mutator
class _Conv1dRewriter(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.wide = {}  # var of a conv1d's (or a widened op's) result -> var of its NC1W form

    def visit_var_binding_(self, binding):
        wide = self._widened(binding.value)
        if wide is None:
            super().visit_var_binding_(binding)
            return
        wide_var = self.builder_.emit(with_span(wide, binding.value.span))
        self.wide[binding.var] = wide_var
        narrow = self.builder_.normalize(relax.op.squeeze(wide_var, axis=[_HEIGHT]))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, narrow))

    def _widened(self, value):
        """`value` one pixel high (a Relax call), or None when it stays as it is."""
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        if value.op.same_as(_CONV1D):
            return self._conv2d(value)
        positions = _EPILOGUE_OPS.get(value.op.name)
        if positions is None or not any(value.args[i] in self.wide for i in positions) \
                or len(shape_dims(value) or ()) != 3:
            return None
        args = []
        for i, arg in enumerate(value.args):
            args.append(self._operand(arg) if i in positions else self.visit_expr(arg))
            if args[-1] is None:
                return None
        return relax.Call(value.op, args, value.attrs, value.ty_args)

    def _conv2d(self, call):
        attrs = call.attrs
        if (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) != ("NCW", "OIW", "NCW"):
            return None
        data, weight = self._operand(call.args[0]), self._operand(call.args[1])
        if data is None or weight is None:
            return None
        return relax.op.nn.conv2d(data, weight, strides=(1, int(attrs.strides[0])),
                                  padding=(0, int(attrs.padding[0]), 0, int(attrs.padding[1])),
                                  dilation=(1, int(attrs.dilation[0])), groups=int(attrs.groups),
                                  out_dtype=str(call.ty.dtype))

    def _operand(self, expr):
        """Operand `expr` of a rank-3 op, with the unit axis: the widened form of a widened
        value, a constant's tensor viewed so (a bias broadcasting from fewer axes gets its
        leading ones first), or the value through expand_dims; None when it has another rank."""
        if expr in self.wide:
            return self.wide[expr]
        if isinstance(expr, tvm.ir.GenericConst):
            shape = tuple(int(d) for d in expr.value.shape)
            if len(shape) > 3:
                return None
            shape = (1,) * (3 - len(shape)) + shape
            return relax.const(expr.value._create_view(shape[:_HEIGHT] + (1,) + shape[_HEIGHT:]))
        dims = shape_dims(expr)
        if dims is None or len(dims) != 3:
            return None
        return self.builder_.emit(relax.op.expand_dims(self.visit_expr(expr), axis=_HEIGHT))

