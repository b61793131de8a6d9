"""Causal attention over a symbolic sequence length: flash.py's key-tile kernel for every length.
(Without a mask, an encoder's, spec.causal None: every whole key tile, then one cut to the keys
left, no band; the whole-row branches' items read keys 0 .. s - 1. DistilBERT at 16 tokens on
cgra-8x8: 2,018 cycles a layer, as static; Q Kᵀ, softmax and P V as kernels of their own and the
mask on the host took 8,693.)

Stage: partition (`length_spec` reads the pattern normalise/attention_lengths.py writes: the
attention with its causal mask built from arange, less_equal and where), tiling
(`choose_length_tiling`) and kernel definition (`length_compute`, lowered TIR as flash.py's).
In: q (B, Hk, G, s, D), k and v (B, Hk, 1, s, D | Dv), s symbolic, or head splits and boxes of
sequence-major (B, s, H, D) tensors, the result maybe merged back (length_layouts.py). Per batch,
query tile of tq rows (ceildiv(s, tq) of them) and head, as flash.py under a constant causal mask:

    Q tile [* scale]; FILL m, l, O
    key tiles below the diagonal (qt * tq / tk of them, all inside s): the online step, unmasked
    (software-pipelined where the tiling says so: length_pipeline.py)
    the tq / tk key tiles crossing the diagonal that start inside s: K, V read up to s, the
    online step with the band's triangle added, its columns cut to min(tk, s - k0)
    O * 1 / l, stored up to s

Every command of the last query tile computes min(tq, s - qt * tq) rows, and the DMA boxes stop
at s (lower/ragged.py cuts boxes along a symbolic dimension), so a ragged tile costs what its
rows do. A padded key column past s lies above the diagonal of every row that exists, so the
band masks it; cutting the diagonal tile's columns leaves it out of the GEMMs altogether.

The tiles come from the bound (`shape_bounds`, `tir_var_upper_bound`, torch.export's
`Dim(max=...)`): the tiling whose estimated cycles at the worst of the lengths 16, 32, ..., the
bound is the closest to the best tiling for that length (minimax regret, as the GEMMs' search);
with whole-row branches below (next paragraph), over the lengths past them only.

Where a head's K and V fit the scratchpad whole at a shorter length, the kernel first branches
on the run-time length: `if s <= limit` runs rows.py's whole-row items (rows_length.py: keys to
each tile's diagonal, a group's heads stacked, the items pipelined), one branch per whole-row
tiling up to the longest length it fits (`LengthTiling.rows`), and the key tiles above run only
past the last limit. The branches' buffers share scratchpad bytes (disjoint scopes), and the
branch is the host's: the device sees the commands of the one taken. Up to the limit the
commands are a static compile's for that length (Llama's attention on cgra-8x8 at 16 / 128 /
1024 tokens: 1,523 / 46,784 / 2.67 M cycles a layer, as static; over key tiles 3,396 / 79,752 /
3.89 M). Past the whole rows (1,536 there) the key tiles are 64 x 64 instead of 16 x 16: 8.23 M /
13.18 M cycles at 1,600 / 2,048 tokens instead of 9.34 M / 15.20 M.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ...errors import ScratchpadTooSmall, UnsupportedOperator
from ...relax_info import dtype_of, expression_name
from ..common.dynamic import read_shape
from ..common.spad_layout import a_row_stride
from ..common.spec import SINGLE_BUFFERED, round_up
from ..layout.copy_kernel import parse_script
from .attention_tiles import LOWEST, TINY, choose_attention_tiling
from .flash import SINGLE, _band
from .head_layouts import ROLES, base_role, operand_of, param_name
from .length_layouts import length_layouts, length_shapes, length_views
from .length_pipeline import load_keys, online_step, pipelined_keys
from .rows_length import BUFFERS as ROW_BUFFERS, NAMES as ROW_NAMES, choose_row_limits, is_box, load_box, \
    load_row_chunks, row_gemm, rows_branch
from .script_text import element as stored_at
from .script_text import Writer, eltwise, fill, gemm, vfunc
from .flash_tiles import F32_BYTES, FlashTiling, flash_cycles, flash_footprint
from .spec import F32, AttentionSpec

#: Names the kernel's text uses for its own buffers and loops: a length variable named like one is renamed.
_RESERVED = {"n", "qt", "c", "j", "kt", "ks", "i", "e", "u", "z", "q", "m", "l", "m_old", "alpha", "o", "s", "p",
             "inv", "res", "band", "k", "v", "k_diag", "v_diag", "lhs", "rhs", "value", "out", "T", "flash", "mask",
             "rowb", "ones_c"} | ROW_NAMES
#: The lengths the tile search weighs, up to the bound.
_LENGTHS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclasses.dataclass(frozen=True)
class LengthTiling(FlashTiling):
    """The key-tile kernel's tiling, and the whole-row kernel's (rows_length.py): ((limit,
    RowTiling), ...) by growing limit, each for the lengths up to its limit and past the one
    before (none: the key tiles at every length)."""

    rows: tuple = ()


def length_spec(annotated: dict, scale, safe: bool, causal: bool = True) -> AttentionSpec:
    """The AttentionSpec of a causal attention over a symbolic length (`length` its variable,
    sq and sk its bound), or with `causal` false of one where every query sees every key (no
    mask: spec.causal None); raises UnsupportedOperator saying why not."""
    prefix = f"{'causal ' if causal else ''}attention over a symbolic length: "
    shapes, names = [], set()
    for role in ROLES:
        operand = operand_of(annotated, role)
        shape, symbolic = read_shape(operand, role, symbolic_axes=(3,), prefix=prefix)
        if dtype_of(operand) != F32:
            raise UnsupportedOperator(prefix + "another dtype than float32: the vector unit computes float32")
        shapes.append(shape)
        names |= set(symbolic.values()) if symbolic else {None}
    if len(names) != 1 or None in names:
        raise UnsupportedOperator(prefix + "q, k and v must have the same symbolic length")
    (name,) = names
    (b, hk, g, sq, d), (kb, khk, one, _, kd), (vb, vhk, vone, _, dv) = shapes
    axes = annotated["transpose"].attrs.axes
    if (kb, khk, one, kd) != (b, hk, 1, d) or (vb, vhk, vone) != (b, hk, 1) or axes is None or \
            [int(a) for a in axes] != [0, 1, 2, 4, 3] or min(d, dv) < 2:
        raise UnsupportedOperator(prefix + f"q {shapes[0]}, k {shapes[1]}, v {shapes[2]}: not the normal form "
                                  "(normalise/attentions.py)")
    if causal:
        _check_mask(annotated, name, prefix)
    seq_major, parts = length_layouts(annotated, name, (b, hk, g, d, dv))
    sliced = tuple(role for role, _, _ in parts)
    return AttentionSpec(b, hk, g, sq, sq, d, dv, scale=scale, safe=safe, causal=0 if causal else None, length=name,
                         seq_major=seq_major,
                         parts=parts, param_roles=tuple(param_name(seq_major, role, sliced) for role in ROLES))


def _check_mask(annotated: dict, name: str, prefix: str) -> None:
    """The mask is where(less_equal(arange(0, s)[None], arange(0, s)[:, None]), 0, -inf)."""
    start, end, step = (expression_name(getattr(arg, "value", arg)) for arg in annotated["positions"].args)
    rows = [expression_name(d) for d in annotated["query_positions"].ty.shape.values]
    columns = [expression_name(d) for d in annotated["key_positions"].ty.shape.values]
    where = annotated["length_mask"]
    kept, masked = (float(arg.value.numpy().reshape(())) if arg.value.numpy().size == 1 else None
                    for arg in where.args[1:])
    if str(start) != "0" or str(step) != "1" or str(end) != name or rows != [name, "1"] or \
            columns != ["1", name] or kept != 0.0 or masked != -np.inf:
        raise UnsupportedOperator(prefix + "its mask is not where(j <= i, 0, -inf) over the length "
                                  "(normalise/attention_lengths.py writes that one)")


def choose_tiling(spec: AttentionSpec, arch):
    """The attention family's tile search: a symbolic length's here, a static attention's
    attention_tiles.choose_attention_tiling."""
    if spec.length is None:
        return choose_attention_tiling(spec, arch)
    tiling = choose_length_tiling(spec, arch)
    if tiling is None:
        raise ScratchpadTooSmall(
            f"causal attention over a symbolic length, heads of {spec.d} + {spec.dv} dims: the smallest query and "
            f"key tiles do not fit the scratchpad of '{arch.name}' ({arch.spad_bytes} bytes)")
    return tiling


def length_fits(parts: dict, arch) -> bool:
    """Whether an attention over a symbolic length (normalise/attention_lengths.py's parts) runs
    as one kernel on `arch`: its key tiles do not depend on the length."""
    spec = AttentionSpec(parts["B"], parts["Hk"], parts["G"], 256, 256, parts["D"], parts["Dv"], causal=0,
                         length=str(parts["length"]))
    return _key_tiling(spec, arch) is not None


@functools.lru_cache(maxsize=256)
def choose_length_tiling(spec: AttentionSpec, arch) -> LengthTiling | None:
    """The key tiles of least worst regret over the lengths up to the bound and the whole-row
    branches below them (module docstring); None if no key tiles fit."""
    chosen = _key_tiling(spec, arch)
    if chosen is None:
        return None
    rows = choose_row_limits(spec, arch, lambda n: _cycles_at(spec, arch, chosen, n))
    if rows and rows[-1][0] < spec.sq:  # the key tiles for the lengths past the whole rows only
        chosen = _key_tiling(spec, arch, rows[-1][0])
    return LengthTiling(**dataclasses.asdict(chosen), rows=rows)


def _key_tiling(spec: AttentionSpec, arch, above: int = 0) -> FlashTiling | None:
    """The fitting key tiling of least worst regret over the lengths past `above` up to the
    bound (cgra-8x8 at bound 2048: 16 x 16 tiles over them all, 64 x 64 past the whole rows'
    1,536, an estimated fifth fewer cycles at 2,048); None if none fits."""
    bound = spec.sq
    lengths = sorted({n for n in _LENGTHS if above < n < bound} | {bound} | ({above + 1} if above else set()))
    # (two query tiles' keys: a pipelined tiling's footprint counts its copies of S, P, K and V)
    # (a bias box is loaded into S, which the pipeline's copies of S would have to take too)
    fitting = [t for t in _candidates(spec, arch) if not (t.pipeline and is_box(spec))
               and flash_footprint(dataclasses.replace(spec, sq=t.tq, sk=2 * t.tq, mask_shape=()), t) +
               _row_bytes(spec, t) <= arch.spad_bytes]
    if not fitting:
        return None
    cycles = {t: [_cycles_at(spec, arch, t, n) for n in lengths] for t in fitting}
    best = [min(c[i] for c in cycles.values()) for i in range(len(lengths))]
    worst = {t: max(c / b for c, b in zip(cycles[t], best)) for t in fitting}
    chosen = min(fitting, key=lambda t: (round(worst[t], 3), cycles[t][-1]))
    return dataclasses.replace(chosen, cycles=cycles[chosen][-1])


def _row_bytes(spec: AttentionSpec, t: FlashTiling) -> int:
    """The key tiles' buffers for a bias row (length_rows.py): a head's row to the bound, a
    column of ones."""
    return (round_up(spec.sq, t.tq) + t.tq) * F32_BYTES if spec.mask_shape and not is_box(spec) else 0


def _candidates(spec: AttentionSpec, arch) -> list:
    tiles, tq = [], arch.rows
    while tq <= max(round_up(spec.sq, arch.rows), arch.rows):
        q_stride = a_row_stride(tq, spec.d, F32_BYTES, arch)
        for tk in sorted({arch.cols * 2 ** i for i in range(8)} | {2, 4, 8}):
            if tk < 2 or tq % tk:
                continue
            p_stride = a_row_stride(tq, tk, F32_BYTES, arch)
            tiles += [FlashTiling(tq, tk, "causal", lean, pipeline, q_stride, p_stride)
                      for lean in (False, True) for pipeline in (False, True)]
        tq *= 2
    return tiles


def _cycles_at(spec: AttentionSpec, arch, t: FlashTiling, length: int) -> int:
    """flash_tiles' estimate at `length`, the last query tile whole."""
    padded = round_up(length, t.tq)
    return flash_cycles(dataclasses.replace(spec, sq=padded, sk=padded, length=None), arch, t)


def length_compute(spec: AttentionSpec, t: FlashTiling):
    """The kernel's PrimFunc: parameters lhs (B, H, s, D), rhs (B, Hk, s, D), value (B, Hk, s, Dv),
    out (B, H, s, Dv); the caller's rank-5 views in `cgra.arg_shapes`."""
    func = parse_script(length_script(spec, t))
    s = next(e for param in func.params for e in param.ty.shape
             if not isinstance(e, int) and not hasattr(e, "value"))
    views = length_views(spec, s)
    func = func.with_attr("cgra.arg_shapes", [list(views[base_role(role)]) for role in list(spec.param_roles) + ["out"]])
    if spec.shape_args:
        func = func.with_attr("cgra.shape_args", list(spec.shape_args))
    return func.with_attr(SINGLE_BUFFERED, SINGLE + ROW_BUFFERS + ["rowb", "ones_c"] + (["q"] if t.lean else []))


def _variable(spec: AttentionSpec) -> str:
    """The length's name in the kernel's text (the code generator binds it from the tensors)."""
    return spec.length + "_length" if spec.length in _RESERVED else spec.length


def length_script(spec: AttentionSpec, t: FlashTiling) -> str:
    """The TVMScript text of the kernel (module docstring)."""
    b, hk, g, s = spec.b, spec.hk, spec.g, _variable(spec)
    shapes = length_shapes(spec, s)
    roles = [base_role(r) for r in spec.param_roles] + ["out"]
    w = Writer()
    w.lines = ["@T.prim_func", f"def flash({', '.join(f'{r}_handle: T.handle' for r in roles)}):",
               '    T.func_attr({"tirx.noalias": True})', f"    {s} = T.int32()"]
    w.lines += [f'    {r} = T.match_buffer({r}_handle, ({", ".join(map(str, shapes[r]))}), "float32")' for r in roles]
    for limit, rows in getattr(t, "rows", ()):  # the whole-row kernel up to its limits, the key tiles past them
        w.add(f"if {s} <= {limit}:")
        w.depth += 1
        rows_branch(w, spec, rows, limit, s)
        w.depth -= 1
        if limit >= spec.sq:
            return "\n".join(w.lines) + "\n"
        w.add("else:")
        w.depth += 1
    if spec.causal is not None:
        _band(w, t)
    n = w.loop("n", b)
    w.add(f"for qt in range(T.floordiv({s} + {t.tq - 1}, {t.tq})):")
    w.depth += 1
    c = w.loop("c", hk)
    j = w.loop("j", g)
    _head(w, spec, t, n, c, f"{c} * {g} + {j}" if g > 1 else c)
    return "\n".join(w.lines) + "\n"


def _head(w: Writer, spec: AttentionSpec, t: FlashTiling, n: str, c: str, head: str) -> None:
    """One head's query tile: Q, the key tiles up to the diagonal, the normalised output."""
    tq, tk, d, dv, s = t.tq, t.tk, spec.d, spec.dv, _variable(spec)
    r, rows = tq // tk, f"T.min({tq}, {s} - qt * {tq})"
    w.alloc("q", (tq, t.q_stride))
    w.add(f"for i, e in T.grid({tq}, {d}):",
          f"    q[i, e] = T.if_then_else(qt * {tq} + i < {s}, {stored_at(spec, 'lhs', n, head, f'qt * {tq} + i', 'e')}, "
          "T.float32(0))")
    if spec.scale is not None:
        w.add(vfunc("identity", rows, d, ("q", 0, t.q_stride), ("q", 0, t.q_stride), scale=spec.scale))
    for name, shape in (("m", (tq, 1)), ("l", (tq, 1)), ("m_old", (tq, 1)), ("alpha", (tq, 1)),
                        ("o", (tq, dv)), ("s", (tq, tk)), ("p", (tq, t.p_stride))):
        w.alloc(name, shape)
    # The output's buffers before the key tiles: the code generator plans scratchpad addresses as a
    # stack, and allocated after the diagonal's `if`, they took its K and V tiles' bytes, so the next
    # head's K load waited for this head's store (Llama at 16 tokens: 522 cycles a layer).
    res = "o" if t.lean else "res"
    w.alloc("inv", (tq, 1))
    if not t.lean:
        w.alloc("res", (tq, dv))
    w.add(fill("m", rows, 1, 1, LOWEST), fill("l", rows, 1, 1, 0.0), fill("o", rows, dv, dv, 0.0))
    row = _bias_row(w, spec, t, c, head)
    depth = w.depth
    # the key tiles below the diagonal (every whole one without a mask), all inside s: unmasked
    keys = f"qt * {r}" if spec.causal is not None else f"T.floordiv({s}, {tk})"
    if t.pipeline:  # flash.py's pipeline
        pipelined_keys(w, spec, t, n, c, rows, keys, _variable(spec), row)
    else:
        w.add(f"for kt in range({keys}):")
        w.depth += 1
        _key_tile(w, spec, t, n, c, rows, "kt", tk, "", None, row, head)
    w.depth = depth
    if spec.causal is None:  # the last keys, a tile cut to them: none past s is computed, none masked
        w.add(f"if {s} % {tk} > 0:")
        w.depth += 1
        _key_tile(w, spec, t, n, c, rows, keys, f"{s} - {keys} * {tk}", "_diag", None, row, head)
    else:
        w.add(f"for ks in range({r}):", f"    if (qt * {r} + ks) * {tk} < {s}:")
        w.depth += 2
        band = ("band", f"({r - 1} - ks) * {tk * tk}", tk, 1)
        _key_tile(w, spec, t, n, c, rows, f"qt * {r} + ks", f"T.min({tk}, {s} - (qt * {r} + ks) * {tk})", "_diag",
                  band, row)
    w.depth = depth
    w.add(vfunc("reciprocal", rows, 1, ("l", 0, 1), ("inv", 0, 1), offset=TINY if spec.safe else None))
    w.add(eltwise("multiply", rows, dv, ("o", 0, dv, 1), ("inv", 0, 1, 0), (res, 0, dv)),
          f"for i, e in T.grid({tq}, {dv}):",
          f"    if qt * {tq} + i < {s}:", f"        {stored_at(spec, 'out', n, head, f'qt * {tq} + i', 'e')} = {res}[i, e]")


def _bias_row(w: Writer, spec: AttentionSpec, t: FlashTiling, c: str, head: str) -> int | None:
    """With a bias row (length_rows.py): the head's keys 0 .. s - 1 into `rowb` and a column of
    ones, and the row's width; else None."""
    if not spec.mask_shape or is_box(spec):
        return None
    width = round_up(spec.sq, t.tq)
    w.alloc("rowb", (width,))
    w.alloc("ones_c", (t.tq,))
    w.add(fill("ones_c", 1, t.tq, t.tq, 1.0))
    load_row_chunks(w, "rowb", 1, f"(qt + 1) * {t.tq // t.tk}", t.tk, f"mask[{head}, {{}}]", spec.mask_shape[4])
    return width


def _key_tile(w: Writer, spec: AttentionSpec, t: FlashTiling, n: str, c: str, rows: str, tile: str, cols,
              suffix: str, mask, row: int | None = None, head: str = "") -> None:
    """Key tile `tile` (tk keys from tile * tk, `cols` of them computed): K and V in, the online
    step of flash.py, `mask` an ELTWISE operand added to the scores (the band) or None; `row`:
    `rowb`'s width, its columns of the tile added to the scores first (a bias row), or None; with
    a bias box (length_boxes.py) its tq x tk tile of query head `head` loaded into S, the GEMM
    accumulating onto it."""
    d, dv, tk = spec.d, spec.dv, t.tk
    k0 = f"{tile} * {tk}" if suffix == "" else f"({tile}) * {tk}"
    kb, vb = "k" + suffix, "v" + suffix
    w.alloc(kb, (d, tk))
    w.alloc(vb, (tk, dv))
    load_keys(w, spec, tk, n, c, k0, kb, vb, _variable(spec) if suffix else None)
    if is_box(spec):
        load_box(w, "s[{i}, {u}]", head, f"qt * {t.tq}", t.tq, f"({k0})", "1", tk, spec.mask_shape[4])
    w.add(gemm(is_box(spec), rows, cols, d, ("q", 0, t.q_stride), (kb, 0, tk), ("s", 0, tk)))
    if row is not None:
        w.add(row_gemm(rows, cols, ("ones_c", 0), ("rowb", k0, row), ("s", 0, tk)))
    online_step(w, spec, t, rows, cols, ("s", 0), ("p", 0), (vb, 0), mask)
