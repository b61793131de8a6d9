"""Copies that walk more axes than the DMA's tensors have: each tensor seen through a view of at
most four, the copy's axes kept.

Stage: partition (layout.py's spec of a one-input copy, after `compact` merged the axes it moves
alike). A DMA command (docs/command-stream.md) addresses a tensor of rank 1..4 and walks a box of
4 loops, each loop along one tensor dimension at a step; two loops may walk the same dimension.
So a transpose whose axes cannot be merged (a window partition composed with the transpose before
it: 5 to 8 axes) keeps its axes as the copy's loops, and only its tensors are viewed with fewer:

- the input: two neighbouring axes d, d + 1 (neither padded: no halo along them) are one axis of
  e_d * e_{d+1} elements; an output axis walking d at step s walks it at s * e_{d+1}, one
  walking d + 1 at s, the origin o_d * e_{d+1} + o_{d+1} (`fold_input`);
- the output: neighbouring axes grouped into one dimension, each axis's coordinate times the
  extents after it in its group (`fold_output`, `folded_targets`).

Each DMA box of the copy is at most 4 loops (copy_kernel.choose_splits: the axes before its
split are the kernel's control loops; a tile of more axes is a loop of boxes over its innermost
4, lower/dma.py), so each box is one DMA_LOAD and one DMA_STORE of the format the simulator and
the C++ runtime already run: nothing new on the device.
"""

from __future__ import annotations

import dataclasses
import math

from ...errors import UnsupportedOperator

#: The most axes a copy may walk once those it moves alike are merged: Swin's window reverse, patch
#: merging and next window partition composed (normalise/window_sinks.py) walk 8.
MAX_AXES = 8


def fold_input(piece, shape: tuple, rank: int, op: str) -> tuple:
    """(a view of at most `rank` axes of the input `shape`, the copy_kernel.Piece reading it): neighbouring
    unpadded axes merged, innermost first."""
    shape, piece = list(shape), piece
    while len(shape) > rank:
        pairs = [d for d in range(len(shape) - 2, -1, -1) if d not in piece.guarded and d + 1 not in piece.guarded]
        if not pairs:
            raise UnsupportedOperator(f"{op} of {tuple(shape)}: padded along too many of its axes to view it with "
                                      f"{rank}, and the NPU's DMA moves tensors of rank 1..{rank}")
        d = pairs[0]
        inner = shape[d + 1]

        def moved(walk, d=d, inner=inner):
            source, step = walk
            if source == d:
                return d, step * inner
            return (source - 1, step) if source > d else walk

        origin = piece.origin
        piece = dataclasses.replace(piece, walks=tuple(moved(w) for w in piece.walks),
                                    origin=origin[:d] + (origin[d] * inner + origin[d + 1],) + origin[d + 2:],
                                    guarded=tuple(g - 1 if g > d else g for g in piece.guarded))
        shape[d:d + 2] = [shape[d] * inner]
    return tuple(shape), piece


def fold_output(shape: tuple, rank: int) -> tuple[tuple, tuple]:
    """(a view of at most `rank` axes of the output `shape`, the number of the copy's axes in each
    of its dimensions): the leading axes grouped into its first dimension."""
    if len(shape) <= rank:
        return tuple(shape), ()
    first = len(shape) - rank + 1
    return (math.prod(shape[:first]), *shape[first:]), (first,) + (1,) * (rank - 1)


def folded_targets(targets: list, extent: tuple, groups: tuple) -> list:
    """The output view's coordinates (copy_kernel's TVMScript) of the copy's `targets`, one per
    axis of `extent`, grouped as `fold_output` said (no `groups`: as they are)."""
    if not groups:
        return targets
    folded, start = [], 0
    for size in groups:
        terms = []
        for axis in range(start, start + size):
            inner = math.prod(extent[axis + 1:start + size])
            terms.append(f"({targets[axis]}) * {inner}" if inner != 1 else f"({targets[axis]})")
        folded.append(" + ".join(terms))
        start += size
    return folded
