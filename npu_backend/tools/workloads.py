"""Single-kernel workloads: Relax models of matmul, conv2d and pooling with their numpy references.

Used by `cgra-sim verify` (one kernel against numpy in one command) and by the tests, so both
check the compiler the same way.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..kernels.common.operands import stored

ACC = {"int8": "int32", "float32": "float32", "bfloat16": "float32", "float16": "float32", "int16": "int64"}
#: Integer inputs whose kernels produce their accumulator (out_dtype): int8, and int16 activations
#: times int8 weights (the 16x8 mode).
INTEGER = ("int8", "int16")
#: Inputs whose kernels sum in float32 and store (and take a bias and residual in) their own format.
HALF_FLOATS = ("bfloat16", "float16")


def numpy_dtype(dtype: str):
    """The numpy type of a dtype name: ml_dtypes' for bfloat16 (TVM's tensors take and give it)."""
    if dtype == "bfloat16":
        import ml_dtypes  # a dependency of tvm

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def _stored(dtype: str) -> str:
    """The dtype of a GEMM kernel's bias, residual and output for `dtype` inputs."""
    return dtype if dtype in HALF_FLOATS else ACC[dtype]


def weight_dtype(dtype: str) -> str:
    """The weights' dtype of a GEMM kernel on `dtype` activations: int8 under int16, else the same."""
    return "int8" if dtype == "int16" else dtype


def _random(rng, shape, dtype):
    if dtype == "int16":
        return rng.integers(-32768, 32768, size=shape, dtype=np.int16)
    if dtype == "int8":
        return rng.integers(-128, 128, size=shape, dtype=np.int8)
    if dtype == "int32":
        return rng.integers(-1000, 1000, size=shape, dtype=np.int32)
    return rng.standard_normal(shape).astype(np.float32).astype(numpy_dtype(dtype))


def _rounded(ref, dtype):
    """The reference as the kernel stores it: a 16-bit float's rounded to nearest even."""
    return ref.astype(np.float32).astype(numpy_dtype(dtype)) if dtype in HALF_FLOATS else ref.astype(ACC[dtype])


def relax_module(name_shapes, body_fn):
    """A module whose main takes `name_shapes` [(name, shape, dtype)] and returns body_fn(vars)."""
    builder = relax.BlockBuilder()
    params = [relax.Var(name, relax.TensorType(shape, dtype)) for name, shape, dtype in name_shapes]
    with builder.function("main", params):
        with builder.dataflow():
            out = builder.emit_output(body_fn(builder, *params))
        builder.emit_func_output(out)
    return builder.get()


def _epilogue_tail(bb, y, residual, clip):
    """+ residual (added on the left, as ONNX's MobileNetV2 writes x + block(x)), then clip."""
    if residual is not None:
        y = bb.emit(relax.op.add(residual, y))
    return y if clip is None else bb.emit(relax.op.clip(y, *clip))


def _epilogue_reference(ref, inputs, bias, residual, relu, clip):
    """The fused chain in numpy: + bias (inputs[2]), + residual (the last input), relu, clip."""
    ref = ref + inputs[2] if bias else ref
    ref = ref + inputs[-1] if residual else ref
    ref = np.maximum(ref, 0) if relu else ref
    return ref if clip is None else np.clip(ref, *clip)


def matmul_model(m, n, k, dtype="float32", bias=True, relu=True, transposed=False, softmax=False,
                 residual=False, clip=None, seed=None):
    """x @ w (+ b) (+ r) (relu) (clip to (lo, hi)) (softmax): returns (module, inputs, reference).
    With a residual r (m x n) relu comes after it, as in ResNet's relu(conv + b + shortcut)."""
    acc, out = ACC[dtype], _stored(dtype)
    w_shape = (n, k) if transposed else (k, n)
    specs = [("x", (m, k), dtype), ("w", w_shape, weight_dtype(dtype))] + ([("b", (n,), out)] if bias else [])
    specs += [("r", (m, n), out)] if residual else []

    def body(bb, x, w, *rest):
        rhs = bb.emit(relax.op.permute_dims(w, [1, 0])) if transposed else w
        y = bb.emit(relax.op.matmul(x, rhs, out_dtype=acc if dtype in INTEGER else None))
        if bias:
            y = bb.emit(relax.op.add(y, rest[0]))
        y = _epilogue_tail(bb, y, rest[-1] if residual else None, None)
        if relu:
            y = bb.emit(relax.op.nn.relu(y))
        y = _epilogue_tail(bb, y, None, clip)
        if softmax:
            y = bb.emit(relax.op.nn.softmax(y))
        return y

    rng = np.random.default_rng(m * 1000003 + n * 1009 + k if seed is None else seed)
    inputs = [_random(rng, shape, dt) for _, shape, dt in specs]
    x, w = inputs[0].astype(acc), inputs[1].astype(acc)
    ref = x @ (w.T if transposed else w)
    ref = _epilogue_reference(ref, [a.astype(acc) for a in inputs], bias, residual, relu, clip)
    if softmax:
        e = np.exp(ref - ref.max(-1, keepdims=True))
        ref = e / e.sum(-1, keepdims=True)
    return relax_module(specs, body), inputs, _rounded(ref, dtype)


def gemm_terms(inputs, op: str, bias: bool, residual: bool, transposed=False, **conv) -> np.ndarray:
    """Per output element, the sum of the magnitudes of the terms a matmul_model or conv2d_model
    (NCHW, `conv`: stride, pad, dilation, groups) adds: |x| @ |w| + |b| + |r|, in float64 (the
    scale of its float32 summation error, half_floats.error_bound)."""
    x, w = (np.abs(a.astype(np.float64)) for a in inputs[:2])
    if op == "matmul":
        total = x @ (w.T if transposed else w)
    else:
        total = conv2d_reference(x, w, conv["stride"], conv["pad"], conv.get("dilation", (1, 1)), conv.get("groups", 1))
    total = total + np.abs(inputs[2].astype(np.float64)) if bias else total
    return total + np.abs(inputs[-1].astype(np.float64)) if residual else total


def conv2d_reference(x, w, stride, pad, dilation=(1, 1), groups=1):
    """NCHW / OIHW conv2d in numpy (accumulating in the inputs' dtype)."""
    if groups > 1:
        xs, ws = np.split(x, groups, axis=1), np.split(w, groups, axis=0)
        return np.concatenate([conv2d_reference(xg, wg, stride, pad, dilation)
                               for xg, wg in zip(xs, ws)], axis=1)
    top, left, bottom, right = pad
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    n, c, h, wd = xp.shape
    f, _, kh, kw = w.shape
    oh = (h - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, f, oh, ow), dtype=x.dtype)
    for ry in range(kh):
        for rx in range(kw):
            y0, x0 = ry * dilation[0], rx * dilation[1]
            patch = xp[:, :, y0:y0 + stride[0] * (oh - 1) + 1:stride[0], x0:x0 + stride[1] * (ow - 1) + 1:stride[1]]
            out += np.einsum("nchw,fc->nfhw", patch, w[:, :, ry, rx])
    return out


def conv2d_model(n, c, h, w_, f, kh, kw, stride=(1, 1), pad=(0, 0, 0, 0), dtype="float32",
                 bias=True, relu=True, dilation=(1, 1), groups=1, layouts=("NCHW", "OIHW", "NCHW"),
                 residual=False, clip=None, seed=None):
    """conv2d (+ bias) (+ residual of the output's shape) (relu) (clip to (lo, hi)) with data,
    weight and output stored in `layouts`: (module, inputs, reference). Shapes are given in
    NCHW / OIHW order whatever the layouts."""
    acc, out = ACC[dtype], _stored(dtype)
    data_layout, kernel_layout, out_layout = layouts
    specs = [("data", stored((n, c, h, w_), "NCHW", data_layout), dtype),
             ("weight", stored((f, c // groups, kh, kw), "OIHW", kernel_layout), weight_dtype(dtype))]
    specs += [("bias", tuple(f if axis == "C" else 1 for axis in out_layout), out)] if bias else []
    if residual:
        top, left, bottom, right = pad
        oh = (h + top + bottom - dilation[0] * (kh - 1) - 1) // stride[0] + 1
        ow = (w_ + left + right - dilation[1] * (kw - 1) - 1) // stride[1] + 1
        specs += [("residual", stored((n, f, oh, ow), "NCHW", out_layout), out)]

    def body(bb, x, w, *rest):
        y = bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=pad, dilation=dilation, groups=groups,
                                       data_layout=data_layout, kernel_layout=kernel_layout,
                                       out_layout=out_layout, out_dtype=acc if dtype in INTEGER else None))
        if bias:
            y = bb.emit(relax.op.add(y, rest[0]))
        y = _epilogue_tail(bb, y, rest[-1] if residual else None, None)
        if relu:
            y = bb.emit(relax.op.nn.relu(y))
        return _epilogue_tail(bb, y, None, clip)

    rng = np.random.default_rng(n * 7 + c * 11 + h * 13 + f * 17 + kh * 19 if seed is None else seed)
    inputs = [_random(rng, shape, dt) for _, shape, dt in specs]
    x = inputs[0].transpose([data_layout.index(axis) for axis in "NCHW"]).astype(acc)
    w = inputs[1].transpose([kernel_layout.index(axis) for axis in "OIHW"]).astype(acc)
    ref = conv2d_reference(x, w, stride, pad, dilation, groups).transpose(["NCHW".index(a) for a in out_layout])
    ref = _epilogue_reference(ref, [a.astype(acc) for a in inputs], bias, residual, relu, clip)
    return relax_module(specs, body), inputs, _rounded(ref, dtype)


def batch_matmul_model(lhs_shape, rhs_shape, dtype="float32", bias=True, relu=True, transposed=False,
                       seed=None):
    """matmul(x, w) with batch dims (numpy's broadcast) (+ bias row) (relu); with `transposed`,
    w is stored (..., N, K) and permute_dims swaps its last two axes first, as PyTorch's Linear
    and `x @ w.transpose(-1, -2)` import. Returns (module, inputs, reference)."""
    acc = ACC[dtype]
    n = rhs_shape[-2] if transposed else rhs_shape[-1]
    specs = [("x", tuple(lhs_shape), dtype), ("w", tuple(rhs_shape), weight_dtype(dtype))] + \
        ([("b", (n,), _stored(dtype))] if bias else [])

    def body(bb, x, w, *rest):
        if transposed:
            rank = len(rhs_shape)
            w = bb.emit(relax.op.permute_dims(w, list(range(rank - 2)) + [rank - 1, rank - 2]))
        y = bb.emit(relax.op.matmul(x, w, out_dtype=acc if dtype in INTEGER else None))
        if bias:
            y = bb.emit(relax.op.add(y, rest[0]))
        return bb.emit(relax.op.nn.relu(y)) if relu else y

    rng = np.random.default_rng(sum(lhs_shape) * 1009 + sum(rhs_shape) if seed is None else seed)
    inputs = [_random(rng, shape, dt) for _, shape, dt in specs]
    x, w = inputs[0].astype(acc), inputs[1].astype(acc)
    ref = np.matmul(x, np.swapaxes(w, -1, -2) if transposed else w)
    if bias:
        ref = ref + inputs[2].astype(acc)
    if relu:
        ref = np.maximum(ref, 0)
    return relax_module(specs, body), inputs, _rounded(ref, dtype)


def _pool_extent(size, kernel, stride, lo, hi, dilation, ceil_mode):
    span = size + lo + hi - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    return out - 1 if ceil_mode and (out - 1) * stride >= size + lo else out


def pool_reference(x, kind, kernel, stride=(1, 1), pad=(0, 0, 0, 0), dilation=(1, 1), ceil_mode=False,
                   count_include_pad=False):
    """NCHW max / average pooling in numpy, as PyTorch (and relax's legalisation) define it: the
    padding never wins a max; an average divides the sum of the image's taps by the taps inside
    the image (count_include_pad=False) or inside the padded image (True), so ceil mode's last
    windows, which reach past the padding, count fewer."""
    n, c, h, w = x.shape
    top, left, bottom, right = pad
    oh = _pool_extent(h, kernel[0], stride[0], top, bottom, dilation[0], ceil_mode)
    ow = _pool_extent(w, kernel[1], stride[1], left, right, dilation[1], ceil_mode)
    out = np.zeros((n, c, oh, ow), np.float64)
    for y in range(oh):
        for x_ in range(ow):
            rows = [y * stride[0] - top + r * dilation[0] for r in range(kernel[0])]
            cols = [x_ * stride[1] - left + r * dilation[1] for r in range(kernel[1])]
            window = x[:, :, [r for r in rows if 0 <= r < h]][:, :, :, [q for q in cols if 0 <= q < w]]
            if kind == "max":
                out[:, :, y, x_] = window.max(axis=(2, 3))
                continue
            lo_y, hi_y, lo_x, hi_x = (-top, h + bottom, -left, w + right) if count_include_pad else (0, h, 0, w)
            count = sum(lo_y <= r < hi_y for r in rows) * sum(lo_x <= q < hi_x for q in cols)
            out[:, :, y, x_] = window.astype(np.float64).sum(axis=(2, 3)) / count
    return out.astype(x.dtype)


def pool_model(kind, n, c, h, w_, kernel, stride=(1, 1), pad=(0, 0, 0, 0), dilation=(1, 1), ceil_mode=False,
               count_include_pad=False, dtype="float32", layout="NCHW", seed=None):
    """relax.nn.max_pool2d / avg_pool2d over (n, c, h, w_) data stored in `layout`:
    (module, inputs, reference)."""
    op = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
    specs = [("data", stored((n, c, h, w_), "NCHW", layout), dtype)]

    def body(bb, x):
        return bb.emit(op(x, kernel, stride, pad, dilation, ceil_mode=ceil_mode,
                          count_include_pad=count_include_pad, layout=layout, out_layout=layout))

    rng = np.random.default_rng(n * 7 + c * 11 + h * 13 + w_ * 17 + kernel[0] * 19 if seed is None else seed)
    inputs = [_random(rng, specs[0][1], dtype)]
    x = inputs[0].transpose([layout.index(axis) for axis in "NCHW"])
    ref = pool_reference(x, kind, kernel, stride, pad, dilation, ceil_mode, count_include_pad)
    return relax_module(specs, body), inputs, ref.transpose(["NCHW".index(a) for a in layout])


def run(ex, inputs):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


def mismatch(out, ref, dtype, tolerance: float = 1e-5) -> str | None:
    """None when `out` matches: int8 kernels exactly, float32 within `tolerance` of the output's
    scale (its largest finite magnitude, at least 1), infinities and NaNs where the reference has
    them. Otherwise a description of the worst element."""
    if out.shape != ref.shape:
        return f"shape {out.shape} != reference {ref.shape}"
    if dtype == "int8":
        bad = np.flatnonzero(out != ref)
        if bad.size:
            i = np.unravel_index(bad[0], out.shape)
            return f"{bad.size} elements differ, first at {tuple(int(x) for x in i)}: {out[i]} != {ref[i]}"
        return None
    # An infinity or a NaN must be matched exactly (the same infinity, a NaN for a NaN); the
    # finite elements within `tolerance` of the largest finite reference.
    same = (out == ref) | (np.isnan(out) & np.isnan(ref))
    finite = np.isfinite(ref) & np.isfinite(out)
    if not np.all(same | finite):
        i = np.unravel_index(int(np.flatnonzero(~(same | finite))[0]), out.shape)
        return f"non-finite element differs at {tuple(int(x) for x in i)}: {out[i]} vs {ref[i]}"
    scale = max(1.0, float(np.abs(np.where(np.isfinite(ref), ref, 0)).max(initial=0)))
    with np.errstate(invalid="ignore"):  # inf - inf where both are the same infinity: not used
        error = np.where(same, 0.0, np.abs(out.astype(np.float64) - ref) / scale)
    if not np.all(error <= tolerance):
        i = np.unravel_index(int(np.nanargmax(error)), out.shape)
        return f"relative error {float(error[i]):.2e} at {tuple(int(x) for x in i)}: {out[i]} vs {ref[i]}"
    return None


def eltwise_model(func: str, lhs_shape, rhs_shape, dtype="float32", seed=0):
    """`func`(lhs, rhs) of two tensors with numpy broadcasting; returns (mod, inputs, numpy result)."""
    mod = relax_module([("lhs", tuple(lhs_shape), dtype), ("rhs", tuple(rhs_shape), dtype)],
                       lambda bb, lhs, rhs: getattr(relax.op, func)(lhs, rhs))
    rng = np.random.default_rng(seed)
    inputs = [_random(rng, tuple(lhs_shape), dtype), _random(rng, tuple(rhs_shape), dtype)]
    with np.errstate(over="ignore"):
        ref = getattr(np, func)(*inputs, dtype=dtype)
    return mod, inputs, ref


def half_mismatch(out, ref, bound) -> str | None:
    """None when every element of a 16-bit float `out` is within `bound` (per element) of `ref`
    (non-finite ones equal, a NaN for a NaN); else a description of the worst element."""
    if out.shape != ref.shape:
        return f"shape {out.shape} != reference {ref.shape}"
    out64, ref64 = out.astype(np.float64), ref.astype(np.float64)
    same = (out64 == ref64) | (np.isnan(out64) & np.isnan(ref64))
    with np.errstate(invalid="ignore"):
        excess = np.where(same, 0.0, np.abs(out64 - ref64) - bound)
    excess = np.where(np.isnan(excess), np.inf, excess)  # a non-finite element that differs
    if np.all(excess <= 0):
        return None
    i = np.unravel_index(int(np.argmax(excess)), out.shape)
    return f"{out64[i]} vs {ref64[i]} at {tuple(int(x) for x in i)}: off by {abs(out64[i] - ref64[i]):.3g}, " \
           f"bound {float(bound[i]):.3g}"
