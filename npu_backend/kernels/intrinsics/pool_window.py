"""What one POOL command computes: its window, and the one expression of a pooled output.

Stage: schedule and tensorize. `pool_value` is built by both the POOL intrinsic's description
(vector_unit.py) and the pooling kernel's TE compute (kernels/pool.py), so tensorize sees one
expression; the simulator's functional core implements the same rule (isa.py's POOL). A
`PoolWindow` carries everything that expression depends on, all known at compile time: the
pooling kernel holds the whole image in one tile, so which taps lie in the padding is a property
of the output's position in the tile, not of the tile's place.
"""

from __future__ import annotations

import dataclasses

from tvm import tirx


@dataclasses.dataclass(frozen=True)
class PoolWindow:
    """One POOL's window: `kind` "max" or "avg", kernel (kh, kw), strides, dilation, the valid
    rectangle (y_lo, y_hi, x_lo, x_hi) in window positions and, for "avg", the count rectangle."""

    kind: str
    kernel: tuple
    strides: tuple = (1, 1)
    dilation: tuple = (1, 1)
    valid: tuple = (0, 0, 0, 0)
    count: tuple | None = None

    @property
    def name(self) -> str:
        """The window's fields as a piece of an intrinsic's name, e.g. "max_k3x3_s2x2_d1x1_v1-9-1-9"."""
        def join(values, sep="x"):
            return sep.join(str(v) for v in values)
        count = f"_c{join(self.count, '-')}" if self.count is not None else ""
        return (f"{self.kind}_k{join(self.kernel)}_s{join(self.strides)}_d{join(self.dilation)}"
                f"_v{join(self.valid, '-')}{count}")

    def extent(self, out: int, axis: int) -> int:
        """Window rows (axis 0) or columns (axis 1) that `out` outputs read."""
        return (out - 1) * self.strides[axis] + (self.kernel[axis] - 1) * self.dilation[axis] + 1


def _inside(window: PoolWindow, rect: tuple, axis: int, extent: int, tap: int, position):
    """Whether tap `tap` of output `position` lies in `rect` along `axis`: True or False when it
    holds for every output 0..extent-1 (no test in the expression), else the TIR condition."""
    lo, hi = rect[2 * axis], rect[2 * axis + 1]
    step, spacing = window.strides[axis], window.dilation[axis]
    first, last = tap * spacing, (extent - 1) * step + tap * spacing
    if lo <= first and last < hi:
        return True
    if last < lo or first >= hi:
        return False
    at = position * step + tap * spacing
    terms = ([at >= lo] if first < lo else []) + ([at < hi] if last >= hi else [])
    return terms[0] if len(terms) == 1 else tirx.all(*terms)


def never_valid_taps(window: PoolWindow, out_shape: tuple) -> list:
    """(axis, tap) of every tap that lies outside the valid rectangle for all outputs of a tile of
    `out_shape`: `pool_value` leaves those out, so the tile would read less than its window (and
    te.create_prim_func folds such taps away where the intrinsic keeps the window), which a
    kernel cannot tensorize; it happens only for images smaller than the window."""
    position = tirx.Var("o", "int32")
    return [(axis, tap) for axis in (0, 1) for tap in range(window.kernel[axis])
            if _inside(window, window.valid, axis, out_shape[axis], tap, position) is False]


def _both(a, b):
    if a is False or b is False:
        return False
    if a is True:
        return b
    return a if b is True else tirx.all(a, b)


def _count(window: PoolWindow, axis: int, extent: int, position):
    """Taps along `axis` inside the count rectangle: an int, or an int32 TIR expression."""
    total, terms = 0, []
    for tap in range(window.kernel[axis]):
        inside = _inside(window, window.count, axis, extent, tap, position)
        if inside is True:
            total += 1
        elif inside is not False:
            terms.append(tirx.Select(inside, tirx.const(1, "int32"), tirx.const(0, "int32")))
    for term in terms:
        total = term if isinstance(total, int) and total == 0 else total + term
    return total


def pool_value(load, y, x, c, window: PoolWindow, out_shape: tuple, dtype: str):
    """The pooled value of output (y, x, c) over a tile of `out_shape` = (oh, ow) outputs: taps
    ry-major; a tap outside the valid rectangle gives the dtype's lowest value (-inf) to a max and
    0 to a sum; an average divides the sum by the taps inside the count rectangle (at least 1).
    `load(py, px, c)` reads the window at a window position."""
    oh, ow = out_shape
    lowest = tirx.const(float("-inf"), dtype) if dtype == "float32" else tirx.min_value(dtype)
    fallback = lowest if window.kind == "max" else tirx.const(0, dtype)
    total = None
    for ry in range(window.kernel[0]):
        for rx in range(window.kernel[1]):
            py, px = y * window.strides[0] + ry * window.dilation[0], x * window.strides[1] + rx * window.dilation[1]
            valid = _both(_inside(window, window.valid, 0, oh, ry, y), _inside(window, window.valid, 1, ow, rx, x))
            term = load(py, px, c) if valid is True else fallback if valid is False else \
                tirx.Select(valid, load(py, px, c), fallback)
            total = term if total is None else tirx.max(total, term) if window.kind == "max" else total + term
    if window.kind == "max":
        return total
    count = _count(window, 0, oh, y) * _count(window, 1, ow, x)
    if isinstance(count, int):
        return total / tirx.const(float(max(count, 1)), dtype)
    return total / tirx.Cast(dtype, tirx.max(count, tirx.const(1, "int32")))
