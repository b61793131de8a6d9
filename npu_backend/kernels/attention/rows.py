"""The whole-row attention kernel, software-pipelined over its heads and query tiles.

Stage: kernel definition (the attention family's compute when its tile search chose a RowTiling:
attention_tiles.py). In: the AttentionSpec. Out: the kernel as lowered TIR, built with TVM's IR
builder (prim_build.py: no text parsed), whose commands compute what the whole-row softmax computes:

    S = (Q * scale) Kᵀ [+ mask] (VFUNC identity, [the mask copied into S: VFUNC identity,] GEMM)
    [S + a mask row or column: 1 m or m 1 (GEMM of k = 1, accumulating)]
    m = row max of S (FILL, REDUCE MAX); P = exp(S - m) (ELTWISE, VFUNC); l = P 1 (GEMM)
    O = P V (GEMM); O * 1 / l (VFUNC reciprocal, ELTWISE), stored

The vector unit is the kernel's bottleneck (the exp on the function unit alone is an element a
cycle on cgra-8x8), so whatever the PE array can do exactly goes there: the row sums as a GEMM
with a column of ones (summed in the GEMM's order, not the REDUCE's left to right: within the
same bound, not the same bits), a mask row or column as a GEMM of k = 1 whose products are
exact, so S + m rounds once as the ELTWISE add did.

The items (batch, K / V head, query head of its group, tile of tq query rows) run as one flat
loop t, in that order, each with its own copy (of two) of Q, S, the columns and O, so that the
four queues overlap neighbouring items instead of waiting for each other (the commands of one
item depend on each other all the way): in iteration t the stream holds

    [K and V of item t + 1's K / V head, if it starts one] the scale of Q(t + 1) and S(t + 1) = Q Kᵀ,
    the load of Q(t + 2); the softmax of item t, l(t) = P 1, O(t) = P V; 1 / l(t - 1), O(t - 1)
    normalised and stored

so the PE array computes item t + 1's scores while the vector unit runs item t's softmax, and the
vector unit normalises O(t - 1) (its GEMM long done) instead of waiting for O(t). K and V are held
per K / V head (two copies where they fit: the next head's load runs under this one's items),
shared by the G query heads of its group. A batch's mask is held whole where it fits (loaded
once per batch: Swin's bias per head, a causal or padding mask shared by the heads), else a
tile per item is loaded an item ahead.

Under a causal triangle of offset c (spec.causal: no mask operand for it; a padding row may come
with it, normalise/causal_rows.py) the kernel builds the triangle once, band[i, z] = -inf where
z >= i else 0 (tq x (tq - 1): a FILL of -inf and a FILL of a growing row prefix per row), and an
item of query rows row0 .. row0 + tq - 1 computes only keys 0 .. min(Sk, row0 + tq + c) - 1 (its
last row's diagonal): S = Q Kᵀ, the row's GEMM, the max, S - m, the exp, the sums and P V all on
those columns (their sizes expressions of the loop variable), and adds the band to the columns
row0 + c + 1 .. (those its first row does not see) at the start of its softmax. A key above every
row's diagonal would have scored -inf, given exp 0 and added +0 to the sums and to P V: leaving
it out gives the same bits. A row that sees no key (a padding row over its visible keys) gives
what the mask's kernel gave: 0 under a safe softmax, NaN under a plain one. An item may take
the same query tile of `RowTiling.stack` heads of a group (their K shared), their rows one under
the other (y tq + i) in Q, S and O, the band built once per head of the stack: each command then
covers the group's rows (its fixed costs once), and each row's arithmetic is what it was alone.
With `RowTiling.diagonal` the exp skips most of the triangle: it runs over row groups up to
their own diagonals and writes P per query tile, zero where it does not write (diagonal_exps.py).
"""

from __future__ import annotations

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from ..common.spec import SINGLE_BUFFERED
from cgra_sim.isa import GEMM_ACCUMULATE, VFunc

from .attention_tiles import LOWEST, TINY, RowTiling, mask_in_gemm, mask_on_pe, scale_at, score_copies
from . import diagonal_exps, fabric_exps, scores_mask
from .diagonal_exps import p_copies
from .prim_build import KernelBuilder, both, eq, guarded, lt, ne, plus
from .script_text import F32, call, eltwise, fill, gemm, reduce, rounded, vfunc, with_arg_shapes

#: Every buffer: the kernel keeps its own two copies where it needs them (lower/double_buffer.py
#: must leave them alone; they are allocated outside the loop anyway).
BUFFERS = ["kt", "v", "q", "s", "m", "l", "inv", "o", "res", "mask_all", "mask_tile", "ones", "band",
           "weights", "cv", "u", "factor", "p", fabric_exps.BUFFER]


def rows_compute(spec, t: RowTiling):
    """The kernel's PrimFunc: parameters as flash.py's, the caller's rank-5 views in
    `cgra.arg_shapes`."""
    func = with_arg_shapes(rows_func(spec, t), spec)
    return func.with_attr(SINGLE_BUFFERED, BUFFERS)


class _Item:
    """Index expressions of item `at` (an int, or an expression of the flat loop variable kept
    inside the items with T.min / T.max where an `if` already does: lower/dma.py bounds the
    copies' indices without reading the `if`)."""

    def __init__(self, spec, t: RowTiling, at):
        tiles, groups = t.mp // t.tq, spec.g // t.stack  # items of a K / V head: groups x tiles
        per_kv, per_batch = groups * tiles, spec.hk * groups * tiles
        self.at = at
        self.n = at // per_batch if spec.b > 1 else 0
        self.c = at // per_kv % spec.hk if spec.hk > 1 else 0
        j = at // tiles % groups if groups > 1 else 0
        j = j * t.stack if t.stack > 1 and groups > 1 else j
        self.head = self.c * spec.g + j if spec.g > 1 else self.c  # the first of its stack
        self.row0 = at % tiles * t.tq if tiles > 1 else 0
        self.slot = at % 2
        self.p_slot = (at % tiles if tiles > 1 else at % 2) if t.diagonal else None  # diagonal_exps.p_copies
        self.s_slot = at % score_copies(spec)
        self.kv_slot = at // per_kv % 2 if t.kv_copies == 2 else 0
        self.new_kv = eq(at % per_kv, 0)
        self.new_batch = eq(at % per_batch, 0)
        mb = spec.mask_shape[0] if spec.mask_shape else 1
        self.mask_slot = at // per_batch % 2 if mb > 1 else 0  # a mask per batch: two copies
        # under a causal triangle of offset c: the keys up to the last row's diagonal, and the
        # triangle's columns from the first row's diagonal + 1 (attention_tiles.tile_keys, band_width)
        c, sk, tq = spec.causal, spec.sk, t.tq
        self.keys = sk
        if c is not None:
            self.keys = min(sk, tq + c) if tiles == 1 else T.min(sk, self.row0 + (tq + c))
            self.band_at = self.row0 + (c + 1)
            self.band = min(tq - 1, sk - c - 1) if tiles == 1 else T.min(tq - 1, (sk - c - 1) - self.row0)


def rows_func(spec, t: RowTiling):
    """The kernel (module docstring) built: its PrimFunc without the caller's views."""
    w = KernelBuilder(spec, "attention")
    _allocate(w, spec, t)
    items = spec.b * spec.hk * spec.g // t.stack * (t.mp // t.tq)
    first = _Item(spec, t, 0)
    if t.mask == "whole":  # in the order the first S needs them (V only for its P V)
        _load_whole_mask(w, spec, t, first)
    _load_kv(w, spec, first, "k")
    _load_q(w, spec, t, first)
    _load_kv(w, spec, first, "v")
    if items > 1:
        _load_q(w, spec, t, _Item(spec, t, 1))
    _scores(w, spec, t, first, scale_k=scale_at(spec) == "k")
    with w.serial("t", items) as at:
        one_copy = t.kv_copies == 1 and spec.b * spec.hk > 1
        if items > 1:
            _next_items(w, spec, t, at, items, "same head" if one_copy else "")
        _softmax(w, spec, t, _Item(spec, t, at), items)
        if items > 1 and one_copy:
            _next_items(w, spec, t, at, items, "new head")
        if items > 1:
            with w.when(_gt(at, 0)):
                _normalise(w, spec, t, _Item(spec, t, T.max(at - 1, 0)))
    _normalise(w, spec, t, _Item(spec, t, items - 1))
    return w.finish()


def _gt(a, b):
    return tirx.GT(a, tirx.IntImm(str(a.ty.dtype), b))


def _next_items(w: KernelBuilder, spec, t: RowTiling, at, items: int, when: str = "") -> None:
    """Iteration `at`'s work for the items after it: [K and V of item at + 1's K / V head (of item
    at + 2's when K is scaled: its scale then waits for nothing)], S of item at + 1, Q of at + 2.
    With one copy of K and V, item at + 1 of the same head comes before item at's softmax
    (`when` "same head") and one of a new head after it ("new head"): its K / V load replaces
    what item at's P V GEMM reads."""
    per_kv = spec.g // t.stack * (t.mp // t.tq)
    early = scale_at(spec) == "k" and t.kv_copies == 2 and per_kv > 1  # two K / V copies stay apart
    after, later = (_Item(spec, t, T.min(at + k, items - 1)) for k in (1, 2))
    condition = lt(at + 1, items)
    if when:
        condition = both(condition, (ne if when == "same head" else eq)((at + 1) % per_kv, 0))
    with w.when(condition):
        if when != "same head":
            with w.when(after.new_kv):
                if early:
                    _scale_k(w, spec, after)
                else:
                    _load_kv(w, spec, after)
                    if scale_at(spec) == "k":
                        _scale_k(w, spec, after)
                if t.mask == "whole" and spec.mask_shape[0] > 1:
                    with w.when(after.new_batch):
                        _load_whole_mask(w, spec, t, after)
        _scores(w, spec, t, after)
        if items > 2:
            with w.when(lt(at + 2, items)):
                _load_q(w, spec, t, later)
                if early:
                    with w.when(later.new_kv):
                        _load_kv(w, spec, later)


def _scale_k(w: KernelBuilder, spec, item: _Item) -> None:
    """Kᵀ of the item's K / V head times the scale, once for the G query heads of its group."""
    kt = (w["kt"], item.kv_slot * (spec.d * spec.sk), spec.sk)
    w.add(_scaled(w, spec.d, spec.sk, kt))


def _scaled(w: KernelBuilder, rows, cols, x: tuple):
    """x (buffer, offset, row stride) times the scale in place: an ELTWISE multiply by the scale
    held in `factor` (read once, stride 0), the one rounding a VFUNC identity's scale makes, at
    the lanes' width where that VFUNC takes two steps an element (scale, then identity)."""
    return eltwise("multiply", rows, cols, x + (1,), (w["factor"], 0, 0, 0), x)


def _allocate(w: KernelBuilder, spec, t: RowTiling) -> None:
    """Two copies of every per-item buffer (a leading axis of 2), K and V per K / V head."""
    tq, sk, d, dv = t.rows, spec.sk, spec.d, spec.dv
    for name, shape in (("kt", (t.kv_copies, d, sk)), ("v", (t.kv_copies, sk, dv)), ("q", (2, tq, t.q_stride)),
                        ("s", (score_copies(spec), tq, t.p_stride)), ("m", (2, tq)), ("l", (2, tq)), ("inv", (2, tq)),
                        ("o", (2, tq, dv))):
        w.alloc(name, shape)
    w.alloc("res", (2, tq, dv), spec.half_out or "float32")  # what is stored (_normalise)
    if t.mask == "whole":
        _, mhk, mg, msq, msk = spec.mask_shape
        w.alloc("mask_all", (2 if spec.mask_shape[0] > 1 else 1, mhk * mg, t.mp if msq > 1 else 1, msk))
    elif t.mask == "tile":
        w.alloc("mask_tile", (2, t.tq if spec.mask_shape[3] > 1 else 1, spec.mask_shape[4]))
    # the PE array's other operand: ones (the row sums P 1; a mask row 1 m or column m 1)
    ones = w.alloc("ones", (max(sk, tq),))
    w.add(fill(ones, 1, max(sk, tq), max(sk, tq), 1.0))
    if scale_at(spec) in ("q", "k"):
        w.add(fill(w.alloc("factor", (1,)), 1, 1, 1, spec.scale))
    if spec.unseen:  # a row of c (each key's weight in a row that sees none), c 1ᵀ V, the rows' flags
        w.add(fill(w.alloc("weights", (sk,)), 1, sk, sk, spec.unseen))
        w.alloc("cv", (t.kv_copies, dv))
        w.alloc("u", (2, tq))
    if spec.causal is not None and t.tq > 1:  # the triangle: band[i, z] = -inf where z >= i, else 0
        q = t.tq  # (once per head of a stack: rows y q + i)
        band = w.alloc("band", (tq, q - 1))
        w.add(fill(band, tq, q - 1, q - 1, float("-inf")))
        if t.stack == 1:
            with w.serial("z", q - 1) as z:
                w.add(fill(band, 1, z + 1, q - 1, 0.0, offset=(z + 1) * (q - 1)))
        else:
            with w.grid("y, z", t.stack, q - 1) as (y, z):
                w.add(fill(band, 1, z + 1, q - 1, 0.0, offset=(y * q + z + 1) * (q - 1)))
    fabric_exps.allocate(w, t, sk)  # the fabric's share of the exps: its scratch tile
    if t.diagonal:  # P per query tile, its entries no exp writes +0 for good (diagonal_exps.py)
        w.add(fill(w.alloc("p", (p_copies(t), tq, t.p_stride)), p_copies(t) * tq, t.p_stride, t.p_stride, 0.0))


def _load_kv(w: KernelBuilder, spec, item: _Item, which: str = "kv") -> None:
    """Kᵀ (the DMA reads K with its strides swapped) and V of the item's K / V head (`which`:
    "k", "v" or both)."""
    slot = item.kv_slot
    if "k" in which:
        with w.grid("e, u", spec.d, spec.sk) as (e, u):
            w.store("kt", (slot, e, u), w.element("rhs", item.n, item.c, u, e))
    if "v" in which:
        with w.grid("u, e", spec.sk, spec.dv) as (u, e):
            w.store("v", (slot, u, e), w.element("value", item.n, item.c, u, e))
        if spec.unseen:  # c 1ᵀ V = sum_j fl(c v_j): HF's P V in a row of uniform weights c, the same products
            w.add(gemm(False, 1, spec.dv, spec.sk, (w["weights"], 0, spec.sk),
                       (w["v"], slot * (spec.sk * spec.dv), spec.dv), (w["cv"], slot * spec.dv, spec.dv)))


def _load_whole_mask(w: KernelBuilder, spec, t: RowTiling, item: _Item) -> None:
    """The mask of the item's batch, every head's (Swin's bias) or the one shared, whole (two
    copies for a mask per batch: the next batch's load runs under this one's items)."""
    mb, mhk, mg, msq, msk = spec.mask_shape
    rows = t.mp if msq > 1 else 1
    with w.grid("h, i, e", mhk * mg, rows, msk) as (h, i, e):
        load = w["mask"][item.n if mb > 1 else 0, h, i if msq > 1 else 0, e]
        w.store("mask_all", (item.mask_slot, h, i, e), guarded(i, spec.sq, t.tq, load) if msq > 1 else load)


def _load_q(w: KernelBuilder, spec, t: RowTiling, item: _Item) -> None:
    """The item's Q tile (zero rows past the sequence) [and its mask tile]."""
    if t.stack == 1:
        with w.grid("i, e", t.tq, spec.d) as (i, e):
            row = item.row0 + i
            w.store("q", (item.slot, i, e), guarded(row, spec.sq, t.tq, w.element("lhs", item.n, item.head, row, e)))
    else:  # the stack's heads one under the other
        with w.grid("y, i, e", t.stack, t.tq, spec.d) as (y, i, e):
            row = item.row0 + i
            load = guarded(row, spec.sq, t.tq, w.element("lhs", item.n, item.head + y, row, e))
            w.store("q", (item.slot, y * t.tq + i, e), load)
    if t.mask == "tile":
        _load_mask_tile(w, spec, t, item)
    elif t.mask == scores_mask.MODE:  # straight into its S: no copy (scores_mask.py)
        scores_mask.load(w, spec, t, item)


def _load_mask_tile(w: KernelBuilder, spec, t: RowTiling, item: _Item) -> None:
    """The item's tile of the mask, loaded with its Q two items ahead."""
    mb, mhk, mg, msq, msk = spec.mask_shape
    with w.grid("i, e", t.tq if msq > 1 else 1, msk) as (i, e):
        row = item.row0 + i
        load = w["mask"][item.n if mb > 1 else 0, item.head if mhk * mg > 1 else 0, row if msq > 1 else 0, e]
        w.store("mask_tile", (item.slot, i, e), guarded(row, spec.sq, t.tq, load) if msq > 1 else load)


def _scores(w: KernelBuilder, spec, t: RowTiling, item: _Item, scale_k: bool = False) -> None:
    """[Kᵀ * scale (`scale_k`), Q * scale (in place)] and S = Q Kᵀ of the item; with a mask of
    whole tiles, S = mask + Q Kᵀ: the mask copied into S (VFUNC identity: one read a score, where
    an ELTWISE add reads two) and the GEMM accumulating onto it, which rounds fl(Q Kᵀ) + mask as
    the ELTWISE did. The copy comes first: the mask is the first load (rows_func). A mask loaded
    into S with the item's Q (scores_mask.py) needs no copy."""
    tq, qs, ps = t.rows, t.q_stride, t.p_stride
    q = (w["q"], item.slot * (tq * qs), qs)
    s = (w["s"], item.s_slot * (tq * ps), ps)
    if mask_in_gemm(spec) and t.mask != scores_mask.MODE:
        a = _mask_operand(w, spec, t, item)
        w.add(call("cgra_vfunc", flags=0, func=int(VFunc.IDENTITY), dtype=F32, rows=tq, cols=spec.sk,
                   a_addr=a[:2], a_row_stride=a[2], a_col_stride=a[3], out_addr=s[:2], out_stride=ps,
                   scale_bits=0, offset_bits=0))
    if scale_k:
        _scale_k(w, spec, item)
    if scale_at(spec) == "q":
        w.add(_scaled(w, tq, spec.d, q))
    w.add(call("cgra_gemm", flags=GEMM_ACCUMULATE if mask_in_gemm(spec) else 0, dtype=F32, m=tq, n=item.keys,
               k=spec.d, a_addr=q[:2], a_stride=qs, b_addr=(w["kt"], item.kv_slot * (spec.d * spec.sk)),
               b_stride=spec.sk, acc_addr=s[:2], acc_stride=ps))
    if mask_on_pe(spec):  # S + a mask row (1 m) or column (m 1): fl(S + m), as the ELTWISE add rounds
        mask = _mask_operand(w, spec, t, item)
        ones = (w["ones"], 0)
        row = spec.mask_shape[3] == 1
        w.add(gemm(True, tq, item.keys, 1, ones + (1,) if row else mask[:2] + (1,), mask[:2] + (spec.sk,) if row
                   else ones + (spec.sk,), s))


def _mask_operand(w: KernelBuilder, spec, t: RowTiling, item: _Item) -> tuple:
    """The ELTWISE operand (buffer, offset, row stride, column stride) of the item's mask."""
    _, mhk, mg, msq, msk = spec.mask_shape
    row_stride, col_stride = (msk if msq > 1 else 0), (1 if msk > 1 else 0)
    if t.mask == "tile":
        return (w["mask_tile"], item.slot * ((t.tq if msq > 1 else 1) * msk), row_stride, col_stride)
    rows = t.mp if msq > 1 else 1
    batch = item.mask_slot * (mhk * mg * rows * msk)
    head = item.head * (rows * msk) if mhk * mg > 1 else 0
    row = item.row0 * msk if msq > 1 else 0
    return (w["mask_all"], batch + head + row, row_stride, col_stride)


def _softmax(w: KernelBuilder, spec, t: RowTiling, item: _Item, items: int) -> None:
    """[S + a scalar mask], the row max m of S, P = exp(S - m) (in place, or into P per query tile:
    diagonal_exps.py), its row sums l = P 1 and O = P V. The sums are a GEMM on the PE array where the vector unit is the busier unit
    (`RowTiling.sums_on_pe`: a REDUCE takes the vector unit a cycle a column), else a REDUCE.
    S - m stays an ELTWISE: a GEMM of k = 1 adding m times a row of -1 would round the same, but
    the PE array's in-order queue holds it behind the previous item's P V GEMM, and the exp would
    wait for that every item. The last item's sums are a REDUCE all the same: the vector unit has
    nothing else left to do, and its sums then run beside that item's P V GEMM, not before it."""
    tq, sk, ps, dv = t.rows, item.keys, t.p_stride, spec.dv
    s = (w["s"], item.s_slot * (tq * ps), ps)
    m = (w["m"], item.slot * tq, 1)
    if spec.mask_shape and not mask_in_gemm(spec) and not mask_on_pe(spec):
        w.add(eltwise("add", tq, sk, s + (1,), _mask_operand(w, spec, t, item), s))
    if spec.causal is not None and t.tq > 1:
        _add_band(w, spec, t, item, s)
    w.add(fill(w["m"], tq, 1, 1, LOWEST if spec.safe else float("-inf"), offset=m[1]),
          reduce("max", tq, sk, s, m[:2]),
          eltwise("subtract", tq, sk, s + (1,), m + (0,), s))
    exps = fabric_exps.exps if t.fabric_rows else diagonal_exps.exps  # [a share on the fabric]
    s = exps(w, spec, t, item, s, spec.scale if scale_at(spec) == "exp" else None)  # now P
    if spec.unseen:  # after the exp: the P V GEMM waits for nothing new
        _flag_unseen(w, spec, t, item, m)
    l = (w["l"], item.slot * tq)
    on_vector = (fill(w["l"], tq, 1, 1, 0.0, offset=l[1]), reduce("sum", tq, sk, s, l))
    if t.sums_on_pe and items > 1:
        with w.when_else(lt(item.at, items - 1)) as (then, otherwise):
            with then():
                w.add(gemm(False, tq, 1, sk, s, (w["ones"], 0, 1), l + (1,)))
            with otherwise():
                w.add(*on_vector)
    elif t.sums_on_pe:
        w.add(gemm(False, tq, 1, sk, s, (w["ones"], 0, 1), l + (1,)))
    else:
        w.add(*on_vector)
    w.add(gemm(False, tq, dv, sk, s, (w["v"], item.kv_slot * (spec.sk * dv), dv), (w["o"], item.slot * (tq * dv), dv)))
    if spec.unseen:
        _give_unseen(w, spec, t, item, l)


def _flag_unseen(w: KernelBuilder, spec, t: RowTiling, item: _Item, m: tuple) -> None:
    """u = 1 in the item's rows that see no key, else +0, from their max m: the safe softmax's
    max starts at LOWEST and stays there only in such a row (a seen row's max is a score, at
    least ulp(LOWEST) = 2^104 above it). m + FLT_MAX is 0 there, else at least 2^104: its minimum
    with 1 is 0 or 1, and 1 - that is u, each step exact. Three short vector commands right
    after the max, nothing waited for (the sums' GEMM comes later)."""
    tq = t.rows
    u = (w["u"], item.slot * tq, 1)
    w.add(vfunc("identity", tq, 1, m, u, offset=-LOWEST),
          eltwise("minimum", tq, 1, u + (0,), (w["ones"], 0, 0, 0), u),
          vfunc("identity", tq, 1, u, u, scale=-1.0, offset=1.0))


def _give_unseen(w: KernelBuilder, spec, t: RowTiling, item: _Item, l: tuple) -> None:
    """The rows u flags take c 1ᵀ V, where(kept, P, c)'s output there: l += u 1 and O += u (c 1ᵀ V)
    on the PE array after P V, GEMMs of k = 1 whose products are exact: such a row's O = 0 + c 1ᵀ V
    and l = 1 (its reciprocal 1: O * 1 unchanged), every other row's O + 0 and l + 0."""
    tq, dv = t.rows, spec.dv
    u = (w["u"], item.slot * tq, 1)
    w.add(gemm(True, tq, 1, 1, u, (w["ones"], 0, 1), l + (1,)),
          gemm(True, tq, dv, 1, u, (w["cv"], item.kv_slot * dv, dv), (w["o"], item.slot * (tq * dv), dv)))


def _add_band(w: KernelBuilder, spec, t: RowTiling, item: _Item, s: tuple) -> None:
    """The causal triangle added to the item's scores where it crosses their columns (none for a
    tile whose rows all see every key): -inf above the diagonal, exactly as the mask's add."""
    tq, c = t.tq, spec.causal
    at = plus(s[1], item.band_at)
    band = eltwise("add", t.rows, item.band, (s[0], at, s[2], 1), (w["band"], 0, tq - 1, 1), (s[0], at, s[2]))
    if (t.mp // tq) * tq + c <= spec.sk:  # every tile's triangle whole inside the keys
        w.add(band)
    elif t.mp // tq == 1:
        if spec.sk - c - 1 > 0:
            w.add(band)
    else:
        with w.when(lt(item.row0, spec.sk - c - 1)):
            w.add(band)


def _normalise(w: KernelBuilder, spec, t: RowTiling, item: _Item) -> None:
    """O * 1 / l of the item, stored (its rows inside the sequence); with spec.half_out the
    product (in place in O, which nothing reads after it) rounded to nearest even into the stored
    tile by an EPILOGUE: the float32 value rounded once, as the cast after the attention did."""
    tq, dv = t.rows, spec.dv
    at = item.slot * (tq * dv)
    column = (w["l"], item.slot * tq, 1)
    w.add(vfunc("reciprocal", tq, 1, column, (w["inv"],) + column[1:], offset=TINY if spec.safe else None))
    product = (w["o"] if spec.half_out else w["res"], at, dv)
    w.add(eltwise("multiply", tq, dv, (w["o"], at, dv, 1), (w["inv"], item.slot * tq, 1, 0), product))
    if spec.half_out:
        w.add(rounded(tq, dv, product, (w["res"], at, dv), spec.half_out))
    q = t.tq
    if t.stack == 1:
        names, extents = "i, e", (q, dv)
    else:  # the stack's heads one under the other
        names, extents = "y, i, e", (t.stack, q, dv)
    with w.grid(names, *extents) as loops:
        y, i, e = loops if t.stack > 1 else (0, *loops)
        row = item.row0 + i
        head, res_row = (item.head, i) if t.stack == 1 else (item.head + y, y * q + i)
        if spec.sq % q:
            with w.when(lt(row, spec.sq)):
                w.store_element("out", item.n, head, row, e, w["res"][item.slot, res_row, e])
        else:
            w.store_element("out", item.n, head, row, e, w["res"][item.slot, res_row, e])
