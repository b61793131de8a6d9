"""The cycle-level array simulator: a mapped configuration run PE by PE, cycle by cycle.

Stage: mapping (the check). In: a `Mapping` (mapper.py), input streams, an iteration count. Out:
the output streams and the cycle count. It does not read the dataflow graph's order: it builds each
PE's context memory from the mapping (for each of the II slots: the operation to issue, the values
to keep in its register file, the values to send over each link, as a configuration would) and
runs it. Every cycle each PE issues its slot's operation on the operands in its own register file,
results land `latency` cycles later, and values move one link (a hycube: up to `hops_per_cycle`)
into a neighbour's register file. It stops with `ArrayError` when an operand is not where the
configuration reads it, a register file overflows, or a link or unit is used twice in one cycle:
then the mapping is wrong. Its results must equal `DataflowGraph.evaluate` and its cycle count
`Mapping.cycles(n)`; tests check both on random graphs and fabrics.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from .dfg import OPS, apply
from .mrrg import segments


class ArrayError(RuntimeError):
    """A configuration does something the array cannot: a mapping bug, named by PE and cycle."""


def contexts(mapping) -> dict:
    """pe -> slot -> actions: ("issue", node, cycle, pe, 0) and ("keep" | "send", value, cycle,
    to_pe, ahead) for every step of a route (its value read `ahead` iterations later), cycles
    relative to the iteration that computes the value."""
    table: dict = defaultdict(lambda: defaultdict(list))
    for name, (pe, cycle) in mapping.placement.items():
        table[pe][cycle % mapping.ii].append(("issue", name, cycle, pe, 0))
    # A value's routes form a tree from where it lands (a route may start where another passes):
    # each state's step is needed as far ahead as the nearest reader downstream of it.
    came_from: dict = {}  # (value, state) -> the state before it
    for (reader, index), chain in mapping.routes.items():
        value = mapping.graph.by_name[reader].operands[index].source
        came_from.update({(value, b): a for a, b in zip(chain, chain[1:])})
    ahead: dict = {}
    for (reader, index), chain in mapping.routes.items():
        operand = mapping.graph.by_name[reader].operands[index]
        state = (operand.source, chain[-1])
        while state in came_from:
            ahead[state] = min(ahead.get(state, operand.distance), operand.distance)
            state = (operand.source, came_from[state])
    for (value, (nxt, _)), needed in ahead.items():
        pe, cycle = came_from[(value, (nxt, _))]
        table[pe][cycle % mapping.ii].append(("keep" if nxt == pe else "send", value, cycle, nxt, needed))
    return table


def run_array(mapping, inputs: dict, iterations: int) -> tuple[dict, int]:
    """(output streams, cycles) of `iterations` iterations of the mapped loop."""
    graph, fabric, ii = mapping.graph, mapping.fabric, mapping.ii
    table = contexts(mapping)
    kind = np.dtype(graph.dtype).type
    registers: dict[int, dict] = defaultdict(dict)  # pe -> {(value, iteration): number} this cycle
    landing: dict[int, list] = defaultdict(list)  # cycle -> [(pe, value, iteration, number)]
    outputs = {stream: [None] * iterations for stream in graph.outputs}
    end = mapping.cycles(iterations)
    last = 0
    for cycle in range(end + 1):
        for pe, value, iteration, number in landing.pop(cycle, ()):
            registers[pe][(value, iteration)] = number
        for pe, held in registers.items():
            if len(held) > fabric.registers:
                raise ArrayError(f"cycle {cycle}: PE {pe} holds {len(held)} values, its register file "
                                 f"{fabric.registers}")
        arriving: dict[int, dict] = defaultdict(dict)
        links, issues = Counter(), Counter()
        for pe in range(fabric.num_pes):
            for action in table[pe][cycle % ii] if pe in table else ():
                iteration = (cycle - action[2]) // ii
                if not 0 <= iteration < iterations - action[4]:  # no reader that far ahead
                    continue
                issues[pe] += action[0] == "issue"
                last = max(last, _act(mapping, action, pe, cycle, iteration, registers, arriving, landing, links,
                                      inputs, outputs, kind))
        for where, count in list(links.items()) + list(issues.items()):
            if count > 1:
                raise ArrayError(f"cycle {cycle}: {'link' if isinstance(where, tuple) else 'PE'} {where} is used "
                                 f"{count} times")
        registers = arriving
    return {stream: np.array(values, dtype=graph.dtype) for stream, values in outputs.items()}, last


def _act(mapping, action, pe, cycle, iteration, registers, arriving, landing, links, inputs, outputs, kind) -> int:
    """Carry out one context action; the cycle it finishes by."""
    verb, name, _, target, _ = action
    graph, fabric = mapping.graph, mapping.fabric
    if verb in ("keep", "send"):
        number = _read(registers, pe, name, iteration, cycle, kind)
        if verb == "send":
            links.update(segments(fabric, pe, target))
        arriving[target][(name, iteration)] = number
        return cycle + 1
    node = graph.by_name[name]
    args = [_read(registers, pe, o.source, iteration - o.distance, cycle, kind) for o in node.operands]
    result = apply(node, args, inputs, iteration, graph.dtype)
    done = cycle + fabric.latency[OPS[node.op][0]]
    if node.op == "store":
        outputs[node.stream][iteration] = result
    else:
        landing[done].append((pe, name, iteration, result))
    return done


def _read(registers, pe, value, iteration, cycle, kind):
    if iteration < 0:
        return kind(0)  # before the first iteration: the register's reset value
    try:
        return registers[pe][(value, iteration)]
    except KeyError:
        raise ArrayError(f"cycle {cycle}: PE {pe} reads {value} of iteration {iteration}, which is not in "
                         "its register file") from None
