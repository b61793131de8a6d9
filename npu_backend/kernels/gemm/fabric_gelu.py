"""A share of a GEMM + GELU kernel's GELUs (erf form) as FABRIC passes on the PE array, beside the VFUNC.

Stage: tiling (`share_tiling`, which sets Tiling.fabric_gelu_rows after the tile search) and
tensorize (`tile_calls`, which intrinsics/epilogue_tail.py's EPILOGUE intrinsic issues). In: a
tile's rows and columns, the tile of x (updated in place) and a scratch tile of the same shape.
Out: the FABRIC commands (the PE array's queue) of the first rows; the caller's VFUNC covers the
other rows (the vector unit's queue), both at once.

Swin's and ConvNeXt's fc1 + GELU kernels are bound by the vector unit: cgra-8x8's function unit
takes about an element a cycle, and the PE array, after a tile's GEMM, idles (Swin's 256 x 16 ->
64: vector 15,040 cycles busy, PE 4,608). The fabric computes x Phi(x) as six bodies
(cgra_sim/mapping/gelu_erf.py: a degree-12 polynomial argument in two passes, the fabric's exp,
a logistic times x; about 2.9 PE cycles an element on cgra-8x8, 9 on cgra-4x4, whose lanes take
85 operations an element), within 4.6 ulps of float64 for x >= -1, 23 for x >= -4, 3.2e-7
absolute below -5 (gelu_erf.py's bound; the function unit's is 7 ulps).

The passes need x, the running value and the exp's t at once: the tile's columns go in two
halves h, the first half's running value and t in the scratch tile's two halves, the second's in
its second half and the first (free once the first half's last pass has read it):

    half 0: HIGH x0 -> F0; LOW (x0, F0) -> F0; ROUND F0 -> F1; POLYNOMIAL (F0, F1) -> F0;
            SCALE (F1, F0) -> F0; LOGISTIC (x0, F0) -> x0
    half 1: the same with F1 for F0 and F0 for F1, x1 for x0

In the GEMM epilogue the scratch is the accumulator tile (dead once the EPILOGUE has written
x = acc + bias into the output tile). The share is chosen per tiling by the busiest unit of a
tile in the steady state (`share_rows`): the PE array's GEMM, its refill after the passes, and
the passes; the vector unit's EPILOGUE and the VFUNC of the other rows; the load engine's tiles.
Taken only where that beats the tile without one (and its bias in the accumulator, bias_acc.py).
"""

from __future__ import annotations

import dataclasses
import functools

from cgra_sim import cost
from cgra_sim.isa import DType
from cgra_sim.mapping import gelu_erf
from cgra_sim.mapping.body import reads_b

from ..common.chains import require_program
from ..intrinsics.fabric import FabricBody, fabric_call
from ..common.spad_layout import a_row_stride
from ..common.spec import aligned
from .gemm_estimate import gemm_footprint, holds_a_panel


def applies(spec, tiling) -> bool:
    """Whether a GEMM kernel may share its GELU with the fabric: a static float32 2-D matmul
    (a pre-norm on its A panel or not) whose epilogue is [+ bias] then GELU's erf form, whole tiles of even columns finished at once
    (no epilogue pieces, no padded row tile: lower/padded_rows.py cuts the VFUNC's rows)."""
    plain = spec.op == "matmul" and spec.compute_name == "matmul" and spec.dtype == "float32" and \
        spec.acc_dtype == "float32" and spec.out_dtype == "float32" and not spec.symbols and spec.batch <= 1
    epilogue = spec.act == "gelu" and not (
        spec.relu or spec.clip or spec.residual_shape or spec.multiplier_shape or spec.channel_scale_shape
        or spec.gated or spec.rope_pattern or spec.post_norm or spec.fabric_body or spec.scale_shape
        or spec.half_out or spec.half_via or spec.requant_zero_point is not None)
    rows = spec.gemm_extents[0]
    tiles = tiling.tn % 2 == 0 and not tiling.stream_panel and not 0 < tiling.epilogue_rows < tiling.tm \
        and isinstance(rows, int) and rows % tiling.tm == 0
    return plain and epilogue and tiles


@functools.lru_cache(maxsize=16)
def _programs(arch) -> tuple:
    """((mapped program, whether it reads B) of each pass), once per preset."""
    return tuple((require_program(nodes, dtype, arch, "the fabric's GELU"), reads_b(nodes))
                 for nodes, dtype in gelu_erf.passes())


def fabric_cycles(arch, rows: int, cols: int) -> int:
    """PE array cycles of the passes over `rows` x `cols` of a tile of `tm` rows: six passes
    (their mapped runs, each input read and the output written), over the whole share when the
    scratch holds two copies of it (`halves` False), else over each half of the columns."""
    if rows <= 0:
        return 0
    return sum(cost.fabric_run_cycles(arch, program, rows * part, (12 if two else 8) * rows * part)
               for part in _parts(cols, False) for program, two in _programs(arch))


def _parts(cols: int, halves: bool) -> tuple:
    return (cols // 2, cols - cols // 2) if halves else (cols,)


def config_cycles(arch) -> int:
    """Cycles loading the bodies' configurations (the six passes', the bias add's), once a launch."""
    return sum(cost.fabric_config_cycles(arch, program.config_bytes) for program, _ in _programs(arch)) + \
        cost.fabric_config_cycles(arch, _bias_program(arch).config_bytes)


@functools.lru_cache(maxsize=16)
def _bias_program(arch):
    return require_program(gelu_erf.bias_add(), "float32", arch, "the fabric's bias add")


def _bias_cycles(arch, elements: int) -> int:
    """PE array cycles of the bias add over `elements` (acc and the bias read, acc written)."""
    return cost.fabric_run_cycles(arch, _bias_program(arch), elements, 12 * elements)


def tile_units(spec, tiling, arch, fabric_rows: int, bias_in_acc: bool = False) -> tuple:
    """(load, PE array, vector unit) cycles of one output tile in the steady state with
    `fabric_rows` rows on the fabric: the tile's operands and bias loaded (the bias each row when
    it goes into the accumulator); the GEMM, and with a share the bias add and the passes (in
    halves of the columns: share_calls) and the GEMM's refill after them; the EPILOGUE over the
    other rows (none with the bias in the accumulator) and the VFUNC's issue over them."""
    tm, tn, tk = tiling.tm, tiling.tn, tiling.tk
    size = DType.FLOAT32.itemsize
    a_tile = 0 if holds_a_panel(spec, tiling) else tm * tk * size  # (one column tile: A's per tile)
    bias = (tm if bias_in_acc else 1) * tn * size if spec.bias_shape else 0
    load = cost.dma_transfer_cycles(arch, tk * tn * size + a_tile + bias)
    pe = cost.gemm_steady_cycles(arch, tm, tn, tk, "float32")
    if fabric_rows:
        pe += sum(fabric_cycles(arch, fabric_rows, part) for part in _parts(tn, True))
        pe += cost.gemm_fill_cycles(arch, tm, tn) + (_bias_cycles(arch, fabric_rows * tn) if spec.bias_shape else 0)
    vector = 0
    if fabric_rows < tm:
        vector += cost.vfunc_issue_cycles(arch, (tm - fabric_rows) * tn, "gelu")
        vector += cost.vector_cycles(arch, tm - fabric_rows, tn) if spec.bias_shape and not bias_in_acc else 0
    return load, pe, vector


def _kernel_cycles(spec, tiling, arch, fabric_rows: int, bias_in_acc: bool) -> int:
    """The tiles' busiest unit, tile after tile, and the bodies' configurations with a share."""
    tiles = (spec.gemm_extents[0] // tiling.tm) * -(-spec.gemm_extents[1] // tiling.tn)
    return tiles * max(tile_units(spec, tiling, arch, fabric_rows, bias_in_acc)) + \
        (config_cycles(arch) if fabric_rows else 0)


def _taller(spec, tiling, arch) -> list:
    """`tiling` and the tilings of 2, 4, ... times its rows (rows a whole number of tiles) whose
    buffers fit the scratchpad: taller tiles pay the passes' latencies over more rows."""
    found, rows = [tiling], spec.gemm_extents[0]
    if spec.row_norm:  # (a pre-norm's panel program is sized for its tile: row_norm.py)
        return found
    tm = 2 * tiling.tm
    while tm <= rows and rows % tm == 0:
        t = dataclasses.replace(tiling, tm=tm, mp=rows)
        size = DType.FLOAT32.itemsize
        footprint = gemm_footprint(tm, t.tn, t.tk, size, size, bool(spec.bias_shape),
                                   a_row=a_row_stride(tm, t.tk, size, arch))
        if t.operand_copies > 2:
            footprint += aligned(tm * a_row_stride(tm, t.tk, size, arch) * size) + aligned(t.tk * t.tn * size)
        if footprint > arch.spad_bytes:
            break
        found.append(t)
        tm *= 2
    return found


def share_tiling(spec, tiling, arch, bias_in_acc: bool):
    """`tiling`, or a taller one with the fabric's share of the GELU (Tiling.fabric_gelu_rows):
    of each candidate (`_taller`) the rows that make a tile's busiest unit least busy, and of those
    the fewest cycles; taken only where that beats `tiling` without a share (with its bias in the
    accumulator when `bias_in_acc`)."""
    if not applies(spec, tiling):
        return tiling
    best, chosen = _kernel_cycles(spec, tiling, arch, 0, bias_in_acc), tiling
    for candidate in _taller(spec, tiling, arch):
        for rows in range(1, candidate.tm + 1):
            cycles = _kernel_cycles(spec, candidate, arch, rows, False)
            if cycles < best:
                best, chosen = cycles, dataclasses.replace(candidate, fabric_gelu_rows=rows, bias_in_acc=False)
    return chosen


def _at(tile: tuple, row: int, col: int) -> tuple:
    """The tile (data, offset, row stride) from element (row, col) of `tile`."""
    data, offset, stride = tile
    return data, offset + row * stride + col, stride


def tile_calls(rows: int, cols: int, x: tuple, s: tuple, t: tuple, out: tuple | None = None) -> list:
    """The six FABRIC calls of x Phi(x) over `rows` x `cols` of `x` into `out` (default: x, in
    place); `s` and `t` free tiles of the same shape (the running value, the exp's t). Tiles are
    (data, offset, row stride). A kernel calls this for its share's rows and a VFUNC for the rest."""
    (high, f32), (low, _), (first, _), (second, _), (third, i32), (logistic, _) = gelu_erf.passes()
    out = x if out is None else out
    xa, sa, ta = x[:2], s[:2], t[:2]
    return [fabric_call(FabricBody(high, f32), rows, cols, xa, x[2], sa, s[2]),
            fabric_call(FabricBody(low, f32), rows, cols, xa, x[2], sa, s[2], b=(sa, s[2], 1)),
            fabric_call(FabricBody(first, f32), rows, cols, sa, s[2], ta, t[2]),
            fabric_call(FabricBody(second, f32), rows, cols, sa, s[2], sa, s[2], b=(ta, t[2], 1)),
            fabric_call(FabricBody(third, i32), rows, cols, ta, t[2], sa, s[2], b=(sa, s[2], 1)),
            fabric_call(FabricBody(logistic, f32), rows, cols, xa, x[2], out[:2], out[2], b=(sa, s[2], 1))]


def halves_calls(rows: int, cols: int, x: tuple, scratch: tuple, out: tuple | None = None) -> list:
    """tile_calls over the two halves of the columns (cols even) with one free tile `scratch`
    (module doc): in place on `x`; or, with `out`, into `out`, which is then the scratch too
    (`scratch` = `out`) and x dead after it (the second half's t goes in x's first half, read by
    then)."""
    if cols % 2:
        raise ValueError(f"the fabric's GELU in halves takes a tile of even columns, not {cols}")
    h = cols // 2
    target = x if out is None else out
    calls = []
    for half in (0, 1):
        f0 = _at(scratch, 0, half * h)
        f1 = _at(scratch, 0, (1 - half) * h) if out is None or not half else _at(x, 0, 0)
        calls += tile_calls(rows, h, _at(x, 0, half * h), f0, f1, _at(target, 0, half * h))
    return calls


def share_calls(rows: int, cols: int, shared: int, acc: tuple, out: tuple, bias=None) -> list:
    """A tile's GELU(acc [+ bias]) into `out` with its first `shared` rows on the fabric: the bias
    add (a FABRIC, the bias row `bias` ((data, offset)) read with row stride 0) in place on
    acc's rows, the passes (halves_calls, out's rows the scratch); the other rows' EPILOGUE
    (acc + bias into out) and VFUNC (in place), on the vector unit at once. `acc`, `out`: (data,
    offset, row stride) tiles of rows x cols (cols even); acc's rows are dead after it. What a
    kernel holding its hidden tile (fc1 + GELU + fc2) calls for it too."""
    from ..intrinsics.row_ops import vfunc_call
    from ..intrinsics.vector_unit import epilogue_call

    calls = []
    if shared:
        head = (_at(acc, 0, 0)[:2], acc[2])
        if bias is not None:
            calls.append(fabric_call(FabricBody(gelu_erf.bias_add(), "float32"), shared, cols, *head, *head,
                                     b=(bias, 0, 1)))
        calls += halves_calls(shared, cols, acc, out, out=out)
    if shared < rows:
        a_rest, o_rest = _at(acc, shared, 0), _at(out, shared, 0)
        source = o_rest if bias is not None else a_rest
        if bias is not None:
            calls.append(epilogue_call({"Acc": a_rest[:2], "Bias": bias}, {"Acc": (acc[2],)}, rows - shared, cols,
                                       "float32", "float32", bias=True, relu=False, residual=False, clip=None,
                                       out=(o_rest[:2], out[2])))
        calls.append(vfunc_call("gelu", rows - shared, cols, (source[:2], source[2]), (o_rest[:2], out[2])))
    return calls
