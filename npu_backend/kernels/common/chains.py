"""Chains of elementwise ops as FABRIC bodies: the pattern of one link and the body of a chain.

Stage: partition (patterns; reading a match) for the families that run such a chain on the PE
fabric: fabric.py (a chain on its own) and epilogue.py (a chain after a GEMM-shaped kernel's
epilogue, run in place on each output tile). A link is an elementwise call whose chain operand
is the previous link (the first: the chain's input x) and whose other operand is a one-element
constant or x itself: add, subtract, multiply, divide by a constant, maximum, minimum, clip,
relu, leaky relu. `chain_body` writes the links as a body of cgra_sim/mapping/body.py: clip is a
max and a min, relu a max with 0, leaky relu `max(x, alpha x)` (`min` for alpha > 1, `max(x, 0) +
alpha min(x, 0)` for alpha < 0: exact), c - e `(e * -1) + c` (exact), x / c `x * (1 / c)` rounded
to float32 (within 1.5 ulp of the division: the fabric has no divider).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import tvm
import tvm_ffi
from tvm import sym, tirx
from tvm.relax.dpl import is_const, is_op, wildcard

from cgra_sim.fabric import Fabric
from cgra_sim.isa import BODY_MAX_NODES
from cgra_sim.mapping import body as bodies
from cgra_sim.mapping.mapper import MappingError

from ...errors import UnsupportedOperator
from ...normalise.scalars import float32_reciprocal
from ..intrinsics.fabric import FabricBody, body_value

#: The piece of a pattern's name that marks a chain (fabric.py's, an epilogue's tail: "_chain<k>").
CHAIN_MARK = "_chain"
#: The patterns of integer ops between quantized layers (elementwise/qlinear.py).
QLINEAR_PREFIX = "cgra.qlinear"
#: The attention kernel reads its scale and its guard's constants at compile time too.
ATTENTION_PATTERN = "cgra.attention"
#: So does a scaled row reduction (rows/row_reduce.py: "cgra.row_max_scaled"), its scale a VFUNC immediate.
SCALED_MARK = "_scaled"


def reads_immediates(composite: str) -> bool:
    """Whether the kernel of pattern `composite` reads its one-element constants at compile
    time, as a body's immediates (partition/scalar_args.py binds them inside it): a chain's, or
    an integer QLinearAdd's (elementwise/qlinear.py), an attention's scale and guard, or a scaled
    row reduction's scale."""
    return CHAIN_MARK in composite or composite.startswith((QLINEAR_PREFIX, ATTENTION_PATTERN)) \
        or (composite.startswith("cgra.row_") and composite.endswith(SCALED_MARK))


def reads_constants(composite: str) -> bool | str:
    """Whether the kernel of pattern `composite` builds what its constants hold instead of loading
    them (an attention's constant causal mask; a plain norm's gamma of ones and beta of zeros,
    which it does not read): partition/scalar_args.py binds them all inside it; "indices": its
    integer constants only (RoPE's partners in a linear's epilogue: gemm/rope_epilogue.py);
    "triangles": its one-element constants and those of only 0 and -inf (an attention's triangle)."""
    if composite.endswith("_rope"):
        return "indices"
    if composite.startswith(ATTENTION_PATTERN) and "_causal" in composite:
        return "triangles"  # the triangle, not a constant mask row beside it (normalise/constant_rows.py)
    return composite in ("cgra.layer_norm_plain", "cgra.rms_norm_plain")


_COMMUTATIVE = {"relax.add": "add", "relax.multiply": "mul", "relax.maximum": "max", "relax.minimum": "min"}
#: What the vector unit runs as one command (eltwise.py, activation.py, an epilogue's relu or
#: clip) when it is a chain alone.
VECTOR_UNIT_OPS = ("relax.add", "relax.subtract", "relax.multiply", "relax.maximum", "relax.minimum",
                   "relax.clip", "relax.nn.relu")


def level_pattern(inner, x):
    """One link: an elementwise call of `inner` and a constant or `x`."""
    other = is_const() | x
    alternatives = []
    for op in _COMMUTATIVE:
        alternatives += [is_op(op)(inner, other), is_op(op)(other, inner)]
    alternatives += [is_op("relax.subtract")(inner, other), is_op("relax.subtract")(other, inner),
                     is_op("relax.divide")(inner, is_const()), is_op("relax.clip")(inner, wildcard(), wildcard()),
                     is_op("relax.nn.relu")(inner), is_op("relax.nn.leakyrelu")(inner)]
    return functools.reduce(lambda a, b: a | b, alternatives)


def chain_body(calls: list, dtype: str, what: str) -> tuple:
    """The body of the chain of `calls` (first to last), or UnsupportedOperator with the reason."""
    # x as the calls name it: the first call's non-constant operand (the matcher annotates a
    # role with what a variable is bound to; the calls read the variable)
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
    return tuple(body)


def require_program(body: tuple, dtype: str, arch, what: str):
    """The program the chip runs `body` with (cgra_sim/mapping/body.py), or UnsupportedOperator
    naming `what` when the body does not map onto the chip's fabric."""
    try:
        return bodies.program(body, dtype, Fabric.of(arch))
    except MappingError as error:
        raise UnsupportedOperator(f"{what}: {error}") from None


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


def constant_first_subtract(call) -> bool:
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
    reciprocal = float32_reciprocal(right)
    if reciprocal is None:
        raise UnsupportedOperator(f"divide by the constant {right}: its reciprocal is not a normal float32")
    return [("mul", left, float(reciprocal))]


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


def clip_bounds(call, acc_dtype: str) -> tuple:
    """The (lo, hi) of a clip as the epilogue applies them: constants of the accumulator dtype,
    lo <= hi (the NPU computes min(max(x, lo), hi), the host max(min(x, hi), lo): equal then)."""
    bounds = call.args[1:3]
    if not all(isinstance(b, (tirx.IntImm, tirx.FloatImm)) for b in bounds):
        raise UnsupportedOperator(f"clip bounds {list(bounds)} are not constants; the epilogue clips to constants")
    lo, hi = (float(b.value) for b in bounds)
    if np.isnan(lo) or np.isnan(hi) or lo > hi:
        raise UnsupportedOperator(f"clip to [{lo}, {hi}] is not a range (needs lo <= hi)")
    if lo == hi:  # TIR folds it to a constant that reads no accumulator: nothing left to tensorize
        raise UnsupportedOperator(f"clip to [{lo}, {hi}] is the constant {lo}, not an epilogue; it runs on its own")
    if acc_dtype == "float32":
        return float(np.float32(lo)), float(np.float32(hi))
    info = np.iinfo(acc_dtype)
    if not all(v.is_integer() and info.min <= v <= info.max for v in (lo, hi)):
        raise UnsupportedOperator(f"clip bounds [{lo}, {hi}] of an {acc_dtype} result must be {acc_dtype} integers")
    return int(lo), int(hi)
