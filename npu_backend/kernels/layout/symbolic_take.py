"""A lookup of a symbolic number of indices: an embedding of a prompt of any length.

Stage: partition (layout.py's spec reader calls `symbolic_take_parts` for a take with a symbolic
dimension). In: take(table, indices) with a static table and 1-D indices of symbolic length n
(a prefill's token ids). Out: the lookup's Gather (its count at the bound, which sizes its tiles)
and the symbolic axes of the kernel's shapes and of the caller's: the indices' axis 0 and the
kernel's output (P, n, Q) axis 1. The kernel (copy_kernel._gather_lines) runs a first tile of
`head` rows, then ceildiv(n - head, rows) tiles, of one DMA box per row that exists (a row past
n loads nothing), its stores cut to n (lower/ragged.py).

Why: the embedding lookup of a model compiled for any length ran on the host (4.8 k of the 11 k
host cycles of a Llama prefill of 16 tokens on cgra-8x8).
"""

from __future__ import annotations

import dataclasses

from ...errors import UnsupportedOperator
from .copy_kernel import budget_of, gather_rows, pipeline_cycles


def symbolic_take_parts(call, in_shapes, out_shape, names: dict, read_take) -> tuple:
    """(gather, views, symbols, caller symbols) of a take of `names`' symbolic indices (layout.py's
    `_take` reads the rest as for static shapes); raises UnsupportedOperator for another form."""
    if names.get("lhs") or len(in_shapes[1][1]) != 1 or set(names.get("rhs", {})) != {0}:
        raise UnsupportedOperator("take with a symbolic dimension: the NPU's lookup takes a static table and one "
                                  "axis of indices of symbolic length")
    _, gather, views = read_take(call, in_shapes, out_shape)
    if gather.scalar or gather.constants is not None:
        raise UnsupportedOperator("take of a symbolic number of constant indices")
    name = names["rhs"][0]
    axis = 0 if call.attrs.axis is None else int(call.attrs.axis) % len(in_shapes[0][1])
    if names.get("out") != {axis: name}:
        raise UnsupportedOperator(f"take's result has symbolic axes {names.get('out')}, not its indices' at {axis}")
    symbols = (("rhs", 0, name), ("out", 1, name))
    callers = (("rhs", 0, name), ("out", axis, name))
    return gather, views, symbols, callers


def symbolic_gather_rows(arch, gather, itemsize: int) -> tuple[int, int, int]:
    """(rows per tile, rows of the first tile (0: none), estimated cycles at the bound) of a
    lookup of a symbolic number of indices (`gather.count` its bound): a box per row that
    exists, the pair of least worst regret over the counts 1, 2, 4, ..., the bound against the
    rows best for each count (copy_kernel.gather_rows). A first tile smaller than the others
    (its own buffer) lets a short prompt's store start after a few loads while a long one
    streams large tiles: on cgra-8x8 (64 floats a row) 8 then 32 rows run 544 cycles at 16
    tokens, 2,880 at 128 (the static kernels' figures), where 16 rows alone ran 672 and 2,944."""
    (p, _, q), bound = gather.table, gather.count
    row = p * q * itemsize

    def cycles(rows: int, head: int, count: int) -> int:
        first = min(head, count)
        whole, rest = divmod(count - first, rows)
        tiles = ([(1, (row,) * first, first * row)] if first else []) + [(0, (row,) * rows, rows * row)] * whole + \
            ([(0, (row,) * rest, rest * row)] if rest else [])
        return pipeline_cycles(arch, tiles)

    counts = sorted({min(2 ** k, bound) for k in range(bound.bit_length() + 1)})
    best = [gather_rows(arch, dataclasses.replace(gather, count=count), itemsize)[1] for count in counts]
    budget = budget_of(arch)
    candidates = [(rows, head) for rows in range(1, bound + 1) if rows * row <= budget and rows & (rows - 1) == 0
                  for head in [0] + [1 << k for k in range(rows.bit_length() - 1)]]
    rows, head = min(candidates, key=lambda c: (max(cycles(*c, n) / b for n, b in zip(counts, best)), -c[0], c[1]))
    return rows, head, cycles(rows, head, bound)
