"""Where on the fabric the solver looks: corners, and tiles that repeat a graph's identical parts.

Stage: mapping (the solver's regions; solver.py solves on them). In: a `DataflowGraph`, a `Fabric`
and an II. Out: `Tiling`s, smallest first: a corner of the fabric (a tile) on which the solver
maps `per_tile` of the graph's parts, and the offsets (whole tiles apart) where that mapping is
copied for the other parts; `place` turns the tile's mapping into the whole graph's.

Why: the time-expanded model grows with PEs x cycles x operations, so a 16x16 fabric is far too
large to solve whole, and CP-SAT does not find the mapping of a FABRIC body's 16 lanes on it in
any reasonable budget. But a small graph needs only a corner (its links are links of the fabric,
as the heuristic's corners), and an unrolled body is the same part many times over: mapped once on
a tile (a row with its memory port for a streaming lane), it is valid at every offset where the
fabric looks the same (the same operations run on the same PEs of the tile; mesh, torus and hycube
links are the same everywhere inside a tile), since tiles share no PE, register or link. Parts
fewer than the tiles leave some copies out, which only frees resources.
"""

from __future__ import annotations

import dataclasses

from ..fabric import OP_CLASSES
from .dfg import DataflowGraph, res_mii

#: A tile's slots (PEs x II) per operation it must map, at least (below that routing rarely fits).
ROOM = 1.5
#: Fabrics up to this many PEs are solved whole (their models are small enough).
WHOLE_FABRIC = 36


@dataclasses.dataclass(frozen=True)
class Tiling:
    tile: object  # the Fabric the solver maps on: a corner of the fabric, or the fabric itself
    graph: DataflowGraph  # the parts mapped on the tile
    copies: tuple  # for each tile offset (row, col) used, the parts ([[node names]]) copied there
    region: object  # the corner of the fabric the tiles cover: the mapping's fabric

    def place(self, placement: dict, routes: dict) -> tuple[dict, dict]:
        """The tile's placement and routes copied to every offset, on the region's PE numbers."""
        names = [node.name for node in self.graph.nodes]
        all_placement, all_routes = {}, {}
        for (row, col), parts in self.copies:
            rename = dict(zip(names, (name for part in parts for name in part)))
            pe = self._mover(row, col)
            for name, (at, t) in placement.items():
                if name in rename:
                    all_placement[rename[name]] = (pe(at), t)
            for (reader, index), chain in routes.items():
                if reader in rename:
                    all_routes[(rename[reader], index)] = [(pe(at), c) for at, c in chain]
        return all_placement, all_routes

    def _mover(self, row: int, col: int):
        tile, region = self.tile, self.region

        def move(pe):
            r, c = tile.position(pe)
            return (row + r) * region.cols + col + c

        return move


def tilings(graph: DataflowGraph, fabric, ii: int) -> list[Tiling]:
    """The tilings worth a try, smallest first: the fewest PEs per part (the most compact
    mapping), then each at least twice as roomy as the last, then the whole fabric."""
    parts = _parts(graph)
    if fabric.num_pes <= WHOLE_FABRIC:
        return [whole(graph, fabric)]
    candidates = []
    for rows in range(1, fabric.rows + 1):
        for cols in range(1, fabric.cols + 1):
            if (rows, cols) != (fabric.rows, fabric.cols):
                found = _tiling(graph, parts, fabric, rows, cols, ii)
                if found is not None:
                    per_part = rows * cols / len(found.copies[0][1])
                    candidates.append(((per_part, rows * cols, abs(rows - cols), rows), found))
    chosen, room = [], 0.0
    for (per_part, *_), found in sorted(candidates, key=lambda c: c[0]):
        if per_part >= room:
            chosen.append(found)
            room = 2 * per_part
    return chosen[:3] + [whole(graph, fabric)]


def whole(graph, fabric) -> Tiling:
    return Tiling(fabric, graph, (((0, 0), [[n.name for n in graph.nodes]]),), fabric)


def _tiling(graph, parts, fabric, rows: int, cols: int, ii: int) -> Tiling | None:
    """`parts` spread over the rows x cols tiles that look like the corner one, as few per tile
    as fit; None when they do not fit (units, slots) or there is no such tile."""
    tile = fabric.sub_fabric(rows, cols)
    offsets = [(row, col) for row in range(0, fabric.rows - rows + 1, rows)
               for col in range(0, fabric.cols - cols + 1, cols) if _agrees(tile, fabric, row, col)]
    if not offsets:  # (a corner of a fabric with memory ports on its border has ports of its own)
        return None
    per_tile = -(-len(parts) // len(offsets))
    nodes = [node for part in parts[:per_tile] for node in part]
    if rows * cols * ii < ROOM * len(nodes):
        return None
    sub = graph if per_tile == len(parts) else DataflowGraph(graph.name, tuple(nodes), graph.dtype)
    try:
        if res_mii(sub, tile) > ii:
            return None
    except ValueError:  # the tile lacks a kind of unit
        return None
    copies = [(offsets[i], [[node.name for node in part] for part in parts[i * per_tile:(i + 1) * per_tile]])
              for i in range(-(-len(parts) // per_tile))]
    height = max(row for (row, _), _ in copies) + rows
    width = max(col for (_, col), _ in copies) + cols
    corner = fabric.sub_fabric(height, width)
    # The mapping's fabric: the corner the tiles cover, when its PEs are the fabric's (else the fabric).
    region = corner if (height, width) != (fabric.rows, fabric.cols) and _agrees(corner, fabric, 0, 0) else fabric
    return Tiling(tile, sub, tuple(copies), region)


def _agrees(part, fabric, row: int, col: int) -> bool:
    """Whether every PE of `part` placed at (row, col) runs what the fabric's PE there runs."""
    return all(part.can_run(r * part.cols + c, kind) == fabric.can_run((row + r) * fabric.cols + col + c, kind)
               for r in range(part.rows) for c in range(part.cols) for kind in OP_CLASSES)


def _parts(graph: DataflowGraph) -> list[list]:
    """The graph's independent parts (weakly connected) when they are all alike (the same
    operations reading the same positions: an unrolled body's lanes), else the graph as one."""
    group = {node.name: node.name for node in graph.nodes}

    def root(name):
        while group[name] != name:
            group[name] = group[group[name]]
            name = group[name]
        return name

    for source, dest, _, _ in graph.edges():
        group[root(source)] = root(dest)
    parts: dict[str, list] = {}
    for node in graph.nodes:
        parts.setdefault(root(node.name), []).append(node)
    found = list(parts.values())
    if len({_shape(part) for part in found}) != 1:
        return [list(graph.nodes)]
    return found


def _shape(part) -> tuple:
    """What the mapper sees of a part: each node's op and, per operand, the position of its
    source in the part and its distance."""
    index = {node.name: i for i, node in enumerate(part)}
    return tuple((node.op, tuple((index[o.source], o.distance) for o in node.operands)) for node in part)
