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
    tm: int  # rows of a scratchpad tile (a multiple of the PE array's rows)
    tn: int  # columns of a scratchpad tile (a multiple of the PE array's columns)
    tk: int  # reduction depth of a scratchpad tile
    mp: int  # padded extents: whole tiles
    np: int
    kp: int

    def spad_bytes(self, in_bytes: int, acc_bytes: int, has_bias: bool) -> int:
        """Scratchpad the kernel's buffers take (operand tiles, accumulator, output, bias), each
        twice: every tile is double-buffered (double_buffer.py)."""
        total = _aligned(2 * self.tm * self.tk * in_bytes) + _aligned(2 * self.tk * self.tn * in_bytes)
        total += 2 * _aligned(2 * self.tm * self.tn * acc_bytes)
        if has_bias:
            total += _aligned(2 * self.tn * acc_bytes)
        return total


def choose_tiling(rows: int, cols: int, depth: int, dtype: str, acc_dtype: str,
                  has_bias: bool, arch: HardwareDescription) -> Tiling:
    """The largest output tile (most reuse) that fits, with the deepest reduction that fits.

    The output tile is grown in whole PE-array steps up to the padded problem; the reduction
    depth is the whole reduction when it fits, otherwise the largest chunk that does.
    """
    # A unit reduction extent would be elided by compute_at and leave nothing to tensorize
    # along; one zero column is cheaper than a special case.
    depth = max(depth, 2)
    in_bytes = DType.from_name(dtype).itemsize
    acc_bytes = DType.from_name(acc_dtype).itemsize
    max_tm = _round_up(rows, arch.rows)
    max_tn = _round_up(cols, arch.cols)
    best = None
    for tm in range(arch.rows, max_tm + 1, arch.rows):
        for tn in range(arch.cols, max_tn + 1, arch.cols):
            tk = _deepest_fitting_k(tm, tn, depth, in_bytes, acc_bytes, has_bias, arch.spad_bytes)
            if tk is None:
                continue
            # Fewest tiles first (each tile costs a fill and a drain), then the most reuse.
            tiles = -(-rows // tm) * -(-cols // tn)
            padding = _round_up(rows, tm) * _round_up(cols, tn)
            key = (tiles * -(-depth // tk), padding, -tm * tn)
            if best is None or key < best[0]:
                best = (key, tm, tn, tk)
    if best is None:
        raise ScratchpadTooSmall(
            f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold even one "
            f"{arch.rows}x{arch.cols} tile of a {dtype} GEMM: describe a larger scratchpad")
    _, tm, tn, tk = best
    return Tiling(tm, tn, tk, _round_up(rows, tm), _round_up(cols, tn), _round_up(depth, tk))


def _deepest_fitting_k(tm, tn, depth, in_bytes, acc_bytes, has_bias, capacity):
    for tk in _k_candidates(depth):
        probe = Tiling(tm, tn, tk, tm, tn, tk)
        if probe.spad_bytes(in_bytes, acc_bytes, has_bias) <= capacity:
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
