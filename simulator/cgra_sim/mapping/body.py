"""A FABRIC command's body: its record words, its meaning on whole tiles, and the program the
chip runs it as.

Stage: shared by the simulator (decode, execute, time a FABRIC record) and the compiler (which
builds bodies for activations the vector unit lacks, npu_backend/kernels/elementwise/fabric.py). No tvm.

A body is a tuple of nodes `(op, first, second)`: `op` one of `BODY_OPS` (isa.BodyOp), an
operand either a reference (`"a"`, `"b"`: the command's inputs; `"n3"`: node 3's value, an
earlier node) or, as the second operand only, a number (the immediate). The last node's value is
the output. `evaluate` is its meaning on numpy arrays (the functional core's; the ops of
dfg.apply, elementwise).

The program: the body is unrolled over `lanes` elements (independent copies, each with its
loads and its store) and mapped onto the fabric as a modulo schedule (mapper.py). Lanes are
2 x (memory-port PEs / memory operations per element), or fewer if the copies would not fit two
slots of every PE: at II = 2 that keeps every memory port busy (the fabric's bound for a
streaming body) and leaves the mapper two slots per PE to route in; when that does not map, half
as many, down to one; when it maps above MII, twice as many are tried too (graphs of up to 128
nodes) and the one with more elements per cycle kept. A tile of E elements then takes
(ceil(E / lanes) - 1) x II + latency cycles (cost.fabric_steady_cycles), after loading the
mapping's configuration when it is not in the PEs' context memory (timing.py).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import struct

import numpy as np

from ..isa import (BODY_FIRST_NODE, BODY_IMMEDIATE, BODY_INPUT_A, BODY_INPUT_B, BODY_MAX_NODES, BodyOp,
                   body_fields, body_word)
from .dfg import DataflowGraph, Node, Operand
from .mapper import Mapping, MappingError, map_graph
from .solver import cache_tag, mode

BODY_OPS = tuple(op.name.lower() for op in BodyOp)
BODY_DTYPES = ("int32", "float32")
_NODE_REF = re.compile(r"n(\d+)$")


class BodyError(ValueError):
    """A body is malformed: an unknown op, a reference to a later node, too many nodes, ..."""


def check_body(body, dtype: str, two_inputs: bool | None = None) -> None:
    """Raises `BodyError` naming the node and the problem. `two_inputs`: whether the command
    streams B (None: either)."""
    if dtype not in BODY_DTYPES:
        raise BodyError(f"the fabric computes {' or '.join(BODY_DTYPES)}, not {dtype}")
    if not 1 <= len(body) <= BODY_MAX_NODES:
        raise BodyError(f"a body has 1 to {BODY_MAX_NODES} nodes, this one {len(body)}")
    reads_b = False
    for index, node in enumerate(body):
        if len(node) != 3 or node[0] not in BODY_OPS:
            raise BodyError(f"node {index} {node!r}: not (op, first, second) with op one of {', '.join(BODY_OPS)}")
        op, first, second = node
        if _is_number(first):
            raise BodyError(f"node {index} ({op}): the immediate can only be the second operand")
        for operand in (first, second):
            if _is_number(operand):
                continue
            match = _NODE_REF.match(operand) if isinstance(operand, str) else None
            if operand not in ("a", "b") and not (match and int(match.group(1)) < index):
                raise BodyError(f"node {index} ({op}) reads {operand!r}: an operand is 'a', 'b', an earlier "
                                f"node 'n0'..'n{index - 1}' or (second only) a number")
            reads_b |= operand == "b"
        if op in ("shr", "shl") and (dtype != "int32" or not _is_number(second) or not 0 <= second < 32):
            raise BodyError(f"node {index} ({op}): shifts take an int32 and an immediate 0..31")
    if two_inputs is not None and reads_b != two_inputs:
        raise BodyError("the body reads input b but the command does not stream B" if reads_b else
                        "the command streams B but the body never reads it")


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def reads_b(body) -> bool:
    return any(operand == "b" for node in body for operand in node[1:])


# ---- record words ----------------------------------------------------------------------------

def encode(body, dtype: str) -> list[int]:
    """The body's node words (isa.body_word), `len(body)` of them."""
    check_body(body, dtype)
    return [body_word(BodyOp[op.upper()], _ref(first), _ref(second), _imm_bits(second, dtype))
            for op, first, second in body]


def _ref(operand) -> int:
    if _is_number(operand):
        return BODY_IMMEDIATE
    if operand in ("a", "b"):
        return BODY_INPUT_A if operand == "a" else BODY_INPUT_B
    return BODY_FIRST_NODE + int(operand[1:])


def _imm_bits(operand, dtype: str) -> int:
    if not _is_number(operand):
        return 0
    if dtype == "float32":
        return struct.unpack("<I", struct.pack("<f", float(operand)))[0]
    value = int(operand)
    if not -(1 << 31) <= value < 1 << 31:
        raise BodyError(f"immediate {value} does not fit int32")
    return value & 0xFFFFFFFF


def decode(words, dtype: str, two_inputs: bool) -> tuple:
    """The body of a record's node words; raises `BodyError`."""
    body = []
    for index, word in enumerate(words):
        if word & 0xFF000000:
            raise BodyError(f"node {index}: bits 24..31 are reserved and must be 0")
        code, first, second, bits = body_fields(word)
        if code not in BodyOp._value2member_map_:
            raise BodyError(f"node {index}: op code {code} is not one of "
                            f"{', '.join(f'{op.name}={int(op)}' for op in BodyOp)}")
        if first == BODY_IMMEDIATE:
            raise BodyError(f"node {index}: the immediate can only be the second operand")
        if bits and second != BODY_IMMEDIATE:
            raise BodyError(f"node {index}: immediate bits {bits:#x} are set but no operand reads the immediate")
        body.append((BodyOp(code).name.lower(), _operand(first, index, bits, dtype),
                     _operand(second, index, bits, dtype)))
    body = tuple(body)
    check_body(body, dtype, two_inputs)
    return body


def _operand(ref: int, index: int, bits: int, dtype: str):
    if ref == BODY_IMMEDIATE:
        if dtype == "float32":
            return float(struct.unpack("<f", struct.pack("<I", bits))[0])
        return bits - (1 << 32) if bits >= 1 << 31 else bits
    if ref in (BODY_INPUT_A, BODY_INPUT_B):
        return "a" if ref == BODY_INPUT_A else "b"
    if BODY_FIRST_NODE <= ref < BODY_FIRST_NODE + index:
        return f"n{ref - BODY_FIRST_NODE}"
    raise BodyError(f"node {index}: operand reference {ref} is not A ({BODY_INPUT_A}), B ({BODY_INPUT_B}), "
                    f"the immediate ({BODY_IMMEDIATE}) or an earlier node ({BODY_FIRST_NODE}.."
                    f"{BODY_FIRST_NODE + index - 1})")


# ---- meaning ---------------------------------------------------------------------------------

_NUMPY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def evaluate(body, dtype: str, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """The body on arrays (a and b broadcast together), in `dtype`: int32 wraps, float32 rounds
    once per operation, max and min propagate NaN (dfg.apply, per element)."""
    kind = np.dtype(dtype).type
    values = {"a": np.asarray(a, dtype), "b": None if b is None else np.asarray(b, dtype)}
    result = values["a"]
    with np.errstate(over="ignore", invalid="ignore"):
        for index, (op, first, second) in enumerate(body):
            x = values[first]
            if op in ("shr", "shl"):
                result = (np.right_shift if op == "shr" else np.left_shift)(x, kind(second))
            else:
                y = kind(second) if _is_number(second) else values[second]
                result = _NUMPY[op](x, y, dtype=dtype)
            values[f"n{index}"] = result
    return np.asarray(result, dtype)


# ---- the program on the fabric ---------------------------------------------------------------

def graph(body, dtype: str, lanes: int = 1) -> DataflowGraph:
    """The body unrolled over `lanes` elements as one loop iteration (loads `a<l>`, `b<l>`,
    store `out<l>` per lane l): what the mapper places."""
    nodes = []
    for lane in range(lanes):
        names = {"a": f"a{lane}", "b": f"b{lane}"}
        nodes.append(Node(f"a{lane}", "load", stream=f"a{lane}"))
        if reads_b(body):
            nodes.append(Node(f"b{lane}", "load", stream=f"b{lane}"))
        for index, (op, first, second) in enumerate(body):
            name = names[f"n{index}"] = f"l{lane}n{index}"
            operands = tuple(Operand(names[o]) for o in (first, second) if not _is_number(o))
            nodes.append(Node(name, op, operands, second if _is_number(second) else None))
        nodes.append(Node(f"out{lane}", "store", (Operand(names[f"n{len(body) - 1}"]),), stream=f"out{lane}"))
    return DataflowGraph("fabric-body", tuple(nodes), dtype)


@dataclasses.dataclass(frozen=True)
class Program:
    """A body as the fabric runs it: `lanes` elements per iteration of `mapping`."""

    lanes: int
    mapping: Mapping

    @property
    def ii(self) -> int:
        return self.mapping.ii

    @functools.cached_property
    def latency(self) -> int:
        """The mapping's length, computed once: tile searches and the timing ask per tile."""
        return self.mapping.length

    @property
    def config_bytes(self) -> int:
        return self.mapping.config_bytes


def program(body, dtype: str, fabric) -> Program:
    """The mapping the chip runs `body` with (cached per body and fabric); raises `MappingError`
    when not even one lane maps."""
    # The mapper ($CGRA_MAPPER, ortools' version) is part of the key, as it is of map_graph's caches.
    return _program(tuple(body), dtype, fabric, cache_tag(mode()))


_WIDER_NODES = 128  # the largest graph tried with twice the lanes (its mapping takes ~0.1 s)


@functools.lru_cache(maxsize=256)
def _program(body: tuple, dtype: str, fabric, mapper: str) -> Program:
    check_body(body, dtype)
    memory = 2 + reads_b(body)  # loads and the store of one element
    # Two slots of every memory port, and of every PE, at II = 2.
    lanes = max(1, min(2 * fabric.units("mem") // memory, 2 * fabric.num_pes // (len(body) + memory)))
    problem = None
    while lanes >= 1:
        try:
            found = Program(lanes, map_graph(graph(body, dtype, lanes), fabric))
        except MappingError as error:
            problem = error
            lanes //= 2
            continue
        # Above MII the mapper left slots unused: twice the copies may fill them (a small graph only)
        if found.ii > found.mapping.mii and 2 * lanes * (len(body) + memory) <= _WIDER_NODES:
            try:
                wider = Program(2 * lanes, map_graph(graph(body, dtype, 2 * lanes), fabric))
                if wider.lanes * found.ii > found.lanes * wider.ii:
                    return wider
            except MappingError:
                pass
        return found
    raise MappingError(f"a {len(body)}-node body does not map onto the {fabric.rows}x{fabric.cols} fabric even "
                       f"one element at a time: {problem}")
