"""rows.py's whole-row kernel over a symbolic length, for the lengths whose K and V head fit whole.

Stage: tiling (`choose_row_limits`: the lengths the whole-row kernel holds, by tiling) and kernel
definition (`rows_branch`, written into flash_length.py's kernel under `if s <= limit`). In: the
AttentionSpec of a causal attention over a symbolic length s (flash_length.length_spec). Out:
lines of the kernel's TVMScript text: rows.py's pipelined items (batch, K / V head, group of
stacked query heads, query tile of tq rows), their count ceildiv(s, tq) per head a function of
the run-time length, with buffers sized for the limit:

    K and V of a head (keys 0 .. s - 1: the DMA box cut at s), per item: Q of the stack's heads,
    S = Q Kᵀ over the keys to the tile's last row's diagonal, min(s, row0 + tq), the triangle
    added to its columns row0 + 1 .. (without a mask, spec.causal None: every key, no triangle),
    the max, exp, row sums (a GEMM with ones), P V, and the previous item normalised and stored
    (rows below s)

The item order and the pipelining are rows.py's (its module docstring), so at a length up to the
limit the kernel's commands are those of a static compile for that length with the limit's
tiling. Its buffers are named `w_*`: flash_length.py's other branch has its own, and the code
generator gives the two branches' scopes the same scratchpad bytes (codegen/cgra_codegen/spad.py).

Why: over the bound (Llama's 2048) K and V of a head do not fit, so the symbolic compile ran the
key-tile kernel at every length: at 16 tokens 3,396 cycles a layer where the static compile's
whole-row kernel takes 1,523 (its heads stacked, the items pipelined).
"""

from __future__ import annotations

import dataclasses

from . import length_exps
from .attention_tiles import LOWEST, TINY, RowTiling, estimate_attention_cycles, scale_at, whole_row_tiling
from .script_text import F32, GEMM_ACCUMULATE, Writer, call, eltwise, element, fill, gemm, reduce, vfunc


def _chunk(limit: int) -> int:
    """Columns of the bias row a DMA box moves: the largest power of two up to 64 dividing `limit`."""
    return next(c for c in (64, 32, 16, 8, 4, 2, 1) if limit % c == 0)


def load_row_chunks(w: Writer, buffer: str, heads: int, count: str, chunk: int, element: str, width: int) -> None:
    """`count` boxes of `chunk` columns of the bias row table (`element` the text of its element,
    `{}` its column; `width` its columns) into `buffer` ((heads, .) or (.,) for one head): the
    lowering cuts no box of a static tensor at the length, so the row comes in chunks covering
    it, each guarded inside the table."""
    at = "kc * {0} + u".format(chunk)
    target = f"{buffer}[h, {at}]" if heads > 1 else f"{buffer}[{at}]"
    loops = f"T.grid({heads}, {chunk})" if heads > 1 else f"range({chunk})"
    index = "h, u" if heads > 1 else "u"
    # (the `if` keeps the chunk loop out of the box: the DMA lowering takes static extents)
    w.add(f"for kc in range({count}):", f"    if kc * {chunk} < {width}:", f"        for {index} in {loops}:",
          f"            {target} = T.if_then_else({at} < {width}, {element.format(at)}, T.float32(0))")


def is_box(spec) -> bool:
    """Whether the spec's bias is a box of a (1, Hk, G, T, T) table (normalise/length_boxes.py:
    T5's relative-position bias), not a row per head (Bloom's ALiBi)."""
    return bool(spec.mask_shape) and spec.mask_shape[3] > 1


def load_box(w: Writer, target: str, head: str, row0: str, rows: int, col0: str, count: str, chunk: int,
             bound: int) -> None:
    """The bias box's rows row0 .. row0 + rows - 1 of query head `head` from column `col0`, in
    `count` chunks of `chunk` columns, into `target` (text with {i} and {u}: the row and column
    within the buffer): straight into the scores, which the Q Kᵀ GEMM then accumulates onto
    (attention.py's mask in the GEMM). Each chunk is guarded inside the (T, T) table: the lowering
    cuts no box of a static tensor at the length; rows and columns past s are loaded but never
    computed on or stored."""
    u = f"kc * {chunk} + u"
    row, col = f"{row0} + i", (f"{col0} + {u}" if col0 != "0" else u)
    load = f"mask[{head}, {row}, {col}]"
    low = f"0 <= {col} and " if col0 != "0" else ""  # (the analyzer cannot bound a tile's origin below)
    w.add(f"for kc in range({count}):", f"    if {col0} + kc * {chunk} < {bound}:",
          f"        for i, u in T.grid({rows}, {chunk}):",
          f"            {target.format(i='i', u=u)} = T.if_then_else(0 <= {row} and {row} < {bound} and {low}{col} < {bound}, {load}, "
          "T.float32(0))")


def row_gemm(rows, cols, ones: tuple, row: tuple, scores: tuple) -> str:
    """S (buffer, offset, row stride) += a column of `rows` ones (buffer, offset) times the bias
    row's `cols` columns (buffer, offset, row stride): fl(S + r) on the PE array (length_rows.py)."""
    return gemm(True, rows, cols, 1, ones + (1,), row, scores)

from ...errors import ScratchpadTooSmall

#: The kernel's buffers (rows.py keeps its own two copies: the double-buffering pass leaves them).
BUFFERS = ["w_kt", "w_v", "w_q", "w_s", "w_m", "w_l", "w_inv", "w_o", "w_res", "w_ones", "w_band", "w_row",
           length_exps.BUFFER]
#: Past the last power of two whose K and V fit whole, the whole-row limits are tried at each
#: 1 / STEPS of it more (cgra-8x8 at bound 2048: 1,152, 1,280, ... while they fit).
STEPS = 8
#: Names of the kernel's loop and item variables: a length named like one is renamed (flash_length).
NAMES = {"it", "h", "kc"} | set(BUFFERS)


def _static(spec, length: int):
    """The spec at a static length (the causal triangle of offset 0 the kernel builds; a bias
    row's table, length_rows.py, as a mask row of that length)."""
    mask = tuple(spec.mask_shape[:4]) + (length,) if spec.mask_shape and not is_box(spec) else ()
    return dataclasses.replace(spec, sq=length, sk=length, length=None, mask_shape=mask)


def choose_row_limits(spec, arch, key_tiles=None) -> tuple:
    """((limit, RowTiling), ...) by growing limit: the whole-row tilings of 16 times the powers of
    two below the bound and of the bound, then past the last that fits of its STEPS-ths up to
    twice it, those that fit, each run of lengths of one tiling (tq, stack, K / V copies,
    the sums' unit) taken at its longest length, with the fabric's share of the exps there from
    the run length it pays at on (length_exps.py); () if none fits. With `key_tiles` (length ->
    the key-tile kernel's estimated cycles) a branch is kept only while its estimate at its limit
    is no more than the key tiles' (cgra-8x8 at bound 2048: one query head a tile past 1,500
    keys, 11 M cycles at 1,600 where the key tiles take about 9 M). (One branch at the longest
    length alone would hold one copy of K and V where a short prompt's static compile holds two:
    Llama at 16 tokens, 1,565 cycles a layer against 1,523.)"""
    found = []
    for length in [16 << i for i in range(16) if 16 << i < spec.sq] + [spec.sq]:
        if not _fits(spec, arch, length, found):
            break
    if found and found[-1][0] < spec.sq:  # past the last power that fits: eighths of it, while they fit
        last = found[-1][0]
        for length in range(last + last // STEPS, min(2 * last, spec.sq + 1), last // STEPS):
            if not _fits(spec, arch, length, found):
                break
    runs = []
    for length, tiling in found:
        kind = (tiling.tq, tiling.stack, tiling.kv_copies, tiling.sums_on_pe)
        if runs and runs[-1][0] == kind:
            runs.pop()
        runs.append((kind, length, tiling))
    kept = []
    for _, length, tiling in runs:  # the fabric's share from the run length it pays at (length_exps.py)
        tiling = length_exps.with_share(lambda n: _static(spec, n), arch, tiling, kept[-1][0] if kept else 0, length)
        if key_tiles is not None and estimate_attention_cycles(_static(spec, length), arch, tiling) > key_tiles(length):
            break
        kept.append((length, tiling))
    return tuple(kept)


def _fits(spec, arch, length: int, found: list) -> bool:
    """Whether the whole-row kernel fits at `length`; if so (length, its tiling) joins `found`."""
    try:
        tiling = whole_row_tiling(_static(spec, length), arch)
    except ScratchpadTooSmall:
        return False
    if spec.mask_shape and not is_box(spec) and tiling.mask != "whole":  # it holds every head's bias row whole
        return False
    found.append((length, tiling))
    return True


class _Item:
    """Index expressions (text) of item `at` (rows.py's _Item, its query tiles ceildiv(s, tq))."""

    def __init__(self, spec, t: RowTiling, s: str, at: str):
        groups = spec.g // t.stack
        tiles = f"T.floordiv({s} + {t.tq - 1}, {t.tq})"
        per_kv = f"{tiles} * {groups}" if groups > 1 else tiles
        self.at, self.length = at, s
        # (clamped: lower/dma.py cannot bound a quotient by the length's expression)
        self.n = f"T.max(T.min(({at}) // ({per_kv} * {spec.hk}), {spec.b - 1}), 0)" if spec.b > 1 else "0"
        self.c = f"({at}) // ({per_kv}) % {spec.hk}" if spec.hk > 1 else "0"
        j = f"({at}) // {tiles} % {groups}" if groups > 1 else "0"
        j = f"{j} * {t.stack}" if t.stack > 1 and groups > 1 else j
        self.head = f"{self.c} * {spec.g} + {j}" if spec.g > 1 else self.c
        self.row0 = f"({at}) % {tiles} * {t.tq}"
        self.slot = f"({at}) % 2"
        self.kv_slot = f"({at}) // ({per_kv}) % 2" if t.kv_copies == 2 else "0"
        self.new_kv = f"({at}) % ({per_kv}) == 0"
        self.keys = f"T.min({s}, {self.row0} + {t.tq})" if spec.causal is not None else s  # (all without a mask)
        self.band_at = f"{self.row0} + 1"
        self.band = f"T.min({t.tq - 1}, {s} - 1 - {self.row0})"


def rows_branch(w: Writer, spec, t: RowTiling, limit: int, s: str) -> None:
    """The whole-row kernel's text at the writer's depth, for lengths s up to `limit`."""
    groups = spec.g // t.stack
    items = f"{spec.b * spec.hk * groups} * T.floordiv({s} + {t.tq - 1}, {t.tq})"
    _allocate(w, spec, t, limit, s)
    first = _Item(spec, t, s, "0")
    _load_kv(w, spec, first, s, limit, "k")
    _load_q(w, spec, t, first, s)
    w.add(f"if {items} > 1:")  # before V, which only the first P V reads (as a static compile's order)
    _load_q(w, spec, t, _Item(spec, t, s, "1"), s, indent="    ")
    _load_kv(w, spec, first, s, limit, "v")
    _scores(w, spec, t, first, limit)
    # One item a query tile (one batch, K / V head and group): the loop's extent would read as
    # lower/ragged.py's tile loop over the length, which cut every command in it to the rows of
    # tile `it`, the next item's scores and the previous one's normalising too (one head at 25
    # tokens: rows 17 .. 23 from the stale copy of item 0). T.max(., 1) (s >= 1) keeps it whole.
    w.add(f"for it in range({items if spec.b * spec.hk * groups > 1 else f'T.max({items}, 1)'}):")
    w.depth += 1
    one_copy = t.kv_copies == 1 and spec.b * spec.hk > 1
    _next_items(w, spec, t, s, limit, items, "same head" if one_copy else "")
    _softmax(w, spec, t, _Item(spec, t, s, "it"), items, limit)
    if one_copy:
        _next_items(w, spec, t, s, limit, items, "new head")
    w.add("if it > 0:")
    w.depth += 1
    _normalise(w, spec, t, _Item(spec, t, s, "T.max(it - 1, 0)"), s)
    w.depth -= 2
    _normalise(w, spec, t, _Item(spec, t, s, f"{items} - 1"), s)


def _next_items(w: Writer, spec, t: RowTiling, s: str, limit: int, items: str, when: str) -> None:
    """rows.py's: K and V of item it + 1's head if it starts one, S of item it + 1, Q of it + 2."""
    per_kv = f"{spec.g // t.stack} * T.floordiv({s} + {t.tq - 1}, {t.tq})"
    after, later = (_Item(spec, t, s, f"T.min(it + {k}, {items} - 1)") for k in (1, 2))
    only = {"": "", "same head": f" and (it + 1) % ({per_kv}) != 0",
            "new head": f" and (it + 1) % ({per_kv}) == 0"}[when]
    w.add(f"if it + 1 < {items}{only}:")
    w.depth += 1
    if when != "same head":
        w.add(f"if {after.new_kv}:")
        w.depth += 1
        _load_kv(w, spec, after, s, limit)
        w.depth -= 1
    _scores(w, spec, t, after, limit)
    w.add(f"if it + 2 < {items}:")
    _load_q(w, spec, t, later, s, indent="    ")
    w.depth -= 1


def _allocate(w: Writer, spec, t: RowTiling, limit: int, s: str) -> None:
    """rows.py's buffers at the limit, and the triangle once per head of a stack."""
    rows, d, dv = t.rows, spec.d, spec.dv
    for name, shape in (("w_kt", (t.kv_copies, d, limit)), ("w_v", (t.kv_copies, limit, dv)),
                        ("w_q", (2, rows, t.q_stride)), ("w_s", (2, rows, t.p_stride)), ("w_m", (2, rows)),
                        ("w_l", (2, rows)), ("w_inv", (2, rows)), ("w_o", (2, rows, dv)), ("w_res", (2, rows, dv))):
        w.alloc(name, shape)
    ones = max(limit, rows)  # (filled to the length: a FILL of the limit's cost Llama 42 cycles at 16 tokens)
    w.alloc("w_ones", (ones,))
    length_exps.allocate(w, t, limit)
    w.add(fill("w_ones", 1, f"T.max({s}, {rows})", ones, 1.0))
    if spec.mask_shape and not is_box(spec):  # every head's bias row (length_rows.py), keys 0 .. s - 1
        h = spec.hk * spec.g
        w.alloc("w_row", (h, limit))
        load_row_chunks(w, "w_row", h, f"T.floordiv({s} + {_chunk(limit) - 1}, {_chunk(limit)})", _chunk(limit),
                        "mask[h, {}]", spec.mask_shape[4])
    if t.tq > 1 and spec.causal is not None:  # band[y q + i, z] = -inf where z >= i, else 0
        q = t.tq
        w.alloc("w_band", (rows, q - 1))
        w.add(fill("w_band", rows, q - 1, q - 1, float("-inf")),
              f"for y, z in T.grid({t.stack}, {q - 1}):",
              "    " + fill("w_band", 1, "z + 1", q - 1, 0.0, offset=f"(y * {q} + z + 1) * {q - 1}"))


def _load_kv(w: Writer, spec, item: _Item, s: str, limit: int, which: str = "kv") -> None:
    """Kᵀ and V of the item's K / V head, keys 0 .. s - 1 (`which`: "k", "v" or both)."""
    slot = item.kv_slot
    if "k" in which:
        load = element(spec, "rhs", item.n, item.c, "u", "e")
        w.add(f"for e, u in T.grid({spec.d}, {limit}):",
              f"    w_kt[{slot}, e, u] = T.if_then_else(u < {s}, {load}, T.float32(0))")
    if "v" in which:
        load = element(spec, "value", item.n, item.c, "u", "e")
        w.add(f"for u, e in T.grid({limit}, {spec.dv}):",
              f"    w_v[{slot}, u, e] = T.if_then_else(u < {s}, {load}, T.float32(0))")


def _load_q(w: Writer, spec, t: RowTiling, item: _Item, s: str, indent: str = "") -> None:
    """The Q tiles of the item's stack of heads; in the last tile, its rows past s zeros (a FILL:
    the DMA box stops at s, and the GEMMs compute every row of the stack)."""
    rows, qs, valid = t.rows, t.q_stride, f"{s} - {item.row0}"
    w.add(indent + f"if {item.row0} + {t.tq} > {s}:",
          indent + f"    for y in range({t.stack}):",
          indent + "        " + fill("w_q", f"{t.tq} - ({valid})", spec.d, qs, 0.0,
                                     offset=f"{item.slot} * {rows * qs} + (y * {t.tq} + {valid}) * {qs}"))
    row = f"{item.row0} + i"
    load = element(spec, "lhs", item.n, f"{item.head} + y" if t.stack > 1 else item.head, row, "e")
    w.add(indent + f"for y, i, e in T.grid({t.stack}, {t.tq}, {spec.d}):",
          indent + f"    w_q[{item.slot}, y * {t.tq} + i, e] = T.if_then_else({row} < {s}, {load}, T.float32(0))")


def _scores(w: Writer, spec, t: RowTiling, item: _Item, limit: int) -> None:
    """[Q * scale in place] and S = Q Kᵀ over the item's keys."""
    rows, qs, ps = t.rows, t.q_stride, t.p_stride
    q = ("w_q", f"{item.slot} * {rows * qs}", qs)
    if scale_at(spec) in ("q", "k"):  # (a power of two with a bias row: on Q too, as exact)
        w.add(vfunc("identity", rows, spec.d, q, q, scale=spec.scale))
    box = is_box(spec)
    for y in range(t.stack if box else 0):  # each stacked head's bias box, loaded into its scores
        head = f"{item.head} + {y}" if y else item.head
        load_box(w, f"w_s[{item.slot}, {y * t.tq} + {{i}}, {{u}}]", head, item.row0, t.tq, "0",
                 f"T.floordiv({item.length} + {_chunk(limit) - 1}, {_chunk(limit)})", _chunk(limit), spec.mask_shape[4])
    w.add(call("cgra_gemm", flags=GEMM_ACCUMULATE if box else 0, dtype=F32, m=rows, n=item.keys, k=spec.d,
               a_addr=q[:2], a_stride=qs,
               b_addr=("w_kt", f"{item.kv_slot} * {spec.d * limit}"), b_stride=limit,
               acc_addr=("w_s", f"{item.slot} * {rows * ps}"), acc_stride=ps))
    for y in range(t.stack if spec.mask_shape and not box else 0):  # each stacked head's bias row
        head = f"{item.head} + {y}" if y else item.head
        w.add(row_gemm(t.tq, item.keys, ("w_ones", 0), ("w_row", f"({head}) * {limit}", limit),
                       ("w_s", f"{item.slot} * {rows * ps} + {y * t.tq * ps}", ps)))


def _softmax(w: Writer, spec, t: RowTiling, item: _Item, items: str, limit: int) -> None:
    """The triangle, the row max, P = exp(S - m), the row sums, O = P V (rows.py's _softmax)."""
    rows, sk, ps, dv = t.rows, item.keys, t.p_stride, spec.dv
    s = ("w_s", f"{item.slot} * {rows * ps}", ps)
    m = ("w_m", f"{item.slot} * {rows}", 1)
    if t.tq > 1 and spec.causal is not None:  # the columns its first row does not see (none past the length)
        at = ("w_s", f"{s[1]} + {item.band_at}", ps)
        w.add(f"if {item.row0} + 1 < {item.keys}:",
              "    " + eltwise("add", rows, item.band, at + (1,), ("w_band", 0, t.tq - 1, 1), at))
    w.add(fill("w_m", rows, 1, 1, LOWEST if spec.safe else float("-inf"), offset=m[1]),
          reduce("max", rows, sk, s, m[:2]),
          eltwise("subtract", rows, sk, s + (1,), m + (0,), s),
          *length_exps.exps(t, s, sk, item.length, spec.scale if scale_at(spec) == "exp" else None))  # [fabric's share]
    l = ("w_l", f"{item.slot} * {rows}")
    on_vector = [fill("w_l", rows, 1, 1, 0.0, offset=l[1]), reduce("sum", rows, sk, s, l)]
    if t.sums_on_pe:  # the last item's on the vector unit, beside its P V GEMM
        w.add(f"if {item.at} < {items} - 1:", "    " + gemm(False, rows, 1, sk, s, ("w_ones", 0, 1), l + (1,)),
              "else:", *("    " + line for line in on_vector))
    else:
        w.add(*on_vector)
    w.add(gemm(False, rows, dv, sk, s, ("w_v", f"{item.kv_slot} * {limit * dv}", dv),
               ("w_o", f"{item.slot} * {rows * dv}", dv)))


def _normalise(w: Writer, spec, t: RowTiling, item: _Item, s: str) -> None:
    """O * 1 / l of the item, its rows below s stored."""
    rows, dv, q = t.rows, spec.dv, t.tq
    at = f"{item.slot} * {rows * dv}"
    column = ("w_l", f"{item.slot} * {rows}", 1)
    w.add(vfunc("reciprocal", rows, 1, column, ("w_inv",) + column[1:], offset=TINY if spec.safe else None),
          eltwise("multiply", rows, dv, ("w_o", at, dv, 1), ("w_inv", f"{item.slot} * {rows}", 1, 0),
                  ("w_res", at, dv)))
    row = f"{item.row0} + i"
    stored_at = element(spec, "out", item.n, f"{item.head} + y" if t.stack > 1 else item.head, row, "e")
    w.add(f"for y, i, e in T.grid({t.stack}, {q}, {dv}):",
          f"    if {row} < {s}:", f"        {stored_at} = w_res[{item.slot}, y * {q} + i, e]")

