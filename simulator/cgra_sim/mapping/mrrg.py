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
    fabric = resources.fabric
    dest_pe, dest_cycle = target
    if target in held:
        return [target], Counter()
    start = min((cycle for _, cycle in held), default=dest_cycle + 1)
    if start > dest_cycle:
        return None
    # cost[pe] at the current cycle, with the step that got there
    best: dict[int, tuple[int, tuple | None]] = {}
    trail: dict[tuple[int, int], tuple | None] = {}
    for cycle in range(start, dest_cycle + 1):
        layer: dict[int, tuple[int, tuple | None]] = {}
        for pe, cycle_held in held:
            if cycle_held == cycle:
                layer[pe] = (0, None)
        resources.work += len(best)
        for pe, (cost, _) in best.items():
            for nxt in (pe,) + fabric.neighbours(pe):
                if (nxt, cycle) in held or fabric.hops(nxt, dest_pe) > dest_cycle - cycle:
                    continue
                if not resources.free("reg", nxt, cycle, pending):
                    continue
                if nxt != pe and not all(resources.free("link", link, cycle - 1, pending)
                                         for link in segments(fabric, pe, nxt)):
                    continue
                step = cost + 1 + (nxt != pe)
                if penalty:
                    step += penalty[("reg", nxt, cycle % resources.ii)] + sum(
                        penalty[("link", link, (cycle - 1) % resources.ii)] for link in segments(fabric, pe, nxt)
                        if nxt != pe)
                if nxt not in layer or step < layer[nxt][0]:
                    layer[nxt] = (step, (pe, cycle - 1))
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


def route_uses(resources: Resources, chain: list[tuple[int, int]]) -> Counter:
    """The registers and links (by slot) a chain of states uses; its first state is already paid for."""
    uses: Counter = Counter()
    for (pe, cycle), (nxt, nxt_cycle) in zip(chain, chain[1:]):
        uses[("reg", nxt, nxt_cycle % resources.ii)] += 1
        if nxt != pe:
            for link in segments(resources.fabric, pe, nxt):
                uses[("link", link, cycle % resources.ii)] += 1
    return uses
