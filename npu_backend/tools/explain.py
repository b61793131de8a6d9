"""Where each operator of a model runs, and why the ones left on the host are not offloaded.

Stage: tools (it runs normalise and partition, read-only). Input: a Relax IRModule and an
architecture. Output: one `Placement` per operator call of the module's Relax functions, in
order: "npu" with the kernel it becomes, or "host" with a reason a user can act on. It runs the
same normalise and partition stages as the compiler and reads every offloaded function back
through the compiler's own `kernels.offloaded_spec`, so what it says is what `tvm.compile` will
do: a kernel the compiler would refuse raises the same error here.
"""

from __future__ import annotations

import dataclasses
import math

import tvm
from tvm import relax, sym, tirx

from cgra_sim.arch import load_arch

from ..frontend.provenance import SOURCE_NODES_ATTR, call_nodes
from ..kernels import offload_reason, offloaded_spec
from ..kernels.common.dynamic import shape_bounds
from ..kernels.registry import host_patterns, kernel_ops
from ..options import CompileOptions
from ..partition.composite import composite_call, composite_ops
from ..partition.call_tir import call_tir_reason, called_prim_func, wrapped_call
from ..partition.stage import bounds_of, tir_offload_reason
from ..pipeline import KERNEL_STAGES, STAGES
from ..relax_info import shape_dims, static_shape
from ..target.relax_pipeline import run_stages
from .post_norm_reasons import post_norm_reasons

#: Operators that count multiply-accumulates (`Placement.macs`): every convolution, NPU or not
#: (a conv1d or conv3d on the host is work the NPU share must count).
_CONVS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")
_TRANSPOSED_CONVS = ("relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose", "relax.nn.conv3d_transpose")
_MAC_OPS = ("relax.matmul",) + _CONVS + _TRANSPOSED_CONVS


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one operator of the model runs, and why."""

    op: str  # the Relax operator, e.g. "nn.conv2d"
    output: str  # its output type, e.g. "(1, 16, 32, 32) float32"
    where: str  # "npu" or "host"
    kernel: str  # the NPU kernel it is part of ("" on the host)
    # why it stays on the host; on the NPU "", or why a layer norm is a kernel of its own rather
    # than the epilogue of the GEMM before it (post_norm_reasons.py)
    reason: str
    macs: int = 0  # multiply-accumulates of the operator (conv2d, matmul; 0 for the others)
    nodes: str = ""  # the model nodes (ONNX node names, "+"-joined) it came from, "" if unknown
    site: int = -1  # which call of the model it belongs to: the operators of one kernel share it
    symbol: str = ""  # the kernel's symbol (its launches' name in a profile; "" on the host)


def npu_mac_fraction(placements: list[Placement]) -> float:
    """The share of the model's multiply-accumulates that run on the NPU (1.0 without MACs)."""
    total = sum(p.macs for p in placements)
    return sum(p.macs for p in placements if p.where == "npu") / total if total else 1.0


def explain(mod: tvm.IRModule, arch=None, dims: dict | None = None, fuse_chains: bool = False) -> list[Placement]:
    """Every operator of `mod`, where it runs and why. `dims` (name -> size) gives symbolic
    dimensions a size for counting MACs (e.g. the sizes a run used); without it an operator with a
    symbolic dimension counts 0 MACs; a name the module has no dimension of is refused (ValueError).
    `fuse_chains`: as `npu_backend.compile`'s."""
    arch = load_arch(arch)
    _check_dims(mod, dims or {})
    options = CompileOptions(fuse_chains=fuse_chains)
    bounds = bounds_of(mod, options)
    mod = run_stages(mod, arch, options, [(name, stage) for name, stage in STAGES if name != "codegen"])
    placements = []
    # A host op's reason is its kernel's at the bounds partitioning sized it for (a softmax row
    # held at a bound too wide for the scratchpad).
    with shape_bounds(bounds):
        for _, func in mod.functions.items():
            if isinstance(func, relax.Function) and not _attr(func, "Codegen") and not _attr(func, "Composite"):
                placements += _placements(mod, func, arch, len(placements), dims or {})
    return placements


def model_macs(mod: tvm.IRModule, dims: dict | None = None) -> int:
    """The multiply-accumulates of `mod` as imported (its matmuls and convolutions, before
    normalise): the model's own work, which a rewrite that adds a GEMM (a correction, a
    put-back) does not raise. Benchmarks divide it by the PEs for their ideal cycles."""
    _check_dims(mod, dims or {})
    total = 0
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            for block in func.body.blocks:
                for binding in block.bindings:
                    if isinstance(binding.value, relax.Call) and isinstance(binding.value.op, tvm.ir.Op):
                        total += _macs(binding.value, binding.var, dims or {})
    return total


def dimension_names(mod: tvm.IRModule) -> set[str]:
    """The names of the symbolic dimensions `mod`'s Relax functions use (torch.export's "s58")."""
    names = set()
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            for var in list(relax.analysis.defined_symbolic_vars(func)) + list(relax.analysis.free_symbolic_vars(func)):
                names.add(str(var.name))
    return names


def _check_dims(mod: tvm.IRModule, dims: dict) -> None:
    """Refuse a size for a dimension the module does not have: it would size nothing, and every
    matmul with that dimension would count 0 MACs (100% on the NPU, whatever runs on the host)."""
    unknown = sorted(set(dims) - dimension_names(mod)) if dims else []
    if unknown:
        known = ", ".join(repr(name) for name in sorted(dimension_names(mod))) or "none: every shape is static"
        raise ValueError(f"explain: dims names {', '.join(repr(name) for name in unknown)}, which the module has no "
                         f"dimension of; its symbolic dimensions are {known}. Give sizes by those names.")


def format_placements(placements: list[Placement]) -> str:
    """A table of the placements, one operator a line, and the share of MACs on the NPU."""
    lines = [f"{'op':<16} {'output':<28} {'runs on':<8} {'MACs':>10}  detail"]
    for p in placements:
        detail = (f"{p.kernel}: {p.reason}" if p.reason else p.kernel) if p.where == "npu" else p.reason
        lines.append(f"{p.op:<16} {p.output:<28} {p.where:<8} {p.macs:>10}  {detail}")
    total = sum(p.macs for p in placements)
    lines.append(f"{npu_mac_fraction(placements):.2%} of {total} MACs run on the NPU" if total else
                 "no matmul or conv2d: the model has no multiply-accumulates to count")
    return "\n".join(lines)


def _attr(func, key):
    """The function's attribute `key`, or None."""
    return (func.attrs or {}).get(key) if func.attrs is not None else None


def _placements(mod, func, arch, start: int, dims: dict):
    """The placements of every operator `func` calls, on the NPU (each kernel's ops) or the host."""
    placements = []
    refused = post_norm_reasons(mod, func, arch)
    for block in func.body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not isinstance(call, relax.Call):
                continue
            if isinstance(call.op, tvm.ir.GlobalVar) and _attr(mod[call.op], "Codegen") == "cgra":
                ops = _kernel_ops(mod[call.op], start + len(placements), dims)
                placements += [dataclasses.replace(p, reason=refused[binding.var]) for p in ops] \
                    if binding.var in refused else ops
            elif isinstance(call.op, tvm.ir.Op):
                placements.append(Placement(_op_name(call), _type_of(binding.var, dims), "host", "",
                                            _host_reason(mod, call, arch), _macs(call, binding.var, dims),
                                            call_nodes(call), start + len(placements)))
    return placements


def _kernel_ops(wrapper, site: int, dims: dict) -> list[Placement]:
    """The placements of the operators one offloaded function (`wrapper`) computes on the NPU."""
    spec = offloaded_spec(wrapper)  # what the compiler reads; raises where the compiler would
    symbol = str(wrapper.attrs["global_symbol"])
    tir_call = wrapped_call(wrapper)
    if tir_call is not None:  # a user's PrimFunc
        nodes = [str(n) for n in (_attr(wrapper, SOURCE_NODES_ATTR) or [""])]
        macs = spec.macs or 0
        return [Placement(_op_name(tir_call), _type_of(relax.Var("out", tir_call.ty_args[0])), "npu", f"{spec.kind} ({symbol})", "", macs,
                          nodes[0], site, symbol)]
    composite, _ = composite_call(wrapper)
    kernel = f"{composite.attrs['Composite']} ({symbol})"
    ops = composite_ops(wrapper)
    nodes = [str(n) for n in (_attr(wrapper, SOURCE_NODES_ATTR) or [])]
    nodes = nodes if len(nodes) == len(ops) else [""] * len(ops)
    return [Placement(_short(call.op.name), _type_of(var, dims), "npu", kernel, "", _macs(call, var, dims), node, site, symbol)
            for (var, call), node in zip(ops, nodes)]


#: Operators that only give the data a new shape (a conv1d's expand_dims and squeeze, a flatten).
_SHAPE_OPS = ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten")
_VIEW_OPS = ("relax.memory.view",)  # normalise/masks.py reads an int64's 32-bit words through one

_BATCH_NORM_REASON = (
    "an inference batch norm runs on the NPU folded into the conv2d before it (normalise/fold_weights.py): "
    "that conv2d needs constant weights, at most a constant bias add after it, and no other reader, and the "
    "batch norm constant statistics; this one is not such a batch norm")


def _host_reason(mod, call, arch) -> str:
    """Why a host call was not offloaded: the reason its op family gives for it alone, or why
    no pattern took it; for a call_tir, why its PrimFunc is not an NPU kernel."""
    if call.op.name == "relax.nn.batch_norm":
        return _BATCH_NORM_REASON
    called = called_prim_func(mod, call)
    if called is not None:
        name, func = called
        return call_tir_reason(call) or tir_offload_reason(func, name, arch, CompileOptions(), KERNEL_STAGES) or \
            "it compiles as an NPU kernel but was not offloaded (please report this)"
    if call.op.name in _VIEW_OPS:
        return "reads the same bytes as another dtype or shape (a view): no arithmetic to offload"
    if call.op.name in _SHAPE_OPS:
        return "changes only the shape: no arithmetic to offload (the same memory seen anew, or one copy)"
    if call.op.name == "relax.tensor_to_shape":  # kv_cache.py: a decode step's length is its position's value
        return "reads a tensor's values as a shape (the VM's builtin, no arithmetic to offload)"
    pattern = host_patterns().get(call.op.name)
    if pattern is None:
        return f"no NPU kernel for {_op_name(call)} ({kernel_ops_text()})"
    # The roles a pattern names: lhs and rhs, and the operator's own argument names (a norm's
    # gamma, beta or weight), which the op families read by name.
    named = {str(arg.name): value for arg, value in zip(call.op.arguments, call.args)}
    annotated = {**named, "root": call, "lhs": call.args[0], **({"rhs": call.args[1]} if len(call.args) > 1 else {})}
    reason = offload_reason(pattern, annotated, arch)
    return reason or "matched no cgra pattern (its operands are produced in a form the patterns do not take)"


def kernel_ops_text() -> str:
    """What the NPU runs, from the kernel registry (so it names every family's ops as they are)."""
    families = "; ".join(f"{name}: {', '.join(_short(op) for op in ops)}" for name, ops in kernel_ops().items())
    return f"the NPU's kernels take, by family, {families}; and what normalise rewrites into those"


def _op_name(call) -> str:
    """The operator's name; for a call_tir, the TIR function it calls (e.g. "call_tir clip")."""
    name = _short(call.op.name)
    if name == "call_tir" and isinstance(call.args[0], tvm.ir.GlobalVar):
        return f"{name} {call.args[0].name_hint}"
    return name


def _macs(call, out_var, dims: dict) -> int:
    """Multiply-accumulates of a convolution (1-D, 2-D or 3-D, transposed or not, any groups) or
    a matmul, its symbolic dimensions at their sizes in `dims`; 0 for other ops and for a shape
    with a dimension `dims` does not give."""
    name = call.op.name
    if name not in _MAC_OPS:
        return 0
    out, lhs, rhs = (_sized(expr, dims) for expr in (out_var, call.args[0], call.args[1]))
    if out is None or rhs is None or lhs is None:
        return 0
    if name in _TRANSPOSED_CONVS:  # every input meets the weights of one input channel
        return math.prod(lhs) * (math.prod(rhs) // rhs[str(call.attrs.kernel_layout).index("I")])
    if name in _CONVS:  # every output takes the weights of one output channel
        per_output = math.prod(rhs) // rhs[str(call.attrs.kernel_layout).index("O")]
    else:
        per_output = lhs[-1]
    return math.prod(out) * per_output


def _sized(expr, dims: dict) -> tuple | None:
    """The shape with its symbolic dimensions evaluated at `dims`; None if one stays unknown."""
    shape = static_shape(expr)
    if shape is not None or not dims:
        return shape
    values = shape_dims(expr)
    if values is None:
        return None
    analyzer = sym.Analyzer()
    sized = []
    for d in values:
        if not isinstance(d, int):
            free = tirx.analysis.undefined_vars(d)
            if any(v.name not in dims for v in free):
                return None
            for v in free:
                analyzer.bind(v, tirx.IntImm(v.ty.dtype, dims[v.name]))
            d = analyzer.simplify(d)
            if not hasattr(d, "value"):
                return None
            d = int(d.value)
        sized.append(d)
    return tuple(sized)




def _short(op_name: str) -> str:
    """The operator's name without "relax." ("nn.conv2d")."""
    return op_name.replace("relax.", "")


def _type_of(var, sizes: dict | None = None) -> str:
    """"(shape) dtype", symbolic dimensions at their `sizes` where given, else by name."""
    ty = getattr(var, "struct_info", None) or getattr(var, "ty", None)
    shape = getattr(ty, "shape", None)
    dims = tuple(int(d) if hasattr(d, "value") else str(d) for d in shape.values) if shape is not None \
        and hasattr(shape, "values") else "?"
    if sizes and dims != "?" and not all(isinstance(d, int) for d in dims):
        dims = _sized(var, sizes) or dims
    return f"{dims} {getattr(ty, 'dtype', '')}"
