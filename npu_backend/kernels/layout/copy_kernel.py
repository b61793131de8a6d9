"""DMA-only copy kernels: each output tile read by DMA boxes into the scratchpad, then stored.

Stage: kernel definition (the layout family's compute; layout.py reads the ops into pieces).
A layout op (a transpose, a slice, a broadcast, a concatenation, a pad, an embedding lookup)
moves elements without arithmetic, so its kernel is DMA only: per tile of the output, a
DMA_LOAD whose box walks the input with the op's strides (a permuted axis order, a slice's
origin and step, a broadcast axis at step 0, a pad's halo filled with zeros) into a scratchpad
tile laid out as the output, and one DMA_STORE of the tile. A concatenation is one such piece
per input, each storing into its region of the output; a lookup (`take`) loads one box per index
read by the kernel's control code (the PrimFunc lists the indices in `cgra.read_params`: the
code generator lets the control code read that parameter, codegen/cgra_codegen/entry.py).

The kernel is written as lowered TIR (TVMScript text, no blocks to schedule): the DMA pass
(lower/dma.py) turns each copy nest into one box, double buffering overlaps a tile's load with the
store of the one before.
"""

from __future__ import annotations

import dataclasses
import math

import tvm

from cgra_sim.isa import BOX_DIMS

from ...errors import ScratchpadTooSmall
from .folds import folded_targets

SPAD = "global.cgra_spad"
#: The largest tile: at most a quarter of the scratchpad (each tile double-buffered, with room).
TILE_BYTES = 64 * 1024
#: The most tiles a piece is cut into (the tile search simulates each; more would be tiny boxes).
MAX_TILES = 4096


@dataclasses.dataclass(frozen=True)
class Piece:
    """One input's part of the output: out[offset + o] = input[origin + sum of o's walks], for o
    in `extent`. `walks[a]`: (the input axis output axis a walks, or -1 for none; its step).
    `guarded`: the input axes a pad may leave (their copies are guarded, the DMA halo zero)."""

    role: str
    offset: tuple
    extent: tuple
    walks: tuple
    origin: tuple
    guarded: tuple = ()


@dataclasses.dataclass(frozen=True)
class Gather:
    """A lookup: out (P, N, Q)[p, n, q] = table (P, V, Q)[p, clip(indices[n], 0, V - 1), q]."""

    table: tuple  # (P, V, Q)
    count: int  # N
    scalar: bool = False  # one index, a rank-0 tensor
    constants: tuple | None = None  # constant indices (clipped into the table): origins fixed at compile time


@dataclasses.dataclass(frozen=True)
class LayoutTiling:
    """Per piece (axis s, tile t): tiles of t along axis s and all of the axes after it (one of
    each axis before it); a lookup's rows per tile; the kernel's estimated cycles."""

    splits: tuple = ()
    rows: int = 0
    cycles: int = 0
    head: int = 0  # a symbolic lookup's first tile's rows, before its tiles of `rows` (0: none)


def budget_of(arch) -> int:
    """The bytes a tile may take on `arch`."""
    return min(TILE_BYTES, arch.spad_bytes // 4)


def splits(extent: tuple, itemsize: int, budget: int):
    """Every (axis, tile, tiles, tile bytes) whose tile fits `budget`: t divides extent[axis]."""
    for axis in range(len(extent)):
        inner = math.prod(extent[axis + 1:]) * itemsize
        for tile in range(1, extent[axis] + 1):
            tiles = math.prod(extent[:axis]) * (extent[axis] // tile)
            if extent[axis] % tile == 0 and tile * inner <= budget and tiles <= MAX_TILES:
                yield axis, tile, math.prod(extent[:axis]) * (extent[axis] // tile), tile * inner


def pipeline_cycles(arch, tiles: list) -> int:
    """Cycles of a copy's tiles, [(piece, bytes of each of its loads, bytes of its store)] in issue
    order: DMA_LOADs in order on the load engine, DMA_STOREs on the store engine, each store after
    its tile's loads, each load after the store of its piece's tile two back (the same one of its
    two scratchpad copies): cgra_sim's timing."""
    from cgra_sim import cost
    load_free = store_free = end = 0
    stored = {}  # piece -> ends of its stores
    for piece, loads, store in tiles:
        previous = stored.setdefault(piece, [])
        loaded = 0
        for nbytes in loads:
            start = max(load_free, previous[-2] if len(previous) >= 2 else 0)
            load_free = start + cost.dma_transfer_cycles(arch, nbytes)
            loaded = max(loaded, load_free + arch.dma_latency)
        transfer = cost.dma_transfer_cycles(arch, store)
        store_start = max(store_free, loaded)
        store_free, stored_at = store_start + transfer, store_start + arch.dma_latency + transfer
        end = max(end, stored_at)
        previous.append(stored_at)
    return end


def choose_splits(arch, pieces, itemsize: int, symbolic_axes: tuple = ()) -> tuple[tuple, int]:
    """(per piece the fastest split, the kernel's estimated cycles): each piece's tiles by
    `pipeline_cycles`, then the pieces in turn. With `symbolic_axes` (output axes of a symbolic
    length, held at their bound) only splits at or before the first of them, so that no loop runs
    over the length one row at a time, and of at least an eighth of the budget when there are
    such (timing thousands of small tiles at the bound took seconds per kernel)."""
    budget, chosen = budget_of(arch), []
    for index, piece in enumerate(pieces):
        options = list(splits(piece.extent, itemsize, budget))
        if symbolic_axes:
            # a symbolic copy's tile is one DMA box: at most BOX_DIMS loops (a copy of more axes, folds.py)
            options = [o for o in options if len(piece.extent) - o[0] <= BOX_DIMS]
            options = [o for o in options if o[0] <= min(symbolic_axes)] or options
            options = [o for o in options if o[3] * 8 >= budget] or options
        if not options:
            raise ScratchpadTooSmall(f"a layout copy's last axis of {piece.extent[-1]} elements does not fit a "
                                     f"{budget}-byte tile")
        best = min(options, key=lambda o: (pipeline_cycles(arch, [(index,) + tile_transfers(piece.extent, o)] * o[2]),
                                           -o[3]))
        chosen.append(best)
    cycles = pipeline_cycles(arch, [(index,) + tile_transfers(piece.extent, o)
                                    for index, (piece, o) in enumerate(zip(pieces, chosen)) for _ in range(o[2])])
    return tuple((axis, tile) for axis, tile, _, _ in chosen), cycles


def tile_transfers(extent: tuple, option: tuple) -> tuple:
    """(the bytes of each DMA_LOAD of a tile, the bytes it stores) for a `splits` option: a tile
    of more than BOX_DIMS axes is a loop of boxes over its innermost BOX_DIMS (lower/dma.py),
    each box's load in flight beside the others', so one tile of several boxes pays the DMA's
    latency once where tiles of one box each paid it per box (Swin's window reverse, patch
    merge and partition in one copy of 8 axes: 16 tiles of 1 KiB, two buffers, 2,368 cycles)."""
    axis, tile, _, nbytes = option
    box = (tile,) + tuple(extent[axis + 1:])
    boxes = math.prod(box[:-BOX_DIMS]) if len(box) > BOX_DIMS else 1
    return (nbytes // boxes,) * boxes, nbytes


def gather_rows(arch, gather: Gather, itemsize: int) -> tuple[int, int]:
    """(rows per tile, estimated cycles) of a lookup: one box per row, tiles of whole rows."""
    (p, _, q), n = gather.table, gather.count
    row, budget = p * q * itemsize, budget_of(arch)
    if row > budget:
        raise ScratchpadTooSmall(f"an embedding row of {row} bytes does not fit a {budget}-byte tile")
    tiles = {rows: pipeline_cycles(arch, [(0, (row,) * rows, rows * row)] * (n // rows))
             for rows in range(1, n + 1) if n % rows == 0 and rows * row <= budget}
    rows = min(tiles, key=lambda r: (tiles[r], -r))
    return rows, tiles[rows]


def copy_script(params: list, out_shape: tuple, dtype: str, pieces, tiling: LayoutTiling,
                gather: Gather | None = None, symbolic: dict | None = None, groups: tuple = ()) -> str:
    """The TVMScript of the kernel: `params` [(name, shape, dtype)] then `out`; `pieces` (or one
    `gather`) say what each tile copies, `tiling` in what tiles. `symbolic` {(name or "out",
    axis): variable name}: those axes are the variable (int32, bound from the tensor), the other
    shapes hold them at their bound; a tile loop along one runs ceildiv(length, tile) tiles, whose
    last one lower/ragged.py cuts. `groups`: the pieces' axes in each dimension of `out_shape`
    (folds.fold_output: a view of fewer axes than the pieces walk)."""
    symbolic = symbolic or {}
    if symbolic:
        return _symbolic_script(params, out_shape, dtype, pieces, tiling, symbolic, gather)
    args = ", ".join(f"{name}: T.Buffer({_tuple(shape)}, \"{kind}\")" for name, shape, kind in params)
    lines = ["@T.prim_func", f"def copy({args}, out: T.Buffer({_tuple(out_shape)}, \"{dtype}\")):",
             "    T.func_attr({\"tirx.noalias\": True})"]
    if gather is not None:
        lines += _gather_lines(params, dtype, gather, tiling.rows)
    for index, (piece, split) in enumerate(zip(pieces, tiling.splits)):
        source = dict((name, shape) for name, shape, _ in params)[piece.role]
        lines += _piece_lines(index, piece, source, dtype, split, groups=groups)
    return "\n".join(lines) + "\n"


def _symbolic_script(params: list, out_shape: tuple, dtype: str, pieces, tiling: LayoutTiling, symbolic: dict,
                     gather: Gather | None = None) -> str:
    """copy_script's text for shapes with symbolic axes: the buffers matched from handles, each
    variable declared once; a lookup of a symbolic number of indices (`gather`, its count the
    indices' axis 0)."""
    tensors = [(name, shape, kind) for name, shape, kind in params] + [("out", out_shape, dtype)]
    handles = ", ".join(f"{name}_handle: T.handle" for name, _, _ in tensors)
    lines = ["@T.prim_func", f"def copy({handles}):", "    T.func_attr({\"tirx.noalias\": True})"]
    lines += [f"    {name} = T.int32()" for name in sorted(set(symbolic.values()))]
    for name, shape, kind in tensors:
        extents = [symbolic.get((name, axis), extent) for axis, extent in enumerate(shape)]
        lines.append(f"    {name} = T.match_buffer({name}_handle, ({', '.join(map(str, extents))},), \"{kind}\")")
    if gather is not None:
        lines += _gather_lines(params, dtype, gather, tiling.rows, symbolic[("rhs", 0)], tiling.head)
    for index, (piece, split) in enumerate(zip(pieces, tiling.splits)):
        source = dict((name, shape) for name, shape, _ in params)[piece.role]
        lines += _piece_lines(index, piece, source, dtype, split, symbolic)
    return "\n".join(lines) + "\n"


def _tuple(values) -> str:
    return "(" + ", ".join(str(int(v)) for v in values) + ("," if len(values) == 1 else "") + ")" if values else "()"


def _piece_lines(index: int, piece: Piece, source: tuple, dtype: str, split: tuple, variables: dict | None = None,
                 groups: tuple = ()) -> list:
    """One piece's tile loops: per tile a scratchpad buffer, its load nest and its store nest
    (`variables` {(tensor, axis): variable}: loops over the output's run to the variable, in whole
    tiles, and the copies along them are guarded by the variable: the DMA's halo)."""
    extent, (axis, tile) = piece.extent, split
    variables = variables or {}
    symbolic = {a: var for (role, a), var in variables.items() if role == "out"}
    indent, lines, position = "    ", [], []
    for a in range(axis):  # one of each axis before the split: a loop, or 0
        if extent[a] == 1 and a not in symbolic:
            position.append("0")
            continue
        lines.append(f"{indent}for v{index}_{a} in range({symbolic.get(a, extent[a])}):")
        indent += "    "
        position.append(f"v{index}_{a}")
    tiles = extent[axis] // tile
    if axis in symbolic:
        tiles = f"T.floordiv({symbolic[axis]} + {tile - 1}, {tile})"
        lines.append(f"{indent}for t{index} in range({tiles}):")
        indent += "    "
    elif tiles > 1:
        lines.append(f"{indent}for t{index} in range({tiles}):")
        indent += "    "
    box = (tile,) + tuple(extent[axis + 1:])
    names = [f"i{index}_{a}" for a in range(axis, len(extent))]
    position.append(f"t{index} * {tile} + {names[0]}" if axis in symbolic or tiles > 1 else names[0])
    position += names[1:]
    spad = f"s{index}"
    lines.append(f"{indent}{spad} = T.alloc_buffer({_tuple(box)}, \"{dtype}\", scope=\"{SPAD}\")")
    grid = f"for {', '.join(names)} in T.grid({', '.join(str(e) for e in box)}):"
    indices = []
    for d, origin in enumerate(piece.origin):
        terms = [str(origin)] + [f"{step} * ({position[a]})" for a, (walked, step) in enumerate(piece.walks)
                                 if walked == d and step]
        indices.append(" + ".join(terms))
    load = f"{piece.role}[{', '.join(indices)}]"
    tests = [f"{indices[d]} >= 0 and {indices[d]} < {source[d]}" for d in piece.guarded]
    tests += [f"{indices[d]} < {var}" for (role, d), var in sorted(variables.items()) if role == piece.role]
    if tests:
        load = f"T.if_then_else({' and '.join(tests)}, {load}, T.{dtype}(0))"
    lines += [f"{indent}{grid}", f"{indent}    {spad}[{', '.join(names)}] = {load}"]
    targets = [f"{off} + {pos}" for off, pos in zip(piece.offset, position)]
    store = f"out[{', '.join(folded_targets(targets, piece.extent, groups))}] = {spad}[{', '.join(names)}]"
    inside = [f"{targets[a]} < {var}" for a, var in sorted(symbolic.items())]
    lines += [f"{indent}{grid}"]
    lines += [f"{indent}    if {' and '.join(inside)}:", f"{indent}        {store}"] if inside else [f"{indent}    {store}"]
    return lines


def _gather_lines(params: list, dtype: str, gather: Gather, rows: int, count: str | None = None,
                  head: int = 0) -> list:
    """Tiles of rows: per index one box of the table's row into the tile, then one store. A
    symbolic `count` (its variable): ceildiv(count, rows) tiles, the last one loading only the
    rows inside the count (lower/ragged.py cuts its store to the count); with a `head`, a first
    tile of that many rows (its own buffer), then ceildiv(count - head, rows) tiles after it."""
    n = gather.count
    if count and head:
        return ["    for gh in range(1):"] + _gather_tile(params, dtype, gather, head, count, "0", "looked_up_head") + \
            [f"    for gt in range(T.floordiv({count} + {rows - 1 - head}, {rows})):"] + \
            _gather_tile(params, dtype, gather, rows, count, f"{head} + gt * {rows}", "looked_up")
    tiles = f"T.floordiv({count} + {rows - 1}, {rows})" if count else n // rows
    return [f"    for gt in range({tiles}):"] + _gather_tile(params, dtype, gather, rows, count, f"gt * {rows}",
                                                            "looked_up")


def _gather_tile(params: list, dtype: str, gather: Gather, rows: int, count, origin: str, buffer: str) -> list:
    """The body of one tile of `rows` rows from output row `origin` (an expression): its buffer,
    a load per row (with a `count`, a row past it loads nothing; row 0 of a tile always exists)
    and the store of the rows inside the count."""
    (p, v, q) = gather.table
    indices = params[1][0] if gather.constants is None else None
    lines = [f"        {buffer} = T.alloc_buffer(({p}, {rows}, {q}), \"{dtype}\", scope=\"{SPAD}\")"]
    for r in range(rows):
        index = f"{indices}[()]" if gather.scalar else f"{indices}[{origin} + {r}]"
        row_index = f"T.min(T.max(T.Cast(\"int32\", {index}), 0), {v - 1})"
        if gather.constants is not None:  # the row of each tile's r-th index, chosen by the tile loop
            row_index = _constant_rows(gather.constants, rows, r)
        load = [f"for ga, gc in T.grid({p}, {q}):",
                f"    {buffer}[ga, {r}, gc] = {params[0][0]}[ga, {row_index}, gc]"]
        if count and r:
            load = [f"if {origin} + {r} < {count}:"] + ["    " + line for line in load]
        lines += ["        " + line for line in load]
    store = f"out[ga, {origin} + gr, gc] = {buffer}[ga, gr, gc]"
    lines += [f"        for ga, gr, gc in T.grid({p}, {rows}, {q}):"]
    lines += [f"            if {origin} + gr < {count}:", f"                {store}"] if count else [f"            {store}"]
    return lines


def _constant_rows(constants: tuple, rows: int, r: int) -> str:
    """The table row of index gt * rows + r, gt the tile loop, as an expression of gt (constant
    indices: the box's origin is known when compiling)."""
    values = [constants[t * rows + r] for t in range(len(constants) // rows)]
    if len(values) == 1:
        return str(values[0])
    if len(values) > 1 and all(b - a == values[1] - values[0] for a, b in zip(values, values[1:])):
        return f"{values[0]} + {values[1] - values[0]} * gt"
    expression = str(values[-1])
    for t in range(len(values) - 2, -1, -1):
        expression = f"T.Select(gt == {t}, {values[t]}, {expression})"
    return expression


def parse_script(text: str):
    """The PrimFunc of `copy_script`'s text."""
    from tvm.script import tirx as T  # noqa: F401 (the script's T)
    return tvm.script.from_source(text)
