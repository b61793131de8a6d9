"""Attention over key tiles with an online softmax: any sequence length, the scores never in DRAM.

Stage: kernel definition (the attention family's compute when its tile search chose a
FlashTiling: flash_tiles.py). In: the AttentionSpec. Out: the kernel as lowered TIR (TVMScript
text, no blocks to schedule, as layout/copy_kernel.py writes its copies): loops, scratchpad
buffers, copy nests that lower/dma.py turns into DMA boxes, and the device calls of the
commands the whole-row kernel (attention.py) already uses. TE cannot state the loop-carried
rescale, so the loop is written out. Per batch and query tile of tq rows [the mask's rows of
the tile, once for all heads], per head:

    Q tile (* scale: VFUNC identity); FILL m = lowest float32, l = 0, O = 0
    per key tile of tk keys (K tile read transposed by the DMA, V tile; both double-buffered):
        S = Q Kᵀ (GEMM) [+ mask (ELTWISE)]
        m_old = m (VFUNC identity); m = max(m, row max of S) (REDUCE MAX into m)
        alpha = exp(m_old - m) (ELTWISE, VFUNC: a column)
        P = exp(S - m) (ELTWISE, VFUNC); l = l * alpha + row sum of P (ELTWISE, REDUCE SUM into l)
        O = O * alpha + P V (ELTWISE, accumulating GEMM)
    O * 1 / l (VFUNC reciprocal, ELTWISE), stored [rounded to spec.half_out: EPILOGUE].

The max starts at the lowest finite float32, not -inf, so a key tile whose scores are all -inf
gives alpha = exp(0) = 1 and P = 0 rather than exp(-inf + inf) = NaN. A row with no finite score
ends with l = 0 and O = 0: a safe softmax takes the reciprocal of l + FLT_MIN (0 out, as
PyTorch's SDPA), a plain one of l (0 * inf = NaN, as PyTorch's softmax). A last key tile
shorter than tk runs as its own copy of the loop body (peeled, with its own sizes); a last
query tile shorter than tq is padded (zero rows, never stored).

Two or more whole key tiles are software-pipelined (`_pipelined_keys`): iteration kt issues the
loads and S = Q Kᵀ of the next tile before this tile's online step, each with its own copy (of
two) of K, V, S, P and the mask block, so the PE array and the vector unit overlap.

Under a constant causal mask (spec.causal: no mask operand) the kernel builds the triangles of
the diagonal tiles once (`_band`) and runs per query tile only the key tiles up to its diagonal
(`_causal_keys`): a skipped tile's scores are all -inf, which the step above leaves m, l and O
unchanged for.
"""

from __future__ import annotations

from ..common.spec import SINGLE_BUFFERED
from ..layout.copy_kernel import parse_script
from .attention_tiles import LOWEST, TINY
from .flash_tiles import FlashTiling, pipelined
from .script_text import Writer, eltwise, element, fill, gemm, guarded, kernel_writer, reduce, rounded, vfunc, \
    with_arg_shapes

#: Buffers kept one copy of (lower/double_buffer.py doubles the rest): the running state, the
#: scores, the mask's rows, and the last key tile's (it runs once per head).
SINGLE = ["m", "l", "m_old", "alpha", "inv", "o", "s", "p", "mask_rows", "k_rest", "v_rest", "mask_rest", "band",
          "kp", "vp", "sp", "pp", "mp"]  # the last five: two copies kept by hand (_pipelined_keys)


def flash_compute(spec, t: FlashTiling):
    """The flash kernel's PrimFunc: parameters lhs (B, H, Sq, D), rhs (B, Hk, Sk, D), value
    (B, Hk, Sk, Dv) [, mask (Bm, Hm, Sqm, Skm)], out (B, H, Sq, Dv); the caller's rank-5 views
    in `cgra.arg_shapes`."""
    func = parse_script(flash_script(spec, t))
    func = with_arg_shapes(func, spec)
    return func.with_attr(SINGLE_BUFFERED, SINGLE + (["q"] if t.lean else []))


def flash_script(spec, t: FlashTiling) -> str:
    """The TVMScript text of the kernel (module docstring)."""
    b, hk, g, sq = spec.b, spec.hk, spec.g, spec.sq
    w = kernel_writer(spec, "flash")
    if spec.causal is not None:
        _band(w, t)
    n = w.loop("n", b)
    qt = w.loop("qt", -(-sq // t.tq))
    row0 = f"{qt} * {t.tq}"
    shared_rows = t.mask == "rows" and spec.mask_shape[1] * spec.mask_shape[2] == 1
    if shared_rows:
        _mask_rows(w, spec, t, n, "0", row0)
    c = w.loop("c", hk)
    j = w.loop("j", g)
    head = f"{c} * {g} + {j}" if g > 1 else c
    if t.mask == "rows" and not shared_rows:
        _mask_rows(w, spec, t, n, head, row0)
    _head(w, spec, t, n, c, head, qt)
    return "\n".join(w.lines) + "\n"


def _band(w: Writer, t: FlashTiling) -> None:
    """A constant causal mask's diagonal key tiles, built once: r = tq / tk blocks of tk columns
    cross a query tile's diagonal, block s being rows (r - 1 - s) tk .. of `band`, which is -inf
    above the (r - 1) tk-th row, a triangle (0 where column <= row) in the next tk rows, 0 below:
    a FILL of -inf, a FILL of zeros and a FILL of a growing row prefix per triangle row."""
    tk, r = t.tk, t.tq // t.tk
    w.alloc("band", ((2 * r - 1) * tk, tk))
    w.add(fill("band", r * tk, tk, tk, float("-inf")))
    if r > 1:
        w.add(fill("band", (r - 1) * tk, tk, tk, 0.0, offset=r * tk * tk))
    w.add(f"for z in range({tk}):", "    " + fill("band", 1, "z + 1", tk, 0.0, offset=f"({(r - 1) * tk} + z) * {tk}"))


def _mask_rows(w: Writer, spec, t: FlashTiling, n: str, head: str, row0: str) -> None:
    """The query tile's rows of the mask (one row for a mask broadcast along the queries)."""
    mb, _, _, msq, msk = spec.mask_shape
    rows = t.tq if msq > 1 else 1
    w.alloc("mask_rows", (rows, msk))
    row = f"{row0} + i" if msq > 1 else "0"
    load = f"mask[{n if mb > 1 else 0}, {head}, {row}, e]"
    w.add(f"for i, e in T.grid({rows}, {msk}):",
          f"    mask_rows[i, e] = {guarded(row, spec.sq, t.tq, load) if msq > 1 else load}")


def _head(w: Writer, spec, t: FlashTiling, n: str, c: str, head: str, qt: str) -> None:
    """One head's query tile: the Q tile, the key tiles, the normalised output stored."""
    tq, d, dv, sq = t.tq, spec.d, spec.dv, spec.sq
    row0 = f"{qt} * {tq}"
    w.alloc("q", (tq, t.q_stride))
    w.add(f"for i, e in T.grid({tq}, {d}):",
          f"    q[i, e] = {guarded(f'{row0} + i', sq, tq, element(spec, 'lhs', n, head, f'{row0} + i', 'e'))}")
    if spec.scale is not None:
        w.add(vfunc("identity", tq, d, ("q", 0, t.q_stride), ("q", 0, t.q_stride), scale=spec.scale))
    for name, shape in (("m", (tq, 1)), ("l", (tq, 1)), ("m_old", (tq, 1)), ("alpha", (tq, 1)),
                        ("o", (tq, dv)), ("s", (tq, t.tk)), ("p", (tq, t.p_stride))):
        w.alloc(name, shape)
    w.add(fill("m", tq, 1, 1, LOWEST), fill("l", tq, 1, 1, 0.0), fill("o", tq, dv, dv, 0.0))
    keys, rest = divmod(spec.sk, t.tk)
    if spec.causal is not None:
        _causal_keys(w, spec, t, n, c, head, qt)
        keys = rest = 0
    if keys >= 2 and pipelined(spec, t):
        _pipelined_keys(w, spec, t, n, c, head, row0, keys)
    elif keys:
        depth = w.depth
        k0 = w.loop("kt", keys)
        _key_tile(w, spec, t, n, c, head, row0, f"{k0} * {t.tk}" if keys > 1 else "0", t.tk, "")
        w.depth = depth
    if rest:
        _key_tile(w, spec, t, n, c, head, row0, str(keys * t.tk), rest, "_rest")
    w.alloc("inv", (tq, 1))
    w.add(vfunc("reciprocal", tq, 1, ("l", 0, 1), ("inv", 0, 1), offset=TINY if spec.safe else None))
    res = "o" if t.lean or spec.half_out else "res"
    if not t.lean or spec.half_out:  # a 16-bit output: O * 1 / l in place, rounded on store (rows.py)
        w.alloc("res", (tq, dv), spec.half_out or "float32")
    w.add(eltwise("multiply", tq, dv, ("o", 0, dv, 1), ("inv", 0, 1, 0), (res, 0, dv)))
    if spec.half_out:
        w.add(rounded(tq, dv, ("o", 0, dv), ("res", 0, dv), spec.half_out))
        res = "res"
    w.add(f"for i, e in T.grid({tq}, {dv}):")
    stored_at = element(spec, "out", n, head, f"{row0} + i", "e")
    if sq % tq:
        w.add(f"    if {row0} + i < {sq}:", f"        {stored_at} = {res}[i, e]")
    else:
        w.add(f"    {stored_at} = {res}[i, e]")


def _causal_keys(w: Writer, spec, t: FlashTiling, n: str, c: str, head: str, qt: str) -> None:
    """Under a constant causal mask: the key tiles below the query tile's diagonal unmasked
    (pipelined, their count a function of the query tile), the r crossing it with their block of
    the band, none above."""
    tk, r, nk = t.tk, t.tq // t.tk, spec.sk // t.tk
    first = f"{qt} * {r} + {spec.causal // tk}"
    depth = w.depth
    count = f"T.min({first}, {nk})" if qt != "0" else min(spec.causal // tk, nk)
    row = "read" if spec.mask_shape else None  # a padding row (t.mask "rows") beside the triangle
    if pipelined(spec, t) and (not isinstance(count, int) or count >= 2):
        _pipelined_keys(w, spec, t, n, c, head, "", count, mask=row)
    elif count:
        below = w.loop("kt", count)
        _key_tile(w, spec, t, n, c, head, "", f"{below} * {tk}", tk, "", mask=row)
    w.depth = depth
    ks = w.loop("ks", r)  # the tile search keeps them inside the keys (flash_tiles._key_tiles)
    band = ("band", f"({r - 1} - {ks}) * {tk * tk}", tk, 1)
    _key_tile(w, spec, t, n, c, head, "", f"({first} + {ks}) * {tk}", tk, "_diag", mask=band, row=row)
    w.depth = depth


def _key_tile(w: Writer, spec, t: FlashTiling, n: str, c: str, head: str, row0: str, k0: str, cols: int,
              suffix: str, mask="read", row=None) -> None:
    """One key tile of `cols` keys from key k0: K, V (and the mask block) in, the online step;
    `mask` an ELTWISE operand to add instead of the spec's mask, or None for no mask [and `row`
    "read": the spec's mask row added first]."""
    kb, vb = "k" + suffix, "v" + suffix
    w.alloc(kb, (spec.d, cols))
    w.alloc(vb, (cols, spec.dv))
    _load_k(w, spec, n, c, k0, cols, kb)
    _load_v(w, spec, n, c, k0, cols, vb)
    w.add(gemm(False, t.tq, cols, spec.d, ("q", 0, t.q_stride), (kb, 0, cols), ("s", 0, t.tk)))
    _online_step(w, spec, t, n, head, row0, k0, cols, suffix, mask, ("s", 0), ("p", 0), (vb, 0), row)


def _load_k(w: Writer, spec, n: str, c: str, k0: str, cols: int, kb: str, slot: str = "") -> None:
    """Kᵀ of `cols` keys from k0 into `kb` (`slot`: its copy, a leading index)."""
    at = f"{slot}, " if slot else ""
    w.add(f"for e, u in T.grid({spec.d}, {cols}):", f"    {kb}[{at}e, u] = {element(spec, 'rhs', n, c, f'{k0} + u', 'e')}")


def _load_v(w: Writer, spec, n: str, c: str, k0: str, cols: int, vb: str, slot: str = "") -> None:
    at = f"{slot}, " if slot else ""
    w.add(f"for u, e in T.grid({cols}, {spec.dv}):", f"    {vb}[{at}u, e] = {element(spec, 'value', n, c, f'{k0} + u', 'e')}")


def _online_step(w: Writer, spec, t: FlashTiling, n: str, head: str, row0: str, k0: str, cols: int, suffix: str,
                 mask, s: tuple, p: tuple, v: tuple, row=None) -> None:
    """The online softmax over the key tile's scores S (buffer, offset; row stride tk) into P
    (row stride p_stride), O += P V (V: buffer, offset); `row` "read": the mask's row added
    before `mask` (a causal diagonal tile's band)."""
    tq, dv, tk = t.tq, spec.dv, t.tk
    s3, p3 = s + (tk,), p + (t.p_stride,)
    if row == "read":
        w.add(eltwise("add", tq, cols, s3 + (1,), _mask_operand(w, spec, t, n, head, row0, k0, cols, suffix), s3))
    if mask == "read" and spec.mask_shape:
        mask = _mask_operand(w, spec, t, n, head, row0, k0, cols, suffix)
    if mask is not None and mask != "read":
        w.add(eltwise("add", tq, cols, s3 + (1,), mask, s3))
    w.add(vfunc("identity", tq, 1, ("m", 0, 1), ("m_old", 0, 1)),
          reduce("max", tq, cols, s3, ("m", 0)),
          eltwise("subtract", tq, 1, ("m_old", 0, 1, 1), ("m", 0, 1, 1), ("alpha", 0, 1)),
          vfunc("exp", tq, 1, ("alpha", 0, 1), ("alpha", 0, 1)),
          eltwise("subtract", tq, cols, s3 + (1,), ("m", 0, 1, 0), s3),
          vfunc("exp", tq, cols, s3, p3),
          eltwise("multiply", tq, 1, ("l", 0, 1, 1), ("alpha", 0, 1, 1), ("l", 0, 1)),
          reduce("sum", tq, cols, p3, ("l", 0)),
          eltwise("multiply", tq, dv, ("o", 0, dv, 1), ("alpha", 0, 1, 0), ("o", 0, dv)),
          gemm(True, tq, dv, cols, p3, v + (dv,), ("o", 0, dv)))


def _pipelined_keys(w: Writer, spec, t: FlashTiling, n: str, c: str, head: str, row0: str, keys,
                    mask="read") -> None:
    """Key tiles 0 .. keys - 1 (an int >= 2, or the text of a count, guarded), software-pipelined:
    two copies of K, V, S and P (`kp`, `vp`, `sp`, `pp`, and the mask's blocks `mp`, by the
    tile's parity), and iteration kt issues V [, the mask block] and S = Q Kᵀ of tile kt + 1 and
    K of tile kt + 2 before tile kt's online step, so the PE array computes the next tile's
    scores while the vector unit runs this one's softmax (in-order queues: S of tile kt + 1 must
    come before P V of tile kt in the stream). K is loaded two tiles ahead so the GEMM never
    waits for its DMA; each copy it replaces was read by a GEMM earlier in the stream (K by S of
    tile kt, V by P V of tile kt - 1). `mask` as _online_step's (None: unmasked)."""
    tq, d, dv, tk = t.tq, spec.d, spec.dv, t.tk
    blocks = t.mask == "blocks" and mask == "read"
    for name, shape in (("kp", (2, d, tk)), ("vp", (2, tk, dv)), ("sp", (2, tq, tk)), ("pp", (2, tq, t.p_stride))) \
            + ((("mp", (2, tq, tk)),) if blocks else ()):
        w.alloc(name, shape)
    static = isinstance(keys, int)

    def tile(ahead: int) -> str:  # tile kt + ahead, kept inside the keys (lower/dma.py bounds it)
        return f"T.min(kt + {ahead}, {keys - 1})" if static else f"T.max(T.min(kt + {ahead}, {keys} - 1), 0)"

    def scores(slot: str) -> None:
        w.add(gemm(False, tq, tk, d, ("q", 0, t.q_stride), ("kp", f"{slot} * {d * tk}", tk),
                    ("sp", f"{slot} * {tq * tk}", tk)))

    depth = w.depth
    if not static:
        w.add(f"if {keys} > 0:")
        w.depth += 1
    second = "1" if static else f"T.max(T.min(1, {keys} - 1), 0)"
    _load_k(w, spec, n, c, "0", tk, "kp", "0")
    _load_k(w, spec, n, c, f"{second} * {tk}", tk, "kp", "1")
    _load_v(w, spec, n, c, "0", tk, "vp", "0")
    if blocks:
        _load_mask_block(w, spec, t, n, head, row0, "0", tk, "mp", "0")
    scores("0")
    w.depth = depth
    w.add(f"for kt in range({keys}):", f"    if kt + 1 < {keys}:")
    w.depth += 2
    after = tile(1)
    _load_v(w, spec, n, c, f"{after} * {tk}", tk, "vp", f"{after} % 2")
    if blocks:
        _load_mask_block(w, spec, t, n, head, row0, f"{after} * {tk}", tk, "mp", f"{after} % 2")
    scores(f"{after} % 2")
    if not static or keys > 2:
        w.add(f"if kt + 2 < {keys}:")
        w.depth += 1
        _load_k(w, spec, n, c, f"{tile(2)} * {tk}", tk, "kp", f"{tile(2)} % 2")
        w.depth -= 1
    w.depth -= 1
    mask = ("mp", f"kt % 2 * {tq * tk}", tk, 1) if blocks else mask
    _online_step(w, spec, t, n, head, row0, f"kt * {tk}", tk, "", mask, ("sp", f"kt % 2 * {tq * tk}"),
                 ("pp", f"kt % 2 * {tq * t.p_stride}"), ("vp", f"kt % 2 * {tk * dv}"))
    w.depth = depth


def _mask_operand(w: Writer, spec, t: FlashTiling, n: str, head: str, row0: str, k0: str, cols: int,
                  suffix: str) -> tuple:
    """The ELTWISE operand of the mask over this key tile: a window of the held rows, or a
    block loaded here."""
    mb, _, _, msq, msk = spec.mask_shape
    if t.mask == "rows":
        offset = k0 if msk > 1 else "0"
        return ("mask_rows", offset, msk if msq > 1 else 0, 1 if msk > 1 else 0)
    name = "mask" + ("_rest" if suffix else "_block")
    w.alloc(name, (t.tq, cols))
    _load_mask_block(w, spec, t, n, head, row0, k0, cols, name)
    return (name, 0, cols, 1)


def _load_mask_block(w: Writer, spec, t: FlashTiling, n: str, head: str, row0: str, k0: str, cols: int,
                     name: str, slot: str = "") -> None:
    """The tq x cols block of the mask from key k0 into `name` (`slot`: its copy)."""
    mb = spec.mask_shape[0]
    row, at = f"{row0} + i", f"{slot}, " if slot else ""
    heads = head if spec.mask_shape[1] * spec.mask_shape[2] > 1 else 0
    load = guarded(row, spec.sq, t.tq, f"mask[{n if mb > 1 else 0}, {heads}, {row}, {k0} + u]")
    w.add(f"for i, u in T.grid({t.tq}, {cols}):", f"    {name}[{at}i, u] = {load}")
