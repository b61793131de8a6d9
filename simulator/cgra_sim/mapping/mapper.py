"""Modulo scheduling, placement and routing of a dataflow graph on the fabric.

Stage: mapping. In: a `DataflowGraph` (dfg.py) and a `Fabric` (fabric.py). Out: a `Mapping`:
for each operation its PE and its cycle within the iteration, for each operand the route its
value takes through registers and links (mrrg.py), the initiation interval II, the schedule's
length, and the bounds it is measured against (MII = max(ResMII, RecMII)).

How (the iterative modulo scheduling the CGRA mappers use, CGRA-Mapper's and Morpher's heuristic
kind): from II = MII up to the fabric's context depth, operations are placed one at a time in
dependence order (loads and long chains first); each goes at the earliest cycle, and there on the
PE, where routes from its placed operands (and, for a value read in a later iteration, to its
placed readers) exist with the fewest new registers and links (routes negotiate: a register or
link a route would overfill costs more on the next try, as in PathFinder). PEs nearest the
scratchpad corner come first, so small graphs stay compact. When the II found is above MII, the
fabric one row and one column smaller are searched too (their corners are links of this fabric)
and the best kept, so a bigger array rarely does worse than a smaller one; the benchmark and a
property test check that across sizes. Deterministic: no randomness, ties
broken by PE number.

Where the heuristic's II is above MII (or it finds none), the exact fallback (solver.py, OR-Tools
CP-SAT, the `solver` extra) tries II = MII, MII + 1, ... below it, each within a deterministic
budget, and the lower II is kept (the heuristic's on a tie); an II the solver proves infeasible is
recorded in the mapping. $CGRA_MAPPER chooses: `auto` (the default: the fallback when ortools is
installed), `heuristic` (never the solver), `solver` (the fallback, and an error without ortools).
Mappings (and the absence of one) are cached by (graph, fabric) fingerprints and that choice
(with ortools' version), in the process and on disk ($CGRA_MAPPING_CACHE, "off" for none; the
mapper's source is part of the key); the presets' mappings ship with the package (store.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

from . import solver, store
from .dfg import OPS, DataflowGraph, res_mii, rec_mii
from .mrrg import Resources, negotiated_route


#: Routing states one scheduling attempt may expand before it gives up at that II (deterministic,
#: unlike a time limit): the suite's mappings expand at most ~2,000 on 16x16; a large
#: fabric failing at a too-small II would spend minutes.
ROUTE_BUDGET = 50_000
#: IIs the solver may try per mapping without settling them (IIs it proves infeasible are free).
SOLVER_TRIES = 3


class MappingError(ValueError):
    """No modulo schedule up to the fabric's context depth."""


@dataclasses.dataclass(frozen=True)
class Mapping:
    graph: DataflowGraph
    fabric: object  # the Fabric the mapping uses (a corner of the one asked for, at times)
    ii: int
    res_mii: int
    rec_mii: int
    placement: dict  # node -> (pe, cycle of iteration 0)
    routes: dict  # (node, operand index) -> [(pe, cycle), ...] from the producer's landing state
    seconds: float
    mapper: str = "heuristic"  # which found it: "heuristic" or "cp-sat"
    infeasible: tuple = ()  # IIs below `ii` the solver proved have no mapping

    @property
    def mii(self) -> int:
        return max(self.res_mii, self.rec_mii)

    def latency_of(self, name: str) -> int:
        return self.fabric.latency[OPS[self.graph.by_name[name].op][0]]

    @property
    def length(self) -> int:
        """Cycles from iteration 0's first operation to its last result."""
        return max(cycle + self.latency_of(name) for name, (_, cycle) in self.placement.items())

    def cycles(self, iterations: int) -> int:
        """Cycles to run `iterations` iterations: the last one starts (n - 1) x II later."""
        return (iterations - 1) * self.ii + self.length if iterations else 0

    @property
    def utilisation(self) -> float:
        """Operations per PE slot: nodes / (PEs x II)."""
        return len(self.graph.nodes) / (self.fabric.num_pes * self.ii)

    @property
    def config_bytes(self) -> int:
        """The configuration the array loads: every PE's word for each of II slots."""
        return -(-self.fabric.num_pes * self.ii * self.fabric.config_word_bits // 8)


_CACHE: dict = {}  # (graph, fabric fingerprints, mapper) -> Mapping or MappingError, this process


def map_graph(graph: DataflowGraph, fabric) -> Mapping:
    """The mapping of `graph` on `fabric` at the smallest II this mapper finds (cached in the
    process and on disk; a preset's read from the package, store.py); raises MappingError when
    there is none."""
    mode = solver.mode()
    tag = solver.cache_tag(mode)
    key = (graph.fingerprint, fabric.fingerprint, tag)
    if key not in _CACHE:
        result = _from_data(store.shipped(graph.fingerprint, fabric.fingerprint, tag), graph, fabric)
        if result is None:
            path = store.cache_file(graph.fingerprint, fabric.fingerprint, tag)
            result = _from_data(store.read(path), graph, fabric)
            if result is None:
                try:
                    result = _map(graph, fabric, mode != "heuristic" and solver.version() is not None)
                except MappingError as error:
                    result = error
                store.write(path, _to_data(result))
        _CACHE[key] = result
    if isinstance(_CACHE[key], MappingError):
        raise _CACHE[key]
    return _CACHE[key]


def _from_data(data: dict | None, graph: DataflowGraph, fabric):
    """The mapping (or the MappingError) `data` stores (_to_data's), or None."""
    if data is None:
        return None
    try:
        if "error" in data:
            return MappingError(data["error"])
        rows, cols, topology = data["region"]
        region = fabric.sub_fabric(rows, cols)
        if region.topology != topology:
            return None
        return Mapping(graph, region, data["ii"], data["res_mii"], data["rec_mii"],
                       {name: tuple(at) for name, at in data["placement"].items()},
                       {(reader, index): [tuple(step) for step in chain] for reader, index, chain in data["routes"]},
                       data["seconds"], data["mapper"], tuple(data["infeasible"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _to_data(result) -> dict:
    """A mapping (or a MappingError) as JSON data."""
    if isinstance(result, MappingError):
        return {"error": str(result)}
    region = result.fabric
    return {"ii": result.ii, "res_mii": result.res_mii, "rec_mii": result.rec_mii, "seconds": result.seconds,
            "mapper": result.mapper, "infeasible": list(result.infeasible),
            "region": [region.rows, region.cols, region.topology],
            "placement": {name: list(at) for name, at in result.placement.items()},
            "routes": [[reader, index, [list(step) for step in chain]]
                       for (reader, index), chain in result.routes.items()]}


def _map(graph: DataflowGraph, fabric, use_solver: bool = False) -> Mapping:
    started = time.perf_counter()
    res, rec = res_mii(graph, fabric), rec_mii(graph, fabric)
    # Past MII + one slot per operation, a larger II only lengthens lifetimes: give up there.
    limit = min(fabric.context_depth, max(res, rec) + len(graph.nodes) + 4)
    best = _search(graph, fabric, max(res, rec), limit)
    if best is None or best.ii > max(res, rec):
        # The fabric one row or one column smaller: its own search may do better (not further down:
        # that costs a search per corner of a large array).
        for rows, cols in ((fabric.rows - 1, fabric.cols), (fabric.rows, fabric.cols - 1)):
            corner = fabric.sub_fabric(rows, cols) if rows and cols else None
            if corner is not None and _fits(graph, corner, limit):
                found = _search(graph, corner, max(res_mii(graph, corner), rec), (best.ii - 1) if best else limit)
                if found is not None and (best is None or found.ii < best.ii):
                    best = found
    if use_solver and (best is None or best.ii > max(res, rec)):
        best = _solver_fallback(graph, fabric, max(res, rec), best.ii - 1 if best else limit, best)
    if best is None:
        raise MappingError(f"{graph.name}: no mapping on the {fabric.rows}x{fabric.cols} {fabric.topology} with "
                           f"{fabric.registers} registers per PE up to II {limit} (MII {max(res, rec)}; the context "
                           f"depth is {fabric.context_depth}): give the fabric more registers, memory ports or contexts")
    return dataclasses.replace(best, res_mii=res, rec_mii=rec, seconds=time.perf_counter() - started)


def _solver_fallback(graph: DataflowGraph, fabric, first: int, last: int, best: Mapping | None) -> Mapping | None:
    """The solver's mapping at the first II from `first` to `last` it finds one, else `best`;
    either with the IIs below it the solver proved infeasible."""
    proved, tries = [], 0
    for ii in range(first, last + 1):
        if tries == SOLVER_TRIES:
            break
        outcome = solver.attempt(graph, fabric, ii)
        if outcome.status == "mapped":
            return Mapping(graph, outcome.fabric, ii, 0, 0, outcome.placement, outcome.routes, 0.0, "cp-sat",
                           tuple(proved))
        if outcome.status == "infeasible":
            proved.append(ii)
        else:
            tries += 1
    return dataclasses.replace(best, infeasible=tuple(proved)) if best is not None else None


def _search(graph: DataflowGraph, fabric, first: int, last: int) -> Mapping | None:
    """The first II from `first` to `last` at which one of the placement orders maps the graph."""
    for ii in range(first, last + 1):
        for order in _orders(graph, fabric):
            found = _schedule(graph, fabric, ii, order)
            if found is not None:
                return Mapping(graph, fabric, ii, 0, 0, *found, 0.0)
    return None


def _fits(graph, region, ii: int) -> bool:
    try:
        return res_mii(graph, region) <= ii
    except ValueError:  # the corner lacks a kind of unit
        return False


def _priority(graph: DataflowGraph, fabric) -> list[str]:
    """Dependence order; among ready nodes, the longest chain to a store first."""
    height: dict[str, int] = {}
    for name in reversed(graph.order()):
        readers = [d for d, _, dist in graph.readers[name] if dist == 0]
        lat = fabric.latency[graph.op_class(name)]
        height[name] = lat + max((height[r] for r in readers), default=0)
    order, placed = [], set()
    pending, position = set(graph.by_name), {name: i for i, name in enumerate(graph.order())}
    while pending:
        ready = [n for n in pending if all(o.source in placed for o in graph.by_name[n].operands if o.distance == 0)]
        pick = min(ready, key=lambda n: (-height[n], position[n]))
        order.append(pick)
        placed.add(pick)
        pending.discard(pick)
    return order


def _pe_order(fabric) -> list[int]:
    """PEs nearest the scratchpad corner first: the growing squares from (0, 0)."""
    return sorted(range(fabric.num_pes), key=lambda pe: (max(fabric.position(pe)), fabric.position(pe)))


def _orders(graph: DataflowGraph, fabric):
    """The placement orders tried at each II, in turn: the longest chain first, plain dependence
    order (loads in the graph's order, which keeps an unrolled body's lanes apart), then readers
    right after their values."""
    tried = []
    for order in (_priority(graph, fabric), graph.order(), _readers_first(graph)):
        if order not in tried:
            tried.append(order)
            yield order


def _readers_first(graph: DataflowGraph) -> list[str]:
    """Depth first: each value's readers right after it, once their other operands are placed, so
    values live briefly (what a fabric with few registers needs)."""
    readers: dict[str, list[str]] = {name: [] for name in graph.by_name}
    for source, dest, _, distance in graph.edges():
        if distance == 0 and dest not in readers[source]:
            readers[source].append(dest)
    order: list[str] = []

    def ready(name):
        return name not in order and all(o.source in order for o in graph.by_name[name].operands if o.distance == 0)

    def visit(name):
        order.append(name)
        for reader in readers[name]:
            if ready(reader):
                visit(reader)

    for name in graph.order():
        if ready(name):
            visit(name)
    return order


def _schedule(graph: DataflowGraph, fabric, ii: int, order: list[str]):
    resources = Resources(fabric, ii)
    placement: dict[str, tuple[int, int]] = {}
    held: dict[str, dict] = {}  # value -> {(pe, cycle): None} where it sits
    routes: dict = {}
    horizon = sum(fabric.latency[graph.op_class(n)] for n in graph.by_name) + (fabric.rows + fabric.cols + 2) * ii
    pes = _pe_order(fabric)
    for name in order:
        choice = _place(graph, fabric, resources, placement, held, name, pes, horizon, ii)
        if choice is None:
            return None
        (pe, cycle), new_routes, uses = choice
        resources.take(uses)
        placement[name] = (pe, cycle)
        held[name] = {_landing(graph, fabric, placement, name): None}
        for (value, reader, index), chain in new_routes.items():
            routes[(reader, index)] = chain
            held[value].update(dict.fromkeys(chain))
    return placement, routes


def _landing(graph, fabric, placement, name) -> tuple[int, int]:
    pe, cycle = placement[name]
    return pe, cycle + fabric.latency[graph.op_class(name)]


def _place(graph, fabric, resources, placement, held, name, pes, horizon, ii):
    """The earliest (pe, cycle) for `name` with routes for every placed operand and reader."""
    node = graph.by_name[name]
    kind = OPS[node.op][0]
    lat = fabric.latency[kind]
    inputs = [(o.source, index, o.distance) for index, o in enumerate(node.operands) if o.source in placement]
    # Placed nodes that read this value in a later iteration, and the node itself if it does.
    readers = [(d, index, dist) for d, index, dist in graph.readers[name] if d in placement or d == name]
    spare_needed = {scarce: _unplaced(graph, placement, scarce) - _free_slots(fabric, resources, scarce) + 1
                    for scarce in ("mem", "mul")}
    earliest = max((_landing(graph, fabric, placement, s)[1] - dist * ii for s, _, dist in inputs), default=0)
    latest = min((placement[d][1] + dist * ii - lat for d, _, dist in readers if d != name), default=horizon)
    # The PEs that may take it at any cycle: the last slots of a scarce unit are kept for the
    # operations that need it.
    candidates = [pe for pe in pes if fabric.can_run(pe, kind) and not any(
        need > 0 and fabric.can_run(pe, scarce) for scarce, need in spare_needed.items() if scarce != kind)]
    for cycle in range(max(earliest, 0), min(latest, earliest + ii + fabric.rows + fabric.cols) + 1):
        best, best_cost = None, None
        for pe in candidates:
            if not resources.free("fu", pe, cycle):
                continue
            if not _reachable(graph, fabric, placement, held, inputs, readers, name, pe, cycle, ii):
                continue
            if resources.work > ROUTE_BUDGET:  # a hopeless II on a large fabric: try the next
                return None
            found = _routes_for(graph, fabric, resources, placement, held, name, pe, cycle, inputs, readers, lat)
            if found is None:
                continue
            cost = sum(found[1].values()) + _scarce(fabric, pe, kind)
            if best is None or cost < best_cost:
                best, best_cost = ((pe, cycle), found[0], found[1]), cost
        if best is not None:
            return best
    return None


def _reachable(graph, fabric, placement, held, inputs, readers, name, pe, cycle, ii) -> bool:
    """Whether every operand can reach `pe` by `cycle`, and the value every placed reader, on
    hop counts alone (routing is tried only where this holds)."""
    lat = fabric.latency[graph.op_class(name)]
    for source, _, distance in inputs:
        if not any(fabric.hops(at, pe) <= cycle + distance * ii - when for at, when in held[source]):
            return False
    for reader, _, distance in readers:
        if reader != name:
            at, when = placement[reader]
            if fabric.hops(pe, at) > when + distance * ii - cycle - lat:
                return False
    return True


def _unplaced(graph, placement, kind: str) -> int:
    return sum(1 for node in graph.nodes if node.name not in placement and OPS[node.op][0] == kind)


def _free_slots(fabric, resources, kind: str) -> int:
    """Free issue slots (per II) on the PEs that can run `kind`."""
    used = resources.used.get
    return sum(used(("fu", pe, slot), 0) < 1 for pe in range(fabric.num_pes) if fabric.can_run(pe, kind)
               for slot in range(resources.ii))


def _scarce(fabric, pe: int, kind: str) -> int:
    """What it costs to spend a PE's slot on an operation another kind needs more: a memory port
    on arithmetic, a multiplier on an ALU operation (when not every PE has one)."""
    cost = 0
    if kind != "mem" and fabric.memory_ports != "all" and fabric.can_run(pe, "mem"):
        cost += 2
    if kind == "alu" and fabric.multipliers != "all" and fabric.can_run(pe, "mul"):
        cost += 1
    return cost


def _routes_for(graph, fabric, resources, placement, held, name, pe, cycle, inputs, readers, lat):
    pending = Counter({("fu", pe, cycle % resources.ii): 1})
    if graph.by_name[name].op != "store":  # its result lands in the PE's register file
        pending[("reg", pe, (cycle + lat) % resources.ii)] += 1
    if not resources.fits(pending):
        return None
    # Operands to (pe, cycle + distance x II); this value to placed readers of a later iteration.
    requests = [(source, name, index, held[source], (pe, cycle + distance * resources.ii))
                for source, index, distance in inputs]
    requests += [(name, reader, index, {(pe, cycle + lat): None},
                  (placement[reader][0] if reader != name else pe,
                   (placement[reader][1] if reader != name else cycle) + distance * resources.ii))
                 for reader, index, distance in readers]
    routes = {}
    for value, reader, index, start, target in requests:
        reach = dict(start)
        for (routed, _, _), states in routes.items():  # a route of this value may branch off another
            if routed == value:
                reach.update(dict.fromkeys(states))
        found = negotiated_route(resources, reach, target, pending)
        if found is None:
            return None
        routes[(value, reader, index)] = found[0]
        pending += found[1]
    if not resources.fits(pending):
        return None
    return routes, pending


__all__ = ["Mapping", "MappingError", "map_graph"]
