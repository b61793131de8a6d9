"""The modulo routing resource graph: the fabric's resources in each of II time slots, and routes.

Stage: mapping (the mapper's bookkeeping). A resource is a PE's functional unit, one of its
registers, or a link between two neighbouring PEs, in time slot t mod II (a modulo schedule runs
iteration i's cycle t at i * II + t, so two uses of one resource conflict when their cycles agree
mod II). A value is at (pe, cycle) when it sits in that PE's register file during that cycle: it
gets there by being computed on the PE (landing `latency` cycles after its operation issues), held
from the cycle before, or moved over a link from a neighbour in the cycle before. `route` finds the
cheapest way (fewest new registers and links) from the places a value already is to the place and
cycle an operation reads it.
"""

from __future__ import annotations

import functools
from collections import Counter


def segments(fabric, source: int, dest: int) -> list[tuple[int, int]]:
    """The unit links a move from `source` to its neighbour `dest` uses (several on a hycube)."""
    return _segments(fabric.cols, fabric.hops_per_cycle, source, dest)


@functools.lru_cache(maxsize=1 << 16)
def _segments(cols: int, hops: int, source: int, dest: int) -> list[tuple[int, int]]:
    (r0, c0), (r1, c1) = divmod(source, cols), divmod(dest, cols)
    if hops == 1 or (abs(r1 - r0) + abs(c1 - c0)) == 1:
        return [(source, dest)]
    step_r, step_c = (r1 > r0) - (r1 < r0), (c1 > c0) - (c1 < c0)
    path, (r, c) = [], (r0, c0)
    while (r, c) != (r1, c1):
        nxt = (r + step_r, c + step_c)
        path.append((r * cols + c, nxt[0] * cols + nxt[1]))
        r, c = nxt
    return path


class Resources:
    """What a partial mapping uses, per (kind, where, slot); kind is fu, reg or link."""

    def __init__(self, fabric, ii: int):
        self.fabric, self.ii = fabric, ii
        self.used: Counter = Counter()
        self.work = 0  # routing states expanded: the scheduler's budget counts these

    def capacity(self, kind: str) -> int:
        return self.fabric.registers if kind == "reg" else 1

    def free(self, kind: str, where, cycle: int, extra: Counter | None = None) -> bool:
        key = (kind, where, cycle % self.ii)
        used = self.used.get(key, 0) + (extra.get(key, 0) if extra else 0)
        return used < (self.fabric.registers if kind == "reg" else 1)

    def fits(self, uses: Counter) -> bool:
        return all(self.used[key] + count <= self.capacity(key[0]) for key, count in uses.items())

    def take(self, uses: Counter) -> None:
        self.used.update(uses)

    def give_back(self, uses: Counter) -> None:
        self.used.subtract(uses)


def negotiated_route(resources: Resources, held: dict, target: tuple[int, int], pending: Counter, tries: int = 4):
    """`route`, again with the resources it overfilled made dearer, until its chain fits (its own
    states may share a register slot: a value held longer than II cycles in one PE needs two)."""
    penalty: Counter = Counter()
    for _ in range(tries):
        found = route(resources, held, target, pending, penalty)
        if found is None or resources.fits(pending + found[1]):
            return found
        for key, count in (pending + found[1]).items():
            if resources.used[key] + count > resources.capacity(key[0]):
                penalty[key] += 4
    return None


def route(resources: Resources, held: dict, target: tuple[int, int], pending: Counter, penalty: Counter = None):
    """The cheapest path to `target` (pe, cycle) from the states in `held` ({(pe, cycle): None}
    where the value already is): (the chain of states, from the held one it leaves to the target,
    and the new resources it takes as a Counter), or None. `pending` are resources the caller has
    already claimed for this operation."""
    dest_pe, dest_cycle = target
    if target in held:
        return [target], Counter()
    start = min((cycle for _, cycle in held), default=dest_cycle + 1)
    if start > dest_cycle:
        return None
    held_at: dict[int, dict[int, None]] = {}  # cycle -> the PEs holding the value then
    for pe, cycle_held in held:
        held_at.setdefault(cycle_held, {})[pe] = None
    moves, to_dest = _moves(resources.fabric, dest_pe)
    # cost[pe] at the current cycle, with the step that got there
    best: dict[int, tuple[int, tuple | None]] = {}
    trail: dict[tuple[int, int], tuple | None] = {}
    for cycle in range(start, dest_cycle + 1):
        there = held_at.get(cycle, _nothing)
        layer: dict[int, tuple[int, tuple | None]] = {pe: (0, None) for pe in there}
        resources.work += len(best)
        _advance(resources, best, layer, there, moves, to_dest, cycle, dest_cycle - cycle, pending, penalty)
        for pe, entry in layer.items():
            trail[(pe, cycle)] = entry[1]
        best = layer
    if dest_pe not in best:
        return None
    states, state = [], (dest_pe, dest_cycle)
    while state is not None and state not in held:
        states.append(state)
        state = trail[state]
    states.reverse()
    return [state] + states, route_uses(resources, [state] + states)


_nothing: dict = {}


def _advance(resources, best, layer, there, moves, to_dest, cycle, left, pending, penalty) -> None:
    """Fills `layer` (cycle's states: {pe: (cost, the state it came from)}) from `best` (the
    cycle before's) by every move that keeps the value `left` cycles from the target, into a
    register free at `cycle` over links free the cycle before. The mapper's inner loop (millions of
    moves a large body): the fabric's tables and the resources' counts are read directly, each
    register and link of the cycle checked once."""
    used, claimed = resources.used.get, pending.get if pending else _nothing.get
    registers, slot, link_slot = resources.fabric.registers, cycle % resources.ii, (cycle - 1) % resources.ii
    register_free: list = [None] * len(moves)
    link_free: dict[int, bool] = {}
    for pe, (cost, _) in best.items():
        came_from = (pe, cycle - 1)
        for nxt, links in moves[pe]:
            if to_dest[nxt] > left or nxt in there:
                continue
            free = register_free[nxt]
            if free is None:
                key = ("reg", nxt, slot)
                free = register_free[nxt] = used(key, 0) + claimed(key, 0) < registers
            if not free:
                continue
            if links:
                for number, link in links:
                    free = link_free.get(number)
                    if free is None:
                        key = ("link", link, link_slot)
                        free = link_free[number] = used(key, 0) + claimed(key, 0) < 1
                    if not free:
                        break
                if not free:
                    continue
                step = cost + 2
            else:
                step = cost + 1
            if penalty:
                step += penalty.get(("reg", nxt, slot), 0)
                for _, link in links:
                    step += penalty.get(("link", link, link_slot), 0)
            entry = layer.get(nxt)
            if entry is None or step < entry[0]:
                layer[nxt] = (step, came_from)


def _moves(fabric, dest: int):
    """Per PE, where a value in its register file may be a cycle later: ((pe, ()), (neighbour,
    the links the move uses), ...), staying first, a link as (its number, (source, dest)); and
    every PE's hops to `dest`."""
    moves, distances = _move_tables(fabric)
    return moves, distances[dest]


@functools.lru_cache(maxsize=64)
def _move_tables(fabric):
    pes = range(fabric.num_pes)
    moves = tuple(((pe, ()),) + tuple((nxt, tuple((source * fabric.num_pes + dest, (source, dest))
                                                   for source, dest in segments(fabric, pe, nxt)))
                                      for nxt in fabric.neighbours(pe))
                  for pe in pes)
    # distances[dest][pe]: the hops from pe to dest
    return moves, tuple(tuple(fabric.hops(pe, dest) for pe in pes) for dest in pes)


def route_uses(resources: Resources, chain: list[tuple[int, int]]) -> Counter:
    """The registers and links (by slot) a chain of states uses; its first state is already paid for."""
    uses: Counter = Counter()
    for (pe, cycle), (nxt, nxt_cycle) in zip(chain, chain[1:]):
        uses[("reg", nxt, nxt_cycle % resources.ii)] += 1
        if nxt != pe:
            for link in segments(resources.fabric, pe, nxt):
                uses[("link", link, cycle % resources.ii)] += 1
    return uses
