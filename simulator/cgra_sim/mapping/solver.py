"""The exact fallback of the mapper: a graph mapped at a given II with OR-Tools CP-SAT.

Stage: mapping (used by mapper.py where its heuristic misses MII). In: a `DataflowGraph`, a
`Fabric`, an II and a budget. Out: (placement, routes) in the heuristic's format ({node: (pe,
cycle)}; {(reader, operand index): the chain of (pe, cycle) states from the producer's landing
state}), which the cycle-level array simulator runs as it runs the heuristic's, or None; `attempt`
also says on which part of the fabric, or that the II was proved infeasible.

How: first a relaxation without time (`_slots_feasible`): each operation gets a PE and a slot
mod II; a PE's registers in a slot must hold, at least, each distinct value an operation there
reads in that slot and each result landing in it. Every mapping satisfies it, so when CP-SAT
finds it infeasible no mapping at this II exists, whatever the schedule's length (two registers
cannot hold a binary operation's two operands and its own result at II = 1). Then the
time-expanded model of solver_model.py, with the schedule's slack over the critical path growing
(1, 2, 3, 4, 6, ... cycles: a model too tight is refuted quickly, a loose one is large) until one
solves or the budget is spent. A large fabric is tried on its corners first, and a graph of
identical independent parts (a FABRIC body's lanes) on a tile copied across the fabric
(solver_tiles.py). A solution is decoded into one route per operand, traced back over held states
to where its value lands (routes of one value share states, as the heuristic's branch). A model
infeasible within its slack is not a proof (a longer schedule might fit): that is "none found".

Deterministic: one worker, a fixed seed and a deterministic time budget (CP-SAT's own work units,
the same on every machine), so one input gives one mapping with a given OR-Tools version (which
is part of the mapper's cache key). ortools is the `solver` extra, imported only here, lazily.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import os
from collections import defaultdict

from .dfg import OPS
from .solver_model import Windows, build
from .solver_tiles import tilings, whole

#: Deterministic time (CP-SAT's work units, about a second each on one core) one II may take; the
#: relaxation's share of it and its largest model (operations x PEs x II); the slacks tried; the
#: largest time-expanded model (variables, Windows.size).
BUDGET = 6.0
RELAXATION_SHARE = 0.1
RELAXATION_LIMIT = 8_000
SLACKS = (1, 2, 3, 4, 6, 8, 12, 16)
MODEL_LIMIT = 60_000
SEED = 20240601
INSTALL_HINT = 'pip install -e ".[solver]"'
#: The values of $CGRA_MAPPER, and what each does (`cgra-sim map --mapper` says the same).
MODES = {"auto": "the heuristic, then the CP-SAT solver below its II when ortools is installed (default)",
         "heuristic": "the heuristic alone (iterative modulo scheduling with negotiated routes)",
         "solver": "the heuristic, then the CP-SAT solver below its II; an error without ortools"}


class SolverMissing(ImportError):
    """CGRA_MAPPER=solver without OR-Tools installed."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    status: str  # "mapped", "infeasible" (proved, for every schedule length) or "none found"
    placement: dict | None = None
    routes: dict | None = None
    fabric: object = None  # the fabric (or the corner of it) the mapping uses


def version() -> str | None:
    """The installed OR-Tools version, or None when it is not installed (found without importing
    it: that takes 0.2 s, paid only when the solver runs)."""
    try:
        if importlib.util.find_spec("ortools") is None:
            return None
        return _installed_version()
    except (ImportError, ValueError):  # PackageNotFoundError is an ImportError
        return None


@functools.cache
def _installed_version() -> str:
    """Read once per process: the timing model asks for every FABRIC command it times (a
    package's metadata takes 0.3 ms to read; whether it can be imported, 0.05 ms, stays live)."""
    return importlib.metadata.version("ortools")


def mode() -> str:
    """$CGRA_MAPPER (auto, heuristic or solver); raises ValueError on another value and
    SolverMissing when it asks for the solver without ortools."""
    chosen = os.environ.get("CGRA_MAPPER", "").strip().lower() or "auto"
    if chosen not in MODES:
        raise ValueError(f"CGRA_MAPPER={chosen!r}: use one of {', '.join(MODES)}")
    if chosen == "solver" and version() is None:
        raise SolverMissing(f"CGRA_MAPPER=solver needs OR-Tools: {INSTALL_HINT} (or CGRA_MAPPER=auto, which maps "
                            "with the heuristic alone when it is missing)")
    return chosen


def cache_tag(chosen: str) -> str:
    """The mapper's part of a cache key: the mode, and OR-Tools' version whenever it may run."""
    found = version() if chosen != "heuristic" else None
    return f"{chosen}-ortools{found}" if found else chosen


def solve(graph, fabric, ii: int, budget: float = BUDGET):
    """(placement, routes) of `graph` on `fabric` at `ii` (on `fabric` itself: no corner), or
    None when none is found within the budget."""
    outcome = attempt(graph, fabric, ii, budget, corners=False)
    return (outcome.placement, outcome.routes) if outcome.status == "mapped" else None


def attempt(graph, fabric, ii: int, budget: float = BUDGET, corners: bool = True) -> Outcome:
    """The solver's verdict on `graph` at `ii`: a mapping, a proof that none exists, or neither."""
    clock = _Clock(budget)
    if len(graph.nodes) * fabric.num_pes * ii <= RELAXATION_LIMIT:
        relaxation = clock.share(RELAXATION_SHARE)
        feasible = _slots_feasible(graph, fabric, ii, relaxation)
        clock.spent += relaxation.spent
        if feasible is False:
            return Outcome("infeasible")
    choices = tilings(graph, fabric, ii) if corners else [whole(graph, fabric)]
    for index, tiling in enumerate(choices):
        # each tiling gets half of what is left; the last, all of it
        allowance = clock.share(1.0 if index == len(choices) - 1 else 0.5)
        found = _map(tiling.graph, tiling.tile, ii, allowance)
        clock.spent += allowance.spent
        if found is not None:
            return Outcome("mapped", *_from_zero(*tiling.place(*found)), tiling.region)
    return Outcome("none found")


class _Clock:
    """Deterministic time left; `share` hands part of it to a sub-task (which adds back what it spent)."""

    def __init__(self, budget: float):
        self.budget, self.spent = budget, 0.0

    @property
    def left(self) -> float:
        return self.budget - self.spent

    def share(self, fraction: float) -> "_Clock":
        return _Clock(max(0.0, self.left * fraction))


def _solver(cp_model, budget: float):
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = SEED
    solver.parameters.max_deterministic_time = budget
    # Probing in presolve costs more than the search it saves on these models (measured: 2-3x).
    solver.parameters.cp_model_probing_level = 0
    return solver


def _run(cp_model, model, clock: _Clock):
    """Solve `model` within what `clock` has left: (status, solver)."""
    solver = _solver(cp_model, clock.left)
    status = solver.solve(model)
    clock.spent += solver.deterministic_time
    return status, solver


def _slots_feasible(graph, fabric, ii: int, clock: _Clock) -> bool | None:
    """The relaxation without time: False when proved infeasible, True when satisfiable, None
    when undecided within the budget."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    present = {}  # (value, pe, slot) -> BoolVar: the value occupies a register there
    by_slot = defaultdict(list)

    def occupies(value, pe, slot):
        if (value, pe, slot) not in present:
            present[(value, pe, slot)] = model.new_bool_var("")
        return present[(value, pe, slot)]

    for node in graph.nodes:
        kind = OPS[node.op][0]
        choices = []
        for pe in range(fabric.num_pes):
            for slot in range(ii) if fabric.can_run(pe, kind) else ():
                here = model.new_bool_var("")
                choices.append(here)
                by_slot[(pe, slot)].append(here)
                for source in dict.fromkeys(o.source for o in node.operands):  # in its slot (+ distance x II)
                    model.add_implication(here, occupies(source, pe, slot))
                if node.op != "store":
                    model.add_implication(here, occupies(node.name, pe, (slot + fabric.latency[kind]) % ii))
        model.add_exactly_one(choices)
    for issues in by_slot.values():
        model.add_at_most_one(issues)
    registers = defaultdict(list)
    for (_, pe, slot), var in present.items():
        registers[(pe, slot)].append(var)
    for held in registers.values():
        model.add(sum(held) <= fabric.registers)
    status, _ = _run(cp_model, model, clock)
    if status == cp_model.INFEASIBLE:
        return False
    return True if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None


def _map(graph, fabric, ii: int, clock: _Clock):
    """The first solution of the time-expanded model as the slack grows, or None."""
    from ortools.sat.python import cp_model

    for slack in SLACKS:
        windows = Windows(graph, fabric, ii, slack)
        if not windows.feasible:
            continue  # no schedule within this slack
        if clock.left <= 0 or windows.size() > MODEL_LIMIT:
            return None  # CP-SAT's wall time outgrows its deterministic time on larger models
        model = cp_model.CpModel()
        var = build(model, windows)
        status, solver = _run(cp_model, model, clock)
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return _decode(graph, ii, var, solver)
        if status != cp_model.INFEASIBLE:
            return None  # out of budget
    return None


def _from_zero(placement: dict, routes: dict) -> tuple[dict, dict]:
    """The mapping with its first operation at cycle 0 (every slot turns alike: capacities hold)."""
    shift = min(t for _, t in placement.values())
    return ({name: (pe, t - shift) for name, (pe, t) in placement.items()},
            {key: [(pe, c - shift) for pe, c in chain] for key, chain in routes.items()})


def _decode(graph, ii: int, var, solver):
    """The solution as the heuristic's placement and routes."""
    placement = {name: (pe, t) for (name, pe, t), issue in var.issue.items() if solver.boolean_value(issue)}
    before: dict = {}  # (value, state) -> the state it came from (None where it lands)
    routes = {}
    for node in graph.nodes:
        pe, t = placement[node.name]
        for index, operand in enumerate(node.operands):
            chain, state = [], (pe, t + operand.distance * ii)
            while state is not None:
                chain.append(state)
                if (operand.source, state) not in before:
                    before[(operand.source, state)] = _predecessor(var, solver, operand.source, state)
                state = before[(operand.source, state)]
            routes[(node.name, index)] = chain[::-1]
    return placement, routes


def _predecessor(var, solver, value, state):
    """Where the value held at `state` was the cycle before (None: it lands there): the model
    guarantees it landed, was kept or moved from a neighbour."""
    pe, c = state
    landed = var.landing.get((value, pe, c))
    if landed is not None and solver.boolean_value(landed):
        return None
    kept = var.held.get((value, pe, c - 1))
    if kept is not None and solver.boolean_value(kept):
        return pe, c - 1
    for source, move in var.arrivals[(value, pe, c)]:
        if solver.boolean_value(move):
            return source, c - 1
    raise RuntimeError(f"the solution holds {value} at {state} with no way there")  # a bug of the model
