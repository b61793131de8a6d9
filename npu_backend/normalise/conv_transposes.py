"""A transposed convolution as ordinary convolutions, one per output phase (sub-pixel form).

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which every
`conv2d_transpose` (NCHW data, IOHW constant weights, groups 1, dilation 1, each kernel extent at
least its stride) with static shapes is s_h * s_w conv2d calls and an interleave.

Why: the NPU has no transposed convolution, and the textbook rewrite (a conv2d over the input
with s - 1 zeros inserted between pixels) multiplies by zeros s_h * s_w times as often as it
multiplies anything. Instead, split the output by phase: the output rows oy = i * s + a (one phase
a in [0, s)) all take the kernel rows kh = r, r + s, r + 2s, ... (r = (a + pad_top) mod s) from
input rows i + c - m (c = (a + pad_top) // s), which is a stride-1 conv2d of the input with that
sub-kernel flipped:

    y[i * s + a] = sum_m x[i + c - m] * w[r + m * s]
                 = sum_j x[i + c - (M - 1) + j] * g[j],   g[j] = w[r + (M - 1 - j) * s]

so each phase is a conv2d with padding (or a crop) M - 1 - c above and as much below as gives
ceil((OH - a) / s) rows, and the same for the columns. The phases' outputs are interleaved by
stacking and reshaping (data movement on the host, no arithmetic). The multiply-accumulates are the
model's (every input pixel meets every tap once), plus the taps that fall on the border.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import static_shape
from .rewrite import as_pass, rewrite_functions

_CONV2D_TRANSPOSE = tvm.ir.Op.get("relax.nn.conv2d_transpose")


def conv_transposes_as_convs(mod: tvm.IRModule) -> tvm.IRModule:
    return rewrite_functions(mod, _ConvTransposeRewriter)


conv_transposes_as_convs_pass = as_pass(conv_transposes_as_convs, "cgra.ConvTransposesAsConvs",
                                        ops=("relax.nn.conv2d_transpose",))


def _phase(a: int, stride: int, pad_before: int, kernel: int, extent: int, out_extent: int):
    """One output phase along an axis: (kernel taps, in the order the conv2d reads them;
    input rows to drop before, rows of zero padding before, the same after; output rows)."""
    r, c = (a + pad_before) % stride, (a + pad_before) // stride
    taps = list(range(r, kernel, stride))[::-1]  # g[j] = w[r + (M - 1 - j) * s]
    rows = len(range(a, out_extent, stride))
    before = len(taps) - 1 - c
    after = rows - extent - before + len(taps) - 1
    return taps, max(0, -before), max(0, before), max(0, -after), max(0, after), rows


@relax.expr_functor.mutator
class _ConvTransposeRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_CONV2D_TRANSPOSE)):
            return call
        plan = self._plan(call)
        return call if plan is None else self._rewrite(call, *plan)

    def _plan(self, call):
        attrs = call.attrs
        data, weight = call.args
        weights = weight.value.numpy() if isinstance(weight, tvm.ir.GenericConst) else None
        x_shape, out_shape = static_shape(data), static_shape(call)
        if weights is None or x_shape is None or out_shape is None or int(attrs.groups) != 1 \
                or (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) != ("NCHW", "IOHW", "NCHW") \
                or any(int(d) != 1 for d in attrs.dilation):
            return None
        strides = [int(s) for s in attrs.strides]
        if weights.shape[2] < strides[0] or weights.shape[3] < strides[1]:
            return None  # a phase would take no taps (its outputs are zeros): not worth a kernel
        return weights, x_shape, out_shape, strides

    def _rewrite(self, call, weights, x_shape, out_shape, strides):
        attrs, data = call.attrs, call.args[0]
        top, left = int(attrs.padding[0]), int(attrs.padding[1])
        (_, _, height, width), (_, _, out_h, out_w) = x_shape, out_shape
        sh, sw = strides
        out_dtype = str(call.ty.dtype)  # the attribute is unset when it is the input's

        def emit(value):
            return self.builder_.emit(with_span(value, call.span))

        rows_of = [_phase(a, sh, top, weights.shape[2], height, out_h) for a in range(sh)]
        cols_of = [_phase(b, sw, left, weights.shape[3], width, out_w) for b in range(sw)]
        full_rows, full_cols = rows_of[0][-1], cols_of[0][-1]  # phase 0 has the most
        bands = []
        for kh, crop_top, pad_top, crop_bottom, pad_bottom, rows in rows_of:
            phases = []
            for kw, crop_left, pad_left, crop_right, pad_right, cols in cols_of:
                if min(rows, cols) == 0 or crop_top + crop_bottom >= height or crop_left + crop_right >= width:
                    # No output in this phase, or none an input pixel reaches: zeros (cropped below).
                    phases.append(emit(relax.op.zeros((*out_shape[:2], full_rows, full_cols), out_dtype)))
                    continue
                source = data
                if crop_top or crop_bottom or crop_left or crop_right:
                    source = emit(relax.op.strided_slice(source, axes=[2, 3], begin=[crop_top, crop_left],
                                                         end=[height - crop_bottom, width - crop_right]))
                # g[f, c, j, k] = w[c, f, kh[j], kw[k]]: OIHW, the taps already flipped.
                sub_kernel = np.ascontiguousarray(weights[:, :, kh][:, :, :, kw].transpose(1, 0, 2, 3))
                phase = emit(relax.op.nn.conv2d(source, relax.const(sub_kernel), strides=1,
                                                padding=[pad_top, pad_left, pad_bottom, pad_right],
                                                out_dtype=out_dtype))
                if rows < full_rows or cols < full_cols:  # so that the phases stack
                    phase = emit(relax.op.nn.pad(phase, [0, 0, 0, 0, 0, full_rows - rows, 0, full_cols - cols]))
                phases.append(phase)
            bands.append(phases)
        if sh == sw == 1:
            return bands[0][0]
        n, f = out_shape[:2]
        rows = []
        for phases in bands:  # (N, F, R, C) per column phase -> (N, F, R, C * sw)
            stacked = emit(relax.op.stack(phases, axis=4)) if sw > 1 else phases[0]
            rows.append(emit(relax.op.reshape(stacked, (n, f, full_rows, 1, full_cols * sw))))
        grid = emit(relax.op.concat(rows, axis=3)) if sh > 1 else rows[0]
        out = emit(relax.op.reshape(grid, (n, f, full_rows * sh, full_cols * sw)))
        if (full_rows * sh, full_cols * sw) != (out_h, out_w):
            out = emit(relax.op.strided_slice(out, axes=[2, 3], begin=[0, 0], end=[out_h, out_w]))
        return out
