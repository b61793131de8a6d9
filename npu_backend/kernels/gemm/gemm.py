"""What every GEMM-shaped kernel shares (matmul.py, conv2d.py): its tile search.

Stage: tiling. A GEMM-shaped kernel's PrimFunc (blocks a_pad, b_pad, [bias_pad], [res_pad], acc,
[scale_pad], epi, out; see the families' computes) has rows Mp, columns Np and a reduction Kp
padded to whole tiles. `choose_gemm_tiling` picks tile sizes (tm, tn, tk): whole multiples of the
PE array whose double-buffered buffers fit the scratchpad (a third copy where it has room:
gemm_copies.py), with the fewest estimated cycles (gemm_estimate.py). A static matmul of more rows
than one PE-array fold (a transformer's prefill) may finish each output tile in pieces of the
array's rows (`Tiling.epilogue_rows`); its tile search then also weighs reduction steps shallower
than the deepest that fits, with A's row panel streamed a step at a time by a row tile's first
column tile (Tiling.stream_panel), and takes such a tiling only when the estimate finds it faster
by more than its error bound (in_pieces). gemm_schedule.py schedules the tiling chosen here.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ...errors import ScratchpadTooSmall, UnsupportedOperator
from .epilogue_tail import act_on_vector, check_tail_padding, tail_padding_refused, tail_tile_cycles
from ..intrinsics.epilogue_tail import VFUNC_ACTS
from ..common.spad_layout import a_row_stride, out_row_stride, store_walks_rows
from ..common.spec import KernelSpec, Tiling, aligned, round_up
from .bias_acc import accumulates_bias
from .fabric_gelu import share_tiling
from .gemm_copies import may_take_copies, operand_copies
from .gemm_estimate import estimate_cycles, gemm_footprint, may_hold_a_panel
from .post_norm_rows import rows_only
from .post_norm import post_norm_col_step, post_norm_pieces, post_norm_tiles, require_whole_rows
from .post_norm_cost import check_post_norm, post_norm_tiling
from .row_norm import check_row_norm, panel_bytes
from .row_norm_cost import check_fold_pays
from .gemm_pieces import finishes_in_pieces, in_pieces, patch_pieces, streamed_candidates
from .rope_epilogue import EXTRA_TILES, col_step, rope_tables


# ------------------------------------------------------------------ tile search

def choose_gemm_tiling(spec: KernelSpec, arch: HardwareDescription) -> Tiling:
    """The tiling of a GEMM-shaped kernel (its GEMM extents, dtypes and epilogue operands); with
    symbolic rows, the one that is never far from the best tiling of the size that runs. Searched
    once per problem and chip: partitioning asks (does it fit?) and then the kernel stage."""
    pieces = finishes_in_pieces(spec, arch) or post_norm_pieces(spec, arch)
    key = (spec.gemm_extents, spec.dtype, spec.acc_dtype, bool(spec.bias_shape), spec.row_step,
           bool(spec.residual_shape), bool(spec.scale_shape), store_walks_rows(spec),
           _any_rows(spec), _rows_folded(spec), spec.pixel_order, _taps(spec), spec.act, spec.gated, bool(spec.multiplier_shape),
           _extra_rows(spec), may_hold_a_panel(spec), spec.patch_channels,
           pieces, may_take_copies(spec), spec.rope_pattern, spec.rope_table_period, panel_bytes(spec, 1), spec.post_norm, arch.fingerprint)
    if spec.gated and spec.act != "gelu" and not act_on_vector(spec, arch):
        raise UnsupportedOperator(f"a gated linear unit's {spec.act} runs through a function unit that has it; "
                                  f"'{arch.name}' has none: its parts run as their own kernels")
    if spec.half_via and spec.half_out and spec.act and spec.act not in VFUNC_ACTS and not act_on_vector(spec, arch):
        raise UnsupportedOperator(f"a rounded linear's {spec.act} runs as a VFUNC of a function unit that has it; "
                                  f"'{arch.name}' has none: the activation and its cast run as their own kernels")
    require_whole_rows(spec, arch)  # a post-norm's tiles hold whole rows (post_norm.py)
    if key not in _TILINGS:
        if len(_TILINGS) >= 4096:
            _TILINGS.clear()
        _TILINGS[key] = choose_tiling(*spec.gemm_extents, spec.dtype, spec.acc_dtype, bool(spec.bias_shape), arch,
                                      spec.row_step, has_residual=bool(spec.residual_shape),
                                      has_scale=bool(spec.scale_shape), store_rows=store_walks_rows(spec),
                                      any_rows=_any_rows(spec), rows_folded=_rows_folded(spec), taps=_taps(spec),
                                      ragged=spec.pixel_order != "blocks", has_multiplier=bool(spec.multiplier_shape),
                                      tail_cycles=tail_tile_cycles(spec, arch),
                                      extra_rows=_extra_rows(spec),
                                      a_panel=may_hold_a_panel(spec), depth_step=spec.patch_channels or 1,
                                      pieces=pieces,
                                      # (the panel program's room is not in gemm_copies' check)
                                      more_copies=may_take_copies(spec) and spec.row_norm is None,
                                      # (RoPE's compact tables: held per row tile, not loaded per tile)
                                      extra_tiles=(EXTRA_TILES + bool(spec.bias_shape),
                                                   0 if spec.rope_table_period else 2) if spec.rope_pattern
                                      else post_norm_tiles(spec),  # a post-norm's program: post_norm.py
                                      col_step=col_step(spec) * post_norm_col_step(spec),
                                      col_divides=spec.rope_table_period,
                                      normed_panel=functools.partial(panel_bytes, spec) if spec.row_norm else None,
                                      # a rounded linear's activation: tilings its padding check passes first
                                      allowed=(lambda t: not tail_padding_refused(spec, t, arch))
                                      if spec.half_via and spec.half_out and spec.act else None)
        if act_on_vector(spec, arch):
            _TILINGS[key] = dataclasses.replace(_TILINGS[key], act_on_vector=True)
        _TILINGS[key] = post_norm_tiling(spec, _TILINGS[key], arch)  # or row tiles holding B (post_norm.py)
        # RoPE's tables held per row tile when they repeat (rope_epilogue.py)
        _TILINGS[key] = rope_tables(spec, _TILINGS[key], arch, _footprint(spec, _TILINGS[key], arch))
    _TILINGS[key] = patch_pieces(spec, _TILINGS[key], arch)  # a patch conv storing tokens (gemm_pieces.py)
    check_tail_padding(spec, _TILINGS[key], arch)
    check_row_norm(spec, _TILINGS[key], arch)
    check_fold_pays(spec, _TILINGS[key], arch, choose_gemm_tiling)  # (row_norm_cost.py)
    check_post_norm(spec, _TILINGS[key], arch, choose_gemm_tiling)
    # (decided per spec, not cached: the key leaves out epilogue pieces that forbid it)
    bias_in_acc = accumulates_bias(spec, _TILINGS[key], arch)  # the VFUNC reads acc + bias (bias_acc.py)
    tiling = dataclasses.replace(_TILINGS[key], bias_in_acc=True) if bias_in_acc else _TILINGS[key]
    return share_tiling(spec, tiling, arch, bias_in_acc)  # a share of GELU on the fabric (fabric_gelu.py)


def _footprint(spec: KernelSpec, t: Tiling, arch: HardwareDescription) -> int:
    """Scratchpad bytes of a RoPE epilogue's GEMM as its tiling was searched (choose_tiling: its
    padded rows, the epilogue's tiles, a normed panel, third operand copies)."""
    in_bytes = DType.from_name(spec.dtype).itemsize
    a_row = a_row_stride(t.tm, t.tk, in_bytes, arch)
    total = gemm_footprint(t.tm, t.tn, t.tk, in_bytes, 4, bool(spec.bias_shape), a_row=a_row,
                           out_row=out_row_stride(t.tn, 4, store_walks_rows(spec), arch),
                           extra_tiles=EXTRA_TILES + bool(spec.bias_shape), extra_rows=_extra_rows(spec))
    total += panel_bytes(spec, t.tm) if spec.row_norm else 0
    return total + (t.operand_copies - 2) * (aligned(t.tm * a_row * in_bytes) + aligned(t.tk * t.tn * in_bytes))


def _taps(spec: KernelSpec) -> int:
    """Reduction steps per depth chunk: a conv2d's kernel window (kh * kw; kh over patches, whose
    depth holds a kernel row), 1 for a matmul."""
    if spec.op != "conv2d":
        return 1
    return spec.rhs_shape[2] * (1 if spec.patch_channels else spec.rhs_shape[3])


def _extra_rows(spec: KernelSpec) -> int:
    """Rows of tn values the epilogue stages beside the bias and scale: a batch norm's scale and
    shift, a dequantising EPILOGUE's second scale per channel (dequant_epilogue.py)."""
    return bool(spec.channel_scale_shape) + bool(spec.channel_shift_shape) + spec.dequantise


def _any_rows(spec: KernelSpec) -> bool:
    """One kernel serves every number of GEMM rows: a matmul's rows or a conv2d's image size
    are symbolic."""
    return (spec.op == "matmul" and bool(spec.symbolic("lhs"))) or spec.symbolic_image


def _rows_folded(spec: KernelSpec) -> bool:
    """Whether the search prices a symbolic-rows tiling with its FILL folded (choose_tiling's
    `rows_folded`): a matmul whose only symbolic axes are its rows (post_norm_rows.rows_only),
    not attention's Q Kᵀ or P V, whose symbolic columns or reduction the search does not weigh."""
    return spec.op == "matmul" and bool(spec.symbols) and rows_only(spec)


_TILINGS: dict = {}  # choose_gemm_tiling's results (Tiling is immutable)


def choose_tiling(rows: int, cols: int, depth: int, dtype: str, acc_dtype: str,
                  has_bias: bool, arch: HardwareDescription, row_step: int = 1,
                  has_residual: bool = False, has_scale: bool = False, store_rows: int = 0,
                  any_rows: bool = False, rows_folded: bool = False, taps: int = 1, ragged: bool = True, has_multiplier: bool = False,
                  tail_cycles=None, extra_rows: int = 0, a_panel: bool = False, depth_step: int = 1,
                  pieces: bool = False, more_copies: bool = False, extra_tiles: tuple = (0, 0),
                  col_step: int = 1, normed_panel=None, col_divides: int = 0, allowed=None) -> Tiling:
    """The tiling with the fewest estimated cycles among those that fit the scratchpad.

    With `any_rows` (symbolic rows, `rows` their bound) one tiling serves every size up to
    `rows`: the one whose estimate, at sizes from one PE-array step to the bound, exceeds the
    best tiling of that size by the smallest factor (minimax regret). Its last tile is cut to the
    rows that exist (lower/ragged.py), so a small size does not pay for a large tile's rows.
    `rows_folded`: those estimates with each tile's FILL folded into its first GEMM (a matmul
    whose only symbolic axis is its rows: what its kernel runs).
    `ragged` False: the rows are an image's pixels in blocks of rows and `row_step` columns, the
    blocks past its last row or column cut to the pixels inside (`_block_tiling`). `taps`:
    reduction steps per depth chunk (a conv2d's kh * kw), so that the per-tile costs weigh
    against the steady stream as they do in the kernel.

    Output tiles grow in whole PE-array steps (rows: in multiples of `row_step` when the kernel
    needs whole groups of rows, e.g. whole output rows of a conv2d) up to the padded problem; for
    each, the reduction depth is the whole reduction when it fits, otherwise the largest chunk
    that does. A residual (`has_residual`) is one more output-sized tile in the scratchpad,
    loaded per output tile and read by the epilogue. The footprint counts the row padding the
    schedule adds against bank conflicts (A's rows; the output's when its store walks
    `store_rows` rows, see spad_layout.py). A multiplier (`has_multiplier`) is one more such tile;
    `tail_cycles(elements)`: the (PE array, vector unit) work of an epilogue's activation and
    multiply on a tile (epilogue_tail.py); `allowed(tiling)`: a later check's verdict, the
    tilings it passes preferred where any does (fixed rows only). `a_panel`: the kernel holds A's row
    panel across column tiles where the tiling lets it (holds_a_panel). `depth_step`: a depth
    chunk divides the depth and is a multiple of it (a patch's channels, patchify.py). `pieces`:
    the kernel may finish an output tile in pieces of the PE array's rows (epilogue_rows), and
    reduction steps shallower than the deepest that fits are weighed too: a shallow step lets
    the first GEMM start early, a whole-width tile finished in pieces ends soon after its last
    GEMM (transformer prefill: 16-128 rows, a few hundred columns); such a kernel's tilings are
    priced as it runs, its FILL folded into the first GEMM (lower/fold_init.py), so that one tile
    and many compare fairly. `more_copies`: a tiling whose scratchpad has room gives its per-step
    operand tiles a third copy (gemm_copies.py), priced so. `extra_tiles`: (held in the scratchpad,
    loaded per output tile) more output-sized tiles (RoPE's tables, loaded, and its products);
    `col_step`: a column tile holds a whole number of these columns (RoPE's periods);
    `col_divides`: and lies inside one period of that many (RoPE's compact tables).
    `normed_panel(tm)`: only tiles holding the whole reduction, with room for that many more bytes
    (a norm's program on A's panel and its result, row_norm.py).
    """
    row_step = row_step if row_step > 1 else arch.rows
    # A unit reduction extent would be elided by compute_at and leave nothing to tensorize
    # along; one zero column is cheaper than a special case.
    depth = max(depth, 2)
    in_bytes = DType.from_name(dtype).itemsize
    acc_bytes = DType.from_name(acc_dtype).itemsize
    candidates = []  # (tm, tn, tk) that fit the scratchpad
    streamed = []  # with `pieces`: the same tiles with shallower reduction steps
    shallowest = min(_k_candidates(depth, depth_step))
    held, loaded = extra_tiles[0] + int(has_multiplier), extra_tiles[1] + int(has_multiplier)
    tn_step = math.lcm(arch.cols, col_step)
    for tn in range(tn_step, round_up(cols, tn_step) + 1, tn_step):
        if col_divides and col_divides % tn:
            continue
        out_row = out_row_stride(tn, acc_bytes, store_rows, arch)  # the same for every tm
        for tm in range(row_step, round_up(rows, row_step) + 1, row_step):
            # The compact footprint only grows with tm: past the first tm whose shallowest tile
            # cannot fit even unpadded, none fits (this keeps a large bound, e.g. a symbolic
            # batch x sequence, from enumerating a million row tiles).
            if gemm_footprint(tm, tn, shallowest, in_bytes, acc_bytes, has_bias, has_residual,
                              has_scale, extra_tiles=held, extra_rows=extra_rows) > arch.spad_bytes:
                break
            tk = _deepest_fitting_k(tm, tn, depth, in_bytes, acc_bytes, has_bias, arch, has_residual, out_row,
                                    has_scale, extra_tiles=held, extra_rows=extra_rows,
                                    step=depth_step)
            if normed_panel and (tk is None or tk < depth or normed_panel(tm) + gemm_footprint(
                    tm, tn, tk, in_bytes, acc_bytes, has_bias, has_residual, has_scale,
                    a_row_stride(tm, tk, in_bytes, arch), out_row, held, extra_rows) > arch.spad_bytes):
                continue
            if tk is not None:
                candidates.append((tm, tn, tk))
                if pieces and not normed_panel:
                    streamed += streamed_candidates(tm, tn, tk, depth, round_up(cols, tn) // tn, a_panel, arch, (
                        lambda step, panel, tm=tm, tn=tn, out_row=out_row: gemm_footprint(
                            tm, tn, step, in_bytes, acc_bytes, has_bias, has_residual, has_scale,
                            a_row_stride(tm, step, in_bytes, arch), out_row, held, extra_rows)
                        + aligned(2 * tm * a_row_stride(tm, step, in_bytes, arch) * panel * in_bytes)
                        <= arch.spad_bytes))
    candidates.sort()  # ties go to the smaller row tile, as they always have
    if not candidates:
        if col_divides:
            raise UnsupportedOperator(f"no column tile of '{arch.name}' ({tn_step} columns a step) divides RoPE's "
                                      f"compact tables of {col_divides} columns: the rotary runs as its parts")
        if row_step > arch.rows:  # a conv2d's tile holds whole output rows or columns
            raise ScratchpadTooSmall(
                f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold one tile of {row_step} "
                f"output pixels (a whole output row or column of the conv2d) by {arch.cols} channels in "
                f"{dtype}: describe a larger scratchpad, or split the image")
        raise ScratchpadTooSmall(
            f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold even one "
            f"{arch.rows}x{arch.cols} tile of a {dtype} GEMM: describe a larger scratchpad")

    def tiling_for(candidate, size: int, copies_at_any_rows: bool = False) -> Tiling:
        tm, tn, tk = candidate[:3]  # (and with `pieces`, whether A's panel streams: gemm_pieces.py)
        tm = min(tm, round_up(size, row_step))  # a tile past the rows is cut to them
        stream = len(candidate) > 3 and candidate[3]
        copies = 2
        if more_copies and (copies_at_any_rows or not any_rows):
            a_row = a_row_stride(tm, tk, in_bytes, arch)
            footprint = gemm_footprint(tm, tn, tk, in_bytes, acc_bytes, has_bias, has_residual, has_scale, a_row,
                                       out_row_stride(tn, acc_bytes, store_rows, arch), held, extra_rows)
            footprint += aligned(2 * tm * a_row * (round_up(depth, tk) // tk) * in_bytes) if stream else 0
            copies = operand_copies(footprint, tm, a_row, tk, tn, in_bytes, arch.spad_bytes)
        return Tiling(tm, tn, tk, round_up(size, tm), round_up(cols, tn), round_up(depth, tk),
                      stream_panel=stream, operand_copies=copies)

    def cycles(candidate, size: int, piece_rows: int = 0, folded: bool = False) -> int:
        return estimate_cycles(tiling_for(candidate, size), dtype, in_bytes, acc_bytes, arch, has_residual, taps=taps,
                               extra_tiles=loaded, tail_cycles=tail_cycles, a_panel=a_panel,
                               piece_rows=piece_rows, init_folded=folded)

    if not ragged:
        return _block_tiling(candidates, rows, cols, depth, row_step,
                             lambda t: estimate_cycles(t, dtype, in_bytes, acc_bytes, arch, has_residual, taps=taps,
                                                       extra_tiles=loaded, tail_cycles=tail_cycles))
    if not any_rows:
        # `allowed(tiling)`: the tilings preferred where any is (a later check refuses the others)
        kept = [c for c in candidates if allowed(tiling_for(c, rows))] if allowed is not None else []
        best = min(kept or candidates, key=lambda c: (cycles(c, rows), -c[0] * c[1]))
        if pieces:
            return in_pieces(best, candidates + streamed, rows, row_step, arch, tiling_for, cycles, a_panel)
        return tiling_for(best, rows)
    sizes = sorted({min(rows, row_step << k) for k in range(rows.bit_length() + 1)} | {rows})
    # With `rows_folded`, priced as the kernel runs, each tile's FILL folded into its first GEMM
    # (lower/fold_init.py folds it at symbolic rows too). Priced with the FILL and its bubble, a whole-depth tile
    # looked no better than a 16-deep one at 16 rows, and GPT-NeoX's o-projection + residual took
    # 256 x 32 x 16 tiles: 2,232 cycles at 16 tokens against 1,886 compiled for 16 (64 x 8 x 64
    # now: 1,886).
    fastest = {size: min(cycles(c, size, folded=rows_folded) for c in candidates if c[0] <= round_up(size, row_step))
               for size in sizes}
    best = min(candidates, key=lambda c: (max(cycles(c, s, folded=rows_folded) / fastest[s] for s in sizes),
                                          cycles(c, rows)))
    # The tiles chosen double buffered, then the third copies where they fit: Llama's
    # o-projection at 128 tokens 11,406 -> 11,056 cycles. Weighed in the choice (priced at cut
    # tiles) they took 32 x 16 x 64 tiles there (9,680; 16 tokens 2,032 against 2,224 now), but
    # moved the snapshot's symbolic dense_f32_n97 on cgra-8x8 to a tiling 6% slower.
    return Tiling(*best, round_up(rows, best[0]), round_up(cols, best[1]), round_up(depth, best[2]),
                  operand_copies=tiling_for(best, rows, copies_at_any_rows=True).operand_copies)


def _block_tiling(candidates, rows: int, cols: int, depth: int, block_columns: int, estimate) -> Tiling:
    """The tiling of a GEMM whose rows are the pixels of an image in blocks of tm / block_columns
    rows by block_columns columns, height and width symbolic (conv2d._blocks_compute): minimax
    regret, as for rows, over square images of a power of two pixels a side and one more, from 1
    to the bound (`rows` pixels). The blocks past the image's last row or column compute only
    the pixels inside it (lower/ragged.py), so an image is priced as its whole blocks plus its
    cut ones."""
    # Block heights on a ladder of eight per octave (1-8 rows, then 8, 9, .., 15, 16, 18, ..): the
    # search is as fine as the images it weighs, at a fraction of the estimates.
    candidates = [c for c in candidates if _on_ladder(c[0] // block_columns)]
    largest = max(math.isqrt(rows), block_columns)
    sides = sorted({min(largest, (1 << k) + extra) for k in range(largest.bit_length()) for extra in (0, 1)}
                   | {largest})

    def cycles(candidate, side: int) -> int:
        tm, tn, tk = candidate
        total = 0
        for block_rows, row_count in _blocks_along(side, tm // block_columns):
            for columns, column_count in _blocks_along(side, block_columns):
                m, count = block_rows * columns, row_count * column_count
                total += estimate(Tiling(m, tn, tk, count * m, round_up(cols, tn), round_up(depth, tk)))
        return total

    table = {c: [cycles(c, side) for side in sides] for c in candidates}
    fastest = [min(column) for column in zip(*table.values())]
    best = min(candidates, key=lambda c: (max(a / b for a, b in zip(table[c], fastest)), table[c][-1]))
    return Tiling(*best, round_up(rows, best[0]), round_up(cols, best[1]), round_up(depth, best[2]))


def _on_ladder(value: int) -> bool:
    """Whether `value` is one of 1, 2, .., 8, 9, .., 15, 16, 18, .., 30, 32, 36, ..: eight values
    per octave."""
    return value % (1 << max(value.bit_length() - 4, 0)) == 0


def _blocks_along(side: int, block: int) -> list[tuple[int, int]]:
    """(pixels, how many blocks) along an image side of `side` pixels in blocks of `block`: the
    whole blocks, and the last one cut to what is left."""
    return [(size, count) for size, count in ((block, side // block), (side % block, 1)) if size and count]


def _deepest_fitting_k(tm, tn, depth, in_bytes, acc_bytes, has_bias, arch, has_residual, out_row,
                       has_scale=False, extra_tiles=0, extra_rows=0, step=1):
    for tk in _k_candidates(depth, step):
        a_row = a_row_stride(tm, tk, in_bytes, arch)
        if gemm_footprint(tm, tn, tk, in_bytes, acc_bytes, has_bias, has_residual, has_scale, a_row, out_row,
                          extra_tiles, extra_rows) <= arch.spad_bytes:
            return tk
    return None


def _k_candidates(depth: int, step: int = 1):
    """The whole reduction, then halvings of it (rounded up to a multiple of 8); with a `step`,
    the whole reduction and its halvings that are whole multiples of the step."""
    if step > 1:
        yield from (depth >> k for k in range(depth.bit_length())
                    if (depth >> k) << k == depth and (depth >> k) % step == 0)
        return
    tk = depth
    seen = set()
    while tk >= 1:
        candidate = tk if tk == depth else round_up(tk, 8)
        if candidate not in seen:
            seen.add(candidate)
            yield candidate
        if tk == 1:
            break
        tk = -(-tk // 2)
