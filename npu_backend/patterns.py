"""The partition table: which Relax subgraphs run on the NPU, and why the others do not.

Stage: partition. Input: a Relax IRModule. `make_patterns(arch)` returns the `cgra.*` fusion
patterns, each with a check function that rejects what the kernels cannot do (the reason is
kept: `offload_reason` returns it in words a user can act on). `spec_from_composite` reads the
`KernelSpec` back off an offloaded function for the target hook.

Pooling (max_pool2d, avg_pool2d, global average pool) comes from pool_patterns.py.

Patterns: matmul (2-D and batched, and the permute_dims + matmul form PyTorch's Linear produces)
and conv2d (any order of the axes: NCHW or NHWC data, OIHW, HWIO or OHWI weights; any stride,
padding, dilation and groups; depthwise ones become the DEPTHWISE kernel), in float32 and in
int8 x int8 -> int32, each followed by the epilogue chain [+ bias] [+ residual] [relu | clip]:
a bias `add` (one value per output channel / column), a residual `add` (a tensor of the output's
exact shape and the accumulator dtype, e.g. ResNet's shortcut), then `relu` or `clip` with
constant bounds (relu6; ONNX Clip arrives as R.clip after the normalise stage, see clip_form.py).
An int8 kernel's chain [+ bias] [relu] may end in a requantisation to int8, in the form the
normalise stage writes it (qdq_form.py): quantize(multiply(astype(x, "float32"), scale), 1, zp).
Then, last, the standalone elementwise ops (eltwise.py).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl import is_op, wildcard
from tvm.relax.transform import FusionPattern

from cgra_sim.arch import HardwareDescription

from .eltwise import PREFIX as ELTWISE_PREFIX
from .eltwise import eltwise_pattern_graphs, eltwise_reason, eltwise_spec_from_composite
from .errors import CGRAError
from .kernels import KernelSpec
from .pool_patterns import POOL_OPS, pool_pattern_graphs, pool_spec
from .relax_info import dtype_of, require_static_shape
from .tiling import choose_kernel_tiling

ACC_DTYPE = {"int8": "int32", "float32": "float32"}


#: Activation suffix -> (pattern around x, annotation name or None). The clip's bounds are
#: checked to be constants by the check function (a pattern cannot say "a constant PrimExpr").
_ACTIVATIONS = {
    "": (lambda x: x, None),
    "_relu": (lambda x: is_op("relax.nn.relu")(x), None),
    "_clip": (lambda x: is_op("relax.clip")(x, wildcard(), wildcard()), "clip"),
}


def _pattern_graphs():
    """(name, pattern, annotations) for every supported op with every epilogue chain, shortest
    first; among chains of one length, a residual add before a bias add, so that (reversed in
    make_patterns) an add that qualifies as a bias is fused as one.

    The matcher tries a commutative add's operands in the pattern's order first and the check
    cannot send it back for the other order; so each residual add also comes mirrored, under
    the same name: in `add(a, b)` where both a and b are a conv + bias, but a is used elsewhere
    (MobileNetV2's `x + block(x)` when x is itself a conv + bias), the mirrored pattern fuses b."""
    lhs, rhs, weight, bias, residual = wildcard(), wildcard(), wildcard(), wildcard(), wildcard()
    permute = is_op("relax.permute_dims")(weight)
    roots = {
        "matmul": (is_op("relax.matmul")(lhs, rhs), {"lhs": lhs, "rhs": rhs}),
        "linear": (is_op("relax.matmul")(lhs, permute), {"lhs": lhs, "rhs": weight, "permute": permute}),
        "conv2d": (is_op("relax.nn.conv2d")(lhs, rhs), {"lhs": lhs, "rhs": rhs}),
    }
    graphs = []
    for name, (root, roles) in roots.items():
        with_bias = is_op("relax.add")(root, bias)
        sums = [  # (suffix, pattern, annotations, ops); mirrored first: tried second
            ("", root, {}, 1),
            ("_residual", is_op("relax.add")(residual, root), {"residual": residual}, 2),
            ("_residual", is_op("relax.add")(root, residual), {"residual": residual}, 2),
            ("_bias", with_bias, {"bias": bias}, 2),
            ("_bias_residual", is_op("relax.add")(residual, with_bias), {"bias": bias, "residual": residual}, 3),
            ("_bias_residual", is_op("relax.add")(with_bias, residual), {"bias": bias, "residual": residual}, 3),
        ]
        for suffix, summed, extra, ops in sums:
            for act, (wrap, role) in _ACTIVATIONS.items():
                pattern = wrap(summed)
                annotations = {"root": root, **roles, **extra, **({role: pattern} if role else {})}
                graphs.append((ops + (act != ""), f"cgra.{name}{suffix}{act}", pattern, annotations))
    graphs += _requant_graphs(roots, bias)
    graphs.sort(key=lambda graph: graph[0])  # stable: keeps the tie order above
    return [graph[1:] for graph in graphs] + pool_pattern_graphs()


def _requant_graphs(roots, bias):
    """The int8 chains ending in a requantisation: root [+ bias] [relu], then
    quantize(multiply(astype(., float32), scale), 1.0, zero point), as qdq_form.py writes them."""
    graphs = []
    for name, (root, roles) in roots.items():
        for suffix, summed, extra, ops in (("", root, {}, 1),
                                           ("_bias", is_op("relax.add")(root, bias), {"bias": bias}, 2)):
            for act in ("", "_relu"):
                value = is_op("relax.nn.relu")(summed) if act else summed
                scale = wildcard()
                multiply = is_op("relax.multiply")(is_op("relax.astype")(value), scale)
                tail = is_op("relax.quantize")(multiply, wildcard(), wildcard())
                annotations = {"root": root, **roles, **extra, "requant": tail,
                               "requant_multiply": multiply, "scale": scale}
                graphs.append((ops + (act != "") + 3, f"cgra.{name}{suffix}{act}_requant", tail, annotations))
    return graphs


def make_patterns(arch: HardwareDescription) -> list[FusionPattern]:
    """The fusion patterns for `arch`, most specific first (FuseOpsByPattern tries them in order):
    every conv2d / matmul chain, then the standalone elementwise ops, so that an add a kernel's
    epilogue can fuse (a bias, a residual) is taken by that kernel, not by ELTWISE."""
    patterns = []
    for name, pattern, roles in _pattern_graphs():
        def check(context, name=name):
            # An intermediate value used outside the match would have to leave the kernel too.
            return offload_reason(name, context.annotated_expr, arch) is None and \
                not has_leaking_intermediate_variables(context)
        patterns.append(FusionPattern(name, pattern, roles, check))
    patterns.reverse()
    for name, pattern, roles in eltwise_pattern_graphs():
        patterns.append(FusionPattern(name, pattern, roles, lambda context, name=name: eltwise_reason(
            name, context.annotated_expr, arch) is None))
    return patterns


def offload_reason(name: str, annotated: dict, arch: HardwareDescription) -> str | None:
    """None if the matched subgraph can run on the NPU, else the reason it stays on the host."""
    if name.startswith(ELTWISE_PREFIX):
        return eltwise_reason(name, annotated, arch)
    try:
        _check_distinct_operands(name, annotated)
        spec = spec_from_match(name, annotated)
    except CGRAError as err:
        return str(err)
    if spec.dtype not in arch.dtypes:
        return f"{arch.name} computes {', '.join(arch.dtypes)}, not {spec.dtype}"
    try:
        choose_kernel_tiling(spec, arch)
    except CGRAError as err:
        return str(err)
    return None


class _Reject(CGRAError, ValueError):
    pass


def _check_distinct_operands(name: str, annotated: dict) -> None:
    """The kernel DMAs each operand from its own parameter: x @ x would give the offloaded
    function one parameter in two roles, which `spec_from_composite` refuses."""
    operands = [(role, annotated[role]) for role in ("lhs", "rhs", "bias") if role in annotated]
    for index, (role, expr) in enumerate(operands):
        for other, other_expr in operands[index + 1:]:
            if expr.same_as(other_expr):
                raise _Reject(f"{name.removeprefix('cgra.')} takes the same tensor as {role} and {other}; "
                              "the NPU kernel needs each operand as its own tensor")


def _static_shape(expr, role: str) -> tuple:
    return require_static_shape(expr, role, _Reject)


def spec_from_match(name: str, annotated: dict) -> KernelSpec:
    """The kernel a matched pattern would become; raises `_Reject` with the reason it cannot."""
    if name in POOL_OPS:
        return pool_spec(name, annotated, _static_shape, dtype_of)
    root = annotated["root"]
    op = "conv2d" if name.startswith("cgra.conv2d") else "matmul"
    lhs, rhs = annotated["lhs"], annotated["rhs"]
    dtype, rhs_dtype = dtype_of(lhs), dtype_of(rhs)
    if dtype != rhs_dtype:
        raise _Reject(f"{op} mixes {dtype} and {rhs_dtype}; the PE array multiplies equal dtypes")
    if dtype not in ACC_DTYPE:
        raise _Reject(f"{op} on {dtype} is not supported (float32, or int8 with int32 output)")
    acc_dtype = ACC_DTYPE[dtype]
    out_dtype = dtype_of(root)
    if out_dtype != acc_dtype:
        raise _Reject(f"{op} of {dtype} must produce {acc_dtype}, this one produces {out_dtype} "
                      f"(use out_dtype=\"{acc_dtype}\")")
    bias_shape = None
    if "bias" in annotated:
        bias_shape = _static_shape(annotated["bias"], "bias")
        if dtype_of(annotated["bias"]) != acc_dtype:
            raise _Reject(f"the bias is {dtype_of(annotated['bias'])}, the accumulator {acc_dtype}")
    clip = _clip_bounds(annotated["clip"], acc_dtype) if "clip" in annotated else None
    common = dict(dtype=dtype, acc_dtype=acc_dtype, bias_shape=bias_shape,
                  relu=name.removesuffix("_requant").endswith("_relu"), clip=clip)
    if op == "conv2d":
        spec = _conv2d_spec(root, lhs, rhs, common)
    else:
        spec = _matmul_spec(name, lhs, rhs, annotated.get("permute"), bias_shape, common)
    spec = _with_residual(spec, annotated) if "residual" in annotated else spec
    return _with_requant(spec, annotated) if "requant" in annotated else spec


def _with_requant(spec: KernelSpec, annotated: dict) -> KernelSpec:
    """`spec` ending in a requantisation to int8: quantize(multiply(astype(x, float32), scale),
    1.0, zp) with a float32 scale per output channel (shaped like a bias) and an int8 zero point."""
    quantize, multiply = annotated["requant"], annotated["requant_multiply"]
    if spec.acc_dtype != "int32":
        raise _Reject(f"requantisation to int8 follows an int8 x int8 -> int32 {spec.op}, not {spec.dtype}")
    if spec.compute_name in ("conv2d_layout", "batch_matmul"):
        raise _Reject("requantisation is fused after NCHW conv2d and 2-D matmul, not yet after a "
                      f"{spec.compute_name}: it runs on the host")
    if str(quantize.attrs.out_dtype) != "int8" or _scalar_value(quantize.args[1], "float32") != 1.0:
        raise _Reject("a requantisation is quantize(x * scale, 1.0, zero point) to int8; this quantize "
                      "has another scale or output dtype (the normalise stage writes the fused form)")
    zero_point = _scalar_value(quantize.args[2], "int8")
    if zero_point is None:
        raise _Reject("the requantisation's zero point is not an int8 constant")
    if dtype_of(multiply.args[0]) != "float32" or dtype_of(annotated["scale"]) != "float32":
        raise _Reject("the requantisation multiplies float32(acc) by a float32 scale row")
    shape = _static_shape(annotated["scale"], "requantisation scale")
    expected = spec.bias_shape or _channel_row_shape(spec)
    if tuple(shape) != tuple(expected):
        raise _Reject(f"the requantisation scale of shape {shape} is not one value per output "
                      f"channel (expected {tuple(expected)})")
    return dataclasses.replace(spec, requant_zero_point=int(zero_point), scale_shape=tuple(shape))


def _channel_row_shape(spec: KernelSpec) -> tuple:
    """The shape of a per-output-channel row broadcast over the output: (n,) for a matmul,
    (1, F, 1, 1) (in the output layout) for a conv2d."""
    if spec.op == "matmul":
        return (spec.gemm_extents[1],)
    return tuple(spec.rhs_shape[0] if axis == "C" else 1 for axis in spec.out_layout)


def _scalar_value(expr, dtype: str):
    """The value of a 0-d constant of `dtype`, else None."""
    if not isinstance(expr, tvm.ir.GenericConst) or dtype_of(expr) != dtype:
        return None
    value = expr.value.numpy()
    return value.item() if value.ndim == 0 else None


def _with_residual(spec: KernelSpec, annotated: dict) -> KernelSpec:
    """`spec` with the residual add: a tensor of the output's exact shape in the acc dtype."""
    residual = annotated["residual"]
    for role in ("lhs", "rhs", "bias"):
        if role in annotated and annotated[role].same_as(residual):
            raise _Reject(f"the residual is also the {spec.op}'s {role}: each operand of an NPU kernel "
                          "must be its own tensor")
    if spec.compute_name in ("conv2d_layout", "batch_matmul"):
        form = "batched matmul" if spec.compute_name == "batch_matmul" else \
            f"{spec.data_layout}/{spec.kernel_layout} conv2d"
        raise _Reject(f"a residual add is fused after NCHW and depthwise conv2d and 2-D matmul, not "
                      f"yet after a {form}: the add runs on the host")
    if dtype_of(residual) != spec.acc_dtype:
        raise _Reject(f"the residual is {dtype_of(residual)}, the accumulator {spec.acc_dtype}")
    shape = _static_shape(residual, "residual")
    stored = tuple(spec.output_shape) if spec.op == "matmul" else \
        tuple(spec.output_shape["NCHW".index(axis)] for axis in spec.out_layout)
    if shape != stored:
        raise _Reject(f"the added tensor of shape {shape} is neither a bias (one value per output "
                      f"channel) nor a residual of the output's shape {stored}")
    return dataclasses.replace(spec, residual_shape=shape)


def _clip_bounds(call, acc_dtype: str) -> tuple:
    """The (lo, hi) of a clip as the epilogue applies them: constants of the accumulator dtype,
    lo <= hi (the NPU computes min(max(x, lo), hi), the host max(min(x, hi), lo): equal then)."""
    bounds = call.args[1:3]
    if not all(isinstance(b, (tirx.IntImm, tirx.FloatImm)) for b in bounds):
        raise _Reject(f"clip bounds {list(bounds)} are not constants; the epilogue clips to constants")
    lo, hi = (float(b.value) for b in bounds)
    if np.isnan(lo) or np.isnan(hi) or lo > hi:
        raise _Reject(f"clip to [{lo}, {hi}] is not a range (needs lo <= hi)")
    if acc_dtype == "float32":
        return float(np.float32(lo)), float(np.float32(hi))
    info = np.iinfo(acc_dtype)
    if not all(v.is_integer() and info.min <= v <= info.max for v in (lo, hi)):
        raise _Reject(f"clip bounds [{lo}, {hi}] of an {acc_dtype} result must be {acc_dtype} integers")
    return int(lo), int(hi)


def _matmul_spec(name, lhs, rhs, permute, bias_shape, common) -> KernelSpec:
    lhs_shape, rhs_shape = _static_shape(lhs, "left operand"), _static_shape(rhs, "right operand")
    if min(len(lhs_shape), len(rhs_shape)) < 2:
        raise _Reject(f"matmul of rank {len(lhs_shape)} x {len(rhs_shape)}: the NPU kernel takes "
                      "matrices (reshape a vector operand to (1, K) or (K, 1))")
    if len(lhs_shape) != 2 or len(rhs_shape) != 2:
        return _batched_matmul_spec(name, lhs_shape, rhs_shape, permute, bias_shape, common)
    transposed = name.startswith("cgra.linear")
    if transposed:
        axes = permute.attrs.axes
        if axes is not None and [int(a) for a in axes] != [1, 0]:
            raise _Reject(f"permute_dims with axes {list(axes)} before matmul is not a transpose")
    n = rhs_shape[0] if transposed else rhs_shape[1]
    if bias_shape is not None and (bias_shape[-1] != n or any(d != 1 for d in bias_shape[:-1])):
        raise _Reject(f"the bias of shape {bias_shape} is not a row of {n} columns")
    return KernelSpec("matmul", lhs_shape=lhs_shape, rhs_shape=rhs_shape, rhs_transposed=transposed, **common)


def _conv2d_spec(call, data, weight, common) -> KernelSpec:
    attrs = call.attrs
    layouts = _conv2d_layouts(attrs)
    data_layout, kernel_layout, out_layout = layouts
    data_shape = _logical(_static_shape(data, "data"), data_layout, "NCHW")
    weight_shape = _logical(_static_shape(weight, "weight"), kernel_layout, "OIHW")
    groups = int(attrs.groups)
    if data_shape[1] % groups or weight_shape[0] % groups or weight_shape[1] * groups != data_shape[1]:
        raise _Reject(f"conv2d with groups={groups} on {data_shape[1]} input channels and weights "
                      f"{weight_shape}: each group must take C / groups input channels")
    padding = tuple(int(p) for p in attrs.padding)
    if len(padding) == 2:
        padding = padding * 2
    # One input channel per output channel: the sliding-window DEPTHWISE kernel, not a GEMM
    # one column wide. (A channel multiplier > 1 runs as a grouped GEMM.)
    op = "depthwise" if 1 < groups == data_shape[1] == weight_shape[0] else "conv2d"
    spec = KernelSpec(op, lhs_shape=data_shape, rhs_shape=weight_shape,
                      strides=tuple(int(s) for s in attrs.strides), padding=padding,
                      dilation=tuple(int(d) for d in attrs.dilation), groups=groups,
                      data_layout=data_layout, kernel_layout=kernel_layout, out_layout=out_layout, **common)
    bias_shape = common["bias_shape"]
    if bias_shape is not None:
        aligned = (1,) * (4 - len(bias_shape)) + tuple(bias_shape)
        channels, axis = weight_shape[0], out_layout.index("C")
        expected = tuple(channels if a == axis else 1 for a in range(4))
        if len(bias_shape) > 4 or aligned != expected:
            raise _Reject(f"the bias of shape {bias_shape} is not one value per output channel "
                          f"(expected {expected} or {expected[axis:]} for {out_layout} output)")
    return spec


def _conv2d_layouts(attrs) -> tuple[str, str, str]:
    """(data, kernel, out) layouts of a conv2d, if the NPU kernels can gather and store them:
    any order of the four axes (NHWC, HWIO, OHWI, ...), not blocked layouts such as NCHW4c."""
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    for layout, axes, what in zip(layouts, ("NCHW", "OIHW", "NCHW"), ("data", "kernel", "out")):
        if sorted(layout) != sorted(axes):
            raise _Reject(f"conv2d {what} layout {layout}: the NPU kernel takes an order of the axes "
                          f"{axes} (e.g. NCHW or NHWC data, OIHW, HWIO or OHWI weights), not a blocked layout")
    if int(attrs.groups) > 1 and 0 in (layouts[0].index("C"), layouts[2].index("C")):
        raise _Reject(f"grouped conv2d with layouts {layouts}: the NPU kernel reads one group's "
                      "channels as a view and needs an axis stored before C (use NCHW or NHWC)")
    return layouts


def _logical(shape: tuple, layout: str, axes: str) -> tuple:
    """A shape stored in `layout` in the logical order `axes` (e.g. NHWC -> NCHW)."""
    return tuple(shape[layout.index(axis)] for axis in axes)


def _batched_matmul_spec(name, lhs_shape, rhs_shape, permute, bias_shape, common) -> KernelSpec:
    """A matmul with batch dimensions: as a 2-D GEMM over all the batch's rows when the right
    operand is shared (its batch dims all 1), else with one image per batch element, the left
    operand batched alike or shared. Other broadcasts of the batch dims stay on the host."""
    transposed = name.startswith("cgra.linear")
    if transposed:
        _check_transpose(permute, len(rhs_shape))
    m, k = lhs_shape[-2:]
    n = rhs_shape[-2] if transposed else rhs_shape[-1]
    lhs_batch, rhs_batch = lhs_shape[:-2], rhs_shape[:-2]
    rank = max(len(lhs_batch), len(rhs_batch))
    out_shape = _broadcast(lhs_batch, rhs_batch) + (m, n)
    if bias_shape is not None and (len(bias_shape) > rank + 2 or bias_shape[-1] != n
                                   or any(d != 1 for d in bias_shape[:-1])):
        raise _Reject(f"the bias of shape {bias_shape} is not a row of {n} columns")
    lhs_count, rhs_count = math.prod(lhs_batch), math.prod(rhs_batch)
    if rhs_count == 1:  # shared weights: one GEMM over lhs_count * m rows
        kernel_lhs, kernel_rhs, kernel_out, batch = (lhs_count * m, k), rhs_shape[-2:], (lhs_count * m, n), 1
    elif lhs_count == 1 or _broadcast(lhs_batch, (1,) * rank) == _broadcast(rhs_batch, (1,) * rank):
        kernel_lhs = (m, k) if lhs_count == 1 else (lhs_count, m, k)
        kernel_rhs, kernel_out, batch = (rhs_count,) + rhs_shape[-2:], (rhs_count, m, n), rhs_count
    else:
        raise _Reject(f"matmul of {lhs_shape} x {rhs_shape} broadcasts the batch dimensions against "
                      "each other; the NPU kernel takes equal batches or a shared operand")
    # The kernel reads every operand as a compact view of what the caller passes.
    caller = tuple((role, stored) for role, stored, kernel in (
        ("lhs", lhs_shape, kernel_lhs), ("rhs", rhs_shape, kernel_rhs), ("out", out_shape, kernel_out))
        if tuple(stored) != tuple(kernel))
    return KernelSpec("matmul", lhs_shape=kernel_lhs, rhs_shape=tuple(kernel_rhs), rhs_transposed=transposed,
                      batch=batch, caller_shapes=caller, **common)


def _check_transpose(permute, rank: int) -> None:
    """permute_dims before matmul must swap the last two axes and keep the batch axes."""
    axes = permute.attrs.axes
    expected = list(range(rank - 2)) + [rank - 1, rank - 2]
    actual = list(reversed(range(rank))) if axes is None else [int(a) for a in axes]
    if actual != expected:
        raise _Reject(f"permute_dims with axes {actual} before matmul is not a transpose of the "
                      f"last two axes ({expected})")


def _broadcast(a: tuple, b: tuple) -> tuple:
    """numpy's broadcast of two batch shapes (relax has checked they broadcast)."""
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b)
    return tuple(max(x, y) for x, y in zip(a, b))


def spec_from_composite(func: relax.Function, source_ops=()) -> KernelSpec:
    """The kernel of an offloaded function, its parameters in the function's order."""
    composite = _composite_of(func)
    name = str(composite.attrs["Composite"])
    if name.startswith(ELTWISE_PREFIX):
        return eltwise_spec_from_composite(name, composite, source_ops)
    bindings = {b.var: b.value for block in composite.body.blocks for b in block.bindings}
    annotated = _annotate(name, composite, bindings)
    spec = spec_from_match(name, annotated)
    roles = {}
    for role in ("lhs", "rhs", "bias", "residual", "scale"):
        if role in annotated:
            roles.setdefault(annotated[role], []).append(role)
    param_roles = []
    for param in composite.params:
        if len(roles.get(param, [])) != 1:
            raise _Reject(f"parameter '{param.name}' of '{name}' plays {roles.get(param, [])} "
                          "roles; each operand must be its own tensor")
        param_roles.append(roles[param][0])
    return dataclasses.replace(spec, param_roles=tuple(param_roles), source_ops=tuple(source_ops))


def composite_call(func):
    """(composite function, its call) inside an offloaded wrapper function."""
    if "Composite" in (func.attrs or {}):
        return func, None
    bindings = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    for value in bindings.values():
        callee = getattr(value, "op", None)
        callee = bindings.get(callee, callee)
        if isinstance(callee, relax.Function) and "Composite" in (callee.attrs or {}):
            return callee, value
    raise _Reject("the offloaded function holds no cgra composite")


def _composite_of(func):
    return composite_call(func)[0]


def _annotate(name, composite, bindings):
    """Follow the composite's bindings back from its output to the pattern's roles."""
    def call_of(expr):
        return bindings.get(expr, expr)

    node = call_of(composite.body.body)
    if name in POOL_OPS:  # one call, no epilogue
        return {"root": node, "lhs": node.args[0]}
    annotated = {}
    if name.endswith("_requant"):  # quantize(multiply(astype(x), scale), ...)
        annotated["requant"] = node
        multiply = annotated["requant_multiply"] = call_of(node.args[0])
        annotated["scale"] = multiply.args[1]
        node = call_of(call_of(multiply.args[0]).args[0])
        name = name.removesuffix("_requant")
    if name.endswith("_relu"):
        node = call_of(node.args[0])
    if name.endswith("_clip"):
        annotated["clip"] = node
        node = call_of(node.args[0])
    # add is commutative to the matcher: PyTorch's Linear gives add(bias, matmul). The inner sum
    # is the operand computed inside the composite; the bias (residual) is the other one.
    for role in ("residual", "bias"):  # outermost first
        if f"_{role}" in name:
            first, second = node.args
            if not isinstance(call_of(first), relax.Call):
                first, second = second, first
            annotated[role] = second
            node = call_of(first)
    annotated["root"] = node
    annotated["lhs"], rhs = node.args
    if name.startswith("cgra.linear"):
        annotated["permute"] = call_of(rhs)
        rhs = annotated["permute"].args[0]
    annotated["rhs"] = rhs
    return annotated
