"""The key tiles below the diagonal of flash_length.py's kernel, software-pipelined.

Stage: kernel definition (flash_length.length_script writes them where its tiling says
`pipeline`). flash.py's `_pipelined_keys` over a symbolic count of key tiles (qt * tq / tk for
query tile qt): two copies of K, V, S and P by the tile's parity, and iteration kt issues V and
S = Q Kᵀ of tile kt + 1 and K of tile kt + 2 before tile kt's online step, so the PE array
computes the next tile's scores while the vector unit runs this one's softmax. Every command
computes the query tile's `rows` (its last tile cut to the length), and the loads carry the
guard k0 + u < s the DMA lowering needs (the keys below the diagonal are all inside the length,
which it cannot prove of a tile index clamped with min and max).

Why: unpipelined, the PE array and the vector unit took turns on every key tile (Llama's
attention at 1024 tokens on cgra-8x8: 5.0 M cycles a layer).
"""

from __future__ import annotations

from .flash_tiles import FlashTiling
from .rows_length import row_gemm
from .script_text import Writer, eltwise, element as stored_at, gemm, reduce, vfunc


def pipelined_keys(w: Writer, spec, t: FlashTiling, n: str, c: str, rows: str, keys: str, length: str,
                   row: int | None = None) -> None:
    """Key tiles 0 .. keys - 1 (`keys` the text of a count, maybe 0) of a query tile of `rows`
    rows, pipelined (module doc); `length`: the length variable's text; `row`: with a bias row
    (length_rows.py) the width of the buffer `rowb` holding the head's, added to each tile's S."""
    tq, d, dv, tk = t.tq, spec.d, spec.dv, t.tk
    for name, shape in (("kp", (2, d, tk)), ("vp", (2, tk, dv)), ("sp", (2, tq, tk)), ("pp", (2, tq, t.p_stride))):
        w.alloc(name, shape)

    def tile(ahead: int) -> str:  # tile kt + ahead, kept inside the keys
        return f"T.max(T.min(kt + {ahead}, {keys} - 1), 0)"

    def scores(slot: str, tile_at: str) -> None:
        w.add(gemm(False, rows, tk, d, ("q", 0, t.q_stride), ("kp", f"{slot} * {d * tk}", tk),
                   ("sp", f"{slot} * {tq * tk}", tk)))
        if row is not None:
            w.add(row_gemm(rows, tk, ("ones_c", 0), ("rowb", f"{tile_at} * {tk}", row), ("sp", f"{slot} * {tq * tk}", tk)))

    depth = w.depth
    w.add(f"if {keys} > 0:")
    w.depth += 1
    second = f"T.max(T.min(1, {keys} - 1), 0)"
    load_keys(w, spec, tk, n, c, "0", "kp", "vp", length, "0")
    load_keys(w, spec, tk, n, c, f"{second} * {tk}", "kp", None, length, "1")
    scores("0", "0")
    w.depth = depth
    w.add(f"for kt in range({keys}):", f"    if kt + 1 < {keys}:")
    w.depth += 2
    after = tile(1)
    load_keys(w, spec, tk, n, c, f"{after} * {tk}", None, "vp", length, f"{after} % 2")
    scores(f"{after} % 2", after)
    w.add(f"if kt + 2 < {keys}:")
    w.depth += 1
    load_keys(w, spec, tk, n, c, f"{tile(2)} * {tk}", "kp", None, length, f"{tile(2)} % 2")
    w.depth -= 2
    online_step(w, spec, t, rows, tk, ("sp", f"kt % 2 * {tq * tk}"), ("pp", f"kt % 2 * {tq * t.p_stride}"),
                ("vp", f"kt % 2 * {tk * dv}"), None)
    w.depth = depth


def load_keys(w: Writer, spec, tk: int, n: str, c: str, k0: str, kb: str | None, vb: str | None,
              length: str | None, slot: str = "") -> None:
    """Kᵀ into `kb` and V into `vb` (None: not that one) of the tk keys from k0 (`slot`: the
    buffers' copy, a leading index); with `length` (the variable's text) the keys past it read
    as 0 (the DMA lowering needs that guard where it cannot prove k0 + u inside the length)."""
    at = f"{slot}, " if slot else ""
    guard = (lambda load: f"T.if_then_else({k0} + u < {length}, {load}, T.float32(0))") if length else \
        (lambda load: load)
    if kb is not None:
        w.add(f"for e, u in T.grid({spec.d}, {tk}):",
              f"    {kb}[{at}e, u] = {guard(stored_at(spec, 'rhs', n, c, f'{k0} + u', 'e'))}")
    if vb is not None:
        w.add(f"for u, e in T.grid({tk}, {spec.dv}):",
              f"    {vb}[{at}u, e] = {guard(stored_at(spec, 'value', n, c, f'{k0} + u', 'e'))}")


def online_step(w: Writer, spec, t: FlashTiling, rows: str, cols, s: tuple, p: tuple, v: tuple,
                mask) -> None:
    """flash.py's online softmax over the scores S (buffer, offset; row stride tk) into P (row
    stride p_stride), O += P V (V: buffer, offset), `rows` rows and `cols` keys computed; `mask`
    an ELTWISE operand added to the scores first, or None."""
    dv, tk = spec.dv, t.tk
    s3, p3 = s + (tk,), p + (t.p_stride,)
    if mask is not None:
        w.add(eltwise("add", rows, cols, s3 + (1,), mask, s3))
    w.add(vfunc("identity", rows, 1, ("m", 0, 1), ("m_old", 0, 1)),
          reduce("max", rows, cols, s3, ("m", 0)),
          eltwise("subtract", rows, 1, ("m_old", 0, 1, 1), ("m", 0, 1, 1), ("alpha", 0, 1)),
          vfunc("exp", rows, 1, ("alpha", 0, 1), ("alpha", 0, 1)),
          eltwise("subtract", rows, cols, s3 + (1,), ("m", 0, 1, 0), s3),
          vfunc("exp", rows, cols, s3, p3),
          eltwise("multiply", rows, 1, ("l", 0, 1, 1), ("alpha", 0, 1, 1), ("l", 0, 1)),
          reduce("sum", rows, cols, p3, ("l", 0)),
          eltwise("multiply", rows, dv, ("o", 0, dv, 1), ("alpha", 0, 1, 0), ("o", 0, dv)),
          gemm(True, rows, dv, cols, p3, v + (dv,), ("o", 0, dv)))
