"""The GEMM tile search's estimate of a tiling's cycles, and when a kernel holds A's row panel.

Stage: tiling (gemm.py's tile search, the fused families' searches and the overlap tests call
`estimate_cycles`; gemm_schedule.py asks `holds_a_panel`). In: a `Tiling`, the operands'
sizes, the chip. Out: cycles, each unit's work priced by the simulator's cost model
(cgra_sim.cost), overlapped by cost.double_buffered_cycles.
"""

from __future__ import annotations

import functools

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription

from ..common.spec import KernelSpec, Tiling, aligned


def holds_a_panel(spec: KernelSpec, tiling: Tiling) -> bool:
    """Whether the kernel loads each row tile's A panel once for all its column tiles: a matmul
    (no conv2d gather, symbolic rows at most) whose reduction is one step (tk is the whole depth)
    and which has more than one column tile."""
    return may_hold_a_panel(spec) and _panel_tiling(tiling)


def may_hold_a_panel(spec: KernelSpec) -> bool:
    """Whether `spec`'s kernel holds A's row panel where its tiling lets it (holds_a_panel): a
    matmul whose only symbolic axis is its rows (a ragged last row tile's panel is cut to its
    rows like the rest of that tile), not a reduction or columns of symbolic length."""
    return spec.op == "matmul" and spec.compute_name == "matmul" and \
        all(axis == 0 and role != "rhs" for role, axis, _ in spec.symbols)


def _panel_tiling(t: Tiling) -> bool:
    return t.tk == t.kp and t.np > t.tn


def estimate_cycles(t: Tiling, dtype: str, in_bytes: int, acc_bytes: int, arch: HardwareDescription,
                    has_residual: bool = False, taps: int = 1, init_folded: bool = False, extra_tiles: int = 0,
                    tail_cycles=None, a_panel: bool = False, piece_rows: int = 0, as_lowered: bool = False,
                    piece_major: int = 0) -> int:
    """A first-order estimate of a tiled GEMM's cycles, each unit's work priced by the simulator's
    cost model (cgra_sim.cost).

    A double-buffered loop of reduction steps (cost.double_buffered_cycles): the busiest unit
    sets the pace: the PE array's GEMMs (and one fill of the sub-array a tile occupies,
    cost.gemm_fill_cycles, as the simulator charges it), the load engine's operand tiles, the store engine's output tiles, the vector
    unit's FILL and EPILOGUE of every tile (the epilogue streams the residual tile too). What
    cannot overlap is the first tile's loads (nothing to compute yet), the last tile's epilogue
    and store, and a bubble per tile: the vector unit runs in order, so the next tile's first
    FILL waits behind this tile's EPILOGUE, which waits for this tile's last GEMM, and the PE
    array refills after the gap. `init_folded`: lowering folds that FILL into the tile's first
    GEMM (lower/fold_init.py), so neither the FILL nor the bubble is there (what the kernel
    runs; the tile search itself still prices the FILL, and its choices stay what they were).
    `extra_tiles`: output-sized operands loaded per tile besides the residual (a multiplier);
    `tail_cycles(elements)`: an epilogue activation's and multiply's work on a tile, (PE array,
    vector unit) cycles: a smooth activation's FABRICs take the array between two tiles' GEMMs. `a_panel`:
    the kernel holds A's row panel across the column tiles when the tiling lets it
    (holds_a_panel): the loads of a step are B's tile, and A's once per row tile. `piece_rows`:
    the kernel finishes each output tile in EPILOGUEs and stores of that many rows (gemm.py's
    epilogue_rows), so the last tile's epilogue overlaps its stores but the last piece's. A
    tiling with `stream_panel` loads A's panel a step at a time in each row tile's first column
    tile (lower/stream_panel.py): its first load is one step's A and B, later ones B's. A tiling's
    `operand_copies` (gemm_copies.py) spread the loads' round trip over that many steps.
    `piece_major`: a tile in pieces runs its last that many steps piece by piece (a post-norm's
    tail, lower/piece_major.py), so its pieces complete that many steps' GEMMs apart; with as
    many steps as operand copies the tail's last load waits for the step before the tail.
    """
    tiles, steps = (t.mp // t.tm) * (t.np // t.tn), t.kp // t.tk * taps
    array_fill = cost.gemm_fill_cycles(arch, t.tm, t.tn)
    gemm = _gemm_step_cycles(arch, t.tm, t.tn, t.tk, dtype)  # one tile's reduction step
    compute = tiles * steps * gemm + array_fill
    tile_load = (t.tm * t.tk + t.tk * t.tn) * in_bytes
    pieces_lowered = as_lowered and 0 < piece_rows < t.tm
    held = a_panel and _panel_tiling(t)
    # in pieces, a step loads B's tile, then A's a piece of rows at a time (lower/gemm_rows.py):
    # the first GEMM waits for B's tile and one piece of A's rows
    first_load = (piece_rows * t.tk + t.tk * t.tn) * in_bytes if pieces_lowered and not held else tile_load
    residual_load = t.tm * t.tn * acc_bytes * (int(has_residual) + extra_tiles)
    out_bytes = t.tm * t.tn * acc_bytes
    loaded = tiles * steps * tile_load + tiles * residual_load
    panel_stalls = 0
    if held:  # A once per row tile (holds_a_panel), B per column tile
        tile_load, panel = t.tk * t.tn * in_bytes, t.tm * t.tk * in_bytes
        loaded = tiles * tile_load + t.mp // t.tm * panel + tiles * residual_load
        panel_stalls = (t.mp // t.tm - 1) * _panel_stall(arch, cost.dma_transfer_cycles(arch, panel),
                                                         cost.dma_transfer_cycles(arch, tile_load), gemm, array_fill)
    elif t.stream_panel and t.np > t.tn:  # A a step at a time in the first column tile, then held
        tile_load, a_step = t.tk * t.tn * in_bytes, t.tm * t.tk * in_bytes
        loaded = tiles * steps * tile_load + t.mp // t.tm * t.tm * t.kp * in_bytes + tiles * residual_load
        # the first column tile's steps load A's step and B's: as long as the GEMM, or longer
        late = cost.dma_transfer_cycles(arch, a_step + tile_load) - gemm
        panel_stalls = t.mp // t.tm * steps * max(0, late)
    load = cost.dma_transfer_cycles(arch, loaded)
    if t.operand_copies > 2:
        # Three copies keep the load engine streaming (no round trip gaps): load-bound, the kernel
        # is the prologue's load, the rest of the loads, then the last step's GEMM (the tail
        # follows), not the prologue and every load again.
        load += gemm - cost.dma_transfer_cycles(arch, first_load)
    # The PE array's configuration loads while the first operands arrive; only what it takes
    # beyond them delays the first GEMM.
    compute += max(0, cost.pe_array_config_cycles(arch, dtype) - arch.dma_latency
                   - cost.dma_transfer_cycles(arch, first_load))
    store = cost.dma_transfer_cycles(arch, tiles * out_bytes)
    fills = 0 if init_folded else 1
    vector = cost.vector_stream_cycles(arch, (fills + (2 if has_residual else 1)) * tiles * t.tm * t.tn)
    tail_array, tail_vector = tail_cycles(t.tm * t.tn) if tail_cycles is not None else (0, 0)
    compute += tiles * tail_array
    vector += tiles * tail_vector
    vector_tile = cost.vector_stream_cycles(arch, t.tm * t.tn)  # one FILL or EPILOGUE of a tile
    bubble = 0 if init_folded else (tiles - 1) * (2 * vector_tile + array_fill)
    if tail_array:  # the array waits for each tile's EPILOGUE before its FABRICs, and refills after them
        bubble += tiles * (vector_tile + array_fill)
    bubble += panel_stalls
    # With two buffers, each buffer in turn is loaded (latency, then transfer) and then computed
    # on before it can be loaded again: two steps take at least latency + transfer + compute (the
    # "load" round trip). Short steps, or steps whose loads take as long as their GEMM, wait for
    # the DMA: a row tile cut to a few rows, or a thin conv2d tile reloading its weights every step.
    last_store, last_work = cost.dma_transfer_cycles(arch, out_bytes), cost.vector_cycles(arch, t.tm, t.tn) + tail_array + tail_vector
    if 0 < piece_rows < t.tm:
        last_store, last_work, piece_vector = _pieces_tail(arch, t, piece_rows, acc_bytes, has_residual, tail_cycles,
                                                           gemm * max(piece_major, 1))
        if piece_major >= t.operand_copies:  # (its copy frees when the step before the tail is done)
            last_work += max(0, arch.dma_latency + cost.dma_transfer_cycles(arch, tile_load)
                             - (piece_major - 1) * gemm // (t.tm // piece_rows))
        whole = cost.vector_stream_cycles(arch, (1 + int(has_residual)) * t.tm * t.tn) + tail_vector
        vector += tiles * ((t.tm // piece_rows) * piece_vector - whole)
    if init_folded and t.tk < t.kp and not pieces_lowered:
        # a tile's residual loads after its last step's operands, ahead of the next tile's first
        # ones: what the load engine's slack in a step does not absorb holds the next GEMM back
        # (in pieces it loads halfway through the next tile: lower/late_residual.py)
        slack = gemm - cost.dma_transfer_cycles(arch, tile_load)
        bubble += (tiles - 1) * max(0, cost.dma_transfer_cycles(arch, residual_load) - max(0, slack))
    return cost.double_buffered_cycles(arch, cost.BufferedLoop(
        tiles * steps, cost.dma_transfer_cycles(arch, tile_load), (gemm,), 0,
        first_load=cost.dma_transfer_cycles(arch, first_load), last_store=last_store, last_work=last_work,
        others=max(compute, load, store, vector), stalls=bubble, round_trips=("load",), whole_last_step=True,
        copies=t.operand_copies)).total


def _pieces_tail(arch: HardwareDescription, t: Tiling, piece_rows: int, acc_bytes: int, has_residual: bool,
                 tail_cycles, gemm: int) -> tuple[int, int, int]:
    """(the last piece's store transfer, the last tile's epilogue work after its last GEMM until
    that store starts, the vector unit's cycles on one piece) of a tile finished in pieces of
    `piece_rows` rows: its GEMMs in the same pieces (lower/gemm_rows.py; a step's `gemm` cycles
    split evenly; `gemm` the last steps' when they run piece by piece), piece i's EPILOGUE (and
    activation) when its GEMM ends and the one before it is done, its store after it, the stores one after another on the store engine: after the last
    GEMM, one piece's EPILOGUE and store, plus what the vector unit or the store engine fell
    behind the GEMMs over the pieces before."""
    pieces, elements = t.tm // piece_rows, piece_rows * t.tn
    tail_vector = tail_cycles(elements)[1] if tail_cycles is not None else 0
    piece_vector = cost.vector_cycles(arch, piece_rows, t.tn, 1 + int(has_residual)) + tail_vector
    store = cost.dma_transfer_cycles(arch, elements * acc_bytes)
    behind = (pieces - 1) * max(0, max(piece_vector, store) - gemm // pieces)
    return store, piece_vector + behind, piece_vector


def _panel_stall(arch: HardwareDescription, panel: int, b_tile: int, gemm: int, array_fill: int) -> int:
    """The PE array's wait when a row tile starts: the load engine, about one B tile ahead of
    the array, loads the next row tile's A panel and then its first B tile, which the array
    needs at the end of the row's last GEMM (and then refills)."""
    late = panel + 2 * b_tile + arch.dma_latency - 2 * gemm
    return late + array_fill if late > 0 else 0


@functools.lru_cache(maxsize=1 << 16)
def _gemm_step_cycles(arch: HardwareDescription, m: int, n: int, k: int, dtype: str) -> int:
    """cost.gemm_steady_cycles, remembered: the tile searches ask for the same tiles often."""
    return cost.gemm_steady_cycles(arch, m, n, k, dtype)


def gemm_footprint(tm: int, tn: int, tk: int, in_bytes: int, acc_bytes: int, has_bias: bool,
                   has_residual: bool = False, has_scale: bool = False, a_row: int | None = None,
                   out_row: int | None = None, extra_tiles: int = 0, extra_rows: int = 0) -> int:
    """Scratchpad bytes a GEMM kernel's buffers take (operand tiles, accumulator, output, bias,
    residual tile, requantisation scale row), each twice: every tile is double-buffered
    (lower/double_buffer.py). An int8 output is counted at the accumulator's size. `a_row` and
    `out_row`: the row strides (elements) of the A tile and the output tile when the schedule
    pads them against bank conflicts (spad_layout.py); compact by default. `extra_tiles`: more
    output-sized operand tiles (a multiplier); `extra_rows`: more rows of tn (a per-channel scale, shift)."""
    a_row, out_row = a_row or tk, out_row or tn
    total = aligned(2 * tm * a_row * in_bytes) + aligned(2 * tk * tn * in_bytes)
    total += (2 if has_residual else 1) * aligned(2 * tm * tn * acc_bytes) + extra_tiles * aligned(2 * tm * tn * acc_bytes)
    total += aligned(2 * tm * out_row * acc_bytes)
    if has_bias:
        total += aligned(2 * tn * acc_bytes)
    if has_scale:
        total += aligned(2 * tn * 4)
    total += extra_rows * aligned(2 * tn * acc_bytes)
    return total
