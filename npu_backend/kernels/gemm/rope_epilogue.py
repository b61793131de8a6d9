"""RoPE in a linear's epilogue: the merged q / k / v projection writes its heads rotated.

Stage: partition (the pattern and the spec fields a match fixes), kernel definition (the
epilogue's TE blocks) and schedule (their intrinsics, kernels/intrinsics/rope_epilogue.py).
normalise/rope_epilogues.py writes the rotary embedding of the q and k heads of one projection
y = x W^T [+ b] (S, N) as

    add(multiply(y, C), multiply(take(y, perm, axis=1), S))        C, S: (S, N) constants

perm a column permutation that repeats every P columns (a head of the merged view: rotate_half's
partner inside a rotated head's rotated dims, the column itself elsewhere), C the cosine and S
the signed sine there, 1 and 0 elsewhere. Here that chain is the GEMM kernel's epilogue: each
output tile of tm x tn (tn whole periods, so every partner lies in the tile) is

    [x = acc + bias]                      EPILOGUE, its own tile
    rot = x[:, partner] * S               one ELTWISE per run of columns of one partner offset
    out = x * C + rot                     ELTWISE multiply, ELTWISE add

with the C and S tiles loaded per output tile like a residual, or, when the tables repeat every
W columns (GPT-NeoX: a head's q, k and v, 48 of 192) and a column tile lies inside one such
period, their first W columns loaded once per row tile and held: tile c reads columns
(c mod W / tn) * tn .. + tn of them (`rope_tables`; NeoX's q / k / v kernel at 32 tokens on
cgra-8x8 loaded 49,152 bytes of tables, now 12,288). A column tile whose tables are 1 and 0
(GPT-NeoX's unrotated dims and v heads: four of a head's six 8-column tiles; Llama's v heads;
kernels/gemm/rope_pass_columns.py reads the constants) runs no rotation and loads no tables: its store
reads x (`mark_rotating_tiles`, lower/rope_skips.py). The products and the sum are the
RoPE kernel's (kernels/elementwise/rope.py) on the same values, in the same order: the same bits.
Two RoPE kernels a layer (q's and k's: Llama at 32 tokens on cgra-8x8 2,240 + 1,456 cycles) are
gone, and the heads are read by the attention kernel as boxes of the projection's output
(attention/head_layouts.py). A projection reading the layer's pre-norm (normed_linears.py) has
the same epilogue after the normed roots (`cgra.linear_rms_norm_rope`, `cgra.linear_layer_norm_rope`):
row_norm.py normalises its A panels, so the norm's kernel goes too.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import te, tirx
from tvm.relax.dpl import is_const, is_op, wildcard

from cgra_sim import cost

from ...errors import UnsupportedOperator
from ...relax_info import dtype_of, shape_dims
from ..common.dynamic import read_shape, symbols_of
from ..common.spec import HOLD_TABLES, ROPE_ROTATES, aligned
from ..common.operands import padded
from ..intrinsics import SPAD, get_intrin
from ..intrinsics.rope_epilogue import RotaryPattern
from .roots import linear_roots

#: The offloaded function's attribute [first, columns, ...]: its tables' pass-through column runs
#: (kernels/gemm/rope_pass_columns.py)
ROPE_PASS_COLUMNS = "cgra.rope_pass_columns"
#: The pattern-name suffix: "cgra.linear_rope".
SUFFIX = "_rope"
#: Output-sized scratchpad tiles the epilogue adds to the GEMM's: C, S and the rotated products
#: (and with a bias the biased accumulator).
EXTRA_TILES = 3


def rope_graphs(roots) -> list[tuple]:
    """(name, pattern, annotations, root name) of RoPE after a linear root [+ bias]."""
    graphs = []
    for root in linear_roots(roots):  # a linear normalising its own rows (row_norm.py) first
        bias, perm, cos, sin, cols = wildcard(), is_const(), wildcard(), wildcard(), (is_const(), is_const())
        # a table, or a compact one's columns repeated (normalise/rope_epilogues.py)
        cos_in, sin_in = (is_op("relax.take")(t, c) | t for t, c in zip((cos, sin), cols))
        biased = is_op("relax.add")(root.pattern, bias)
        x = biased | root.pattern
        rotated = is_op("relax.take")(x, perm)
        top = is_op("relax.add")(is_op("relax.multiply")(x, cos_in), is_op("relax.multiply")(rotated, sin_in))
        annotations = {"root": root.pattern, **root.roles, "bias": bias, "perm": perm, "cos": cos, "sin": sin,
                       "rotated": rotated, "cos_cols": cols[0], "sin_cols": cols[1]}
        graphs.append((f"cgra.{root.name}{SUFFIX}", top, annotations, root.name))
    return graphs


def is_rope_pattern(name: str) -> bool:
    return name.endswith(SUFFIX)


def with_rope(spec, annotated: dict):
    """`spec` with RoPE in its epilogue (module doc); refuses what the kernel does not compute."""
    rows = spec.symbolic("out")  # symbolic rows (a prefill's length): the tables' rows are that length
    if spec.op != "matmul" or spec.batch > 1 or spec.acc_dtype != "float32" or spec.half_out \
            or not spec.rhs_transposed or set(rows) - {0} \
            or any(axis != 0 or role not in ("lhs", "out") for role, axis, _ in spec.symbols):
        raise UnsupportedOperator("RoPE is fused after a float32 2-D linear with static sizes (or symbolic rows): "
                                  "this one runs as its parts")
    m, n, _ = spec.gemm_extents
    perm = _constant(annotated["perm"])
    if perm is None or perm.shape != (n,) or int(annotated["rotated"].attrs.axis) % 2 != 1:
        raise UnsupportedOperator("RoPE's rotation in a linear's epilogue is a take of constant columns")
    pattern = rotary_pattern(perm)
    if pattern is None:
        raise UnsupportedOperator("RoPE's partners do not repeat in periods of columns that hold them")
    width = _table_width(annotated, n, pattern)
    symbols = ()
    for role in ("cos", "sin"):
        shape, names = read_shape(annotated[role], role, symbolic_axes=tuple(rows), prefix="RoPE in a linear's epilogue: ")
        if shape != (m, width or n) or names != rows or dtype_of(annotated[role]) != "float32":
            raise UnsupportedOperator(f"RoPE's {role} table in a linear's epilogue is a float32 ({m}, {n}) tensor")
        symbols += symbols_of(role, names)
    return dataclasses.replace(spec, rope_pattern=pattern, rope_table_period=width, symbols=spec.symbols + symbols)


def with_pass_columns(spec, func):
    """`spec` with the pass-through table columns partitioning found at every call site of its
    function (kernels/gemm/rope_pass_columns.py: attribute ROPE_PASS_COLUMNS), if it has RoPE."""
    flat = (func.attrs or {}).get(ROPE_PASS_COLUMNS) if getattr(spec, "rope_pattern", None) else None
    if not flat:
        return spec
    values = [int(v) for v in flat]
    return dataclasses.replace(spec, rope_pass_columns=tuple(zip(values[0::2], values[1::2])))


def passing_columns(cos, sin):
    """Per column of (rows, W) constant tables, whether C = 1 and S = 0 on every row; None when
    a table is not such a constant."""
    if cos is None or sin is None or cos.shape != sin.shape or cos.ndim != 2:
        return None
    return ((cos == 1) & (sin == 0)).all(axis=0)


def table_runs(passing) -> tuple:
    """((first column, columns), ...) of the True runs of `passing`."""
    runs, start = [], None
    for j, flag in enumerate(list(passing) + [False]):
        if flag and start is None:
            start = j
        elif not flag and start is not None:
            runs.append((start, j - start))
            start = None
    return tuple(runs)


def _table_width(annotated, n, pattern) -> int:
    """W of compact (rows, W) tables read as table[:, j mod W] (normalise/rope_epilogues.py's take
    of their columns: W a whole number of the pattern's periods dividing n), 0 for (rows, n) ones."""
    if "cos_cols" not in annotated and "sin_cols" not in annotated:
        return 0
    widths = {shape_dims(annotated[role])[-1] for role in ("cos", "sin")}
    width = widths.pop()
    for role in ("cos", "sin"):
        cols = _constant(annotated[f"{role}_cols"]) if f"{role}_cols" in annotated else None
        if widths or not isinstance(width, int) or width >= n or n % width or width % pattern.period \
                or cols is None or not np.array_equal(cols, np.arange(n) % width):
            raise UnsupportedOperator("RoPE's tables in a linear's epilogue are (rows, N) tables or compact ones "
                                      "repeated every whole number of rotary periods")
    return width


def rope_tables(spec, tiling, arch, footprint: int):
    """`tiling` with `table_cols` W for compact (m, W) tables (spec.rope_table_period: a column
    tile lies inside one period, the tiling search saw to it), held per row tile, if the two (tm, W)
    tables fit beside the kernel's `footprint` bytes; else UnsupportedOperator."""
    width = spec.rope_table_period
    if not spec.rope_pattern or not width:
        return tiling
    if width % tiling.tn:
        raise UnsupportedOperator(f"RoPE's compact tables of {width} columns need column tiles dividing them")
    # (the held copies, one of each slice, replace the double-buffered table tiles the search counted)
    if footprint - 2 * aligned(2 * tiling.tm * tiling.tn * 4) + 2 * aligned(tiling.tm * width * 4) > arch.spad_bytes:
        raise UnsupportedOperator(f"RoPE's tables of {width} columns do not fit beside the GEMM's tiles in "
                                  f"'{arch.name}''s scratchpad: the rotary runs as its parts")
    return dataclasses.replace(tiling, table_cols=width)


def _constant(expr):
    return expr.value.numpy() if isinstance(expr, tvm.ir.GenericConst) else None


def rotary_pattern(perm: np.ndarray) -> RotaryPattern | None:
    """The RotaryPattern of the smallest period that divides the columns and holds every
    column's partner, else None."""
    n = len(perm)
    offsets = perm.astype(np.int64) - np.arange(n)
    for period in (p for p in range(1, n + 1) if n % p == 0):
        first = offsets[:period]
        local = np.arange(period) + first
        if (offsets.reshape(-1, period) == first).all() and local.min() >= 0 and local.max() < period:
            runs, start = [], 0
            for j in range(1, period + 1):
                if j == period or first[j] != first[start]:
                    runs.append((start, j - start, int(first[start])))
                    start = j
            return RotaryPattern(period, tuple(runs))
    return None


def rope_epilogue(spec, acc, tiling, operands: dict, m=None):
    """epi = x * C + x[:, partner] * S over the padded (mp, np) tiles, x = acc [+ bias] (blocks
    [bias_pad, biased], cos_pad, sin_pad, rot, epi); `m`: the rows, symbolic ones as their
    expression (the tables have as many)."""
    n = spec.gemm_extents[1]
    m = spec.gemm_extents[0] if m is None else m
    pattern = spec.rope_pattern
    x = acc
    if spec.bias_shape:
        bias, shape = operands["bias"], spec.bias_shape
        bias_pad = te.compute((tiling.np,), lambda j: padded(bias, shape, [0] * (len(shape) - 1) + [j]),
                              name="bias_pad")
        x = te.compute(acc.shape, lambda i, j: acc[i, j] + bias_pad[j], name="biased")
    width, tn = tiling.table_cols, tiling.tn
    cos_pad, sin_pad = (te.compute((acc.shape[0], width or acc.shape[1]),
                                   lambda i, j: padded(operands[role], (m, width or n), (i, j)), name=f"{role}_pad")
                        for role in ("cos", "sin"))

    def column(j):  # the held tables' column of output column j: the same in its tile's period
        return tirx.floormod(tirx.floordiv(j, tn), width // tn) * tn + tirx.floormod(j, tn) if width else j

    rot = te.compute(acc.shape, lambda i, j: x[i, pattern.partner(j)] * sin_pad[i, column(j)], name="rot")
    return te.compute(acc.shape, lambda i, j: x[i, j] * cos_pad[i, column(j)] + rot[i, j], name="epi")


def rope_operands(spec, m=None) -> dict:
    """The epilogue's parameters as placeholders: the bias (or None) and the (m, n) tables (the
    partners' indices are a constant of the match, read into the spec's pattern); `m` as in
    rope_epilogue."""
    n = spec.gemm_extents[1]
    m = spec.gemm_extents[0] if m is None else m
    return {"bias": te.placeholder(spec.bias_shape, "float32", name="bias") if spec.bias_shape else None,
            **{role: te.placeholder((m, spec.rope_table_period or n), "float32", name=role) for role in ("cos", "sin")}}


def stage_rope_blocks(sch, spec, tile_loop) -> None:
    """The rotated products (and the biased accumulator) under the output tile loop, in the
    scratchpad, before the accumulator is (compute_at needs its readers there first)."""
    for name in ("rot", "biased") if spec.bias_shape else ("rot",):
        block = sch.get_sblock(name)
        sch.compute_at(block, tile_loop)
        sch.set_scope(block, 0, SPAD)
    for name in ("cos_pad", "sin_pad"):
        block = sch.get_sblock(name)
        sch.compute_at(block, tile_loop)
        sch.set_scope(block, 0, SPAD)


def hold_rope_tables(sch, tiling, tile_loop) -> None:
    """Compact tables (rope_tables): the column tile loop says how many column tiles a period
    holds, and lower/held_tables.py keeps one tile of each table per column tile of the first
    period, loaded there, for the later periods to read."""
    if tiling.table_cols:
        sch.annotate(tile_loop, HOLD_TABLES, tiling.table_cols // tiling.tn)


def mark_rotating_tiles(sch, spec, tiling, tile_loop) -> None:
    """Where whole column tiles of the tables pass through (C = 1, S = 0: spec.rope_pass_columns),
    the column tile loop says which tiles rotate (ROPE_ROTATES, rotating_ranges), and
    lower/rope_skips.py leaves the rotation out of the others."""
    ranges = rotating_ranges(spec, tiling)
    if ranges is not None:
        sch.annotate(tile_loop, ROPE_ROTATES, [ranges[0]] + [t for pair in ranges[1] for t in pair])


def rotating_ranges(spec, tiling):
    """(p, [(first, last), ...]): column tile c rotates where c mod p lies in [first, last) of
    one range, p the tiles of the tables' columns (their period when compact); None when every
    tile rotates. Padded columns past the tables rotate nothing."""
    width, tn = tiling.table_cols or tiling.np, tiling.tn
    if not spec.rope_pass_columns or width % tn:
        return None
    columns = spec.rope_table_period or spec.gemm_extents[1]
    passing = np.zeros(width, bool)
    passing[columns:] = True
    for start, length in spec.rope_pass_columns:
        passing[start:start + length] = True
    rotates = ~passing.reshape(-1, tn).all(axis=1)
    if rotates.all():
        return None
    # the fewest tiles the flags repeat in (whole tables of heads alike: a head's tiles)
    period = next(p for p in range(1, len(rotates) + 1)
                  if len(rotates) % p == 0 and (rotates.reshape(-1, p) == rotates[:p]).all())
    rotates = rotates[:period]
    ranges = []
    for t in np.flatnonzero(rotates).tolist():
        if ranges and ranges[-1][1] == t:
            ranges[-1] = (ranges[-1][0], t + 1)
        else:
            ranges.append((t, t + 1))
    return len(rotates), ranges


def tensorize_rope_blocks(sch, spec, tiling) -> None:
    """The biased accumulator's EPILOGUE and the rotated products' ELTWISEs, a tile each."""
    if spec.bias_shape:
        sch.tensorize(sch.get_loops(sch.get_sblock("biased"))[-2],
                      get_intrin("epilogue", tiling.tm, tiling.tn, "float32", bias=True, relu=False))
    sch.tensorize(sch.get_loops(sch.get_sblock("rot"))[-2],
                  get_intrin("rope_rotate", tiling.tm, tiling.tn, spec.rope_pattern))


def combine_intrin(tiling, rows: int) -> str:
    return get_intrin("rope_combine", rows, tiling.tn)


def rope_tile_cycles(spec, arch):
    """cycles(elements) -> (PE array, vector unit) cycles of the epilogue on one output tile:
    the rotated products, the multiply and the add (each ELTWISE streams two operands: the
    products' runs priced as one command, their issue a few cycles each), the bias's EPILOGUE."""
    def cycles(elements: int) -> tuple[int, int]:
        eltwise = cost.eltwise_cycles(arch, elements, 2 * elements)
        bias = cost.vector_cycles(arch, 1, elements) if spec.bias_shape else 0
        return 0, 3 * eltwise + bias

    return cycles


def col_step(spec) -> int:
    """A column tile holds whole periods of the rotary pattern (1 without one)."""
    return spec.rope_pattern.period if spec.rope_pattern else 1
