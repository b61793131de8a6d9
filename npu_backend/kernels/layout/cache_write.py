"""A KV cache written in place: one new row stored at a position read at run time.

Stage: partition (the pattern and its spec, in the layout family) and kernel definition (the DMA
kernel's TIR). A decode step with a preallocated cache (kv_cache.py) writes the new token's keys
(1, heads, 1, d) into the cache (1, heads, bound, d) at row `position`, written in Relax as
scatter_elements(cache, broadcast_to(position, updates' shape), updates, axis=2) (what
`dynamic_update_slice` or PyTorch's `index_copy_` on a StaticCache computes). The kernel is DMA
only: one DMA_LOAD of the new row into the scratchpad and one DMA_STORE of it into the cache at
the row the control code reads from the position tensor (`cgra.read_params`, as an embedding
lookup reads its indices), clipped into the cache: nothing is written past the buffer. It never
reads the cache: codegen (target/stage.py, `writes_in_place`) calls it with the cache as its
output too, so the cache is written where it lies, the same tensor from one step to the next.
"""

from __future__ import annotations

import dataclasses
import math

from tvm.relax.dpl import is_op, wildcard

from ...errors import ScratchpadTooSmall, UnsupportedOperator
from ...relax_info import dtype_of, static_shape
from .copy_kernel import SPAD, LayoutTiling, budget_of, parse_script, pipeline_cycles

#: The pattern's name; codegen calls its kernels in place (target/stage.py).
PATTERN = "cgra.cache_write"
INDEX_DTYPES = ("int32", "int64")


@dataclasses.dataclass(frozen=True)
class RowWrite:
    """out (P, V, Q)[p, clip(index, 0, V - 1), q] = updates (P, 1, Q)[p, 0, q]; nothing else written."""

    cache: tuple  # (P, V, Q)


def cache_write_patterns() -> list:
    """scatter_elements(cache, broadcast_to(position), updates): the row write kv_cache.py emits."""
    cache, index, updates = wildcard(), wildcard(), wildcard()
    root = is_op("relax.scatter_elements")(cache, is_op("relax.broadcast_to")(index, wildcard()), updates)
    return [(PATTERN, root, {"root": root, "data": cache, "index": index, "updates": updates})]


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
        f"    for a, c in T.grid({p}, {q}):",
        f"        out[a, T.min(T.max(T.Cast(\"int32\", index[0]), 0), {v - 1}), c] = s[a, 0, c]",
    ]) + "\n"
    func = parse_script(text).with_attr("cgra.read_params", [list(roles).index("index")])
    return func.with_attr("cgra.returns_out", True)  # Relax's call_inplace_packed takes the result as the cache
