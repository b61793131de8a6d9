"""The partition table's pooling entries: which pooling calls become a POOL kernel, and why not.

Stage: partition. `POOL_PATTERNS` are the `cgra.*` patterns (one Relax call each, no epilogue):
relax.nn.max_pool2d, relax.nn.avg_pool2d, relax.nn.adaptive_avg_pool2d to a 1 x 1 output and
relax.mean over the two spatial axes (what the ONNX importer makes of GlobalAveragePool), on any
order of the NCHW axes (NCHW, NHWC). `pool_spec` reads the `KernelSpec` off a matched call and
raises `PoolRejected` with the reason a call stays on the host. Importing this module registers
the pooling kernel (pooling.py).
"""

from __future__ import annotations

from tvm.relax.dpl import is_op, wildcard

from . import pooling  # noqa: F401  (registers the "pool" kernel's compute and schedule)
from .errors import CGRAError
from .kernels import KernelSpec, PoolAttrs
from .pool_intrinsic import never_valid_taps

#: Pattern name -> the Relax operator it matches.
POOL_OPS = {
    "cgra.max_pool2d": "relax.nn.max_pool2d",
    "cgra.avg_pool2d": "relax.nn.avg_pool2d",
    "cgra.adaptive_avg_pool2d": "relax.nn.adaptive_avg_pool2d",
    "cgra.mean": "relax.mean",
}
#: Input dtypes per kind: an average of integers would round, which POOL does not do.
POOL_DTYPES = {"max": ("float32", "int8"), "avg": ("float32",)}


class PoolRejected(CGRAError, ValueError):
    pass


def pool_pattern_graphs():
    """(name, pattern, annotations) of every pooling pattern."""
    graphs = []
    for name, op in POOL_OPS.items():
        data = wildcard()
        root = is_op(op)(data)
        graphs.append((name, root, {"root": root, "lhs": data}))
    return graphs


def pool_spec(name: str, annotated: dict, static_shape, dtype_of) -> KernelSpec:
    """The pooling kernel of a matched call. `static_shape(expr, role)` and `dtype_of(expr)` are
    the partition table's readers (they reject symbolic shapes)."""
    call, data = annotated["root"], annotated["lhs"]
    op = name.removeprefix("cgra.")
    shape = static_shape(data, "data")
    if len(shape) != 4:
        raise PoolRejected(f"{op} of a rank-{len(shape)} tensor: the NPU pools 4-D images")
    spec = _SPECS[name](op, call, shape, dtype_of(data))
    if spec.dtype not in POOL_DTYPES[spec.pool.kind]:
        raise PoolRejected(f"{op} on {spec.dtype}: the NPU's POOL takes "
                           f"{' or '.join(POOL_DTYPES[spec.pool.kind])} for a {spec.pool.kind} pool")
    outside = never_valid_taps(pooling.pool_window(spec), spec.output_shape[2:])
    if outside:
        axis, tap = outside[0]
        raise PoolRejected(f"{op} of a {shape} image: window {'row' if axis == 0 else 'column'} {tap} lies in "
                           "the padding for every output (an image smaller than the window); the NPU's "
                           "POOL kernel takes whole windows")
    return spec


def _layout(op: str, attrs) -> str:
    layout, out_layout = str(attrs.layout), str(attrs.out_layout)
    if sorted(layout) != sorted("NCHW") or out_layout != layout:
        raise PoolRejected(f"{op} with layout {layout} -> {out_layout}: the NPU pools an order of the axes "
                           "NCHW (e.g. NCHW or NHWC) into the same layout")
    return layout


def _logical(shape, layout: str) -> tuple:
    return tuple(shape[layout.index(axis)] for axis in "NCHW")


def _window_spec(op: str, call, shape, dtype: str) -> KernelSpec:
    """max_pool2d / avg_pool2d: their attributes as they are."""
    attrs = call.attrs
    layout = _layout(op, attrs)
    kind = "max" if op == "max_pool2d" else "avg"
    dilation = tuple(int(d) for d in attrs.dilation)
    if kind == "avg" and dilation != (1, 1):
        raise PoolRejected(f"avg_pool2d with dilation {dilation}: the NPU averages undilated windows")
    padding = tuple(int(p) for p in attrs.padding)
    padding = padding * (4 // len(padding))
    pool = PoolAttrs(kind, tuple(int(k) for k in attrs.pool_size), bool(attrs.ceil_mode),
                     bool(attrs.count_include_pad))
    return KernelSpec("pool", dtype=dtype, acc_dtype=dtype,
                      lhs_shape=_logical(shape, layout), rhs_shape=(), strides=tuple(int(s) for s in attrs.strides),
                      padding=padding, dilation=dilation, data_layout=layout, out_layout=layout, pool=pool,
                      param_roles=("lhs",))


def _global_spec(shape, layout: str, dtype: str, caller_shapes=()) -> KernelSpec:
    """An average over the whole image: a window of H x W taps."""
    n, c, h, w = _logical(shape, layout)
    return KernelSpec("pool", dtype=dtype, acc_dtype=dtype, lhs_shape=(n, c, h, w), rhs_shape=(),
                      data_layout=layout, out_layout=layout, pool=PoolAttrs("avg", (h, w)),
                      param_roles=("lhs",), caller_shapes=caller_shapes)


def _adaptive_spec(op: str, call, shape, dtype: str) -> KernelSpec:
    layout = _layout(op, call.attrs)
    size = call.attrs.output_size
    if size is None or tuple(int(s) for s in size) not in ((1, 1), (1,)):
        raise PoolRejected(f"adaptive_avg_pool2d to {None if size is None else tuple(int(s) for s in size)}: "
                           "the NPU runs the global one (output_size 1)")
    return _global_spec(shape, layout, dtype)


def _mean_spec(op: str, call, shape, dtype: str) -> KernelSpec:
    """mean over the two spatial axes of NCHW (2, 3) or NHWC (1, 2) data, keepdims or not."""
    axes = tuple(sorted(int(a) % 4 for a in call.attrs.axis)) if call.attrs.axis is not None else (0, 1, 2, 3)
    layouts = {(2, 3): "NCHW", (1, 2): "NHWC"}
    if axes not in layouts:
        raise PoolRejected(f"mean over axes {axes} is not a global average pool (axes (2, 3) of NCHW or "
                           "(1, 2) of NHWC data)")
    layout = layouts[axes]
    caller = () if call.attrs.keepdims else (("out", tuple(d for i, d in enumerate(shape) if i not in axes)),)
    return _global_spec(shape, layout, dtype, caller)


_SPECS = {
    "cgra.max_pool2d": _window_spec,
    "cgra.avg_pool2d": _window_spec,
    "cgra.adaptive_avg_pool2d": _adaptive_spec,
    "cgra.mean": _mean_spec,
}
