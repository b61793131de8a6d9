"""The PE array as a CGRA fabric: what each PE can do, how PEs are wired, what a configuration holds.

Stage: shared (the hardware description's `fabric` table; the mapper, mapping/, and the
cycle-level array simulator read it). In: the table from the chip's JSON, or nothing (then
`default_fabric`); out: a checked `Fabric` with its interconnect as neighbour lists.

The table (docs/mapping.md says how the mapper uses each field):

    topology          "mesh" (links to the 4 neighbours), "torus" (a mesh whose edges wrap
                      around) or "hycube" (a mesh whose crossbars pass a value up to
                      `hops_per_cycle` PEs along a row or a column in one cycle, as HyCUBE's do)
    hops_per_cycle    PEs a value may travel in one cycle along a row or a column (hycube only; 1 otherwise)
    registers         registers of each PE's register file: values waiting for their consumer
    memory_ports      which PEs reach the scratchpad (load, store): "left" column, "border" or "all"
    multipliers       which PEs have a multiplier: "all", or "checkerboard" (half of them)
    latency           cycles per operation class: alu (add, sub, max, min, shifts, compare),
                      mul (multiply), mem (load, store)
    context_depth     configuration slots a PE's context memory holds: the largest II a mapping may
                      use, and what the timing keeps resident (GEMM 1 slot, a FABRIC body II)
    config_word_bits  bits of one PE's configuration for one time slot

A PE runs one operation per cycle (pipelined: a new one every cycle whatever its latency); its
result lands in its own register file; in one cycle a value moves over one link (or up to
`hops_per_cycle` on a hycube row or column) into the next PE's register file.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Mapping

TOPOLOGIES = ("mesh", "torus", "hycube")
MEMORY_PORTS = ("left", "border", "all")
MULTIPLIERS = ("all", "checkerboard")
OP_CLASSES = ("alu", "mul", "mem")
KEYS = ("topology", "hops_per_cycle", "registers", "memory_ports", "multipliers", "latency", "context_depth",
        "config_word_bits")
MAX_LATENCY = 16


def default_fabric() -> dict:
    """The fabric of a chip whose description gives none: a mesh of PEs that all multiply, four
    registers each, the left column on the scratchpad, one-cycle ALUs and memory, two-cycle
    multipliers, 32 contexts of 64 bits (this project's defaults, in the range of HyCUBE's and
    CGRA-ME's example architectures)."""
    return {"topology": "mesh", "hops_per_cycle": 1, "registers": 4, "memory_ports": "left",
            "multipliers": "all", "latency": {"alu": 1, "mul": 2, "mem": 1}, "context_depth": 32,
            "config_word_bits": 64}


def check_fabric(table) -> str | None:
    """What is wrong with a fabric table (None if nothing)."""
    if not isinstance(table, dict):
        return f"'fabric' must be an object, got {type(table).__name__}"
    if set(table) != set(KEYS):
        missing, unknown = sorted(set(KEYS) - set(table)), sorted(set(table) - set(KEYS))
        return f"'fabric' must have the keys {list(KEYS)} (missing {missing}, unknown {unknown})"
    for key, allowed in (("topology", TOPOLOGIES), ("memory_ports", MEMORY_PORTS), ("multipliers", MULTIPLIERS)):
        if table[key] not in allowed:
            return f"fabric['{key}'] must be one of {list(allowed)}, got {table[key]!r}"
    for key, low, high in (("hops_per_cycle", 1, 64), ("registers", 1, 256), ("context_depth", 1, 1024),
                           ("config_word_bits", 1, 4096)):
        value = table[key]
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            return f"fabric['{key}'] must be an integer from {low} to {high}, got {value!r}"
    if table["hops_per_cycle"] > 1 and table["topology"] != "hycube":
        return "fabric['hops_per_cycle'] above 1 needs the 'hycube' topology (a mesh moves a value one PE a cycle)"
    latency = table["latency"]
    if not isinstance(latency, dict) or set(latency) != set(OP_CLASSES):
        return f"fabric['latency'] must give cycles for each of {list(OP_CLASSES)}, got {latency!r}"
    for name, value in latency.items():
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_LATENCY:
            return f"fabric['latency']['{name}'] must be an integer from 1 to {MAX_LATENCY}, got {value!r}"
    return None


@dataclasses.dataclass(frozen=True)
class Fabric:
    """A rows x cols CGRA fabric; PEs are numbered row-major (pe = row * cols + col)."""

    rows: int
    cols: int
    topology: str = "mesh"
    hops_per_cycle: int = 1
    registers: int = 4
    memory_ports: str = "left"
    multipliers: str = "all"
    latency: Mapping[str, int] = dataclasses.field(default_factory=lambda: dict(default_fabric()["latency"]),
                                                   hash=False)
    context_depth: int = 32
    config_word_bits: int = 64
    # A corner of a larger fabric (sub_fabric): that fabric's (rows, cols), whose border holds the
    # memory ports when they are on the border (the corner's own last row and column have none);
    # () for a whole fabric.
    within: tuple = ()

    def __post_init__(self):
        problem = check_fabric(self.table())
        if problem:
            raise ValueError(problem)
        if not (isinstance(self.rows, int) and isinstance(self.cols, int) and self.rows > 0 and self.cols > 0):
            raise ValueError(f"a fabric needs positive rows and cols, got {self.rows} x {self.cols}")
        object.__setattr__(self, "latency", dict(sorted(self.latency.items())))

    @classmethod
    def of(cls, arch) -> "Fabric":
        """The fabric of a HardwareDescription."""
        return cls(arch.rows, arch.cols, **arch.fabric)

    def table(self) -> dict:
        return {key: getattr(self, key) for key in KEYS}

    @property
    def num_pes(self) -> int:
        return self.rows * self.cols

    @property
    def fingerprint(self) -> str:
        within = {"within": list(self.within)} if self.within else {}
        text = json.dumps({"rows": self.rows, "cols": self.cols, **self.table(), **within}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def position(self, pe: int) -> tuple[int, int]:
        return divmod(pe, self.cols)

    def can_run(self, pe: int, op_class: str) -> bool:
        return self._units[op_class][pe]

    @functools.cached_property
    def _units(self) -> dict[str, tuple[bool, ...]]:
        """Per operation class, whether each PE can run it (the mapper asks millions of times)."""
        return {op_class: tuple(self._can_run(pe, op_class) for pe in range(self.num_pes)) for op_class in OP_CLASSES}

    def _can_run(self, pe: int, op_class: str) -> bool:
        row, col = self.position(pe)
        if op_class == "mem":
            if self.memory_ports == "all":
                return True
            if self.memory_ports == "left":
                return col == 0
            rows, cols = self.within or (self.rows, self.cols)
            return row in (0, rows - 1) or col in (0, cols - 1)
        if op_class == "mul" and self.multipliers == "checkerboard":
            return (row + col) % 2 == 0
        return True

    def units(self, op_class: str) -> int:
        """PEs that can run `op_class`."""
        return sum(self.can_run(pe, op_class) for pe in range(self.num_pes))

    def neighbours(self, pe: int) -> tuple[int, ...]:
        """PEs a value in `pe`'s register file reaches in one cycle (itself excluded)."""
        return _neighbours(self.rows, self.cols, self.topology, self.hops_per_cycle)[pe]

    def hops(self, source: int, dest: int) -> int:
        """Cycles a value needs to move from `source`'s register file to `dest`'s."""
        return self._hop_table[source][dest]

    @functools.cached_property
    def _hop_table(self) -> tuple[tuple[int, ...], ...]:
        """hops(source, dest) for every pair (the mapper asks millions of times)."""
        return _distances(self.rows, self.cols, self.topology, self.hops_per_cycle)

    def sub_fabric(self, rows: int, cols: int) -> "Fabric":
        """The top-left `rows` x `cols` corner as a fabric of its own, every link and unit of it
        one of this fabric's: a mesh's and a hycube's corner is a mesh or hycube; a torus's is a
        mesh (its wrap-around links are not there); memory ports on the border stay where this
        fabric's border is (`within`)."""
        if (rows, cols) == (self.rows, self.cols):
            return self
        topology = "mesh" if self.topology == "torus" else self.topology
        return dataclasses.replace(self, rows=rows, cols=cols, topology=topology,
                                   within=self.within or (self.rows, self.cols))


@functools.cache
def _neighbours(rows: int, cols: int, topology: str, hops: int) -> list[tuple[int, ...]]:
    table = []
    for pe in range(rows * cols):
        row, col = divmod(pe, cols)
        found = []
        for d_row, d_col in ((0, 1), (1, 0), (0, -1), (-1, 0)):
            for step in range(1, hops + 1):
                r, c = row + d_row * step, col + d_col * step
                if topology == "torus":
                    r, c = r % rows, c % cols
                if 0 <= r < rows and 0 <= c < cols and (r, c) != (row, col):
                    found.append(r * cols + c)
        table.append(tuple(dict.fromkeys(found)))
    return table


@functools.cache
def _distances(rows: int, cols: int, topology: str, hops: int) -> tuple[tuple[int, ...], ...]:
    """Moves between every pair of PEs (breadth-first over the neighbour lists)."""
    table = _neighbours(rows, cols, topology, hops)
    result = []
    for source in range(rows * cols):
        seen, frontier, step = {source: 0}, [source], 0
        while frontier:
            step += 1
            reached = []
            for pe in frontier:
                for other in table[pe]:
                    if other not in seen:
                        seen[other] = step
                        reached.append(other)
            frontier = reached
        result.append(tuple(seen.get(pe, rows * cols) for pe in range(rows * cols)))
    return tuple(result)
