"""A share of the whole-row attention's exps as FABRIC passes on the PE array, beside the VFUNC.

Stage: kernel definition (rows.py's softmax when `RowTiling.fabric_rows` > 0; the tile search,
attention_tiles.fabric_tiling, chooses the share with `fabric_exp_cycles`). In: the spec, the
tiling, the item's S - m. Out: the exp commands (FABRIC on the PE array's queue, VFUNC on the
vector unit's) and the scratch buffer they need.

The vector unit holds the whole-row kernel where the items are small (Swin's 16 x 16 windows:
about 400 vector cycles an item, 258 of them the exp through cgra-8x8's one function-unit lane)
while the PE array, after an item's two GEMMs, idles. The fabric computes exp as three bodies
(cgra_sim/mapping/exp.py: a range reduction, a degree-5 polynomial, the exponent added as int32
bits; 0.95 elements a cycle on cgra-8x8 against the function unit's 1): the first
`fabric_rows` rows of each item's S - m go through them, into a scratch tile T (n in its low bits)
and back into S, the other rows through the VFUNC, both at once on their own queues. The row
sums and P V (GEMMs after them on the PE array's queue) read both.

The fabric's exp is not the function unit's: within 2^-21 relative of float64 where exp(z) >=
2^-126, within 2^-126 absolute below, exactly +0 for z = -inf and exactly 1 for z = 0 (exp.py).
Taken only for a plain softmax with no causal triangle (no diagonal exps) and no stacked heads:
there z = s - max(s) <= 0, or the whole row is NaN or -inf where the row holds a NaN or +inf
(the max propagates NaN; inf - inf is NaN), and such a row's output is NaN either way. A safe
softmax would turn a NaN row's fabric exps (+0 where its sign bit is set) into zeros.
"""

from __future__ import annotations

import functools

from cgra_sim import cost
from cgra_sim.mapping import exp as fabric_exp
from cgra_sim.mapping.body import reads_b

from ..common.chains import require_program
from ..intrinsics.fabric import FabricBody, fabric_call
from .prim_build import plus
from .script_text import vfunc

#: The scratch tile of the fabric's rows: t of the first pass (read by the other two).
BUFFER = "fabric_t"


def applies(spec, stack: int) -> bool:
    """Whether the kernel may split its exps with the fabric (module doc): a plain softmax, no
    causal triangle, no rows of other heads stacked, no unseen rows' weights."""
    return spec.causal is None and not spec.safe and not spec.unseen and stack == 1


def fabric_exp_cycles(arch, elements: int, scale) -> int:
    """PE array cycles of the three passes over `elements` exps (their mapped runs: latency,
    lanes, II; each input read and the output written), configurations resident."""
    if elements <= 0:
        return 0
    return sum(cost.fabric_run_cycles(arch, program, elements, (12 if two else 8) * elements)
               for program, two in _programs(arch, scale))


@functools.lru_cache(maxsize=64)
def _programs(arch, scale) -> tuple:
    """((the mapped program, whether it reads B) of each pass): looked up once per preset and
    scale (a look-up asks the mapping cache's solver version: ~2 ms, and the tile searches price
    thousands of shares: rows_length.py's branches 1.6 -> 25 s under a profiler before)."""
    return tuple((require_program(nodes, dtype, arch, "the fabric's exp"), reads_b(nodes))
                 for nodes, dtype in fabric_exp.passes(scale))


def fabric_share_cycles(spec, arch, rows: int, keys: int, fabric_rows: int, scale, sums_on_pe: bool) -> tuple:
    """(vector cycles the VFUNC saves, PE array cycles added) when `fabric_rows` of an item's
    `rows` rows over `keys` keys take the fabric: their exps leave the VFUNC (its command then
    covers the other rows); the passes join the PE array, and two GEMM fills it hid before (a
    FABRIC starts after the scores' GEMM has drained, and the GEMM after it, the sums' or P V,
    fills the array again)."""
    if not fabric_rows:
        return 0, 0
    saved = cost.vfunc_cycles(arch, rows * keys, "exp")
    if fabric_rows < rows:
        saved -= cost.vfunc_cycles(arch, (rows - fabric_rows) * keys, "exp")
    fills = cost.gemm_fill_cycles(arch, rows, keys) + cost.gemm_fill_cycles(arch, rows, 1 if sums_on_pe else spec.dv)
    return saved, fabric_exp_cycles(arch, fabric_rows * keys, scale) + fills


def config_cycles(arch, fabric_rows: int, scale) -> int:
    """Cycles loading the three bodies' configurations, once a launch (they stay resident beside
    the GEMM's: 2 x 3 context slots of cgra-8x8's 32)."""
    if not fabric_rows:
        return 0
    return sum(cost.fabric_config_cycles(arch, program.config_bytes) for program, _ in _programs(arch, scale))


def footprint(t, keys: int) -> int:
    """Elements of the scratch tile T (one copy: the PE array's queue runs the passes in order)."""
    return t.fabric_rows * keys if t.fabric_rows else 0


def allocate(w, t, keys: int) -> None:
    """The scratch tile T of the fabric's rows."""
    if t.fabric_rows:
        w.alloc(BUFFER, (t.fabric_rows, keys))


def exps(w, spec, t, item, s: tuple, scale) -> tuple:
    """rows.py's P = exp(S - m) of `item` in place (S - m: (buffer, offset, row stride) `s`;
    `scale` the exp's power of two, or None): its first `t.fabric_rows` rows as the fabric's three
    passes (`passes_over`), the others as one VFUNC. Returns P (= s)."""
    f, keys = t.fabric_rows, item.keys
    z = (s[0].data, s[1])
    w.add(*(fabric_call(*operands) for operands in passes_over(f, keys, z, s[2], (w[BUFFER].data, 0), scale)))
    if f < t.rows:
        at = f * s[2]
        rest = (s[0], plus(s[1], at), s[2])
        w.add(vfunc("exp", t.rows - f, keys, rest, rest, scale=scale))
    return s


def passes_over(rows, keys, z: tuple, stride, tile: tuple, scale) -> list:
    """fabric_call's arguments of the three passes over `rows` x `keys` of S - m (z: (data,
    offset), rows `stride` apart; T: `tile` (data, offset), rows `keys` apart): z -> T,
    (z, T) -> S, bits (T, S) -> S. Buffers and sizes as the caller writes them (rows.py's
    PrimExprs, rows_length.py's text)."""
    (first, dtype), (second, _), (third, int32) = fabric_exp.passes(scale)
    return [(FabricBody(first, dtype), rows, keys, z, stride, tile, keys),
            (FabricBody(second, dtype), rows, keys, z, stride, z, stride, (tile, keys, 1)),
            (FabricBody(third, int32), rows, keys, tile, keys, z, stride, (z, stride, 1))]
