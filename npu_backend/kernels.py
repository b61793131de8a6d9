"""Kernel definitions: an offloaded composite function -> a tileable TensorIR PrimFunc.

Stage: target hook, first half. Input: a `KernelSpec` read off a `cgra.*` composite (op, shapes,
dtype, conv geometry, epilogue). Output: a schedulable PrimFunc (`te.create_prim_func`) whose
blocks have fixed names and roles, so that `schedule.py` can tile and tensorize it:

    a_pad   scratchpad tile of the left operand (zero outside the tensor: the DMA halo)
    b_pad   scratchpad tile of the right operand
    bias_pad (optional) scratchpad copy of the bias row
    res_pad (optional) scratchpad tile of the residual (a tensor of the output's shape)
    acc     the reduction, tensorized onto the PE array
    scale_pad (optional) scratchpad copy of the requantisation's float32 scale row
    epi     bias add, residual add, relu and clip on the accumulator (and the requantisation to
            int8, see requant_intrin.py), on the vector unit
    out     the store of the valid region back to the host tensor

Every kernel is a GEMM over padded extents (rows Mp, columns Np, reduction Kp), padded to whole
tiles so that every inner tile can be tensorized; the padding never reaches the host because
the loads read zeros outside the tensor and the store drops what lies outside it. A conv2d is a
GEMM per image: rows are output pixels (whole output rows per tile), columns are output
channels (f), and the reduction runs over (ry, rx, c), the left operand being gathered by a
strided DMA box. A depthwise conv2d is not a GEMM (each output channel reads one input channel):
its acc is a sliding-window sum over an input window tile, the PE array's DEPTHWISE intrinsic
(`depthwise_compute`); a_pad is then that window and b_pad the (kh, kw, channels) weights.

Layouts and batches change only the indexing of those copies: a conv2d in any layout (NHWC data,
HWIO or OHWI weights, ...) gathers its operands from where the layout keeps them and stores its
output through a layout transform (`conv2d_layout_compute`); a batched matmul runs its batch as
the outer images loop, as a conv2d does (`batch_matmul_compute`), or, when the weights are shared,
is a 2-D GEMM over the batch's rows read through a view.
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, te, tirx

from .eltwise_kernel import eltwise_compute
from .intrinsics import window_extent, window_sum
from .requant_intrin import requantise
from .tiling import Tiling, depthwise_padded_width


#: The layouts `conv2d_compute` reads and writes: (data, weight, output).
CONV2D_LAYOUTS = ("NCHW", "OIHW", "NCHW")


@dataclasses.dataclass(frozen=True)
class PoolAttrs:
    """A pooling kernel's own attributes (the spec's strides, padding, dilation and layouts hold
    the rest): "max" or "avg", the window (kh, kw), and how the output size and the average's
    divisor treat the padding (as relax.nn.avg_pool2d / PyTorch define them)."""

    kind: str
    size: tuple
    ceil_mode: bool = False
    count_include_pad: bool = False

    def output_extent(self, extent: int, axis: int, strides, padding, dilation) -> int:
        """Outputs along `axis` (0: H, 1: W); in ceil mode the last window must start inside
        the image or its leading padding."""
        lo, hi = padding[axis], padding[axis + 2]
        span = extent + lo + hi - dilation[axis] * (self.size[axis] - 1) - 1
        out = (-(-span // strides[axis]) if self.ceil_mode else span // strides[axis]) + 1
        if self.ceil_mode and (out - 1) * strides[axis] >= extent + lo:
            out -= 1
        return out


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """What one offloaded kernel computes, independent of the hardware."""

    op: str  # "matmul", "conv2d", "depthwise" (a conv2d with groups == C == F) or "pool"
    dtype: str  # input dtype: "int8" or "float32"
    acc_dtype: str  # "int32" or "float32"
    lhs_shape: tuple  # matmul: (M, K); conv2d, depthwise: (N, C, H, W)
    rhs_shape: tuple  # matmul: (K, N), or (N, K) when rhs_transposed; conv2d: (F, C / groups, KH, KW)
    bias_shape: tuple | None = None  # broadcastable to the output along its channel / column axis
    relu: bool = False
    rhs_transposed: bool = False  # matmul: the right operand is stored (N, K) (PyTorch Linear)
    strides: tuple = (1, 1)
    padding: tuple = (0, 0, 0, 0)  # top, left, bottom, right
    dilation: tuple = (1, 1)
    groups: int = 1  # conv2d: channel groups (depthwise: groups == input channels)
    source_ops: tuple = ()  # names of the model operators fused into this kernel
    param_roles: tuple = ()  # role ("lhs", "rhs", "bias", "residual") of each parameter, in call order
    residual_shape: tuple | None = None  # the output's shape: a tensor added after the bias
    clip: tuple | None = None  # (lo, hi) in the acc dtype, applied last (after relu)
    # conv2d: how each tensor is stored. lhs_shape, rhs_shape and output_shape stay logical
    # (N, C, H, W) / (O, I, H, W); a layout is a permutation of those axes, e.g. "NHWC", "HWIO".
    data_layout: str = "NCHW"
    kernel_layout: str = "OIHW"
    out_layout: str = "NCHW"
    # matmul: images of a batched matmul, one right operand each (lhs (B, M, K) or a shared
    # (M, K); rhs (B, K, N) or (B, N, K)). 1 for a 2-D GEMM, shared weights included.
    batch: int = 1
    # ((role, shape), ...): arguments the caller passes in another shape than the kernel reads
    # them (compact views, e.g. a (B, S, K) input read as (B * S, K)); see `_prim_func`.
    caller_shapes: tuple = ()
    pool: PoolAttrs | None = None  # op "pool": max or average pooling (pooling.py); lhs_shape NCHW
    # Requantisation to int8 after the epilogue (int8 x int8 -> int32 kernels): the output zero
    # point, and the shape of the float32 scale parameter (one value per output channel, shaped
    # like a bias). None: the kernel writes its accumulator dtype.
    requant_zero_point: int | None = None
    scale_shape: tuple | None = None

    @property
    def roles(self) -> tuple:
        return self.param_roles or (("lhs", "rhs") + (("bias",) if self.bias_shape else ())
                                    + (("residual",) if self.residual_shape else ())
                                    + (("scale",) if self.scale_shape else ()))

    @property
    def out_dtype(self) -> str:
        """What the kernel stores: int8 when it requantises, else the accumulator dtype."""
        return "int8" if self.requant_zero_point is not None else self.acc_dtype

    @property
    def gemm_extents(self) -> tuple[int, int, int]:
        """(rows, columns, reduction) of the GEMM: the extents the tiles are chosen for."""
        if self.op == "matmul":
            m, k = self.lhs_shape[-2:]
            n = self.rhs_shape[-2] if self.rhs_transposed else self.rhs_shape[-1]
            return m, n, k
        f, c, _, _ = self.rhs_shape  # c: input channels per group
        _, _, oh, ow = self.output_shape
        return oh * ow, f // self.groups, c

    @property
    def grouped(self) -> bool:
        """A conv2d run as the GEMM kernel over N * G images, one group each (see grouped_shapes)."""
        return self.op == "conv2d" and self.groups > 1

    @property
    def row_step(self) -> int:
        """Rows of a tile come in multiples of this: a conv2d tile holds whole output rows."""
        return self.output_shape[3] if self.op == "conv2d" else 1

    @property
    def output_shape(self) -> tuple:
        if self.op == "pool":
            n, c, h, w = self.lhs_shape
            return (n, c) + tuple(self.pool.output_extent(extent, axis, self.strides, self.padding, self.dilation)
                                  for axis, extent in enumerate((h, w)))
        if self.op == "matmul":
            m, n, _ = self.gemm_extents
            return (self.batch, m, n) if self.batch > 1 else (m, n)
        n, _, h, w = self.lhs_shape
        f, _, kh, kw = self.rhs_shape
        top, left, bottom, right = self.padding
        (sh, sw), (dh, dw) = self.strides, self.dilation
        oh = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1
        ow = (w + left + right - dw * (kw - 1) - 1) // sw + 1
        return (n, f, oh, ow)

    @property
    def grouped_shapes(self) -> tuple:
        """conv2d: (data, output) as the kernel reads them, one image per (n, group):
        (N * G, C / G, H, W) and (N * G, F / G, OH, OW), views of the compact tensors."""
        n, c, h, w = self.lhs_shape
        _, f, oh, ow = self.output_shape
        g = self.groups
        return (n * g, c // g, h, w), (n * g, f // g, oh, ow)

    @property
    def compute_name(self) -> str:
        """The entry of `COMPUTES` that builds this kernel: the op, or its layout / batched form."""
        if self.op == "conv2d" and (self.data_layout, self.kernel_layout, self.out_layout) != CONV2D_LAYOUTS:
            return "conv2d_layout"
        if self.op == "matmul" and self.batch > 1:
            return "batch_matmul"
        return self.op

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the model operator (no padding; a pool has none)."""
        if self.op == "pool":
            return 0
        if self.op == "matmul":
            m, n, k = self.gemm_extents
            return self.batch * m * n * k
        n, f, oh, ow = self.output_shape
        _, c, kh, kw = self.rhs_shape
        return n * f * oh * ow * c * kh * kw


def _in_bounds(indices, shape):
    """The condition under which `indices` lie inside a tensor of `shape` (the DMA halo test)."""
    cond = None
    for index, extent in zip(indices, shape):
        for term in (index >= 0 if not _provably_nonnegative(index) else None, index < extent):
            if term is not None:
                cond = term if cond is None else tirx.all(cond, term)
    return cond if cond is not None else tirx.const(True, "bool")


def _provably_nonnegative(index) -> bool:
    """Loop variables and their non-negative combinations need no lower-bound test."""
    return isinstance(index, (tirx.Var, int)) or (
        isinstance(index, tirx.Add) and _provably_nonnegative(index.a) and _provably_nonnegative(index.b)) or (
        isinstance(index, tirx.Mul) and _provably_nonnegative(index.a) and _provably_nonnegative(index.b)) or (
        isinstance(index, tirx.IntImm) and index.value >= 0)


def _padded(tensor, shape, indices):
    value = tensor(*indices)
    return tirx.if_then_else(_in_bounds(indices, shape), value, tirx.const(0, tensor.dtype))


def _epilogue(spec, acc, tiling, bias, row_axes, residual=None, out_index=None, scale=None):
    """epi = requantise(clip(relu(acc + bias[col] + residual)), scale[col]) over the padded tile
    grid; `row_axes` index acc before the column. A grouped conv2d's image b holds group b % G,
    whose channels start at (b % G) * F/G. `residual` (a placeholder of the output's shape, as
    the kernel stores it) is read through `out_index(*acc_indices)`, the output element an
    accumulator element becomes; outside the output (tile padding) it reads zero. `scale` (the
    requantisation's float32 row, shaped like a bias) is staged like the bias. Returns (epi, bias_pad)."""
    bias_pad = _channel_row(spec, acc, tiling, bias, spec.bias_shape, "bias_pad")
    scale_pad = _channel_row(spec, acc, tiling, scale, spec.scale_shape, "scale_pad")

    res_pad = None
    if residual is not None:
        res_pad = te.compute(acc.shape, lambda *idx: _padded(residual, [int(d) for d in residual.shape], out_index(*idx)),
                             name="res_pad")

    def epi_value(*idx):
        value = acc(*idx)
        if bias_pad is not None:
            value = value + (bias_pad(idx[0], idx[-1]) if spec.grouped else bias_pad(idx[-1]))
        if res_pad is not None:
            value = value + res_pad(*idx)
        value = _activation(value, spec)
        if scale_pad is not None:
            value = requantise(value, scale_pad(idx[0], idx[-1]) if spec.grouped else scale_pad(idx[-1]),
                               spec.requant_zero_point)
        return value

    return te.compute(acc.shape, epi_value, name="epi"), bias_pad


def _channel_row(spec, acc, tiling, tensor, shape, name):
    """The padded scratchpad row of a per-output-channel parameter (bias, requantisation scale),
    one per group for a grouped conv2d; None without the parameter."""
    if tensor is None:
        return None
    channel_axis = _bias_channel_axis(shape)

    def index(channel):
        return [channel if axis == channel_axis else 0 for axis in range(len(shape))]

    if spec.grouped:
        per_group = spec.gemm_extents[1]
        return te.compute((acc.shape[0], tiling.np), lambda b_, j: _padded(
            tensor, shape, index(b_ % spec.groups * per_group + j)), name=name)
    return te.compute((tiling.np,), lambda j: _padded(tensor, shape, index(j)), name=name)


def _activation(value, spec):
    """relu, then clip: the same expression as the epilogue intrinsic's (tensorize matches them)."""
    if spec.relu:
        value = tirx.max(value, tirx.const(0, spec.acc_dtype))
    if spec.clip is not None:
        lo, hi = (tirx.const(bound, spec.acc_dtype) for bound in spec.clip)
        value = tirx.min(tirx.max(value, lo), hi)
    return value


def _scale_placeholder(spec):
    """The requantisation's float32 scale parameter, or None."""
    return te.placeholder(spec.scale_shape, "float32", name="scale") if spec.scale_shape else None


def _residual_placeholder(spec, shape):
    """The residual parameter as the kernel reads it (`shape`: the output as the kernel stores it)."""
    return te.placeholder(shape, spec.acc_dtype, name="residual") if spec.residual_shape else None


def _bias_channel_axis(bias_shape) -> int:
    """The axis of a broadcast bias that carries the channels: the one whose extent is not 1."""
    axes = [axis for axis, extent in enumerate(bias_shape) if extent != 1]
    return axes[0] if axes else len(bias_shape) - 1


def matmul_compute(spec: KernelSpec, tiling: Tiling):
    """C[M, N] = act(A[M, K] @ B[K, N] + bias) as padded TE stages. Returns (args, stage names)."""
    m, n, k = spec.gemm_extents
    a = te.placeholder(spec.lhs_shape, spec.dtype, name="lhs")
    b = te.placeholder(spec.rhs_shape, spec.dtype, name="rhs")
    a_pad = te.compute((tiling.mp, tiling.kp), lambda i, r: _padded(a, spec.lhs_shape, (i, r)), name="a_pad")
    if spec.rhs_transposed:
        b_pad = te.compute((tiling.kp, tiling.np), lambda r, j: _padded(b, spec.rhs_shape, (j, r)), name="b_pad")
    else:
        b_pad = te.compute((tiling.kp, tiling.np), lambda r, j: _padded(b, spec.rhs_shape, (r, j)), name="b_pad")
    r = te.reduce_axis((0, tiling.kp), name="r")
    acc = te.compute(
        (tiling.mp, tiling.np),
        lambda i, j: te.sum(a_pad[i, r].astype(spec.acc_dtype) * b_pad[r, j].astype(spec.acc_dtype), axis=r),
        name="acc")
    bias = te.placeholder(spec.bias_shape, spec.acc_dtype, name="bias") if spec.bias_shape else None
    residual, scale = _residual_placeholder(spec, (m, n)), _scale_placeholder(spec)
    epi, _ = _epilogue(spec, acc, tiling, bias, row_axes=1, residual=residual, out_index=lambda i, j: (i, j),
                       scale=scale)
    out = te.compute((m, n), lambda i, j: epi[i, j], name="out")
    return _prim_func(spec, {"lhs": a, "rhs": b, "bias": bias, "residual": residual, "scale": scale}, out)


def conv2d_compute(spec: KernelSpec, tiling: Tiling):
    """NCHW/OIHW conv2d as one GEMM per image: rows are output pixels p = y * OW + ox (padded to
    whole tiles of whole output rows), columns output channels, reduction (ry, rx, c).

    A grouped conv2d is the same kernel over N * G images of C / G channels (a view of the
    data), image b using the weights and bias of group b % G; the padding of the reduction then
    stays inside its group (it reads the view's zero halo, never the next group's channels)."""
    _, _, kh, kw = spec.rhs_shape
    top, left, _, _ = spec.padding
    (sh, sw), (dh, dw) = spec.strides, spec.dilation
    data_shape, out_shape = spec.grouped_shapes
    images, per_group, oh, ow = out_shape
    x = te.placeholder(data_shape, spec.dtype, name="data")
    w = te.placeholder(spec.rhs_shape, spec.dtype, name="weight")
    # The left operand for one (image, ry, rx): row p gathers output pixel (p // OW, p % OW).
    a_pad = te.compute(
        (images, kh, kw, tiling.mp, tiling.kp),
        lambda b_, ry, rx, p, c: _padded(
            x, data_shape, (b_, c, (p // ow) * sh + ry * dh - top, (p % ow) * sw + rx * dw - left)),
        name="a_pad")
    if spec.groups > 1:
        b_pad = te.compute(
            (images, kh, kw, tiling.kp, tiling.np),
            lambda b_, ry, rx, c, f: _padded(
                w, spec.rhs_shape, (b_ % spec.groups * per_group + f, c, ry, rx)), name="b_pad")

        def weight(b_, ry, rx, rc, f):
            return b_pad[b_, ry, rx, rc, f]
    else:
        b_pad = te.compute(
            (kh, kw, tiling.kp, tiling.np),
            lambda ry, rx, c, f: _padded(w, spec.rhs_shape, (f, c, ry, rx)), name="b_pad")

        def weight(b_, ry, rx, rc, f):
            return b_pad[ry, rx, rc, f]
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    rc = te.reduce_axis((0, tiling.kp), name="rc")
    acc = te.compute(
        (images, tiling.mp, tiling.np),
        lambda b_, p, f: te.sum(
            a_pad[b_, ry, rx, p, rc].astype(spec.acc_dtype) * weight(b_, ry, rx, rc, f).astype(spec.acc_dtype),
            axis=[ry, rx, rc]),
        name="acc")
    bias = te.placeholder(spec.bias_shape, spec.acc_dtype, name="bias") if spec.bias_shape else None
    residual, scale = _residual_placeholder(spec, out_shape), _scale_placeholder(spec)
    epi, _ = _epilogue(spec, acc, tiling, bias, row_axes=2, residual=residual,
                       out_index=lambda b_, p, f: (b_, f, p // ow, p % ow), scale=scale)
    out = te.compute(out_shape, lambda b_, f, y, ox: epi[b_, y * ow + ox, f], name="out")
    views = {"lhs": spec.lhs_shape, "out": spec.output_shape, "residual": spec.output_shape} \
        if spec.groups > 1 else {}
    inputs = {"lhs": x, "rhs": w, "bias": bias, "residual": residual, "scale": scale}
    return _prim_func(spec, inputs, out, views)


def depthwise_compute(spec: KernelSpec, tiling: Tiling):
    """Depthwise conv2d (groups == C == F): out[b, c, y, x] = the window sum of channel c, the
    data, weights and output in the spec's layouts (NCHW / OIHW / NCHW, NHWC / HWIO, ...).

    The input tile lives in the scratchpad as a window (input rows, input columns, channels),
    the halo zero-filled by its DMA, so every input element is loaded once per tile rather than
    once per tap; the DEPTHWISE intrinsic gives each PE one output and slides the taps over the
    window. Output rows are padded to whole tiles (tiling.tm rows) and columns to at least 2."""
    n, _, _, _ = spec.lhs_shape
    _, _, kh, kw = spec.rhs_shape
    top, left, _, _ = spec.padding
    window = (kh, kw, *spec.strides, *spec.dilation)
    rows, cols, width = tiling.mp, tiling.np, depthwise_padded_width(spec)
    in_h = window_extent(rows, kh, spec.strides[0], spec.dilation[0])
    in_w = window_extent(width, kw, spec.strides[1], spec.dilation[1])
    data_shape = _stored(spec.lhs_shape, "NCHW", spec.data_layout)
    weight_shape = _stored(spec.rhs_shape, "OIHW", spec.kernel_layout)
    x = te.placeholder(data_shape, spec.dtype, name="data")
    w = te.placeholder(weight_shape, spec.dtype, name="weight")
    a_pad = te.compute((n, in_h, in_w, cols), lambda b_, iy, ix, c: _padded(
        x, data_shape, _stored((b_, c, iy - top, ix - left), "NCHW", spec.data_layout)), name="a_pad")
    b_pad = te.compute((kh, kw, cols), lambda ry, rx, c: _padded(
        w, weight_shape, _stored((c, 0, ry, rx), "OIHW", spec.kernel_layout)), name="b_pad")
    acc = te.compute((n, rows, width, cols), lambda b_, y, ox, c: window_sum(
        lambda iy, ix, ch: a_pad[b_, iy, ix, ch], lambda ry, rx, ch: b_pad[ry, rx, ch], y, ox, c,
        window, spec.acc_dtype), name="acc")
    bias = te.placeholder(spec.bias_shape, spec.acc_dtype, name="bias") if spec.bias_shape else None
    out_shape = _stored(spec.output_shape, "NCHW", spec.out_layout)
    residual, scale = _residual_placeholder(spec, out_shape), _scale_placeholder(spec)
    epi, _ = _epilogue(spec, acc, tiling, bias, row_axes=3, residual=residual,
                       out_index=lambda b_, y, ox, c: _stored((b_, c, y, ox), "NCHW", spec.out_layout),
                       scale=scale)

    def stored_out(*index):
        axis = dict(zip(spec.out_layout, index))
        return epi[axis["N"], axis["H"], axis["W"], axis["C"]]

    out = te.compute(out_shape, stored_out, name="out")
    return _prim_func(spec, {"lhs": x, "rhs": w, "bias": bias, "residual": residual, "scale": scale}, out)


def _prim_func(spec: KernelSpec, inputs: dict, out, views=None):
    """The PrimFunc with parameters in the order the offloaded function is called with.

    `views` maps a role ("lhs", ..., "out") whose parameter is a view to the shape the caller
    passes; the code generator checks that shape and binds the view (`cgra.arg_shapes`)."""
    func = te.create_prim_func([inputs[role] for role in spec.roles] + [out])
    views = {**dict(spec.caller_shapes), **(views or {})}
    if views:
        roles = list(spec.roles) + ["out"]
        func = func.with_attr("cgra.arg_shapes", [list(views.get(role, ())) for role in roles])
    return func


def _stored(logical, logical_axes: str, layout: str) -> tuple:
    """A logical shape or index, e.g. (N, C, H, W), in the order `layout` (e.g. "NHWC") stores it."""
    return tuple(logical[logical_axes.index(axis)] for axis in layout)


def _group_view(logical, layout: str, groups: int, group=None) -> tuple:
    """An (N, C, H, W) shape (group None) or index stored in `layout`, each group's channels a
    tensor of their own: the group joins the axis stored just before C, as a * G + g. The view
    stays compact, and a bound test of the joined axis is one of a (0 <= a*G + g < A*G iff
    0 <= a < A), so the DMA halo of a padded axis still zero-fills exactly the padding."""
    stored = list(_stored(logical, "NCHW", layout))
    if groups > 1:
        channel = layout.index("C")
        if group is None:
            stored[channel] //= groups
            stored[channel - 1] *= groups
        else:
            stored[channel - 1] = stored[channel - 1] * groups + group
    return tuple(stored)


def conv2d_layout_compute(spec: KernelSpec, tiling: Tiling):
    """conv2d in any layout: the GEMM of `conv2d_compute`, its operands gathered from where their
    layouts keep them. The output is computed in conv2d_compute's order and moved to its layout
    by a layout transform of the output buffer (a store has no bound test to keep in shape)."""
    _, _, kh, kw = spec.rhs_shape
    top, left, _, _ = spec.padding
    (sh, sw), (dh, dw), g = spec.strides, spec.dilation, spec.groups
    _, (images, per_group, oh, ow) = spec.grouped_shapes
    data_shape = _group_view(spec.lhs_shape, spec.data_layout, g)
    weight_shape = _stored(spec.rhs_shape, "OIHW", spec.kernel_layout)
    x = te.placeholder(data_shape, spec.dtype, name="data")
    w = te.placeholder(weight_shape, spec.dtype, name="weight")

    def image(b_):  # image b_ is group b_ % G of batch element b_ // G
        return (b_ // g, b_ % g) if g > 1 else (b_, 0)

    def data(b_, c, y, x_):
        n, group = image(b_)
        return _padded(x, data_shape, _group_view((n, c, y, x_), spec.data_layout, g, group))

    def weight(f, c, ry, rx):
        return _padded(w, weight_shape, _stored((f, c, ry, rx), "OIHW", spec.kernel_layout))

    a_pad = te.compute((images, kh, kw, tiling.mp, tiling.kp), lambda b_, ry, rx, p, c: data(
        b_, c, (p // ow) * sh + ry * dh - top, (p % ow) * sw + rx * dw - left), name="a_pad")
    b_pad = te.compute((images if g > 1 else 1, kh, kw, tiling.kp, tiling.np), lambda b_, ry, rx, c, f: weight(
        image(b_)[1] * per_group + f if g > 1 else f, c, ry, rx), name="b_pad")
    ry, rx = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, kw), name="rx")
    rc = te.reduce_axis((0, tiling.kp), name="rc")
    acc = te.compute((images, tiling.mp, tiling.np), lambda b_, p, f: te.sum(
        a_pad[b_, ry, rx, p, rc].astype(spec.acc_dtype)
        * b_pad[b_ if g > 1 else 0, ry, rx, rc, f].astype(spec.acc_dtype), axis=[ry, rx, rc]), name="acc")
    bias = te.placeholder(spec.bias_shape, spec.acc_dtype, name="bias") if spec.bias_shape else None
    epi, _ = _epilogue(spec, acc, tiling, bias, row_axes=2)
    out = te.compute((images, per_group, oh, ow), lambda b_, f, y, ox: epi[b_, y * ow + ox, f], name="out")
    stored_data, stored_out = _stored(spec.lhs_shape, "NCHW", spec.data_layout), \
        _stored(spec.output_shape, "NCHW", spec.out_layout)
    func = _prim_func(spec, {"lhs": x, "rhs": w, "bias": bias}, out,
                      {"lhs": stored_data, "out": stored_out} if g > 1 else {})
    sch = s_tir.Schedule(func)
    sch.transform_layout(sch.get_sblock("out"), ("write", 0), lambda b_, f, y, ox: _group_view(
        (image(b_)[0], f, y, ox), spec.out_layout, g, image(b_)[1]))
    return sch.mod["main"]


def batch_matmul_compute(spec: KernelSpec, tiling: Tiling):
    """C[b] = act(A[b] @ B[b] + bias) for b < spec.batch: `matmul_compute`'s GEMM under an outer
    images loop, as a conv2d runs its images; A may be one (M, K) matrix shared by all images."""
    m, n, _ = spec.gemm_extents
    a = te.placeholder(spec.lhs_shape, spec.dtype, name="lhs")
    b = te.placeholder(spec.rhs_shape, spec.dtype, name="rhs")
    shared_lhs = len(spec.lhs_shape) == 2
    a_pad = te.compute((spec.batch, tiling.mp, tiling.kp), lambda b_, i, r: _padded(
        a, spec.lhs_shape, (i, r) if shared_lhs else (b_, i, r)), name="a_pad")
    b_pad = te.compute((spec.batch, tiling.kp, tiling.np), lambda b_, r, j: _padded(
        b, spec.rhs_shape, (b_, j, r) if spec.rhs_transposed else (b_, r, j)), name="b_pad")
    r = te.reduce_axis((0, tiling.kp), name="r")
    acc = te.compute((spec.batch, tiling.mp, tiling.np), lambda b_, i, j: te.sum(
        a_pad[b_, i, r].astype(spec.acc_dtype) * b_pad[b_, r, j].astype(spec.acc_dtype), axis=r), name="acc")
    bias = te.placeholder(spec.bias_shape, spec.acc_dtype, name="bias") if spec.bias_shape else None
    epi, _ = _epilogue(spec, acc, tiling, bias, row_axes=2)
    out = te.compute((spec.batch, m, n), lambda b_, i, j: epi[b_, i, j], name="out")
    return _prim_func(spec, {"lhs": a, "rhs": b, "bias": bias}, out)


COMPUTES = {"matmul": matmul_compute, "conv2d": conv2d_compute, "depthwise": depthwise_compute,
            "conv2d_layout": conv2d_layout_compute, "batch_matmul": batch_matmul_compute,
            "eltwise": eltwise_compute}


def kernel_prim_func(spec: KernelSpec, tiling: Tiling):
    return COMPUTES[spec.compute_name](spec, tiling)
