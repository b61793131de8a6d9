"""The whole-row attention kernel as TVMScript text: rows.py's generator before it built its
PrimFunc with TVM's IR builder (kernels/attention/prim_build.py), kept as the golden reference
tests/test_attention_build.py parses and compares the built kernel with (structurally equal).
A change to rows.py's commands changes this text the same way (the test says where they differ).
"""

from __future__ import annotations

from cgra_sim.isa import GEMM_ACCUMULATE, VFunc

from npu_backend.kernels.attention.attention_tiles import LOWEST, TINY, RowTiling, mask_in_gemm, mask_on_pe, \
    scale_at, score_copies
from npu_backend.kernels.attention.script_text import F32, Writer, call, eltwise, element, fill, gemm, guarded, \
    kernel_writer, reduce, rounded, vfunc
from npu_backend.kernels.attention.diagonal_exps import exp_groups, p_copies


class _Item:
    """Index expressions (text) of item `at` (a text expression of the flat loop variable, kept
    inside the items with T.min / T.max where an `if` already does: lower/dma.py bounds the
    copies' indices without reading the `if`)."""

    def __init__(self, spec, t: RowTiling, at: str):
        tiles, groups = t.mp // t.tq, spec.g // t.stack  # items of a K / V head: groups x tiles
        per_kv, per_batch = groups * tiles, spec.hk * groups * tiles
        self.at = at
        self.n = f"({at}) // {per_batch}" if spec.b > 1 else "0"
        self.c = f"({at}) // {per_kv} % {spec.hk}" if spec.hk > 1 else "0"
        j = f"({at}) // {tiles} % {groups}" if groups > 1 else "0"
        j = f"{j} * {t.stack}" if t.stack > 1 and groups > 1 else j
        self.head = f"{self.c} * {spec.g} + {j}" if spec.g > 1 else self.c  # the first of its stack
        self.row0 = f"({at}) % {tiles} * {t.tq}" if tiles > 1 else "0"
        self.kv = f"({at}) // {per_kv}"  # the flat (batch, K / V head)
        self.slot = f"({at}) % 2"
        self.p_slot = (f"({at}) % {tiles}" if tiles > 1 else self.slot) if t.diagonal else None
        self.s_slot = f"({at}) % {score_copies(spec)}"
        self.kv_slot = f"({at}) // {per_kv} % 2" if t.kv_copies == 2 else "0"
        self.new_kv = f"({at}) % {per_kv} == 0"
        self.new_batch = f"({at}) % {per_batch} == 0"
        mb = spec.mask_shape[0] if spec.mask_shape else 1
        self.mask_slot = f"({at}) // {per_batch} % 2" if mb > 1 else "0"  # a mask per batch: two copies
        # under a causal triangle of offset c: the keys up to the last row's diagonal, and the
        # triangle's columns from the first row's diagonal + 1 (attention_tiles.tile_keys, band_width)
        c, sk, tq = spec.causal, spec.sk, t.tq
        self.keys = str(sk)
        if c is not None:
            self.keys = str(min(sk, tq + c)) if tiles == 1 else f"T.min({sk}, {self.row0} + {tq + c})"
            self.band_at = f"{self.row0} + {c + 1}"
            self.band = str(min(tq - 1, sk - c - 1)) if tiles == 1 else f"T.min({tq - 1}, {sk - c - 1} - {self.row0})"


def rows_script(spec, t: RowTiling) -> str:
    """The TVMScript text of the kernel (module docstring)."""
    w = kernel_writer(spec, "attention")
    _allocate(w, spec, t)
    items = spec.b * spec.hk * spec.g // t.stack * (t.mp // t.tq)
    first = _Item(spec, t, "0")
    if t.mask == "whole":  # in the order the first S needs them (V only for its P V)
        _load_whole_mask(w, spec, t, first)
    _load_kv(w, spec, first, "k")
    _load_q(w, spec, t, first)
    _load_kv(w, spec, first, "v")
    if items > 1:
        _load_q(w, spec, t, _Item(spec, t, "1"))
    _scores(w, spec, t, first, scale_k=scale_at(spec) == "k")
    w.add(f"for t in range({items}):")
    w.depth += 1
    one_copy = t.kv_copies == 1 and spec.b * spec.hk > 1
    if items > 1:
        _next_items(w, spec, t, items, "same head" if one_copy else "")
    _softmax(w, spec, t, _Item(spec, t, "t"), items)
    if items > 1 and one_copy:
        _next_items(w, spec, t, items, "new head")
    if items > 1:
        w.add("if t > 0:")
        w.depth += 1
        _normalise(w, spec, t, _Item(spec, t, "T.max(t - 1, 0)"))
        w.depth -= 1
    w.depth -= 1
    _normalise(w, spec, t, _Item(spec, t, str(items - 1)))
    return "\n".join(w.lines) + "\n"


def _next_items(w: Writer, spec, t: RowTiling, items: int, when: str = "") -> None:
    """Iteration t's work for the items after it: [K and V of item t + 1's K / V head (of item
    t + 2's when K is scaled: its scale then waits for nothing)], S of item t + 1, Q of t + 2.
    With one copy of K and V, item t + 1 of the same head comes before item t's softmax
    (`when` "same head") and one of a new head after it ("new head"): its K / V load replaces
    what item t's P V GEMM reads."""
    per_kv = spec.g // t.stack * (t.mp // t.tq)
    early = scale_at(spec) == "k" and t.kv_copies == 2 and per_kv > 1  # two K / V copies stay apart
    after, later = (_Item(spec, t, f"T.min(t + {k}, {items - 1})") for k in (1, 2))
    only = {"": "", "same head": f" and (t + 1) % {per_kv} != 0", "new head": f" and (t + 1) % {per_kv} == 0"}[when]
    w.add(f"if t + 1 < {items}{only}:")
    w.depth += 1
    if when != "same head":
        w.add(f"if {after.new_kv}:")
        w.depth += 1
        if early:
            _scale_k(w, spec, after)
        else:
            _load_kv(w, spec, after)
            if scale_at(spec) == "k":
                _scale_k(w, spec, after)
        if t.mask == "whole" and spec.mask_shape[0] > 1:
            w.add(f"if {after.new_batch}:")
            _load_whole_mask(w, spec, t, after, indent="    ")
        w.depth -= 1
    _scores(w, spec, t, after)
    if items > 2:
        w.add(f"if t + 2 < {items}:")
        w.depth += 1
        _load_q(w, spec, t, later)
        if early:
            w.add(f"if {later.new_kv}:")
            w.depth += 1
            _load_kv(w, spec, later)
            w.depth -= 1
        w.depth -= 1
    w.depth -= 1


def _scale_k(w: Writer, spec, item: _Item, indent: str = "") -> None:
    """Kᵀ of the item's K / V head times the scale, once for the G query heads of its group."""
    kt = ("kt", f"{item.kv_slot} * {spec.d * spec.sk}", spec.sk)
    w.add(indent + _scaled(spec.d, spec.sk, kt))


def _scaled(rows, cols, x: tuple) -> str:
    """x (buffer, offset, row stride) times the scale in place: an ELTWISE multiply by the scale
    held in `factor` (read once, stride 0), the one rounding a VFUNC identity's scale makes, at
    the lanes' width where that VFUNC takes two steps an element (scale, then identity)."""
    return eltwise("multiply", rows, cols, x + (1,), ("factor", 0, 0, 0), x)


def _allocate(w: Writer, spec, t: RowTiling) -> None:
    """Two copies of every per-item buffer (a leading axis of 2), K and V per K / V head."""
    tq, sk, d, dv = t.rows, spec.sk, spec.d, spec.dv
    for name, shape in (("kt", (t.kv_copies, d, sk)), ("v", (t.kv_copies, sk, dv)), ("q", (2, tq, t.q_stride)),
                        ("s", (score_copies(spec), tq, t.p_stride)), ("m", (2, tq)), ("l", (2, tq)), ("inv", (2, tq)),
                        ("o", (2, tq, dv))):
        w.alloc(name, shape)
    w.alloc("res", (2, tq, dv), spec.half_out or "float32")
    if t.mask == "whole":
        _, mhk, mg, msq, msk = spec.mask_shape
        w.alloc("mask_all", (2 if spec.mask_shape[0] > 1 else 1, mhk * mg, t.mp if msq > 1 else 1, msk))
    elif t.mask == "tile":
        w.alloc("mask_tile", (2, t.tq if spec.mask_shape[3] > 1 else 1, spec.mask_shape[4]))
    # the PE array's other operand: ones (the row sums P 1; a mask row 1 m or column m 1)
    w.alloc("ones", (max(sk, tq),))
    w.add(fill("ones", 1, max(sk, tq), max(sk, tq), 1.0))
    if scale_at(spec) in ("q", "k"):
        w.alloc("factor", (1,))
        w.add(fill("factor", 1, 1, 1, spec.scale))
    if spec.unseen:  # a row of c (each key's weight in a row that sees none), c 1ᵀ V, the rows' flags
        w.alloc("weights", (sk,))
        w.add(fill("weights", 1, sk, sk, spec.unseen))
        w.alloc("cv", (t.kv_copies, dv))
        w.alloc("u", (2, tq))
    if spec.causal is not None and t.tq > 1:  # the triangle: band[i, z] = -inf where z >= i, else 0
        q = t.tq  # (once per head of a stack: rows y q + i)
        w.alloc("band", (tq, q - 1))
        w.add(fill("band", tq, q - 1, q - 1, float("-inf")))
        if t.stack == 1:
            w.add(f"for z in range({q - 1}):", "    " + fill("band", 1, "z + 1", q - 1, 0.0, offset=f"(z + 1) * {q - 1}"))
        else:
            w.add(f"for y, z in T.grid({t.stack}, {q - 1}):",
                  "    " + fill("band", 1, "z + 1", q - 1, 0.0, offset=f"(y * {q} + z + 1) * {q - 1}"))
    if t.diagonal:  # P per query tile, zero where no exp writes
        w.alloc("p", (p_copies(t), tq, t.p_stride))
        w.add(fill("p", p_copies(t) * tq, t.p_stride, t.p_stride, 0.0))


def _load_kv(w: Writer, spec, item: _Item, which: str = "kv") -> None:
    """Kᵀ (the DMA reads K with its strides swapped) and V of the item's K / V head (`which`:
    "k", "v" or both)."""
    slot = item.kv_slot
    if "k" in which:
        w.add(f"for e, u in T.grid({spec.d}, {spec.sk}):",
              f"    kt[{slot}, e, u] = {element(spec, 'rhs', item.n, item.c, 'u', 'e')}")
    if "v" in which:
        w.add(f"for u, e in T.grid({spec.sk}, {spec.dv}):",
              f"    v[{slot}, u, e] = {element(spec, 'value', item.n, item.c, 'u', 'e')}")
        if spec.unseen:  # c 1ᵀ V = sum_j fl(c v_j): HF's P V in a row of uniform weights c, the same products
            w.add(gemm(False, 1, spec.dv, spec.sk, ("weights", 0, spec.sk), ("v", f"{slot} * {spec.sk * spec.dv}", spec.dv),
                       ("cv", f"{slot} * {spec.dv}", spec.dv)))


def _load_whole_mask(w: Writer, spec, t: RowTiling, item: _Item, indent: str = "") -> None:
    """The mask of the item's batch, every head's (Swin's bias) or the one shared, whole (two
    copies for a mask per batch: the next batch's load runs under this one's items)."""
    mb, mhk, mg, msq, msk = spec.mask_shape
    rows = t.mp if msq > 1 else 1
    load = f"mask[{item.n if mb > 1 else 0}, h, {'i' if msq > 1 else '0'}, e]"
    w.add(indent + f"for h, i, e in T.grid({mhk * mg}, {rows}, {msk}):",
          indent + f"    mask_all[{item.mask_slot}, h, i, e] = {guarded('i', spec.sq, t.tq, load) if msq > 1 else load}")


def _load_q(w: Writer, spec, t: RowTiling, item: _Item) -> None:
    """The item's Q tile (zero rows past the sequence) [and its mask tile]."""
    row = f"{item.row0} + i"
    if t.stack == 1:
        w.add(f"for i, e in T.grid({t.tq}, {spec.d}):",
              f"    q[{item.slot}, i, e] = {guarded(row, spec.sq, t.tq, element(spec, 'lhs', item.n, item.head, row, 'e'))}")
    else:  # the stack's heads one under the other
        load = guarded(row, spec.sq, t.tq, element(spec, 'lhs', item.n, f"{item.head} + y", row, 'e'))
        w.add(f"for y, i, e in T.grid({t.stack}, {t.tq}, {spec.d}):", f"    q[{item.slot}, y * {t.tq} + i, e] = {load}")
    if t.mask == "tile":
        _load_mask_tile(w, spec, t, item)


def _load_mask_tile(w: Writer, spec, t: RowTiling, item: _Item) -> None:
    """The item's tile of the mask, loaded with its Q two items ahead."""
    mb, mhk, mg, msq, msk = spec.mask_shape
    rows, row = (t.tq if msq > 1 else 1), f"{item.row0} + i"
    load = f"mask[{item.n if mb > 1 else 0}, {item.head if mhk * mg > 1 else 0}, {row if msq > 1 else 0}, e]"
    w.add(f"for i, e in T.grid({rows}, {msk}):",
          f"    mask_tile[{item.slot}, i, e] = {guarded(row, spec.sq, t.tq, load) if msq > 1 else load}")


def _scores(w: Writer, spec, t: RowTiling, item: _Item, scale_k: bool = False) -> None:
    """[Kᵀ * scale (`scale_k`), Q * scale (in place)] and S = Q Kᵀ of the item; with a mask of
    whole tiles, S = mask + Q Kᵀ: the mask copied into S (VFUNC identity: one read a score, where
    an ELTWISE add reads two) and the GEMM accumulating onto it, which rounds fl(Q Kᵀ) + mask as
    the ELTWISE did. The copy comes first: the mask is the first load (rows_script)."""
    tq, qs, ps = t.rows, t.q_stride, t.p_stride
    q = ("q", f"{item.slot} * {tq * qs}", qs)
    s = ("s", f"{item.s_slot} * {tq * ps}", ps)
    if mask_in_gemm(spec):
        a = _mask_operand(spec, t, item)
        w.add(call("cgra_vfunc", flags=0, func=int(VFunc.IDENTITY), dtype=F32, rows=tq, cols=spec.sk,
                    a_addr=a[:2], a_row_stride=a[2], a_col_stride=a[3], out_addr=s[:2], out_stride=ps,
                    scale_bits=0, offset_bits=0))
    if scale_k:
        _scale_k(w, spec, item)
    if scale_at(spec) == "q":
        w.add(_scaled(tq, spec.d, q))
    w.add(call("cgra_gemm", flags=GEMM_ACCUMULATE if mask_in_gemm(spec) else 0, dtype=F32, m=tq, n=item.keys,
                k=spec.d, a_addr=q[:2], a_stride=qs, b_addr=("kt", f"{item.kv_slot} * {spec.d * spec.sk}"),
                b_stride=spec.sk, acc_addr=s[:2], acc_stride=ps))
    if mask_on_pe(spec):  # S + a mask row (1 m) or column (m 1): fl(S + m), as the ELTWISE add rounds
        mask = _mask_operand(spec, t, item)
        ones = ("ones", 0)
        row = spec.mask_shape[3] == 1
        w.add(gemm(True, tq, item.keys, 1, ones + (1,) if row else mask[:2] + (1,), mask[:2] + (spec.sk,) if row
                   else ones + (spec.sk,), s))


def _mask_operand(spec, t: RowTiling, item: _Item) -> tuple:
    """The ELTWISE operand (buffer, offset, row stride, column stride) of the item's mask."""
    _, mhk, mg, msq, msk = spec.mask_shape
    row_stride, col_stride = (msk if msq > 1 else 0), (1 if msk > 1 else 0)
    if t.mask == "tile":
        return ("mask_tile", f"{item.slot} * {(t.tq if msq > 1 else 1) * msk}", row_stride, col_stride)
    rows = t.mp if msq > 1 else 1
    batch = f"{item.mask_slot} * {mhk * mg * rows * msk}"
    head = f"({item.head}) * {rows * msk}" if mhk * mg > 1 else "0"
    row = f"({item.row0}) * {msk}" if msq > 1 else "0"
    return ("mask_all", f"{batch} + {head} + {row}", row_stride, col_stride)


def _softmax(w: Writer, spec, t: RowTiling, item: _Item, items: int) -> None:
    """[S + a scalar mask], the row max m of S, P = exp(S - m) in place, its row sums l = P 1 and
    O = P V. The sums are a GEMM on the PE array where the vector unit is the busier unit
    (`RowTiling.sums_on_pe`: a REDUCE takes the vector unit a cycle a column), else a REDUCE.
    S - m stays an ELTWISE: a GEMM of k = 1 adding m times a row of -1 would round the same, but
    the PE array's in-order queue holds it behind the previous item's P V GEMM, and the exp would
    wait for that every item. The last item's sums are a REDUCE all the same: the vector unit has
    nothing else left to do, and its sums then run beside that item's P V GEMM, not before it."""
    tq, sk, ps, dv = t.rows, item.keys, t.p_stride, spec.dv
    s = ("s", f"{item.s_slot} * {tq * ps}", ps)
    m = ("m", f"{item.slot} * {tq}", 1)
    if spec.mask_shape and not mask_in_gemm(spec) and not mask_on_pe(spec):
        w.add(eltwise("add", tq, sk, s + (1,), _mask_operand(spec, t, item), s))
    if spec.causal is not None and t.tq > 1:
        _add_band(w, spec, t, item, s)
    w.add(fill("m", tq, 1, 1, LOWEST if spec.safe else float("-inf"), offset=m[1]),
          reduce("max", tq, sk, s, m[:2]),
          eltwise("subtract", tq, sk, s + (1,), m + (0,), s))
    s = _exps(w, spec, t, item, s)
    if spec.unseen:  # after the exp: the P V GEMM waits for nothing new
        _flag_unseen(w, spec, t, item, m)
    l = ("l", f"{item.slot} * {tq}")
    on_vector = [fill("l", tq, 1, 1, 0.0, offset=l[1]), reduce("sum", tq, sk, s, l)]
    if t.sums_on_pe and items > 1:
        w.add(f"if {item.at} < {items - 1}:", "    " + gemm(False, tq, 1, sk, s, ("ones", 0, 1), l + (1,)),
              "else:", *("    " + line for line in on_vector))
    elif t.sums_on_pe:
        w.add(gemm(False, tq, 1, sk, s, ("ones", 0, 1), l + (1,)))
    else:
        w.add(*on_vector)
    w.add(gemm(False, tq, dv, sk, s, ("v", f"{item.kv_slot} * {spec.sk * dv}", dv), ("o", f"{item.slot} * {tq * dv}", dv)))
    if spec.unseen:
        _give_unseen(w, spec, t, item, l)


def _exps(w: Writer, spec, t: RowTiling, item: _Item, s: tuple) -> tuple:
    """P = exp(S - m): in place, or over each row group's visible keys into the item's P."""
    scale = spec.scale if scale_at(spec) == "exp" else None
    if not t.diagonal:
        w.add(vfunc("exp", t.rows, item.keys, s, s, scale=scale))
        return s
    ps, tiles = t.p_stride, t.mp // t.tq
    p = ("p", f"{item.p_slot} * {t.rows * ps}", ps)
    for first, rows, stride, last in exp_groups(t.tq, t.stack):
        see = last + spec.causal + 1
        keys = str(min(spec.sk, see)) if tiles == 1 else f"T.min({spec.sk}, {item.row0} + {see})"
        at = first * ps
        w.add(vfunc("exp", rows, keys, (s[0], f"{s[1]} + {at}" if at else s[1], stride * ps),
                    (p[0], f"{p[1]} + {at}" if at else p[1], stride * ps), scale=scale))
    return p


def _flag_unseen(w: Writer, spec, t: RowTiling, item: _Item, m: tuple) -> None:
    """u = 1 in the item's rows that see no key, else +0, from their max m: the safe softmax's
    max starts at LOWEST and stays there only in such a row (a seen row's max is a score, at
    least ulp(LOWEST) = 2^104 above it). m + FLT_MAX is 0 there, else at least 2^104: its minimum
    with 1 is 0 or 1, and 1 - that is u, each step exact. Three short vector commands right
    after the max, nothing waited for (the sums' GEMM comes later)."""
    tq = t.rows
    u = ("u", f"{item.slot} * {tq}", 1)
    w.add(vfunc("identity", tq, 1, m, u, offset=-LOWEST),
          eltwise("minimum", tq, 1, u + (0,), ("ones", 0, 0, 0), u),
          vfunc("identity", tq, 1, u, u, scale=-1.0, offset=1.0))


def _give_unseen(w: Writer, spec, t: RowTiling, item: _Item, l: tuple) -> None:
    """The rows u flags take c 1ᵀ V, where(kept, P, c)'s output there: l += u 1 and O += u (c 1ᵀ V)
    on the PE array after P V, GEMMs of k = 1 whose products are exact: such a row's O = 0 + c 1ᵀ V
    and l = 1 (its reciprocal 1: O * 1 unchanged), every other row's O + 0 and l + 0."""
    tq, dv = t.rows, spec.dv
    u = ("u", f"{item.slot} * {tq}", 1)
    w.add(gemm(True, tq, 1, 1, u, ("ones", 0, 1), l + (1,)),
          gemm(True, tq, dv, 1, u, ("cv", f"{item.kv_slot} * {dv}", dv), ("o", f"{item.slot} * {tq * dv}", dv)))


def _add_band(w: Writer, spec, t: RowTiling, item: _Item, s: tuple) -> None:
    """The causal triangle added to the item's scores where it crosses their columns (none for a
    tile whose rows all see every key): -inf above the diagonal, exactly as the mask's add."""
    tq, c = t.tq, spec.causal
    band = eltwise("add", t.rows, item.band, ("s", f"{s[1]} + {item.band_at}", s[2], 1), ("band", 0, tq - 1, 1),
                   ("s", f"{s[1]} + {item.band_at}", s[2]))
    if (t.mp // tq) * tq + c <= spec.sk:  # every tile's triangle whole inside the keys
        w.add(band)
    elif t.mp // tq == 1:
        if spec.sk - c - 1 > 0:
            w.add(band)
    else:
        w.add(f"if {item.row0} < {spec.sk - c - 1}:", "    " + band)


def _normalise(w: Writer, spec, t: RowTiling, item: _Item) -> None:
    """O * 1 / l of the item, stored (its rows inside the sequence)."""
    tq, dv = t.rows, spec.dv
    at = f"{item.slot} * {tq * dv}"
    column = ("l", f"{item.slot} * {tq}", 1)
    w.add(vfunc("reciprocal", tq, 1, column, ("inv",) + column[1:], offset=TINY if spec.safe else None))
    product = ("o" if spec.half_out else "res", at, dv)
    w.add(eltwise("multiply", tq, dv, ("o", at, dv, 1), ("inv", f"{item.slot} * {tq}", 1, 0), product))
    if spec.half_out:
        w.add(rounded(tq, dv, product, ("res", at, dv), spec.half_out))
    row = f"{item.row0} + i"
    q = t.tq
    if t.stack == 1:
        stored_at, res = element(spec, "out", item.n, item.head, row, "e"), f"res[{item.slot}, i, e]"
        w.add(f"for i, e in T.grid({q}, {dv}):")
    else:  # the stack's heads one under the other
        stored_at, res = element(spec, "out", item.n, f"{item.head} + y", row, "e"), f"res[{item.slot}, y * {q} + i, e]"
        w.add(f"for y, i, e in T.grid({t.stack}, {q}, {dv}):")
    if spec.sq % q:
        w.add(f"    if {row} < {spec.sq}:", f"        {stored_at} = {res}")
    else:
        w.add(f"    {stored_at} = {res}")
