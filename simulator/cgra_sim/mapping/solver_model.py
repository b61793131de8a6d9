"""The CP-SAT model of mapping a dataflow graph at one II: a time-expanded modulo routing graph.

Stage: mapping (the solver's model; solver.py builds, solves and decodes it). In: a
`DataflowGraph`, a `Fabric`, an II, a schedule slack and an OR-Tools `CpModel`. Out: the model's
variables (`Variables`) with every constraint added.

How (SAT-MapIt's encoding, with registers and links as resources): a boolean `issue[n, pe, t]`
for operation n issuing on pe at cycle t of its iteration, `held[v, pe, c]` for value v sitting
in pe's register file during cycle c, and `move[v, a, b, c]` for v crossing from a to its
neighbour b between cycles c and c + 1. Each operation issues once; a result is held where it
lands (`latency` cycles after issue); a value is held at (pe, c) only if it landed there, was held
there at c - 1, or moved there from a neighbour that held it at c - 1; a move needs the value at
its source; an operation needs each operand held on its own PE at its cycle (plus distance x II,
for a value of an earlier iteration). Capacities are modulo II, as in mrrg.Resources: one
operation per PE per slot, `registers` held values per PE per slot (a value held longer than II
cycles counts once per copy), one value per unit link per slot (a hycube move takes every unit
link on its way). Cycles are limited to each operation's window: as soon as its operands can
arrive (latencies and hop distances from the PEs that can run their producers, ASAP) and as late
as its readers allow within the critical path plus `slack` cycles (ALAP), so the model stays small.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from .mrrg import segments


@dataclasses.dataclass
class Variables:
    issue: dict  # (node, pe, t) -> BoolVar
    held: dict  # (value, pe, c) -> BoolVar
    move: dict  # (value, a, b, c) -> BoolVar: a at c to b at c + 1
    landing: dict  # (value, pe, c) -> the issue BoolVar that lands it there
    arrivals: dict = dataclasses.field(default_factory=dict)  # (value, pe, c) -> [(source, move)] into it


class Windows:
    """Each operation's PEs and cycle window, and each value's (pe -> cycle window) of states."""

    def __init__(self, graph, fabric, ii: int, slack: int):
        self.graph, self.fabric, self.ii = graph, fabric, ii
        names = list(graph.by_name)
        self.lat = {n: fabric.latency[graph.op_class(n)] for n in names}
        kinds = {graph.op_class(n) for n in names}
        self.pes = {k: [p for p in range(fabric.num_pes) if fabric.can_run(p, k)] for k in kinds}
        # hops from each PE to the nearest PE of each kind, and back
        self.to_kind = {k: [min(fabric.hops(p, q) for q in self.pes[k]) for p in range(fabric.num_pes)]
                        for k in kinds}
        self.from_kind = {k: [min(fabric.hops(q, p) for q in self.pes[k]) for p in range(fabric.num_pes)]
                          for k in kinds}
        self.edges = [(s, d, dist, self._gap(s, d)) for s, d, _, dist in graph.edges()]
        self.low, self.high = self._bounds(names, slack)

    def kind(self, name: str) -> str:
        return self.graph.op_class(name)

    def _gap(self, source: str, dest: str) -> int:
        """The fewest hops from any PE that can run `source` to any that can run `dest`."""
        return min(self.to_kind[self.kind(dest)][p] for p in self.pes[self.kind(source)])

    def _bounds(self, names, slack):
        """ASAP (Bellman-Ford over latency + gap - distance x II) and ALAP within the critical
        path plus `slack`; None where some dependence cycle cannot close at this II."""
        low = dict.fromkeys(names, 0)
        for _ in range(len(names) + 1):
            changed = False
            for s, d, dist, gap in self.edges:
                if low[s] + self.lat[s] + gap - dist * self.ii > low[d]:
                    low[d], changed = low[s] + self.lat[s] + gap - dist * self.ii, True
            if not changed:
                break
        else:
            return None, None  # a positive cycle: no II-periodic schedule with these hop counts
        length = max(low[n] + self.lat[n] for n in names) + slack
        high = {n: length - self.lat[n] for n in names}
        for _ in range(len(names) + 1):
            changed = False
            for s, d, dist, gap in self.edges:
                if high[d] + dist * self.ii - self.lat[s] - gap < high[s]:
                    high[s], changed = high[d] + dist * self.ii - self.lat[s] - gap, True
            if not changed:
                break
        return low, high

    @property
    def feasible(self) -> bool:
        return self.low is not None and all(self.low[n] <= self.high[n] for n in self.low)

    def size(self) -> int:
        """About how many variables the model has: operations, held states and moves."""
        issue = sum((self.high[n] - self.low[n] + 1) * len(self.pes[self.kind(n)]) for n in self.low)
        held = sum(max(0, last - first + 1) for value in self.low if self.graph.by_name[value].op != "store"
                   for first, last in (self.state_window(value, pe) for pe in range(self.fabric.num_pes)))
        moves = sum(len(self.fabric.neighbours(pe)) for pe in range(self.fabric.num_pes)) / self.fabric.num_pes
        return int(issue + held * (1 + moves))

    def state_window(self, value: str, pe: int) -> tuple[int, int]:
        """The cycles `value` may be held on `pe`: after it can have landed and travelled there,
        before the last of its readers can no longer be reached from there."""
        first = self.low[value] + self.lat[value] + self.from_kind[self.kind(value)][pe]
        readers = [(d, dist) for s, d, dist, _ in self.edges if s == value]
        if not readers:  # a value nobody reads still lands (and takes a register) once
            last = self.high[value] + self.lat[value] if self.fabric.can_run(pe, self.kind(value)) else first - 1
        else:
            last = max(self.high[d] + dist * self.ii - self.to_kind[self.kind(d)][pe] for d, dist in readers)
        return first, last


def build(model, win: Windows):
    """Variables and constraints of mapping the windows' graph at their II within their slack."""
    graph, fabric, ii = win.graph, win.fabric, win.ii
    var = Variables({}, {}, {}, {})
    for name in graph.by_name:
        kind = win.kind(name)
        for t in range(win.low[name], win.high[name] + 1):
            for pe in win.pes[kind]:
                var.issue[(name, pe, t)] = model.new_bool_var("")
                if graph.by_name[name].op != "store":
                    var.landing[(name, pe, t + win.lat[name])] = var.issue[(name, pe, t)]
    for name in graph.by_name:
        if graph.by_name[name].op != "store":
            _states(model, fabric, win, var, name)
    _operations(model, graph, fabric, ii, var)
    _capacities(model, fabric, ii, var)
    return var


def _states(model, fabric, win, var, value: str) -> None:
    """The held and move variables of one value and how each state is reached."""
    spans = {pe: win.state_window(value, pe) for pe in range(fabric.num_pes)}
    first = min(low for low, _ in spans.values())
    last = max(high for _, high in spans.values())
    for c in range(first, last + 1):
        for pe in range(fabric.num_pes):
            low, high = spans[pe]
            if not low <= c <= high:
                continue
            reasons = []
            landed = var.landing.get((value, pe, c))
            if landed is not None:
                reasons.append(landed)
            kept = var.held.get((value, pe, c - 1))
            if kept is not None:
                reasons.append(kept)
            arrivals = []
            for source in fabric.neighbours(pe):
                there = var.held.get((value, source, c - 1))
                if there is not None:
                    move = model.new_bool_var("")
                    model.add_implication(move, there)
                    var.move[(value, source, pe, c - 1)] = move
                    arrivals.append((source, move))
            reasons += [move for _, move in arrivals]
            if not reasons:
                continue  # nothing can bring the value here: no variable
            here = model.new_bool_var("")
            var.held[(value, pe, c)] = here
            var.arrivals[(value, pe, c)] = arrivals
            model.add_bool_or([here.Not()] + reasons)
            if landed is not None:
                model.add_implication(landed, here)


def _operations(model, graph, fabric, ii, var) -> None:
    """Each operation issues once, with its operands on its PE; one operation per PE per slot."""
    by_node = defaultdict(list)
    by_slot = defaultdict(list)
    for (name, pe, t), issue in var.issue.items():
        by_node[name].append(issue)
        by_slot[(pe, t % ii)].append(issue)
        for operand in graph.by_name[name].operands:
            needed = var.held.get((operand.source, pe, t + operand.distance * ii))
            if needed is None:
                model.add(issue == 0)
            else:
                model.add_implication(issue, needed)
        if graph.by_name[name].op != "store" and (name, pe, t + fabric.latency[graph.op_class(name)]) not in var.held:
            model.add(issue == 0)  # its landing state fell outside the value's window
    for name in graph.by_name:
        model.add_exactly_one(by_node[name])
    for issues in by_slot.values():
        model.add_at_most_one(issues)


def _capacities(model, fabric, ii, var) -> None:
    """Registers per PE per slot; one value per unit link per slot."""
    registers = defaultdict(list)
    for (_, pe, c), here in var.held.items():
        registers[(pe, c % ii)].append(here)
    for held in registers.values():
        if len(held) > fabric.registers:
            model.add(sum(held) <= fabric.registers)
    links = defaultdict(list)
    for (_, a, b, c), move in var.move.items():
        for link in segments(fabric, a, b):
            links[(link, c % ii)].append(move)
    for moves in links.values():
        if len(moves) > 1:
            model.add_at_most_one(moves)
