"""Copies become DMA: host <-> scratchpad loop nests -> `cgra_dma_load` / `cgra_dma_store` calls.

Stage: lowering, between s_tir's LowerOpaqueBlock and tirx's FlattenBuffer (buffers are compacted
but still multi-dimensional). Input: a PrimFunc whose copies between a host tensor and a
`global.cgra_spad` buffer are perfect loop nests around one BufferStore, possibly guarded by an
in-bounds test (the zero padding of ragged tiles and of convolutions, or a max pool's padding
of the dtype's lowest value). Output: the same PrimFunc
with each such nest replaced by one DMA call whose box (see `cgra_sim.isa`) moves the same
elements.

The guard is never taken on trust: every conjunct must be exactly "index >= 0" or
"index < extent" of the host tensor, and every index that can leave the tensor must be guarded;
then the DMA engine's halo (zero or lowest-value fill on load, drop on store) is the same
computation. Anything
else raises `UnsupportedCopy`, because a DMA that silently differs from the TIR would be a wrong
number.
"""

from __future__ import annotations

import dataclasses

from tvm import ir, sym, tirx

from cgra_codegen import SPAD_SCOPE as SPAD, device_call
from cgra_sim.isa import BOX_DIMS, DMA_FILL_LOWEST, DType

from ..errors import UnsupportedCopy
from .guards import guarded_dims, proves

_IF_THEN_ELSE = ir.Op.get("prim.if_then_else")


@dataclasses.dataclass
class _Copy:
    """One recognised copy: the host tensor side and the scratchpad side of a BufferStore."""

    direction: str  # "load" (host -> spad) or "store" (spad -> host)
    host: object  # the host tensor (a buffer Var)
    host_indices: list
    spad: object
    spad_indices: list
    guard: object  # the in-bounds condition, or None
    fill: int = 0  # a load's DMA_LOAD flags: what its halo holds (_fill_flags)


def lower_copies_to_dma(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Replace every host <-> scratchpad copy nest of `func` with a DMA call."""
    return func.with_body(_rewrite(func.body, {}))


def _rewrite(stmt, domains):
    """Post-order rebuild; `domains` maps the enclosing loop variables to their ranges."""
    if isinstance(stmt, tirx.For):
        nest, body = _perfect_nest(stmt)
        copy = _as_copy(body)
        if copy is not None:
            widened = [_whole_tile(loop) for loop in nest]
            for loop, guard in widened:
                if guard is not None:
                    copy = dataclasses.replace(copy, guard=guard if copy.guard is None else tirx.And(copy.guard, guard))
            return _lower_nest([loop for loop, _ in widened], copy, domains)
        inner = dict(domains)
        inner[stmt.loop_var] = ir.Range.from_min_extent(stmt.min, stmt.extent)
        return _with_body(stmt, _rewrite(stmt.body, inner))
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([_rewrite(s, domains) for s in stmt.seq])
    if isinstance(stmt, tirx.IfThenElse):
        else_case = _rewrite(stmt.else_case, domains) if stmt.else_case is not None else None
        return tirx.IfThenElse(stmt.condition, _rewrite(stmt.then_case, domains), else_case)
    if isinstance(stmt, tirx.BufferStore) and _as_copy(stmt) is not None:
        return _lower_nest([], _as_copy(stmt), domains)
    return stmt


def _whole_tile(loop):
    """(loop, guard): a copy loop of extent min(T, e) (the store of a row of symbolic length e
    held in a tile of T columns, rows.py) as the tile's T, guarded by `loop < e`: the box's halo
    drops what lies past the tensor, and lower/ragged.py cuts the box to the tensor's extent."""
    extent = loop.extent
    if isinstance(extent, tirx.Min):
        tile, rest = (extent.a, extent.b) if isinstance(extent.a, tirx.IntImm) else (extent.b, extent.a)
        if isinstance(tile, tirx.IntImm):
            widened = tirx.For(loop.loop_var, loop.min, tile, loop.kind, loop.body, loop.thread_binding,
                               loop.annotations)
            return widened, loop.loop_var - loop.min < rest
    return loop, None


def _with_body(loop, body):
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body,
                    loop.thread_binding, loop.annotations)


def _perfect_nest(loop):
    nest = [loop]
    while isinstance(nest[-1].body, tirx.For):
        nest.append(nest[-1].body)
    return nest, nest[-1].body


def _is_spad(buffer) -> bool:
    return buffer.scope() == SPAD


def _as_copy(stmt):
    """The copy `stmt` performs between host memory and the scratchpad, or None."""
    guard = None
    if isinstance(stmt, tirx.IfThenElse) and stmt.else_case is None:
        guard, stmt = stmt.condition, stmt.then_case
    if not isinstance(stmt, tirx.BufferStore):
        return None
    value, fill = stmt.value, 0
    if _is_spad(stmt.buffer):  # a load: the value is the host tensor, maybe zero outside it
        if isinstance(value, ir.Call) and value.op.same_as(_IF_THEN_ELSE):
            cond, load, fallback = value.args
            fill = _fill_flags(fallback)
            if not isinstance(load, ir.TensorLoad) or fill is None:
                raise UnsupportedCopy(f"a scratchpad load pads with {getattr(fallback, 'value', fallback)}: the DMA engine fills "
                                      "its halo with zero or the element type's lowest value")
            guard, value = cond if guard is None else tirx.And(guard, cond), load
        if isinstance(value, ir.TensorLoad) and not _is_spad(value.source):
            return _Copy("load", value.source, list(value.indices), stmt.buffer, list(stmt.indices), guard, fill)
        return None
    if isinstance(value, ir.TensorLoad) and _is_spad(value.source):
        return _Copy("store", stmt.buffer, list(stmt.indices), value.source, list(value.indices), guard)
    return None


def _fill_flags(expr) -> int | None:
    """The DMA_LOAD flags of a halo that holds `expr`: 0 for zero, DMA_FILL_LOWEST for the
    dtype's lowest value (a max pool's padding), None for any other value."""
    if not isinstance(expr, (tirx.IntImm, tirx.FloatImm)):
        return None
    if expr.value == 0:
        return 0
    lowest = DType.from_name(str(expr.ty)).lowest if str(expr.ty) in ("int8", "int32", "float32") else None
    return DMA_FILL_LOWEST if lowest is not None and expr.value == lowest else None


def _lower_nest(nest, copy: _Copy, domains):
    """One DMA call for the innermost BOX_DIMS loops; outer loops of a deeper nest stay loops."""
    outer, box_loops = nest[:-BOX_DIMS] if len(nest) > BOX_DIMS else [], nest[-BOX_DIMS:]
    all_domains = dict(domains)
    for loop in nest:
        all_domains[loop.loop_var] = ir.Range.from_min_extent(loop.min, loop.extent)
    call = _dma_call(copy, box_loops, all_domains)
    stmt = tirx.Evaluate(call)
    for loop in reversed(outer):
        stmt = _with_body(loop, stmt)
    return stmt


def _dma_call(copy: _Copy, loops, domains):
    analyzer = sym.Analyzer()
    for var, rng in domains.items():
        analyzer.bind(var, rng)
    loop_vars = [loop.loop_var for loop in loops]
    # Indices such as p // OW, p % OW (a conv's output pixel split into whole rows) become
    # affine once simplified on the loops' ranges; the guard itself is never rewritten.
    copy = dataclasses.replace(copy, host_indices=[analyzer.simplify(i) for i in copy.host_indices],
                               spad_indices=[analyzer.simplify(i) for i in copy.spad_indices])
    spad_offset = _flat_offset(copy.spad, copy.spad_indices)
    spad_base, spad_strides = _linear(spad_offset, loop_vars, "scratchpad offset")
    # An extent is an int, or a symbolic axis's variable (a batch, a number of rows).
    host_shape = [int(e) if isinstance(e, tirx.IntImm) else e for e in copy.host.ty.shape]
    origin, loop_dims = [], [(0, 0)] * len(loops)
    for dim, index in enumerate(copy.host_indices):
        base, coeffs = _linear(index, loop_vars, f"index {dim} of '{copy.host.name}'")
        origin.append(base)
        for position, coeff in enumerate(coeffs):
            if coeff != 0:
                if loop_dims[position] != (0, 0):
                    raise UnsupportedCopy(f"loop {loops[position].loop_var} walks two dimensions of "
                                          f"'{copy.host.name}': a DMA box loop walks one")
                loop_dims[position] = (dim, coeff)
    pad_lo, pad_hi = _halo(copy, host_shape, analyzer, domains, _spans(loops, loop_dims))
    words = _pad(origin, 0) + _pad(pad_lo, 0) + _pad(pad_hi, 0)
    for position in range(BOX_DIMS):
        if position < len(loops):
            dim, step = loop_dims[position]
            words += [loops[position].extent, dim, step, spad_strides[position]]
        else:
            words += [1, 0, 0, 0]
    operands = dict(slot=copy.host, spad_addr=(copy.spad.data, spad_base), box=[_as_i64(w) for w in words])
    if copy.direction == "load":
        return device_call("cgra_dma_load", flags=copy.fill, **operands)
    return device_call("cgra_dma_store", **operands)


def _pad(values, fill):
    return list(values) + [fill] * (BOX_DIMS - len(values))


def _as_i64(value):
    if isinstance(value, int):
        return tirx.IntImm("int64", value)
    return value.astype("int64")


def _flat_offset(buffer, indices):
    """Element offset of `indices` in the (compacted, static) scratchpad buffer, through its
    strides: a buffer whose rows storage_align padded (spad_layout.py) is not compact."""
    offset = 0
    for index, stride in zip(indices, buffer_strides(buffer)):
        offset = offset + index * stride
    return offset


def buffer_strides(buffer) -> list[int]:
    """The element strides of a static buffer: its own, else row-major over its shape."""
    if len(buffer.strides) > 0:
        return [int(stride) for stride in buffer.strides]
    strides, stride = [], 1
    for extent in reversed(buffer.shape):
        strides.insert(0, stride)
        stride *= int(extent)
    return strides


def buffer_elements(buffer) -> int:
    """Elements a static buffer spans in memory, padding included (its flattened size)."""
    return int(buffer.shape[0]) * buffer_strides(buffer)[0] if len(buffer.shape) > 0 else 1


def _linear(expr, loop_vars, what):
    """expr = base + sum(coeffs[l] * loop_vars[l]) with integer coeffs; (base, coeffs)."""
    result = sym.detect_linear_equation(expr, loop_vars)
    if len(result) != len(loop_vars) + 1:
        raise UnsupportedCopy(f"the {what} ({expr}) is not affine in the copy loops {loop_vars}")
    coeffs = []
    for coeff in result[:-1]:
        coeff = sym.Analyzer().simplify(coeff)
        if not isinstance(coeff, tirx.IntImm):
            raise UnsupportedCopy(f"the {what} ({expr}) has a non-constant stride {coeff}")
        coeffs.append(int(coeff.value))
    return sym.Analyzer().simplify(result[-1]), coeffs


def _spans(loops, loop_dims) -> dict:
    """Per host dim, how many coordinates the box's loops cover along it."""
    spans = {}
    for loop, (dim, step) in zip(loops, loop_dims):
        if step:
            spans[dim] = spans.get(dim, 1) + (int(loop.extent) - 1) * abs(step)
    return spans


def _halo(copy: _Copy, shape, analyzer, domains, spans):
    """How far the copy reaches outside the host tensor, after checking the guard covers it.

    Along a symbolic extent (a batch, a number of rows) the reach is not a constant: the last,
    ragged tile starts inside the tensor, so a guarded copy's box overhangs by less than its
    span along that dim, which is then its halo (the DMA engine clips against the bound
    tensor's run-time shape; the halo only bounds how far a coordinate may lie outside)."""
    guarded_lo, guarded_hi = guarded_dims(copy.guard, copy.host_indices, shape, copy.host.name,
                                          analyzer, domains)
    pad_lo, pad_hi = [], []
    for dim, index in enumerate(copy.host_indices):
        bound = analyzer.const_int_bound(index)
        below = max(0, -bound.min_value)
        if not isinstance(shape[dim], int):
            inside = proves(analyzer, index < shape[dim])
            pad_lo.append(below)
            pad_hi.append(0 if inside else spans.get(dim, 1))
            if not inside and dim not in guarded_hi:
                raise UnsupportedCopy(f"the copy {copy.direction} of '{copy.host.name}' may reach past its "
                                      f"symbolic dimension {dim} ({shape[dim]}) without an in-bounds guard")
            continue
        above = max(0, bound.max_value - (shape[dim] - 1))
        if (below and dim not in guarded_lo) or (above and dim not in guarded_hi):
            raise UnsupportedCopy(
                f"the copy {copy.direction} of '{copy.host.name}' reaches outside dimension {dim} "
                f"(index range [{bound.min_value}, {bound.max_value}], extent {shape[dim]}) without "
                "an in-bounds guard")
        pad_lo.append(below)
        pad_hi.append(above)
    return pad_lo, pad_hi
