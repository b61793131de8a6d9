"""The vector unit's function unit: a pipelined datapath for VFUNC's special functions.

Stage: shared (the hardware description's `function_unit` table; cost.vfunc_cycles times a
VFUNC with it, area.py prices it). In: the table and a VFUNC's function, scale and offset; out:
its pipeline depth and whether the unit runs it. No tvm.

The table (docs/hardware-description.md, "The function unit"):

    lanes       function pipelines, each taking one element a cycle (at most `vector_lanes`: the
                lanes' read port feeds them)
    functions   the VFUNC functions (special.OPS's names) it has

Each pipeline is one stage per operation of the function's float32 sequence (special.py: the
same operations, in the same order, with the same roundings as the lanes run; a divide or
square root 4 stages, as special.OPS counts them), and one stage each for VFUNC's scale and
offset. A function's depth is the length of its sequence; the pipeline has as many stages as
the longest sequence it has (GELU's 85, + 2). A VFUNC over n elements then takes
ceil(n / lanes) cycles once the pipe is full, plus its fill of depth - 1 cycles
(cost.vfunc_cycles); the vector unit is busy only for the ceil(n / lanes) cycles of the issue
(cost.vfunc_issue_cycles), so the next command, a VFUNC into the same pipelines too, starts
while the last elements are still in the stages.

The lanes' ALUs are idle while the unit streams (its pipelines take their elements from the
lanes' read port, an element a pipeline a cycle of the port's `vector_lanes`), so the vector
unit splits a long VFUNC between them (`split`): the lanes take m of its elements (the
sequence an operation a cycle, as a VFUNC on the lanes alone), the unit's pipelines the
rest, m chosen so that the vector unit is busy the fewest cycles (never more, nor a later
last result, than the pipelines alone). GELU's 85 operations make the lanes' share 8 / 85 of
the unit's one lane rate on cgra-8x8 (9%: 16,384 elements issued in 14,976 cycles instead of
16,384), exp's 28 make it 29%, rsqrt's 8 and reciprocal's 4 a lane's equal or more. A column of a few elements runs on the lanes alone (no fill). Results are the same bits
wherever an element runs (the lanes and the pipelines compute the same sequence): only time
changes.

A description without the table (or with `"function_unit": null`) has no function unit: every
VFUNC runs on the lanes, one operation a cycle (the behaviour before the unit existed; such a
description keeps the JSON and fingerprint it had).
"""

from __future__ import annotations

from .special import OPS

KEYS = ("functions", "lanes")
#: Pipeline stages a VFUNC's scale and offset add to any function's sequence.
SCALE_OFFSET_STAGES = 2


def depth(func: str, scale: bool = False, offset: bool = False) -> int:
    """Stages an element of `func` passes through (its sequence's lane operations, + 1 each for
    the scale and the offset): the cycles from its entry to its result."""
    return OPS[func] + scale + offset


def stages(table) -> int:
    """Stages of each pipeline of a function unit `table`: its longest function's sequence with
    scale and offset (0 without a unit)."""
    if not table:
        return 0
    return max(OPS[func] for func in table["functions"]) + SCALE_OFFSET_STAGES


def runs(table, func: str) -> bool:
    """Whether the function unit `table` (None: no unit) has `func`."""
    return bool(table) and func in table["functions"]


def split(table, vector_lanes: int, elements: int, depth_: int) -> tuple[int, int]:
    """(cycles the vector unit is busy issuing, cycles to the last result) of a VFUNC of
    `elements` elements and depth `depth_` through a function unit `table` that has the
    function, without the overhead: the lanes take m of its elements (ceil(m depth /
    vector_lanes) cycles, as on the lanes alone), the pipelines the rest (ceil((elements - m) /
    lanes) cycles of issue, depth - 1 of fill). m is the largest of those that keep the vector
    unit busy the fewest cycles (what bounds a loop of tiles; the largest leaves the pipelines
    the fewest, so the last result comes first). The lanes alone (m = elements) where that
    ends no later, as a short column does."""
    pipes, n = table["lanes"], elements
    # The fewest busy cycles: the least `busy` with some m of ceil(m depth / vector_lanes) <=
    # busy and ceil((n - m) / pipes) <= busy, i.e. n - busy pipes <= busy vector_lanes // depth
    # (near n depth / (pipes depth + vector_lanes)).
    busy = max(0, n * depth_ // (pipes * depth_ + vector_lanes) - 1)
    while n - busy * pipes > busy * vector_lanes // depth_:
        busy += 1
    m = min(n, busy * vector_lanes // depth_)
    lanes, piped = -(-(m * depth_) // vector_lanes), -(-(n - m) // pipes)
    end = max(lanes, piped + depth_ - 1 if m < n else 0)
    alone = -(-(n * depth_) // vector_lanes)
    return (alone, alone) if alone <= end else (max(lanes, piped), end)


def canonical(table) -> dict:
    """The table with its functions sorted (two equal units compare and hash equal)."""
    return {"functions": sorted(table["functions"]), "lanes": table["lanes"]}


def check_function_unit(table, vector_lanes: int) -> str | None:
    """What is wrong with a function unit table (None if nothing): exactly KEYS, 1..vector_lanes
    lanes, a non-empty list of distinct special.OPS names."""
    if not isinstance(table, dict):
        return f"'function_unit' must be an object (lanes, functions) or null, got {type(table).__name__}"
    if set(table) != set(KEYS):
        missing, unknown = sorted(set(KEYS) - set(table)), sorted(set(table) - set(KEYS))
        return f"'function_unit' must have the keys {list(KEYS)} (missing {missing}, unknown {unknown})"
    lanes = table["lanes"]
    if not isinstance(lanes, int) or isinstance(lanes, bool) or not 1 <= lanes <= vector_lanes:
        return (f"function_unit['lanes'] must be an integer from 1 to vector_lanes ({vector_lanes}: the lanes' "
                f"read port feeds the pipelines), got {lanes!r}")
    functions = table["functions"]
    if not isinstance(functions, (list, tuple)) or not functions or not all(isinstance(f, str) for f in functions) \
            or len(set(functions)) != len(functions) or not set(functions) <= set(OPS):
        return (f"function_unit['functions'] must be a non-empty list of distinct VFUNC functions among "
                f"{sorted(OPS)}, got {functions!r}")
    return None
