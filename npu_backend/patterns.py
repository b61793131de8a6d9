"""The partition table: which Relax subgraphs run on the NPU, and why the others do not.

Stage: partition. Input: a Relax IRModule. `make_patterns(arch)` returns the `cgra.*` fusion
patterns, each with a check function that rejects what the kernels cannot do (the reason is
kept: `offload_reason` returns it in words a user can act on). `spec_from_composite` reads the
`KernelSpec` back off an offloaded function for the target hook.

Patterns: matmul (2-D, and the permute_dims + matmul form PyTorch's Linear produces) and conv2d
(NCHW / OIHW, any stride, padding, dilation and groups, depthwise included), in float32 and in
int8 x int8 -> int32, each followed by the epilogue chain [+ bias] [+ residual] [relu | clip]:
a bias `add` (one value per output channel / column), a residual `add` (a tensor of the output's
exact shape and the accumulator dtype, e.g. ResNet's shortcut), then `relu` or `clip` with
constant bounds (relu6; ONNX Clip arrives as R.clip after the normalise stage, see clip_form.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from tvm import relax, tirx
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl import is_op, wildcard
from tvm.relax.transform import FusionPattern

from cgra_sim.arch import HardwareDescription

from .errors import CGRAError
from .kernels import KernelSpec
from .tiling import choose_tiling

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
    graphs.sort(key=lambda graph: graph[0])  # stable: keeps the tie order above
    return [graph[1:] for graph in graphs]


def make_patterns(arch: HardwareDescription) -> list[FusionPattern]:
    """The fusion patterns for `arch`, most specific last (FuseOpsByPattern tries them in order)."""
    patterns = []
    for name, pattern, roles in _pattern_graphs():
        def check(context, name=name):
            # An intermediate value used outside the match would have to leave the kernel too.
            return offload_reason(name, context.annotated_expr, arch) is None and \
                not has_leaking_intermediate_variables(context)
        patterns.append(FusionPattern(name, pattern, roles, check))
    return list(reversed(patterns))


def offload_reason(name: str, annotated: dict, arch: HardwareDescription) -> str | None:
    """None if the matched subgraph can run on the NPU, else the reason it stays on the host."""
    try:
        spec = spec_from_match(name, annotated)
    except CGRAError as err:
        return str(err)
    if spec.dtype not in arch.dtypes:
        return f"{arch.name} computes {', '.join(arch.dtypes)}, not {spec.dtype}"
    try:
        choose_tiling(*spec.gemm_extents, spec.dtype, spec.acc_dtype, bool(spec.bias_shape), arch,
                      spec.row_step, has_residual=bool(spec.residual_shape))
    except CGRAError as err:
        return str(err)
    return None


class _Reject(CGRAError, ValueError):
    pass


def _static_shape(expr, role: str) -> tuple:
    ty = expr.struct_info if hasattr(expr, "struct_info") else expr.ty
    shape = getattr(ty, "shape", None)
    if shape is None:
        raise _Reject(f"the {role} has no known shape")
    values = []
    for dim in shape.values if hasattr(shape, "values") else shape:
        if not hasattr(dim, "value"):
            raise _Reject(f"the {role} has a symbolic dimension ({dim}); the NPU kernels need static "
                          "shapes (bind the dimension, e.g. with relax.transform.BindSymbolicVars)")
        values.append(int(dim.value))
    return tuple(values)


def _dtype(expr) -> str:
    ty = expr.struct_info if hasattr(expr, "struct_info") else expr.ty
    return str(ty.dtype)


def spec_from_match(name: str, annotated: dict) -> KernelSpec:
    """The kernel a matched pattern would become; raises `_Reject` with the reason it cannot."""
    root = annotated["root"]
    op = "conv2d" if name.startswith("cgra.conv2d") else "matmul"
    lhs, rhs = annotated["lhs"], annotated["rhs"]
    dtype, rhs_dtype = _dtype(lhs), _dtype(rhs)
    if dtype != rhs_dtype:
        raise _Reject(f"{op} mixes {dtype} and {rhs_dtype}; the PE array multiplies equal dtypes")
    if dtype not in ACC_DTYPE:
        raise _Reject(f"{op} on {dtype} is not supported (float32, or int8 with int32 output)")
    acc_dtype = ACC_DTYPE[dtype]
    out_dtype = _dtype(root)
    if out_dtype != acc_dtype:
        raise _Reject(f"{op} of {dtype} must produce {acc_dtype}, this one produces {out_dtype} "
                      f"(use out_dtype=\"{acc_dtype}\")")
    bias_shape = None
    if "bias" in annotated:
        bias_shape = _static_shape(annotated["bias"], "bias")
        if _dtype(annotated["bias"]) != acc_dtype:
            raise _Reject(f"the bias is {_dtype(annotated['bias'])}, the accumulator {acc_dtype}")
    clip = _clip_bounds(annotated["clip"], acc_dtype) if "clip" in annotated else None
    common = dict(dtype=dtype, acc_dtype=acc_dtype, bias_shape=bias_shape, relu=name.endswith("_relu"),
                  clip=clip)
    if op == "conv2d":
        spec = _conv2d_spec(root, lhs, rhs, common)
    else:
        spec = _matmul_spec(name, lhs, rhs, annotated.get("permute"), bias_shape, common)
    return _with_residual(spec, annotated) if "residual" in annotated else spec


def _with_residual(spec: KernelSpec, annotated: dict) -> KernelSpec:
    """`spec` with the residual add: a tensor of the output's exact shape in the acc dtype."""
    residual = annotated["residual"]
    for role in ("lhs", "rhs", "bias"):
        if role in annotated and annotated[role].same_as(residual):
            raise _Reject(f"the residual is also the {spec.op}'s {role}: each operand of an NPU kernel "
                          "must be its own tensor")
    if _dtype(residual) != spec.acc_dtype:
        raise _Reject(f"the residual is {_dtype(residual)}, the accumulator {spec.acc_dtype}")
    shape = _static_shape(residual, "residual")
    if shape != tuple(spec.output_shape):
        raise _Reject(f"the added tensor of shape {shape} is neither a bias (one value per output "
                      f"channel) nor a residual of the output's shape {tuple(spec.output_shape)}")
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
    if len(lhs_shape) != 2 or len(rhs_shape) != 2:
        raise _Reject(f"matmul of rank {len(lhs_shape)} x {len(rhs_shape)}: the NPU kernel takes 2-D "
                      "operands (batched matmul stays on the host)")
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
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    if layouts != ("NCHW", "OIHW", "NCHW"):
        raise _Reject(f"conv2d layouts {layouts}: the NPU kernel takes NCHW data, OIHW weights")
    data_shape, weight_shape = _static_shape(data, "data"), _static_shape(weight, "weight")
    groups = int(attrs.groups)
    if data_shape[1] % groups or weight_shape[0] % groups or weight_shape[1] * groups != data_shape[1]:
        raise _Reject(f"conv2d with groups={groups} on {data_shape[1]} input channels and weights "
                      f"{weight_shape}: each group must take C / groups input channels")
    padding = tuple(int(p) for p in attrs.padding)
    if len(padding) == 2:
        padding = padding * 2
    spec = KernelSpec("conv2d", lhs_shape=data_shape, rhs_shape=weight_shape,
                      strides=tuple(int(s) for s in attrs.strides), padding=padding,
                      dilation=tuple(int(d) for d in attrs.dilation), groups=groups, **common)
    bias_shape = common["bias_shape"]
    if bias_shape is not None:
        aligned = (1,) * (4 - len(bias_shape)) + tuple(bias_shape)
        channels = weight_shape[0]
        if len(bias_shape) > 4 or aligned[1] != channels or {aligned[0], aligned[2], aligned[3]} != {1}:
            raise _Reject(f"the bias of shape {bias_shape} is not one value per output channel "
                          f"(expected (1, {channels}, 1, 1) or ({channels}, 1, 1))")
    return spec


def spec_from_composite(func: relax.Function, source_ops=()) -> KernelSpec:
    """The kernel of an offloaded function, its parameters in the function's order."""
    composite = _composite_of(func)
    name = str(composite.attrs["Composite"])
    bindings = {b.var: b.value for block in composite.body.blocks for b in block.bindings}
    annotated = _annotate(name, composite, bindings)
    spec = spec_from_match(name, annotated)
    roles = {}
    for role in ("lhs", "rhs", "bias", "residual"):
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
    annotated = {}
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
