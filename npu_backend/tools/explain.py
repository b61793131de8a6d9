"""Where each operator of a model runs, and why the ones left on the host are not offloaded.

Stage: partition (read-only). Input: a Relax IRModule and an architecture. Output: one
`Placement` per operator call of the module's Relax functions, in order: "npu" with the kernel it
becomes, or "host" with a reason a user can act on. It runs the same normalise and partition
stages as the compiler and reads every offloaded function back through the target hook's own
`offloaded_spec`, so what it says is what `tvm.compile` will do: a kernel the compiler would
refuse raises the same error here.
"""

from __future__ import annotations

import dataclasses
import math

import tvm
from tvm import relax

from cgra_sim.arch import load_arch

from ..eltwise import ELTWISE_OPS
from ..eltwise import PREFIX as ELTWISE_PREFIX
from ..options import CompileOptions
from ..patterns import composite_call, offload_reason
from ..pipeline import STAGES
from ..pool_patterns import POOL_OPS
from ..frontend.provenance import SOURCE_NODES_ATTR, call_nodes
from ..relax_info import static_shape
from ..target.relax_ext import offloaded_spec

_KERNEL_OPS = {"relax.matmul": "cgra.matmul", "relax.nn.conv2d": "cgra.conv2d"}
_ELTWISE_PATTERNS = {op: ELTWISE_PREFIX + func for func, op in ELTWISE_OPS.items()}
_POOLING_OPS = {op: name for name, op in POOL_OPS.items()}  # one call each, no MACs


@dataclasses.dataclass(frozen=True)
class Placement:
    op: str  # the Relax operator, e.g. "nn.conv2d"
    output: str  # its output type, e.g. "(1, 16, 32, 32) float32"
    where: str  # "npu" or "host"
    kernel: str  # the NPU kernel it is part of ("" on the host)
    reason: str  # why it stays on the host ("" on the NPU)
    macs: int = 0  # multiply-accumulates of the operator (conv2d, matmul; 0 for the others)
    nodes: str = ""  # the model nodes (ONNX node names, "+"-joined) it came from, "" if unknown
    site: int = -1  # which call of the model it belongs to: the operators of one kernel share it
    symbol: str = ""  # the kernel's symbol (its launches' name in a profile; "" on the host)


def npu_mac_fraction(placements: list[Placement]) -> float:
    """The share of the model's multiply-accumulates that run on the NPU (1.0 without MACs)."""
    total = sum(p.macs for p in placements)
    return sum(p.macs for p in placements if p.where == "npu") / total if total else 1.0


def explain(mod: tvm.IRModule, arch=None) -> list[Placement]:
    arch = load_arch(arch)
    options = CompileOptions()
    for name, stage in STAGES:
        if name == "codegen":
            break
        mod = stage(mod, arch, options)
    placements = []
    for _, func in mod.functions.items():
        if isinstance(func, relax.Function) and not _attr(func, "Codegen") and not _attr(func, "Composite"):
            placements += _placements(mod, func, arch, len(placements))
    return placements


def format_placements(placements: list[Placement]) -> str:
    lines = [f"{'op':<16} {'output':<28} {'runs on':<8} {'MACs':>10}  detail"]
    for p in placements:
        detail = p.kernel if p.where == "npu" else p.reason
        lines.append(f"{p.op:<16} {p.output:<28} {p.where:<8} {p.macs:>10}  {detail}")
    lines.append(f"{npu_mac_fraction(placements):.2%} of {sum(p.macs for p in placements)} MACs run on the NPU")
    return "\n".join(lines)


def _attr(func, key):
    return (func.attrs or {}).get(key) if func.attrs is not None else None


def _placements(mod, func, arch, start: int = 0):
    placements = []
    for block in func.body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not isinstance(call, relax.Call):
                continue
            if isinstance(call.op, tvm.ir.GlobalVar) and _attr(mod[call.op], "Codegen") == "cgra":
                placements += _kernel_ops(mod[call.op], start + len(placements))
            elif isinstance(call.op, tvm.ir.Op):
                placements.append(Placement(_op_name(call), _type_of(binding.var), "host", "",
                                            _host_reason(call, arch), _macs(call, binding.var),
                                            call_nodes(call), start + len(placements)))
    return placements


def _kernel_ops(wrapper, site: int) -> list[Placement]:
    offloaded_spec(wrapper)  # what the compiler reads; raises where the compiler would
    composite, _ = composite_call(wrapper)
    symbol = str(wrapper.attrs["global_symbol"])
    kernel = f"{composite.attrs['Composite']} ({symbol})"
    ops = [b for block in composite.body.blocks for b in block.bindings
           if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]
    nodes = [str(n) for n in (_attr(wrapper, SOURCE_NODES_ATTR) or [])]
    nodes = nodes if len(nodes) == len(ops) else [""] * len(ops)
    return [Placement(_short(b.value.op.name), _type_of(b.var), "npu", kernel, "", _macs(b.value, b.var),
                      node, site, symbol) for b, node in zip(ops, nodes)]


def _host_reason(call, arch) -> str:
    name = call.op.name
    if name in _POOLING_OPS:
        reason = offload_reason(_POOLING_OPS[name], {"root": call, "lhs": call.args[0]}, arch)
        return reason or "matched no cgra pattern"
    pattern = _KERNEL_OPS.get(name) or _ELTWISE_PATTERNS.get(name)
    if pattern is None:
        return (f"no NPU kernel for {_op_name(call)} (the NPU runs matmul and conv2d, with bias add, "
                "residual add, relu and clip, elementwise add, subtract, multiply, maximum, minimum, "
                "and max / average pooling)")
    if len(call.args) < 2:
        return f"{_op_name(call)} does not take two operands"
    annotated = {"root": call, "lhs": call.args[0], "rhs": call.args[1]}
    reason = offload_reason(pattern, annotated, arch)
    return reason or "matched no cgra pattern (its operands are produced in a form the patterns do not take)"


def _op_name(call) -> str:
    """The operator's name; for a call_tir, the TIR function it calls (e.g. "call_tir clip")."""
    name = _short(call.op.name)
    if name == "call_tir" and isinstance(call.args[0], tvm.ir.GlobalVar):
        return f"{name} {call.args[0].name_hint}"
    return name


def _macs(call, out_var) -> int:
    """Multiply-accumulates of a conv2d (any groups) or matmul with static shapes, else 0."""
    name = call.op.name
    if name not in _KERNEL_OPS:
        return 0
    out, rhs = static_shape(out_var), static_shape(call.args[1])
    lhs = static_shape(call.args[0])
    if out is None or rhs is None or lhs is None:
        return 0
    if name == "relax.nn.conv2d":  # every output takes the weights of one output channel
        per_output = math.prod(rhs) // rhs[str(call.attrs.kernel_layout).index("O")]
    else:
        per_output = lhs[-1]
    return math.prod(out) * per_output




def _short(op_name: str) -> str:
    return op_name.replace("relax.", "")


def _type_of(var) -> str:
    ty = getattr(var, "struct_info", None) or getattr(var, "ty", None)
    shape = getattr(ty, "shape", None)
    dims = tuple(int(d) if hasattr(d, "value") else str(d) for d in shape.values) if shape is not None \
        and hasattr(shape, "values") else "?"
    return f"{dims} {getattr(ty, 'dtype', '')}"
