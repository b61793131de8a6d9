"""A three-dimensional convolution as two-dimensional ones, one per temporal tap, over frames.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which every
`conv3d` with NCDHW data, OIDHW constant weights and NCDHW output, static shapes (any stride,
padding, dilation and groups) is a sum of conv2d's: with the frames as the batch,

    y[n, :, t] = sum over taps i of conv2d(x[n, :, t * sd + i * dd - pad_front], w[:, :, i])

so tap i is one conv2d of the (padded) input's frames i * dd, i * dd + sd, ... stacked as a batch
of N * T' images, and each next tap adds the sum so far as its residual (which the conv2d kernel
fuses). The frames are moved to the batch (permute_dims, a strided slice per tap) before, and
back after (reshape, permute_dims): data movement on the host, no arithmetic.

Why: the NPU's kernels are conv2d's; a conv3d had none and ran on the host: video networks
(R3D, R(2+1)D, the tubelet embedding of VideoMAE and ViViT) left 55-100% of their MACs there.
The multiply-accumulates are the model's (each output frame meets each tap once), plus the taps
that fall on the temporal padding.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import static_shape
from .arrays import read_only_view
from .rewrite import as_pass, rewrite_functions

_CONV3D = tvm.ir.Op.get("relax.nn.conv3d")


def conv3ds_as_conv2ds(mod: tvm.IRModule) -> tvm.IRModule:
    return rewrite_functions(mod, _Conv3dRewriter)


conv3ds_as_conv2ds_pass = as_pass(conv3ds_as_conv2ds, "cgra.Conv3dsAsConv2ds", ops=("relax.nn.conv3d",))


#: Elementwise ops that follow a conv3d into its frames-as-batch form (a bias add, a batch
#: norm's multiply and add, relu, clip), so they run on the NPU too, fused into the last tap's
#: kernel or as elementwise kernels: on the 5-D output they stayed on the host (the DMA moves
#: tensors of rank 1..4). op -> the positions of its tensor operands.
_FRAME_WISE_OPS = {"relax.add": (0, 1), "relax.multiply": (0, 1), "relax.subtract": (0, 1),
                   "relax.nn.relu": (0,), "relax.clip": (0,)}


@relax.expr_functor.mutator
class _Conv3dRewriter(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.frames = {}  # var of a conv3d's (or a frame-wise op's) result -> (its frames-as-batch var, N, T')

    def visit_var_binding_(self, binding):
        folded = self._folded(binding.value)
        if folded is None:
            super().visit_var_binding_(binding)
            return
        batch, n, frames = folded
        self.frames[binding.var] = folded
        shape = static_shape(batch)
        frames_first = self.builder_.emit(relax.op.reshape(batch, (n, frames, *shape[1:])))
        video = self.builder_.normalize(relax.op.permute_dims(frames_first, [0, 2, 1, 3, 4]))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, video))

    def _folded(self, value):
        """(`value` computed with the frames as the batch, N, T'), or None to leave it as it is."""
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        if value.op.same_as(_CONV3D):
            return self._conv2ds(value)
        positions = _FRAME_WISE_OPS.get(value.op.name)
        if positions is None or static_shape(value) is None:
            return None
        sources = [self.frames[value.args[i]] for i in positions if value.args[i] in self.frames]
        if not sources or len({(n, frames) for _, n, frames in sources}) != 1 or \
                static_shape(value) != static_shape(next(v for v in value.args if v in self.frames)):
            return None
        args = []
        for i, arg in enumerate(value.args):
            if i not in positions:
                args.append(self.visit_expr(arg))
            elif arg in self.frames:
                args.append(self.frames[arg][0])
            else:
                args.append(_per_frame_constant(arg))
                if args[-1] is None:
                    return None
        _, n, frames = sources[0]
        call = with_span(relax.Call(value.op, args, value.attrs, value.ty_args), value.span)
        return self.builder_.emit(call), n, frames

    def _conv2ds(self, call):
        attrs = call.attrs
        data, weight = call.args
        x_shape, out_shape = static_shape(data), static_shape(call)
        layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
        if not isinstance(weight, tvm.ir.GenericConst) or x_shape is None or out_shape is None \
                or layouts != ("NCDHW", "OIDHW", "NCDHW"):
            return None
        weights = read_only_view(weight.value)
        (n, channels, _, _, _), frames = x_shape, out_shape[2]
        sd, sh, sw = (int(s) for s in attrs.strides)
        dd, dh, dw = (int(d) for d in attrs.dilation)
        front, top, left, back, bottom, right = (int(p) for p in attrs.padding)

        def emit(value):
            return self.builder_.emit(with_span(value, call.span))

        # (N, C, D, H, W) -> (N, D, C, H, W) (from the frames-as-batch form when the data is a
        # conv3d's: no transposes between the layers of a stack), padded with zero frames
        if data in self.frames:
            video = emit(relax.op.reshape(self.frames[data][0], (n, x_shape[2], channels, *x_shape[3:])))
        else:
            video = emit(relax.op.permute_dims(self.visit_expr(data), [0, 2, 1, 3, 4]))
        if front or back:
            video = emit(relax.op.nn.pad(video, [0, 0, front, back, 0, 0, 0, 0, 0, 0]))
        total = None
        for tap in range(weights.shape[2]):
            first = tap * dd
            batch = emit(relax.op.strided_slice(video, axes=[1], begin=[first], end=[first + (frames - 1) * sd + 1],
                                                strides=[sd]))
            batch = emit(relax.op.reshape(batch, (n * frames, channels, *x_shape[3:])))
            conv = emit(relax.op.nn.conv2d(batch, relax.const(weights[:, :, tap].copy()), strides=(sh, sw),
                                           padding=(top, left, bottom, right), dilation=(dh, dw),
                                           groups=int(attrs.groups), out_dtype=str(call.ty.dtype)))
            total = conv if total is None else emit(relax.op.add(conv, total))
        return total, n, frames


def _per_frame_constant(expr):
    """A constant operand of a frame-wise op as it broadcasts against (N * T', C, H, W): one that
    varies along neither N nor T (a bias or a batch norm's scale, (1, C, 1, 1, 1)) loses the T
    axis; None for any other."""
    if not isinstance(expr, tvm.ir.GenericConst):
        return None
    shape = (1,) * (5 - len(expr.value.shape)) + tuple(int(d) for d in expr.value.shape)
    if len(shape) != 5 or shape[0] != 1 or shape[2] != 1:
        return None
    return relax.const(expr.value._create_view((1, shape[1], shape[3], shape[4])))
