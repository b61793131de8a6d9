"""A tile's zero halo loaded once per buffer copy, then only the tile's inside.

Stage: lowering, after double buffering and operands_first (buffers still N-d, calls are
(data, offset) pairs: calls.py). Input: a loop nest whose body allocates a scratchpad buffer
of C copies (`<name>_x<C>`, double_buffer.py) that one DMA load there fills with a box
reaching outside its host tensor (a window's padding: the DMA engine writes the halo's zeros,
or the lowest value, and charges every box element), and that nothing else in the body writes.
Output: that load in the loop's first C iterations, and in the others a load of the box's
inside alone (its origin moved in, its extents cut, its scratchpad offset moved by the rows
and columns skipped), when every iteration's halo lies at the same scratchpad bytes as one of
the first C iterations' (the box's padded dims start at the same place and every box loop is
the same; checked by evaluating the offset at every iteration).

Why: a depthwise 7 x 7 on a small map tiled over channels (ConvNeXt's later stages: a 4 x 4
map padded to 10 x 10) streamed 84% zeros through the load engine every tile; the zeros stay
where the first load of each copy put them. Same scratchpad contents, same results.
"""

from __future__ import annotations

import itertools
import re

from tvm import ir, sym, tirx

from cgra_codegen import SPAD_SCOPE as SPAD
from cgra_codegen import device_call_positions
from cgra_sim.isa import BOX_DIMS

from ..kernels.common.spec import HELD_HALO_TRIPS  # iterations the offsets are checked over
from .calls import any_leaf, buffer_of, extern_call, with_body
from .dma import _as_i64

_LOAD = device_call_positions("cgra_dma_load")
_BOX = _LOAD["box"][0]  # origins, pad_lo, pad_hi (BOX_DIMS each), then (extent, tdim, tstep, sstride) a loop
_READS = {"a_addr", "b_addr"}  # operand positions that only read (any command); a DMA store's spad_addr too
_COPIES = re.compile(r"_x(\d+)$")


def hold_halos(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.with_body(_rewrite(func.body, []))


def _rewrite(stmt, loops):
    if isinstance(stmt, tirx.For):
        return with_body(stmt, _rewrite(stmt.body, loops + [stmt]))
    if isinstance(stmt, tirx.SeqStmt):
        seq = [_rewrite(s, loops) for s in stmt.seq]
        return tirx.SeqStmt(_held(seq, loops) if loops else seq)
    if isinstance(stmt, tirx.IfThenElse):
        else_case = _rewrite(stmt.else_case, loops) if stmt.else_case is not None else None
        return tirx.IfThenElse(stmt.condition, _rewrite(stmt.then_case, loops), else_case)
    return stmt


def _held(seq: list, loops) -> list:
    """`seq` (a loop body) with each qualifying halo load split into first and later loads."""
    copies = {}
    for stmt in seq:
        if isinstance(stmt, tirx.AllocBuffer) and stmt.buffer.scope() == SPAD:
            match = _COPIES.search(str(stmt.buffer.name))
            if match and int(stmt.buffer.shape[0]) == int(match.group(1)):
                copies[stmt.buffer] = int(match.group(1))
    out = list(seq)
    for i, stmt in enumerate(seq):
        call = extern_call(stmt, "cgra_dma_load")
        target = buffer_of(call.args[_LOAD["spad_addr"][0]]) if call is not None else None
        count = next((c for b, c in copies.items() if target is not None and b.same_as(target)), None)
        if count is None or not _only_writer(seq, i, target):
            continue
        inside = _inside_box(call)
        if inside is not None and _same_bytes(call.args[_LOAD["spad_addr"][1]], loops, count):
            out[i] = tirx.IfThenElse(_iteration(loops) < count, stmt, tirx.Evaluate(inside))
    return out


def _only_writer(seq: list, index: int, buffer) -> bool:
    """Whether every other use of `buffer` in `seq` only reads it."""
    def reads_only(leaf) -> bool:
        if not (isinstance(leaf, tirx.Evaluate) and isinstance(leaf.value, ir.Call)):
            return not isinstance(leaf, tirx.BufferStore) or not leaf.buffer.same_as(buffer)
        call = leaf.value
        if getattr(call.op, "name", "") != "tirx.call_extern":
            return True
        name = str(call.args[0].value)
        positions = device_call_positions(name)
        allowed = _READS | ({"spad_addr"} if name == "cgra_dma_store" else set())
        for param, where in positions.items():
            for position in where:
                used = buffer_of(call.args[position])
                if used is not None and used.same_as(buffer) and param not in allowed:
                    return False
        return True

    return not any(any_leaf(s, lambda leaf: not reads_only(leaf)) for j, s in enumerate(seq) if j != index)


def _ints(values) -> list | None:
    return [int(v) for v in values] if all(isinstance(v, tirx.IntImm) for v in values) else None


def _inside_box(call):
    """The load `call` with its box cut to what lies inside the host tensor, or None when its
    halo is not the same in every iteration (a padded dim's origin or any box loop not a
    constant), it has none, or the inside is empty."""
    args = list(call.args)
    words = args[_BOX:_BOX + 3 * BOX_DIMS + 4 * BOX_DIMS]
    pads, loops = _ints(words[BOX_DIMS:3 * BOX_DIMS]), _ints(words[3 * BOX_DIMS:])
    host = buffer_of(args[_LOAD["slot"][0]])
    if pads is None or loops is None or not any(pads) or host is None:
        return None
    shape = _ints(host.shape)
    loops = [loops[4 * j:4 * j + 4] for j in range(BOX_DIMS)]  # extent, tdim, tstep, sstride
    offset = args[_LOAD["spad_addr"][1]]
    for dim in range(BOX_DIMS):
        if not (pads[dim] or pads[BOX_DIMS + dim]):
            continue
        origin = words[dim]
        walking = [j for j, (extent, tdim, tstep, _) in enumerate(loops) if tdim == dim and tstep and extent > 1]
        if shape is None or dim >= len(shape) or not isinstance(origin, tirx.IntImm) or len(walking) != 1:
            return None
        j = walking[0]
        extent, _, step, stride = loops[j]
        if step < 0:
            return None
        first = max(0, -(-(-int(origin)) // step))  # iterations below 0
        end = min(extent, (shape[dim] - 1 - int(origin)) // step + 1)  # iterations before the end
        if end <= first:
            return None
        words[dim] = _as_i64(int(origin) + first * step)
        words[BOX_DIMS + dim] = words[2 * BOX_DIMS + dim] = _as_i64(0)
        loops[j][0] = end - first
        offset = offset + first * stride
    words[3 * BOX_DIMS:] = [_as_i64(v) for loop in loops for v in loop]
    args[_BOX:_BOX + len(words)] = words
    args[_LOAD["spad_addr"][1]] = offset
    return ir.Call(call.op, args, call.attrs, call.ty_args, call.span, call.ty)


def _iteration(loops):
    """The flat iteration number of the loop nest (row-major), as double_buffer.py counts it."""
    index = 0
    for loop in loops:
        index = index * loop.extent + (loop.loop_var - loop.min)
    return index


def _same_bytes(offset, loops, count: int) -> bool:
    """Whether the load's scratchpad offset in every iteration is one of the first `count`
    iterations' (so the halo there was written by one of them)."""
    extents = _ints([loop.extent for loop in loops])
    mins = _ints([loop.min for loop in loops])
    if extents is None or mins is None or not 0 < count < _trips(extents) <= HELD_HALO_TRIPS:
        return False
    seen = []
    for t, point in enumerate(itertools.product(*(range(e) for e in extents))):
        analyzer = sym.Analyzer()
        for loop, low, value in zip(loops, mins, point):
            analyzer.bind(loop.loop_var, low + value)
        value = analyzer.simplify(offset)
        if not isinstance(value, tirx.IntImm):
            return False
        if t < count:
            seen.append(int(value))
        elif int(value) not in seen:
            return False
    return True


def _trips(extents) -> int:
    total = 1
    for extent in extents:
        total *= extent
    return total
