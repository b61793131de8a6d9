"""The PE fabric's intrinsic: FABRIC, a dataflow body run over a scratchpad tile.

Stage: schedule and tensorize. `fabric_intrin` returns the (description, implementation) pair
of one FABRIC sized for a kernel's tile; `body_value` is the TIR expression of one output
element that the kernel's TE compute builds identically (kernels/elementwise/fabric.py), so tensorize
matches. The body itself (nodes of add, sub, mul, max, min, shifts, with input A and
immediates) and its record words are the simulator's (cgra_sim/mapping/body.py), which maps it
onto the chip's PEs and charges its cycles from that mapping.
"""

from __future__ import annotations

import dataclasses

from tvm import sym, tirx

from cgra_codegen import device_call
from cgra_sim.isa import BODY_MAX_NODES, FABRIC_INPUT_B, FABRIC_INT8
from cgra_sim.mapping import body as bodies

from .builder import SPAD, Tile, intrinsic
from .pe_array import dtype_code

_TIR = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
        "max": tirx.max, "min": tirx.min, "shr": lambda x, y: x >> y, "shl": lambda x, y: x << y}


@dataclasses.dataclass(frozen=True)
class FabricBody:
    """A body (cgra_sim.mapping.body's nodes) in one dtype: an intrinsic's parameter."""

    nodes: tuple
    dtype: str
    # Nodes (commutative ops) whose TIR expression has the immediate first, as a user's PrimFunc
    # writes `0.1 * x`: the description must be the expression tensorize sees; the command
    # computes the same with its operands in the ISA's order.
    flipped: tuple = ()
    # FABRIC_INT8: the inputs and the output are int8 around the body (read as its dtype, the
    # output rounded half to even and saturated): ops between quantized layers (elementwise/qlinear.py).
    int8: bool = False

    @property
    def name(self) -> str:
        """A piece of an intrinsic's name: the dtype and a digest of the nodes."""
        flipped = "_f" + "-".join(map(str, self.flipped)) if self.flipped else ""
        int8 = "_i8" if self.int8 else ""
        return f"body_{self.dtype}{int8}_{bodies.graph(self.nodes, self.dtype).fingerprint}{flipped}"

    @property
    def stored_dtype(self) -> str:
        """What the inputs and the output hold in the scratchpad."""
        return "int8" if self.int8 else self.dtype


def int8_body_value(body: FabricBody, a, b=None):
    """A FABRIC_INT8 body's output in TIR: the int8 inputs as the body's dtype, the body's value
    rounded half to even (float32) and saturated to int8."""
    value = body_value(body, a.astype(body.dtype), None if b is None else b.astype(body.dtype))
    if body.dtype == "float32":
        value = tirx.nearbyint(value)
    value = tirx.max(tirx.min(value, tirx.const(127, body.dtype)), tirx.const(-128, body.dtype)).astype("int8")
    # In its simplest form: where the int8 inputs' range proves that no step overflows, TVM folds
    # the immediates of the kernel's TE compute (za * MA + zb * MB + R), and tensorize compares
    # the description with that form.
    return sym.Analyzer().simplify(value)


def body_value(body: FabricBody, a, b=None):
    """The body's output for input elements `a` (and `b`), in TIR (immediates as `dtype` constants)."""
    values = {"a": a, "b": b}
    for index, (op, first, second) in enumerate(body.nodes):
        other = values[second] if isinstance(second, str) else tirx.const(second, body.dtype)
        operands = (other, values[first]) if index in body.flipped else (values[first], other)
        values[f"n{index}"] = _TIR[op](*operands)
    return values[f"n{len(body.nodes) - 1}"]


def fabric_intrin(rows: int, cols: int, body: FabricBody, *, b_full: tuple | None = None, scope: str = SPAD):
    """FABRIC: Out[rows, cols] = body(A[, B]) over a tile. `b_full`: None for a one-input body,
    else (walks rows, walks cols) of input B, which is read with stride 0 along an axis it does
    not walk (a per-row or per-column operand, loaded once per tile)."""
    inputs = [Tile("A", (rows, cols), body.stored_dtype)]
    if b_full is not None:
        inputs.append(Tile("B", (rows if b_full[0] else 1, cols if b_full[1] else 1), body.stored_dtype))

    def value(buffers, i, j):
        b = None if b_full is None else buffers["B"][i if b_full[0] else 0, j if b_full[1] else 0]
        return (int8_body_value if body.int8 else body_value)(body, buffers["A"][i, j], b)

    def call(buffers, strides):
        b = None if b_full is None else (buffers["B"], strides["B"][0] if b_full[0] else 0, 1 if b_full[1] else 0)
        return fabric_call(body, rows, cols, buffers["A"], strides["A"][0], buffers["Out"], strides["Out"][0], b)

    return intrinsic(inputs, Tile("Out", (rows, cols), body.stored_dtype), "fab", value, call, scope=scope)


def fabric_call(body: FabricBody, rows: int, cols: int, a, a_row_stride, out, out_stride, b=None):
    """The device call of one FABRIC over a rows x cols tile (`b`: None, or (B, its row stride,
    its column stride) for input B)."""
    return device_call("cgra_fabric", **fabric_operands(body, rows, cols, a, a_row_stride, out, out_stride, b))


def fabric_operands(body: FabricBody, rows, cols, a, a_row_stride, out, out_stride, b=None) -> dict:
    """fabric_call's operands by parameter name (a kernel written as text renders them itself:
    kernels/attention/length_exps.py)."""
    words = bodies.encode(body.nodes, body.dtype)
    b_addr, b_row_stride, b_col_stride = b if b is not None else (0, 0, 0)
    flags = (FABRIC_INPUT_B if b is not None else 0) | (FABRIC_INT8 if body.int8 else 0)
    return dict(
        flags=flags, dtype=dtype_code(body.dtype), rows=rows, cols=cols, a_addr=a, a_row_stride=a_row_stride,
        a_col_stride=1, b_addr=b_addr, b_row_stride=b_row_stride, b_col_stride=b_col_stride, out_addr=out,
        out_stride=out_stride, nodes=len(words),
        **{f"node{i}": words[i] if i < len(words) else 0 for i in range(BODY_MAX_NODES)})

