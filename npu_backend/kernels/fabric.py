"""The fabric family: a chain of elementwise operations on one tensor, run as one dataflow body
on the PE fabric (the FABRIC command).

Stage: partition (its patterns and spec), kernel definition, tiling and schedule. Input: a chain
of up to MAX_DEPTH Relax calls, each taking the previous one's result (the first: the chain's
input x) and a 0-d constant or x itself: add, subtract, multiply, divide by a constant, maximum,
minimum, clip, relu and leaky relu. That covers the activations the vector unit has no command
for, as the ONNX and PyTorch importers write them: LeakyRelu, HardSwish (x * clip(x + 3, 0, 6) / 6),
HardSigmoid (clip(alpha x + beta, 0, 1)), and any affine chain between layers. The chain becomes a
body of at most 16 nodes (cgra_sim/mapping/body.py): clip is a max and a min, relu a max with 0,
leaky relu a multiply and a max (or, for alpha outside [0, 1], max(x, 0) + alpha min(x, 0)),
c - e a multiply by -1 and an add (exact), and x / c a multiply by the float32 nearest 1 / c
(within 1.5 ulp of the division: the fabric has no divider). The chip maps the body onto its
PEs as a modulo schedule; a chain whose body does not map stays on the host with that reason.

Taken only where the vector unit cannot do the same in one command: two or more operations, or
one it lacks (leaky relu, a division, c - x). A lone add, multiply, maximum, minimum, relu or
clip stays with the eltwise and activation families. The patterns are one per depth, tried
deepest first (FuseOpsByPattern runs each over the whole module before the next), so a chain is
taken whole. The kernel reads x as a compact (rows, cols) view, loads tm x tn tiles by DMA, runs
one FABRIC per tile and stores it: one pass over the data for the whole chain, where the vector
unit's kernels would make one pass per operation.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import tvm
import tvm_ffi
from tvm import sym, tirx
from tvm.relax.dpl import is_const, is_op, wildcard

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription
from cgra_sim.fabric import Fabric
from cgra_sim.isa import BODY_MAX_NODES, DType
from cgra_sim.mapping import body as bodies
from cgra_sim.mapping.mapper import MappingError

from ..errors import ScratchpadTooSmall, UnsupportedOperator
from ..relax_info import dtype_of, require_static_shape
from .activation import halvings, schedule_unary, unary_compute
from .epilogue import clip_bounds
from .family import OpFamily
from .intrinsics import get_intrin
from .intrinsics.fabric import FabricBody, body_value
from .spec import Tiling, aligned, round_up

PREFIX = "cgra.fabric_chain"
MAX_DEPTH = 8  # calls in a chain (a body has at most BODY_MAX_NODES nodes)
DTYPES = ("float32", "int32")
_COMMUTATIVE = {"relax.add": "add", "relax.multiply": "mul", "relax.maximum": "max", "relax.minimum": "min"}
#: What the vector unit runs as one command (eltwise.py, activation.py) when it is a chain alone.
_VECTOR_UNIT = ("relax.add", "relax.subtract", "relax.multiply", "relax.maximum", "relax.minimum",
                "relax.clip", "relax.nn.relu")


@dataclasses.dataclass(frozen=True)
class FabricSpec:
    dtype: str
    shape: tuple  # x's, and the output's
    rows: int  # the kernel's (rows, cols) view of it
    cols: int
    body: tuple  # cgra_sim.mapping.body nodes
    param_roles: tuple = ("lhs",)
    source_ops: tuple = ()
    op = "fabric"
    macs = 0
    acc_dtype = property(lambda self: self.dtype)


def _patterns() -> list:
    """One pattern per depth, deepest first: level k is an elementwise call whose chain operand
    is level k - 1 (level 0: x, role "lhs") and whose other operand is a constant or x."""
    graphs = []
    for depth in range(MAX_DEPTH, 0, -1):
        x = wildcard()
        roles, inner = {"lhs": x}, x
        for level in range(1, depth + 1):
            inner = roles[f"n{level}"] = _level(inner, x)  # the last level is the root (no role twice)
        graphs.append((f"{PREFIX}{depth}", inner, roles))
    return graphs


def _level(inner, x):
    other = is_const() | x
    alternatives = []
    for op in _COMMUTATIVE:
        alternatives += [is_op(op)(inner, other), is_op(op)(other, inner)]
    alternatives += [is_op("relax.subtract")(inner, other), is_op("relax.subtract")(other, inner),
                     is_op("relax.divide")(inner, is_const()), is_op("relax.clip")(inner, wildcard(), wildcard()),
                     is_op("relax.nn.relu")(inner), is_op("relax.nn.leakyrelu")(inner)]
    return functools.reduce(lambda a, b: a | b, alternatives)


def fabric_spec(name: str, annotated: dict) -> FabricSpec:
    depth = int(name.removeprefix(PREFIX))
    # explain asks about one host call with just its root and operands
    x, calls = annotated["lhs"], [annotated[f"n{level}"] if f"n{level}" in annotated else annotated["root"]
                                  for level in range(1, depth + 1)]
    ops = [str(call.op.name) for call in calls]
    what = " -> ".join(op.removeprefix("relax.") for op in ops)
    dtype = dtype_of(x)
    if dtype not in DTYPES:
        raise UnsupportedOperator(f"{what} on {dtype or 'an unknown dtype'}: the PE fabric computes "
                                  f"{' or '.join(DTYPES)}")
    shape = require_static_shape(x, "operand", UnsupportedOperator, prefix=f"{what}: ")
    if not 1 <= len(shape) <= 4:
        raise UnsupportedOperator(f"{what} of rank {len(shape)}: the NPU's DMA moves tensors of rank 1..4")
    out_shape = require_static_shape(calls[-1], "result", UnsupportedOperator, prefix=f"{what}: ")
    if tuple(out_shape) != tuple(shape) or dtype_of(calls[-1]) != dtype:
        raise UnsupportedOperator(f"{what}: its result {tuple(out_shape)} {dtype_of(calls[-1])} is not shaped as "
                                  f"its input {tuple(shape)} {dtype} (a constant broadcasts it)")
    if depth == 1 and ops[0] in _VECTOR_UNIT and not _constant_first_subtract(calls[0]):
        raise UnsupportedOperator(f"{what} alone is one vector-unit command (the eltwise and activation kernels)")
    # x as the calls name it: the first call's non-constant operand (the matcher annotates "lhs"
    # with what a variable is bound to; the calls read the variable)
    x = next(arg for arg in calls[0].args if not isinstance(arg, tvm.ir.GenericConst))
    body, current = [], "a"
    for call in calls:
        nodes = _nodes(call, x, current, dtype, len(body))
        if nodes:
            body += nodes
            current = f"n{len(body) - 1}"
    if not body:
        raise UnsupportedOperator(f"{what} computes its input unchanged")
    if folded(tuple(body), dtype):
        raise UnsupportedOperator(f"{what} holds an operation TVM's arithmetic folds away (x + 0, x * 1, x * 0, "
                                  f"x - x): the kernel's TensorIR would not be the body; it runs op by op")
    if len(body) > BODY_MAX_NODES:
        raise UnsupportedOperator(f"{what} is {len(body)} fabric operations; a FABRIC body holds {BODY_MAX_NODES}")
    cols = shape[-1]
    return FabricSpec(dtype, tuple(shape), max(math.prod(shape) // cols, 1), cols, tuple(body),
                      source_ops=tuple(op.removeprefix("relax.") for op in ops))


def folded(body: tuple, dtype: str) -> bool:
    """Whether TVM's expression builder or simplifier changes the body's TIR expression (then
    the kernel's compute and the intrinsic's description, both built from it, need not match
    what tensorize sees, and the hardware would compute what TVM dropped)."""
    a = tirx.Var("a", dtype)
    expr = body_value(FabricBody(body, dtype), a)
    if not tvm_ffi.structural_equal(expr, sym.Analyzer().simplify(expr)):
        return True
    sizes = {"a": 0}
    for index, (_, first, second) in enumerate(body):
        sizes[f"n{index}"] = 1 + sum(sizes.get(o, 0) for o in (first, second) if isinstance(o, str))
    return _operations(expr) != sizes[f"n{len(body) - 1}"]


def _operations(expr) -> int:
    if isinstance(expr, (tirx.Var, tirx.IntImm, tirx.FloatImm)):
        return 0
    return 1 + sum(_operations(operand) for operand in (expr.a, expr.b))


def _constant_first_subtract(call) -> bool:
    return str(call.op.name) == "relax.subtract" and isinstance(call.args[0], tvm.ir.GenericConst)


def _nodes(call, x, inner: str, dtype: str, first: int) -> list:
    """The body nodes of one chain call whose chain operand is `inner` ("a" or "n<i>"), the
    nodes numbered from `first`."""
    op = str(call.op.name)
    name = op.removeprefix("relax.")
    if op in ("relax.nn.relu", "relax.clip", "relax.nn.leakyrelu"):
        return _activation_nodes(call, inner, dtype, first)
    left, right = (_operand(arg, x, inner, dtype, name) for arg in call.args[:2])
    if not isinstance(left, str) and not isinstance(right, str):
        raise UnsupportedOperator(f"{name} of two constants is not folded; fold constants first")
    if op in ("relax.maximum", "relax.minimum") and left == right:
        return []  # max(e, e) is e (TVM's simplifier drops it, so must the body)
    if op in _COMMUTATIVE:
        return [(_COMMUTATIVE[op], *((right, left) if not isinstance(left, str) else (left, right)))]
    if op == "relax.subtract":
        if isinstance(left, str):
            return [("sub", left, right)]
        return [("mul", right, _value(-1, dtype)), ("add", f"n{first}", left)]  # c - e = (-e) + c, exactly
    if dtype != "float32" or isinstance(right, str):
        raise UnsupportedOperator(f"divide on {dtype}: the fabric divides float32 by a constant only "
                                  f"(as a multiply by its reciprocal)")
    if right == 0:
        raise UnsupportedOperator("divide by the constant 0")
    return [("mul", left, float(np.float32(1) / np.float32(right)))]


def _operand(arg, x, inner: str, dtype: str, name: str):
    if isinstance(arg, tvm.ir.GenericConst):
        value = arg.value.numpy()
        if value.size != 1:
            raise UnsupportedOperator(f"{name} by a constant of shape {value.shape}: a fabric body takes one-element "
                                      f"constants (immediates); a per-channel constant is the eltwise kernel's")
        return _value(value.item(), dtype)
    return "a" if arg.same_as(x) else inner


def _value(value, dtype: str):
    return float(np.float32(value)) if dtype == "float32" else int(value)


def _activation_nodes(call, inner: str, dtype: str, first: int) -> list:
    op = str(call.op.name)
    if op == "relax.nn.relu":
        return [("max", inner, _value(0, dtype))]
    if op == "relax.clip":
        lo, hi = clip_bounds(call, dtype)
        nodes = [("max", inner, lo)] if lo > -math.inf else []
        return nodes + ([("min", f"n{first + len(nodes) - 1}" if nodes else inner, hi)] if hi < math.inf else [])
    if dtype != "float32":
        raise UnsupportedOperator(f"leakyrelu on {dtype}: the fabric's leaky relu is float32")
    alpha = float(np.float32(call.attrs.alpha))
    if 0 <= alpha <= 1:  # x >= alpha x exactly where x >= 0
        return [("mul", inner, alpha), ("max", inner, f"n{first}")]
    if alpha > 1:
        return [("mul", inner, alpha), ("min", inner, f"n{first}")]
    return [("max", inner, 0.0), ("min", inner, 0.0), ("mul", f"n{first + 1}", alpha),
            ("add", f"n{first}", f"n{first + 2}")]


def choose_fabric_tiling(spec: FabricSpec, arch: HardwareDescription) -> Tiling:
    """tm x tn tiles (an input and an output tile, each double-buffered, in the scratchpad) with
    the fewest estimated cycles: the first tile's load, body and store, then one step of the
    slowest of the three per further tile (they overlap). So a tile is small enough for the
    DMA engines and the fabric to work side by side, and large enough to amortise each DMA's
    latency and the body's pipeline fill. The body must map onto the chip's fabric."""
    try:
        program = bodies.program(spec.body, spec.dtype, Fabric.of(arch))
    except MappingError as error:
        raise UnsupportedOperator(f"{' -> '.join(spec.source_ops)}: {error}") from None
    size = DType.from_name(spec.dtype).itemsize
    best = None
    for tm in halvings(spec.rows):
        for tn in halvings(spec.cols):
            if 2 * aligned(2 * tm * tn * size) > arch.spad_bytes:
                continue
            tiles = -(-spec.rows // tm) * -(-spec.cols // tn)
            transfer = cost.dma_transfer_cycles(arch, tm * tn * size)
            body = program.latency + cost.fabric_steady_cycles(arch, tm * tn, program.lanes, program.ii,
                                                               2 * tm * tn * size)
            estimate = 2 * (arch.dma_latency + transfer) + body + (tiles - 1) * max(transfer, body)
            if best is None or estimate < best[0]:
                best = (estimate, tm, tn)
    if best is None:
        raise ScratchpadTooSmall(f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold two "
                                 f"2x2 {spec.dtype} tiles twice: describe a larger scratchpad")
    _, tm, tn = best
    return Tiling(tm, tn, 1, round_up(spec.rows, tm), round_up(spec.cols, tn), 1)


def fabric_compute(spec: FabricSpec, tiling):
    body = FabricBody(spec.body, spec.dtype)
    return unary_compute(spec, tiling, "fab", lambda value: body_value(body, value))


def schedule_fabric(sch, spec: FabricSpec, tiling, arch: HardwareDescription) -> None:
    schedule_unary(sch, tiling, "fab", get_intrin("fabric", tiling.tm, tiling.tn, FabricBody(spec.body, spec.dtype)))


FABRIC = OpFamily(
    name="fabric", ops=("fabric",), patterns=_patterns, spec_from_match=fabric_spec,
    choose_tiling=choose_fabric_tiling, compute=fabric_compute, schedule=schedule_fabric,
    host_ops={"relax.nn.leakyrelu": f"{PREFIX}1", "relax.divide": f"{PREFIX}1"}, checks_pe_dtype=False)
