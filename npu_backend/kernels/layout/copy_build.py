"""copy_kernel.py's kernel of static shapes built with TVM's IR builder: no TVMScript text to parse.

Stage: kernel definition (layout.py's layout_compute). In: what copy_kernel.copy_script takes
(parameters, output shape, pieces or a lookup, the tiling, the output's folded axes), static
shapes only (a symbolic copy is still written as text). Out: the PrimFunc the parser made of
copy_script's text, structurally equal (tests/test_copy_build.py), without the parser's 0.2 s.
Expressions are built as the parser evaluates that text (kernels/attention/prim_build.py).
"""

from __future__ import annotations

import contextlib
import functools
import math

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from ..attention.prim_build import lt, plus
from .copy_kernel import SPAD, Gather, LayoutTiling


def copy_func(params: list, out_shape: tuple, dtype: str, pieces, tiling: LayoutTiling,
              gather: Gather | None = None, groups: tuple = ()):
    """The kernel copy_script(params, out_shape, dtype, pieces, tiling, gather, groups=groups)
    writes, built."""
    with IRBuilder() as builder:
        with T.prim_func():
            T.func_name("copy")
            buffers = {name: T.arg(name, T.Buffer(tuple(shape), kind)) for name, shape, kind in params}
            buffers["out"] = T.arg("out", T.Buffer(tuple(out_shape), dtype))
            T.func_attr({"tirx.noalias": True})
            if gather is not None:
                _gather(buffers, params, dtype, gather, tiling.rows)
            shapes = {name: shape for name, shape, _ in params}
            for index, (piece, split) in enumerate(zip(pieces, tiling.splits)):
                _piece(buffers, index, piece, shapes[piece.role], dtype, split, groups)
    return builder.get()


@contextlib.contextmanager
def _grid(names: list, extents):
    with T.grid(*extents) as variables:
        variables = [variables] if isinstance(variables, tirx.Var) else list(variables)
        for name, var in zip(names, variables):
            IRBuilder.name(name, var)
        yield variables


@contextlib.contextmanager
def _serial(name: str, extent):
    with T.serial(0, extent) as var:
        IRBuilder.name(name, var)
        yield var


def _piece(buffers: dict, index: int, piece, source: tuple, dtype: str, split: tuple, groups: tuple) -> None:
    """copy_kernel._piece_lines' loops, built: per tile a scratchpad buffer, its load and store."""
    extent, (axis, tile) = piece.extent, split
    with contextlib.ExitStack() as loops:
        outer = []
        for a in range(axis):  # one of each axis before the split: a loop, or 0
            outer.append(0 if extent[a] == 1 else loops.enter_context(_serial(f"v{index}_{a}", extent[a])))
        tiles = extent[axis] // tile
        t = loops.enter_context(_serial(f"t{index}", tiles)) if tiles > 1 else None
        box = (tile,) + tuple(extent[axis + 1:])
        names = [f"i{index}_{a}" for a in range(axis, len(extent))]
        spad = T.alloc_buffer(box, dtype, scope=SPAD)
        IRBuilder.name(f"s{index}", spad)
        with _grid(names, box) as inner:
            position = _position(outer, t, tile, inner)
            indices = [_index(origin, d, piece, position) for d, origin in enumerate(piece.origin)]
            load = buffers[piece.role][tuple(indices)]
            tests = [test for d in piece.guarded for test in (_ge(indices[d], 0), lt(indices[d], source[d]))]
            if tests:
                load = T.if_then_else(_all(tests), load, getattr(T, dtype)(0))
            T.buffer_store(spad, load, inner)
        with _grid(names, box) as inner:
            position = _position(outer, t, tile, inner)
            targets = [plus(off, pos) for off, pos in zip(piece.offset, position)]
            T.buffer_store(buffers["out"], spad[tuple(inner)], _folded(targets, extent, groups))


def _position(outer: list, t, tile: int, inner: list) -> list:
    """The output position of the tile's element: the outer loops, the tile's, the box's."""
    return outer + [t * tile + inner[0] if t is not None else inner[0]] + inner[1:]


def _index(origin: int, d: int, piece, position: list):
    """The input's index along axis d: origin + step * (position) of each output axis walking it."""
    terms = [step * position[a] for a, (walked, step) in enumerate(piece.walks) if walked == d and step]
    return functools.reduce(lambda total, term: total + term, terms, origin)


def _folded(targets: list, extent: tuple, groups: tuple) -> list:
    """folds.folded_targets, built."""
    if not groups:
        return targets
    folded, start = [], 0
    for size in groups:
        terms = []
        for axis in range(start, start + size):
            inner = math.prod(extent[axis + 1:start + size])
            terms.append(targets[axis] * inner if inner != 1 else targets[axis])
        folded.append(functools.reduce(lambda total, term: total + term, terms))
        start += size
    return folded


def _ge(a, b):
    if isinstance(a, int):
        return a >= b
    return tirx.GE(a, tirx.IntImm(str(a.ty.dtype), b))


def _all(tests: list):
    """`a and b and ...` as the parser evaluates it: left to right, Python bools in Python."""
    value = tests[0]
    for test in tests[1:]:
        if isinstance(value, bool) and not value:
            return value
        if isinstance(value, bool) and isinstance(test, bool):
            value = value and test
            continue
        value = tirx.And(tirx.IntImm("bool", value) if isinstance(value, bool) else value,
                         tirx.IntImm("bool", test) if isinstance(test, bool) else test)
    return value


def _gather(buffers: dict, params: list, dtype: str, gather: Gather, rows: int) -> None:
    """copy_kernel._gather_lines (static count), built: per tile of rows one box per index."""
    (p, v, q), n = gather.table, gather.count
    table = buffers[params[0][0]]
    indices = buffers[params[1][0]] if gather.constants is None else None
    with _serial("gt", n // rows) as gt:
        looked_up = T.alloc_buffer((p, rows, q), dtype, scope=SPAD)
        IRBuilder.name("looked_up", looked_up)
        for r in range(rows):
            if gather.constants is not None:
                row_index = _constant_rows(gather.constants, rows, r, gt)
            else:
                index = indices[()] if gather.scalar else indices[gt * rows + r]
                row_index = T.min(T.max(T.Cast("int32", index), 0), v - 1)
            with _grid(["ga", "gc"], (p, q)) as (ga, gc):
                T.buffer_store(looked_up, table[ga, row_index, gc], [ga, r, gc])
        with _grid(["ga", "gr", "gc"], (p, rows, q)) as (ga, gr, gc):
            T.buffer_store(buffers["out"], looked_up[ga, gr, gc], [ga, gt * rows + gr, gc])


def _constant_rows(constants: tuple, rows: int, r: int, gt):
    """copy_kernel._constant_rows, built."""
    values = [constants[t * rows + r] for t in range(len(constants) // rows)]
    if len(values) == 1:
        return values[0]
    if len(values) > 1 and all(b - a == values[1] - values[0] for a, b in zip(values, values[1:])):
        return values[0] + (values[1] - values[0]) * gt
    expression = values[-1]
    for t in range(len(values) - 2, -1, -1):
        expression = T.Select(tirx.EQ(gt, tirx.IntImm(str(gt.ty.dtype), t)), values[t], expression)
    return expression
