"""Kernel definitions: an offloaded composite function -> a GEMM-shaped TensorIR PrimFunc.

Stage: target hook, first half. Input: a `KernelSpec` read off a `cgra.*` composite (op, shapes,
dtype, conv geometry, epilogue). Output: a schedulable PrimFunc (`te.create_prim_func`) whose
blocks have fixed names and roles, so that `schedule.py` can tile and tensorize it:

    a_pad   scratchpad tile of the left operand (zero outside the tensor: the DMA halo)
    b_pad   scratchpad tile of the right operand
    bias_pad (optional) scratchpad copy of the bias row
    res_pad (optional) scratchpad tile of the residual (a tensor of the output's shape)
    acc     the reduction, tensorized onto the PE array
    epi     bias add, residual add, relu and clip on the accumulator, on the vector unit
    out     the store of the valid region back to the host tensor

Every kernel is a GEMM over padded extents (rows Mp, columns Np, reduction Kp), padded to whole
tiles so that every inner tile can be tensorized; the padding never reaches the host because
the loads read zeros outside the tensor and the store drops what lies outside it. A conv2d is a
GEMM per image: rows are output pixels (whole output rows per tile), columns are output channels (f), and the
reduction runs over (ry, rx, c), the left operand being gathered by a strided DMA box.
"""

from __future__ import annotations

import dataclasses

from tvm import te, tirx

from .tiling import Tiling


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """What one offloaded kernel computes, independent of the hardware."""

    op: str  # "matmul" or "conv2d"
    dtype: str  # input dtype: "int8" or "float32"
    acc_dtype: str  # "int32" or "float32"
    lhs_shape: tuple  # matmul: (M, K); conv2d: (N, C, H, W)
    rhs_shape: tuple  # matmul: (K, N), or (N, K) when rhs_transposed; conv2d: (F, C, KH, KW)
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

    @property
    def roles(self) -> tuple:
        return self.param_roles or (("lhs", "rhs") + (("bias",) if self.bias_shape else ())
                                    + (("residual",) if self.residual_shape else ()))

    @property
    def gemm_extents(self) -> tuple[int, int, int]:
        """(rows, columns, reduction) of the GEMM: the extents the tiles are chosen for."""
        if self.op == "matmul":
            m, k = self.lhs_shape
            n = self.rhs_shape[0] if self.rhs_transposed else self.rhs_shape[1]
            return m, n, k
        f, c, _, _ = self.rhs_shape  # c: input channels per group
        _, _, oh, ow = self.output_shape
        return oh * ow, f // self.groups, c

    @property
    def row_step(self) -> int:
        """Rows of a tile come in multiples of this: a conv2d tile holds whole output rows."""
        return self.output_shape[3] if self.op == "conv2d" else 1

    @property
    def output_shape(self) -> tuple:
        if self.op == "matmul":
            m, n, _ = self.gemm_extents
            return (m, n)
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
    def macs(self) -> int:
        """Multiply-accumulates of the model operator (no padding)."""
        if self.op == "matmul":
            m, n, k = self.gemm_extents
            return m * n * k
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


def _epilogue(spec, acc, tiling, bias, row_axes, residual=None, out_index=None):
    """epi = clip(relu(acc + bias[col] + residual)) over the padded tile grid; `row_axes` index
    acc before the column. A grouped conv2d's image b holds group b % G, whose channels start at
    (b % G) * F/G. `residual` (a placeholder of the output's shape, as the kernel stores it) is
    read through `out_index(*acc_indices)`, the output element an accumulator element becomes;
    outside the output (tile padding) it reads zero. Returns (epi, bias_pad)."""
    np_ = tiling.np

    bias_pad = None
    if bias is not None:
        channel_axis = _bias_channel_axis(spec.bias_shape)

        def bias_index(channel):
            return [channel if axis == channel_axis else 0 for axis in range(len(spec.bias_shape))]

        if spec.groups > 1:
            per_group = spec.gemm_extents[1]
            bias_pad = te.compute((acc.shape[0], np_), lambda b_, j: _padded(
                bias, spec.bias_shape, bias_index(b_ % spec.groups * per_group + j)), name="bias_pad")
        else:
            bias_pad = te.compute((np_,), lambda j: _padded(bias, spec.bias_shape, bias_index(j)),
                                  name="bias_pad")

    res_pad = None
    if residual is not None:
        res_pad = te.compute(acc.shape, lambda *idx: _padded(residual, [int(d) for d in residual.shape], out_index(*idx)),
                             name="res_pad")

    def epi_value(*idx):
        value = acc(*idx)
        if bias_pad is not None:
            value = value + (bias_pad(idx[0], idx[-1]) if spec.groups > 1 else bias_pad(idx[-1]))
        if res_pad is not None:
            value = value + res_pad(*idx)
        return _activation(value, spec)

    return te.compute(acc.shape, epi_value, name="epi"), bias_pad


def _activation(value, spec):
    """relu, then clip: the same expression as the epilogue intrinsic's (tensorize matches them)."""
    if spec.relu:
        value = tirx.max(value, tirx.const(0, spec.acc_dtype))
    if spec.clip is not None:
        lo, hi = (tirx.const(bound, spec.acc_dtype) for bound in spec.clip)
        value = tirx.min(tirx.max(value, lo), hi)
    return value


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
    residual = _residual_placeholder(spec, (m, n))
    epi, _ = _epilogue(spec, acc, tiling, bias, row_axes=1, residual=residual, out_index=lambda i, j: (i, j))
    out = te.compute((m, n), lambda i, j: epi[i, j], name="out")
    return _prim_func(spec, {"lhs": a, "rhs": b, "bias": bias, "residual": residual}, out)


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
    residual = _residual_placeholder(spec, out_shape)
    epi, _ = _epilogue(spec, acc, tiling, bias, row_axes=2, residual=residual,
                       out_index=lambda b_, p, f: (b_, f, p // ow, p % ow))
    out = te.compute(out_shape, lambda b_, f, y, ox: epi[b_, y * ow + ox, f], name="out")
    views = {"lhs": spec.lhs_shape, "out": spec.output_shape, "residual": spec.output_shape} \
        if spec.groups > 1 else {}
    return _prim_func(spec, {"lhs": x, "rhs": w, "bias": bias, "residual": residual}, out, views)


def _prim_func(spec: KernelSpec, inputs: dict, out, views=None):
    """The PrimFunc with parameters in the order the offloaded function is called with.

    `views` maps a role ("lhs", ..., "out") whose parameter is a view to the shape the caller
    passes; the code generator checks that shape and binds the view (`cgra.arg_shapes`)."""
    func = te.create_prim_func([inputs[role] for role in spec.roles] + [out])
    if views:
        roles = list(spec.roles) + ["out"]
        func = func.with_attr("cgra.arg_shapes", [list(views.get(role, ())) for role in roles])
    return func


COMPUTES = {"matmul": matmul_compute, "conv2d": conv2d_compute}


def kernel_prim_func(spec: KernelSpec, tiling: Tiling):
    return COMPUTES[spec.op](spec, tiling)
