"""A KV cache written in place: one new row stored at a position read at run time, or a prompt's
rows stored at its first positions.

Stage: partition (the pattern and its spec, in the layout family) and kernel definition (the DMA
kernel's TIR). A decode step with a preallocated cache (kv_cache.py) writes the new token's keys
(1, heads, 1, d) into the cache (1, heads, bound, d) at row `position`, written in Relax as
scatter_elements(cache, broadcast_to(position, updates' shape), updates, axis=2) (what
`dynamic_update_slice` or PyTorch's `index_copy_` on a StaticCache computes). The kernel is DMA
only: one DMA_LOAD of the new row into the scratchpad and one DMA_STORE of it into the cache at
the row the control code reads from the position tensor (`cgra.read_params`, as an embedding
lookup reads its indices); a position past the cache is the DMA's halo, not written: nothing is
written past the buffer, nor over its last row (the attention after it then refuses the length). It never
reads the cache: codegen (target/stage.py, `writes_in_place`) calls it with the cache as its
output too, so the cache is written where it lies, the same tensor from one step to the next.

A prefill step (kv_prefill.py) writes a prompt's keys (1, heads, s, d), s symbolic, into the
cache's first s rows: slice_scatter(cache, rows, 0, s, 1, axis=2), pattern `cgra.cache_rows`
(`RowsWrite`). Its kernel runs ceildiv(s, R) tiles of R rows (R divides the cache's rows), each
one DMA_LOAD of the prompt's rows and one DMA_STORE into the cache, the last tile's boxes cut to
s (lower/ragged.py: the load by the rows' own length, the store by a GATHERS entry on `out`); an
s past the cache's rows is a ValueError before any command runs (BOUNDED): nothing is written
past the buffer, and no row past s is written.
"""

from __future__ import annotations

import dataclasses
import math

import tvm
import tvm_ffi
from tvm import tirx
from tvm.relax.dpl import is_op, wildcard

from ...errors import ScratchpadTooSmall, UnsupportedOperator
from ...relax_info import dtype_of, static_shape
from ..common.dynamic import BOUNDED, STORE_CUTS, read_shape
from .copy_kernel import MAX_TILES, SPAD, LayoutTiling, budget_of, parse_script, pipeline_cycles

#: The pattern's name; codegen calls its kernels in place (target/stage.py).
PATTERN = "cgra.cache_write"
ROWS_PATTERN = "cgra.cache_rows"
PATTERNS = (PATTERN, ROWS_PATTERN)
INDEX_DTYPES = ("int32", "int64")


@dataclasses.dataclass(frozen=True)
class RowWrite:
    """out (P, V, Q)[p, max(index, 0), q] = updates (P, 1, Q)[p, 0, q] for an index below V; nothing else written."""

    cache: tuple  # (P, V, Q)


def cache_write_patterns() -> list:
    """scatter_elements(cache, broadcast_to(position), updates): the row write kv_cache.py emits."""
    cache, index, updates = wildcard(), wildcard(), wildcard()
    root = is_op("relax.scatter_elements")(cache, is_op("relax.broadcast_to")(index, wildcard()), updates)
    rows_cache, rows = wildcard(), wildcard()
    rows_root = is_op("relax.slice_scatter")(rows_cache, rows, varg_default_wildcard=True)
    return [(PATTERN, root, {"root": root, "data": cache, "index": index, "updates": updates}),
            (ROWS_PATTERN, rows_root, {"root": rows_root, "data": rows_cache, "updates": rows})]


def cache_write_parts(annotated: dict) -> tuple:
    """((role, shape, dtype) of data, index, updates; the cache's (P, V, Q); the dtype) of a
    matched scatter_elements, or UnsupportedOperator saying why the NPU cannot write it."""
    call, data, index, updates = (annotated[role] for role in ("root", "data", "index", "updates"))
    shapes = [static_shape(x) for x in (data, index, updates)]
    if any(s is None for s in shapes):
        raise UnsupportedOperator("scatter_elements with a symbolic shape: the NPU's cache write takes a static cache")
    cache, position, rows = shapes
    axis = int(call.attrs.axis) % len(cache)
    dtype = dtype_of(call)
    if str(call.attrs.reduction) != "update" or math.prod(position) != 1 or dtype_of(index) not in INDEX_DTYPES:
        raise UnsupportedOperator("scatter_elements other than one position's row written (reduction 'update', "
                                  "one int32 / int64 index broadcast): the NPU writes a KV cache's new row only")
    if len(rows) != len(cache) or rows[axis] != 1 or any(r != c for a, (r, c) in enumerate(zip(rows, cache))
                                                          if a != axis):
        raise UnsupportedOperator(f"scatter_elements of {rows} into {cache}: the NPU writes one row along axis {axis}")
    p, q = math.prod(cache[:axis]), math.prod(cache[axis + 1:])
    roles = (("data", cache, dtype), ("index", position, dtype_of(index)), ("updates", rows, dtype))
    return roles, (p, cache[axis], q), dtype


def cache_write_tiling(arch, write: RowWrite, itemsize: int) -> LayoutTiling:
    """One tile, the new row whole: its load, then its store."""
    p, _, q = write.cache
    nbytes = p * q * itemsize
    if nbytes > budget_of(arch):
        raise ScratchpadTooSmall(f"a KV cache row of {nbytes} bytes does not fit a {budget_of(arch)}-byte tile")
    return LayoutTiling(rows=1, cycles=pipeline_cycles(arch, [(0, (nbytes,), nbytes)]))


def cache_write_func(write: RowWrite, dtype: str, index_dtype: str, roles: tuple):
    """The kernel's PrimFunc over (P, V, Q) views, parameters in `roles` order then out: data
    (never read), index, updates."""
    p, v, q = write.cache
    buffers = {"data": f"(({p}, {v}, {q}), \"{dtype}\")", "index": f"((1,), \"{index_dtype}\")",
               "updates": f"(({p}, 1, {q}), \"{dtype}\")"}
    params = ", ".join(f"{role}: T.Buffer{buffers[role]}" for role in roles)
    text = "\n".join([
        "@T.prim_func",
        f"def copy({params}, out: T.Buffer(({p}, {v}, {q}), \"{dtype}\")):",
        "    T.func_attr({\"tirx.noalias\": True})",
        f"    s = T.alloc_buffer(({p}, 1, {q}), \"{dtype}\", scope=\"{SPAD}\")",
        f"    for a, c in T.grid({p}, {q}):",
        "        s[a, 0, c] = updates[a, 0, c]",
        f"    for a, c in T.grid({p}, {q}):",  # a position past the cache: its DMA halo, no write
        f"        if T.min(T.max(T.Cast(\"int32\", index[0]), 0), {v}) < {v}:",
        f"            out[a, T.min(T.max(T.Cast(\"int32\", index[0]), 0), {v}), c] = s[a, 0, c]",
    ]) + "\n"
    func = parse_script(text).with_attr("cgra.read_params", [list(roles).index("index")])
    return func.with_attr("cgra.returns_out", True)  # Relax's call_inplace_packed takes the result as the cache


@dataclasses.dataclass(frozen=True)
class RowsWrite:
    """out (P, V, Q)[p, r, q] = rows (P, n, Q)[p, r, q] for r < n, n the symbolic `length` (at most
    V); the cache's rows from n on are not written."""

    cache: tuple  # (P, V, Q)
    length: str  # n's variable name


def cache_rows_parts(annotated: dict) -> tuple:
    """((role, shape, dtype) of data and updates, the updates' length at the cache's bound; the
    RowsWrite; the dtype) of a matched slice_scatter, or UnsupportedOperator saying why."""
    call, data, updates = (annotated[role] for role in ("root", "data", "updates"))
    cache = static_shape(data)
    if cache is None:
        raise UnsupportedOperator("slice_scatter into a cache of symbolic shape: the NPU writes a preallocated cache")
    axis = int(call.attrs.axis) % len(cache)
    rows, names = read_shape(updates, "rows written", (axis,), prefix="slice_scatter: ")
    start, end, step = call.args[2:5]
    length = updates.ty.shape.values[axis] if axis < len(rows) else None
    if axis not in names or _int(start) != 0 or _int(step) != 1 or not tvm_ffi.structural_equal(_int(end), length) or \
            any(r != c for a, (r, c) in enumerate(zip(rows, cache)) if a != axis):
        raise UnsupportedOperator(f"slice_scatter other than a prompt's rows (1.. symbolic) written at the cache's "
                                  f"first positions along axis {axis}: the NPU writes a KV cache's rows from 0")
    dtype = dtype_of(call)
    p, q = math.prod(cache[:axis]), math.prod(cache[axis + 1:])
    roles = (("data", cache, dtype), ("updates", cache, dtype))  # the rows at the bound: the cache's
    return roles, RowsWrite((p, cache[axis], q), names[axis]), dtype


def _int(value):
    """A slice_scatter bound (a PrimExpr): an int, or the expression."""
    return int(value.value) if isinstance(value, tirx.IntImm) else value


def cache_rows_tiling(arch, write: RowsWrite, itemsize: int) -> LayoutTiling:
    """Tiles of R rows, R dividing the cache's rows (the last tile's store stays inside it): the
    fastest R at the bound, by the copy's pipeline."""
    p, v, q = write.cache
    row, budget = p * q * itemsize, budget_of(arch)
    if row > budget:
        raise ScratchpadTooSmall(f"a KV cache row of {row} bytes does not fit a {budget}-byte tile")
    tiles = {r: pipeline_cycles(arch, [(0, (r * row,), r * row)] * (v // r))
             for r in range(1, v + 1) if v % r == 0 and r * row <= budget and v // r <= MAX_TILES}
    rows = min(tiles, key=lambda r: (tiles[r], -r))
    return LayoutTiling(rows=rows, cycles=tiles[rows])


def cache_rows_func(write: RowsWrite, dtype: str, rows: int):
    """The kernel's PrimFunc over (P, V, Q) views: data (never read), the rows (P, n, Q), out."""
    (p, v, q), n = write.cache, write.length
    text = "\n".join([
        "@T.prim_func",
        "def copy(data_handle: T.handle, updates_handle: T.handle, out_handle: T.handle):",
        "    T.func_attr({\"tirx.noalias\": True})",
        f"    {n} = T.int32()",
        f"    data = T.match_buffer(data_handle, ({p}, {v}, {q}), \"{dtype}\")",
        f"    updates = T.match_buffer(updates_handle, ({p}, {n}, {q}), \"{dtype}\")",
        f"    out = T.match_buffer(out_handle, ({p}, {v}, {q}), \"{dtype}\")",
        f"    for tile_ in range(T.floordiv({n} + {rows - 1}, {rows})):",  # names no length variable takes
        f"        spad_ = T.alloc_buffer(({p}, {rows}, {q}), \"{dtype}\", scope=\"{SPAD}\")",
        f"        for p_, r_, q_ in T.grid({p}, {rows}, {q}):",
        f"            spad_[p_, r_, q_] = T.if_then_else(tile_ * {rows} + r_ < {n}, "
        f"updates[p_, tile_ * {rows} + r_, q_], T.{dtype}(0))",
        f"        for p_, r_, q_ in T.grid({p}, {rows}, {q}):",
        f"            if tile_ * {rows} + r_ < {v}:",  # the DMA's halo: never past the cache, whatever n
        f"                out[p_, tile_ * {rows} + r_, q_] = spad_[p_, r_, q_]",
    ]) + "\n"
    func = parse_script(text).with_attr(STORE_CUTS, {"out": [[1, 1, 1, 0]]})  # the store cut to the rows written
    func = func.with_attr(BOUNDED, [[n, v, "a prompt's KV rows written into a cache",
                                     f"the cache holds {v} positions: preallocate it for more "
                                     "(prefill_kv_cache(mod, bound=...))"]])
    return func.with_attr("cgra.returns_out", True)


def cache_write_spec(name: str, annotated: dict) -> dict:
    """The LayoutSpec fields of a matched cache write (`name`: PATTERN or ROWS_PATTERN; explain
    gives a host call's operands as lhs and rhs: the roles are then read from the call)."""
    if "data" not in annotated:
        annotated = _roles(name, annotated["root"])
    if name == PATTERN:
        in_shapes, cache, dtype = cache_write_parts(annotated)
        write, op, symbols = RowWrite(cache), "cache_write", ()
    else:
        in_shapes, write, dtype = cache_rows_parts(annotated)
        op, axis = "cache_rows", int(annotated["root"].attrs.axis) % len(in_shapes[0][1])
        symbols = (("updates", axis, write.length),)
    views = tuple((role, shape) for role, shape, _ in in_shapes) + (("out", in_shapes[0][1]),)
    return dict(op=op, dtype=dtype, in_shapes=in_shapes, out_shape=in_shapes[0][1], write=write, views=views,
                param_roles=tuple(role for role, _, _ in in_shapes), caller_symbols=symbols)


def _roles(name: str, call) -> dict:
    """The pattern's roles of a scatter_elements or slice_scatter call."""
    if name == ROWS_PATTERN:
        return {"root": call, "data": call.args[0], "updates": call.args[1]}
    index = call.args[1]
    if not (isinstance(index, tvm.relax.Call) and index.op.name == "relax.broadcast_to"):
        raise UnsupportedOperator("scatter_elements of an index tensor: the NPU writes a KV cache's row at one "
                                  "position broadcast (broadcast_to(position))")
    return {"root": call, "data": call.args[0], "index": index.args[0], "updates": call.args[2]}


def write_tiling(arch, write, itemsize: int) -> LayoutTiling:
    """A cache write's tiling (RowWrite or RowsWrite)."""
    return (cache_write_tiling if isinstance(write, RowWrite) else cache_rows_tiling)(arch, write, itemsize)


def write_func(spec, tiling):
    """A cache write's PrimFunc, with the caller's shapes (`cgra.arg_shapes`) in parameter order."""
    shapes = {role: (shape, dtype) for role, shape, dtype in spec.in_shapes}
    callers = dict(spec.views)
    if isinstance(spec.write, RowWrite):
        func = cache_write_func(spec.write, spec.dtype, shapes["index"][1], spec.param_roles)
    else:
        func = cache_rows_func(spec.write, spec.dtype, tiling.rows)
        (_, axis, name), = spec.caller_symbols
        length = next(e for param in func.params for e in param.ty.shape if getattr(e, "name", "") == name)
        callers["updates"] = tuple(length if a == axis else e for a, e in enumerate(callers["updates"]))
    return func.with_attr("cgra.arg_shapes", [list(callers[role]) for role in list(spec.param_roles) + ["out"]])
