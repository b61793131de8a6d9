"""Tile sizes: how a GEMM-shaped kernel is cut to fit the PE array and the scratchpad.

Stage: target hook (before scheduling). Input: the GEMM extents of a kernel, its dtypes and the
hardware description. Output: a `Tiling` with scratchpad tile sizes (tm, tn, tk) that are whole
multiples of the PE array (rows, cols) and whose buffers fit the scratchpad, and the padded
extents (mp, np, kp) the kernel iterates over.
"""

from __future__ import annotations

import dataclasses

from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from .errors import ScratchpadTooSmall

#: Scratchpad buffers are placed 64-byte aligned by the code generator.
ALIGN = 64


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _aligned(nbytes: int) -> int:
    return _round_up(nbytes, ALIGN)


@dataclasses.dataclass(frozen=True)
class Tiling:
    tm: int  # rows of a scratchpad tile (PE-array folds of it run back to back)
    tn: int  # columns of a scratchpad tile (a multiple of the PE array's columns)
    tk: int  # reduction depth of a scratchpad tile
    mp: int  # padded extents: whole tiles
    np: int
    kp: int

    def spad_bytes(self, in_bytes: int, acc_bytes: int, has_bias: bool, has_residual: bool = False) -> int:
        """Scratchpad the kernel's buffers take (operand tiles, accumulator, output, bias,
        residual tile), each twice: every tile is double-buffered (double_buffer.py)."""
        total = _aligned(2 * self.tm * self.tk * in_bytes) + _aligned(2 * self.tk * self.tn * in_bytes)
        total += (3 if has_residual else 2) * _aligned(2 * self.tm * self.tn * acc_bytes)
        if has_bias:
            total += _aligned(2 * self.tn * acc_bytes)
        return total


def choose_tiling(rows: int, cols: int, depth: int, dtype: str, acc_dtype: str,
                  has_bias: bool, arch: HardwareDescription, row_step: int = 1,
                  has_residual: bool = False) -> Tiling:
    """The tiling with the fewest estimated cycles among those that fit the scratchpad.

    Output tiles grow in whole PE-array steps (rows: in multiples of `row_step` when the kernel
    needs whole groups of rows, e.g. whole output rows of a conv2d) up to the padded problem; for
    each, the reduction depth is the whole reduction when it fits, otherwise the largest chunk
    that does. A residual (`has_residual`) is one more output-sized tile in the scratchpad,
    loaded per output tile and read by the epilogue.
    """
    row_step = row_step if row_step > 1 else arch.rows
    # A unit reduction extent would be elided by compute_at and leave nothing to tensorize
    # along; one zero column is cheaper than a special case.
    depth = max(depth, 2)
    in_bytes = DType.from_name(dtype).itemsize
    acc_bytes = DType.from_name(acc_dtype).itemsize
    best = None
    for tm in range(row_step, _round_up(rows, row_step) + 1, row_step):
        for tn in range(arch.cols, _round_up(cols, arch.cols) + 1, arch.cols):
            tk = _deepest_fitting_k(tm, tn, depth, in_bytes, acc_bytes, has_bias, arch.spad_bytes,
                                    has_residual)
            if tk is None:
                continue
            tiling = Tiling(tm, tn, tk, _round_up(rows, tm), _round_up(cols, tn), _round_up(depth, tk))
            key = (estimate_cycles(tiling, dtype, in_bytes, acc_bytes, arch, has_residual), -tm * tn)
            if best is None or key < best[0]:
                best = (key, tiling)
    if best is None:
        raise ScratchpadTooSmall(
            f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold even one "
            f"{arch.rows}x{arch.cols} tile of a {dtype} GEMM: describe a larger scratchpad")
    return best[1]


def estimate_cycles(t: Tiling, dtype: str, in_bytes: int, acc_bytes: int, arch: HardwareDescription,
                    has_residual: bool = False) -> int:
    """A first-order estimate of a tiled GEMM's cycles under the simulator's timing model.

    With double buffering the busiest unit sets the pace; what cannot overlap is the first
    tile's loads (nothing to compute yet), the last tile's epilogue and store, and a bubble per
    tile: the vector unit runs in order, so the next tile's first FILL waits behind this tile's
    EPILOGUE, which waits for this tile's last GEMM, and the PE array refills after the gap.
    A residual adds its tile to each output tile's loads and to the epilogue's vector cycles.
    """
    tiles, steps = (t.mp // t.tm) * (t.np // t.tn), t.kp // t.tk
    passes = tiles * steps * -(-t.tm // arch.rows) * -(-t.tn // arch.cols)
    compute = passes * -(-t.tk // arch.macs_per_pe[dtype]) + arch.rows + arch.cols + arch.config_load_cycles
    tile_load = (t.tm * t.tk + t.tk * t.tn) * in_bytes
    residual_load = t.tm * t.tn * acc_bytes if has_residual else 0
    load = (tiles * steps * tile_load + tiles * residual_load) // arch.dma_bytes_per_cycle
    store = tiles * t.tm * t.tn * acc_bytes // arch.dma_bytes_per_cycle
    # fill and epilogue of every tile; the epilogue streams the residual tile too
    vector = (3 if has_residual else 2) * tiles * t.tm * t.tn // arch.vector_lanes
    prologue = arch.dma_latency + tile_load // arch.dma_bytes_per_cycle
    tail = t.tm * t.tn // arch.vector_lanes + arch.dma_latency + t.tm * t.tn * acc_bytes // arch.dma_bytes_per_cycle
    vector_tile = t.tm * t.tn // arch.vector_lanes  # one FILL or EPILOGUE of a tile
    bubble = (tiles - 1) * (2 * vector_tile + arch.rows + arch.cols)
    return max(compute, load, store, vector) + bubble + prologue + tail


def _deepest_fitting_k(tm, tn, depth, in_bytes, acc_bytes, has_bias, capacity, has_residual=False):
    for tk in _k_candidates(depth):
        probe = Tiling(tm, tn, tk, tm, tn, tk)
        if probe.spad_bytes(in_bytes, acc_bytes, has_bias, has_residual) <= capacity:
            return tk
    return None


def _k_candidates(depth: int):
    """The whole reduction, then halvings of it (rounded up to a multiple of 8)."""
    tk = depth
    seen = set()
    while tk >= 1:
        candidate = tk if tk == depth else _round_up(tk, 8)
        if candidate not in seen:
            seen.add(candidate)
            yield candidate
        if tk == 1:
            break
        tk = -(-tk // 2)
