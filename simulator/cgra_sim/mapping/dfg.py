"""A loop body as a dataflow graph: the unit the mapper places on the fabric, with its meaning.

Stage: mapping (input). A `DataflowGraph` is one iteration of a loop: nodes are operations, an
operand names the node it reads and how many iterations back (`distance`: 0 this iteration, 1 the
previous one, as an accumulator reads itself). `evaluate` is its meaning in numpy, the oracle the
cycle-level array simulator is checked against; `res_mii` and `rec_mii` are the two lower bounds
of the initiation interval (II) every modulo scheduler starts from.

Operations (`OPS`): `load` reads its input stream's element of the iteration, `store` writes one;
`add sub mul max min` take two operands, or one and an immediate (`imm`); `shr shl` shift by an
immediate (int32 only). int32 arithmetic wraps around like the functional core's; float32 is IEEE.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math

import numpy as np

#: op -> (operation class of fabric.OP_CLASSES, operands without an immediate)
OPS = {"load": ("mem", 0), "store": ("mem", 1), "add": ("alu", 2), "sub": ("alu", 2), "max": ("alu", 2),
       "min": ("alu", 2), "shr": ("alu", 1), "shl": ("alu", 1), "mul": ("mul", 2)}
DTYPES = ("int32", "float32")


class GraphError(ValueError):
    """A dataflow graph is malformed: an unknown op or operand, a cycle within one iteration."""


@dataclasses.dataclass(frozen=True)
class Operand:
    source: str
    distance: int = 0  # iterations back: 0 this iteration's value


@dataclasses.dataclass(frozen=True)
class Node:
    name: str
    op: str
    operands: tuple[Operand, ...] = ()
    imm: float | int | None = None  # the second operand of a binary op, or the shift
    stream: str | None = None  # a load's input or a store's output


@dataclasses.dataclass(frozen=True)
class DataflowGraph:
    name: str
    nodes: tuple[Node, ...]
    dtype: str = "int32"

    def __post_init__(self):
        _check(self)

    @functools.cached_property
    def by_name(self) -> dict[str, Node]:
        return {node.name: node for node in self.nodes}

    def op_class(self, name: str) -> str:
        return OPS[self.by_name[name].op][0]

    def edges(self):
        """(source, destination, operand index, distance) of every operand."""
        return [(o.source, node.name, index, o.distance) for node in self.nodes for index, o in enumerate(node.operands)]

    @functools.cached_property
    def readers(self) -> dict[str, list[tuple[str, int, int]]]:
        """Per node, (destination, operand index, distance) of every operand reading it, in
        `edges` order."""
        found: dict[str, list] = {name: [] for name in self.by_name}
        for source, dest, index, distance in self.edges():
            found.setdefault(source, []).append((dest, index, distance))
        return found

    def order(self) -> list[str]:
        """The nodes in an order where each comes after the nodes it reads this iteration."""
        placed, order = set(), []
        pending = list(self.nodes)
        while pending:
            ready = [n for n in pending if all(o.source in placed for o in n.operands if o.distance == 0)]
            if not ready:
                raise GraphError(f"{self.name}: a cycle within one iteration through {[n.name for n in pending]}")
            for node in ready:
                placed.add(node.name)
                order.append(node.name)
            pending = [n for n in pending if n.name not in placed]
        return order

    @property
    def inputs(self) -> list[str]:
        return [n.stream for n in self.nodes if n.op == "load"]

    @property
    def outputs(self) -> list[str]:
        return [n.stream for n in self.nodes if n.op == "store"]

    @property
    def fingerprint(self) -> str:
        text = json.dumps([self.name, self.dtype, [dataclasses.asdict(n) for n in self.nodes]], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def evaluate(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every output stream of `len(inputs[...])` iterations; a value read before the first
        iteration is 0."""
        count = len(next(iter(inputs.values()))) if inputs else 1
        values: dict[str, list] = {name: [] for name in self.by_name}
        order = [self.by_name[name] for name in self.order()]
        for i in range(count):
            for node in order:
                args = [values[o.source][i - o.distance] if i - o.distance >= 0 else self._zero()
                        for o in node.operands]
                values[node.name].append(apply(node, args, inputs, i, self.dtype))
        return {n.stream: np.array(values[n.name], dtype=self.dtype) for n in self.nodes if n.op == "store"}

    def _zero(self):
        return np.dtype(self.dtype).type(0)


def apply(node: Node, args: list, inputs: dict, iteration: int, dtype: str):
    """One operation on numpy scalars of `dtype` (int32 wraps around)."""
    kind = np.dtype(dtype).type
    if node.op == "load":
        return kind(inputs[node.stream][iteration])
    if node.op == "store":
        return args[0]
    a = args[0]
    b = kind(node.imm) if node.imm is not None and node.op not in ("shr", "shl") else (args[1] if len(args) > 1 else None)
    with np.errstate(over="ignore"):
        if node.op == "add":
            return kind(a + b)
        if node.op == "sub":
            return kind(a - b)
        if node.op == "mul":
            return kind(a * b)
        if node.op == "max":
            return max(a, b)
        if node.op == "min":
            return min(a, b)
        if node.op == "shr":
            return kind(a >> np.int32(node.imm))
        return kind(a << np.int32(node.imm))


def res_mii(graph: DataflowGraph, fabric) -> int:
    """The II the fabric's units allow: each PE runs one operation per cycle, memory operations
    only on the PEs with a scratchpad port, multiplies only on PEs with a multiplier."""
    counts = {"mem": 0, "mul": 0, "all": len(graph.nodes)}
    for node in graph.nodes:
        kind = OPS[node.op][0]
        if kind in counts:
            counts[kind] += 1
    bound = 1
    for kind, count in counts.items():
        units = fabric.num_pes if kind == "all" else fabric.units(kind)
        if count and not units:
            raise GraphError(f"{graph.name}: the fabric has no PE that can run its {kind} operations")
        if count:
            bound = max(bound, math.ceil(count / units))
    return bound


def rec_mii(graph: DataflowGraph, fabric) -> int:
    """The II the loop-carried dependences allow: the smallest II with no dependence cycle whose
    latency exceeds II x its distance (Bellman-Ford on latency - II x distance)."""
    edges = [(s, d, fabric.latency[graph.op_class(s)], dist) for s, d, _, dist in graph.edges()]
    if not any(dist for *_, dist in edges):
        return 1
    ii = 1
    while _positive_cycle(graph, edges, ii):
        ii += 1
    return ii


def _positive_cycle(graph, edges, ii: int) -> bool:
    longest = dict.fromkeys(graph.by_name, 0)
    for _ in range(len(longest)):
        changed = False
        for source, dest, latency, distance in edges:
            if longest[source] + latency - ii * distance > longest[dest]:
                longest[dest] = longest[source] + latency - ii * distance
                changed = True
        if not changed:
            return False
    return True


def _check(graph: DataflowGraph) -> None:
    names = [node.name for node in graph.nodes]
    if len(set(names)) != len(names):
        raise GraphError(f"{graph.name}: node names repeat")
    if graph.dtype not in DTYPES:
        raise GraphError(f"{graph.name}: dtype {graph.dtype!r} is not one of {DTYPES}")
    for node in graph.nodes:
        if node.op not in OPS:
            raise GraphError(f"{graph.name}: node {node.name} has unknown op {node.op!r} (known: {sorted(OPS)})")
        wanted = OPS[node.op][1] - (node.imm is not None and node.op not in ("shr", "shl"))
        if node.op in ("shr", "shl") and (node.imm is None or graph.dtype != "int32"):
            raise GraphError(f"{graph.name}: {node.name} ({node.op}) shifts an int32 by an immediate")
        if len(node.operands) != wanted:
            raise GraphError(f"{graph.name}: {node.name} ({node.op}) takes {wanted} operands, got {len(node.operands)}")
        if (node.op in ("load", "store")) != (node.stream is not None):
            raise GraphError(f"{graph.name}: {node.name}: loads and stores, and only they, name a stream")
        for operand in node.operands:
            if operand.source not in names or graph.by_name[operand.source].op == "store" or operand.distance < 0:
                raise GraphError(f"{graph.name}: {node.name} reads {operand.source!r} (distance "
                                 f"{operand.distance}), which is not a value of the graph")
    graph.order()
