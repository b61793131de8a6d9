"""One-input elementwise kernels: the operand's view, the TensorIR and the schedule they share.

Stage: partition (the spec readers of the activation, fabric and smooth families read their
operand with `read_operand`), kernel definition and schedule (`unary_compute`,
`schedule_unary`). A static operand is read as (rows, cols): its last axis, and every axis
before it as rows. A symbolic one (kernels/common/dynamic.py: a batch, an image's height and width) is
read through the views of views.py, as the eltwise family reads its operands: a symbolic axis 0
stays a view axis of its own and the trailing symbolic axes are the view's columns, so one
kernel serves every size, its last tile along each symbolic axis cut to what exists
(lower/ragged.py). Per tile the input tile is loaded by DMA into the scratchpad, the family's
intrinsic computes the tile, and the output tile is stored.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from tvm import te
from tvm.relax.dpl import is_op, wildcard

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ...errors import ScratchpadTooSmall, UnsupportedOperator
from ...relax_info import dtype_of
from .dynamic import CUT_PARAMS, read_shape
from ..intrinsics import SPAD
from .operands import padded, prim_func
from .spec import Tiling, aligned, round_up
from .views import cut_levels, eltwise_view, symbolic_axes, symbolic_shape, view_extents

MAX_RANK = 4  # the DMA's tensors


@dataclasses.dataclass(frozen=True)
class UnaryOperand:
    """How a one-input kernel reads its operand: `shape` as the caller passes it (symbolic axes
    at their bounds) and the (rows, cols) of its tiles' view; for a symbolic operand also the
    views.py view (`extents`: outer axes, rows, cols) and its symbolic axes."""

    shape: tuple
    rows: int
    cols: int
    extents: tuple = ()  # () for a static operand
    symbol: str | None = None  # the output's symbolic axis 0
    tail: tuple = ()  # its trailing symbolic axes, the view's columns
    tail_factor: int = 1
    # A static factor times a variable as the columns' extent: the schedule runs unchecked (as
    # for the eltwise family's, views.py).
    symbolic_image = property(lambda self: bool(self.tail) and self.tail_factor > 1)


class ReadsOperand:
    """A one-input kernel's spec (a dataclass with an `operand` field) reads its view's figures
    through it."""

    shape = property(lambda self: self.operand.shape)
    rows = property(lambda self: self.operand.rows)
    cols = property(lambda self: self.operand.cols)
    symbolic_image = property(lambda self: self.operand.symbolic_image)


def single_op_patterns(ops: dict) -> list:
    """A pattern per {pattern name: Relax op} of one call of the op on one input (role "lhs")."""
    patterns = []
    for name, op in ops.items():
        x = wildcard()
        root = is_op(op)(x)
        patterns.append((name, root, {"root": root, "lhs": x}))
    return patterns


def read_operand(x, what: str) -> UnaryOperand:
    """The view of a one-input kernel's operand `x`; raises UnsupportedOperator saying why the op
    stays on the host (`what`: the op, for the message)."""
    shape, names = read_shape(x, "operand", symbolic_axes=range(-MAX_RANK, 0), prefix=f"{what}: ",
                              expressions=True)
    if not 1 <= len(shape) <= MAX_RANK:
        raise UnsupportedOperator(f"{what} of rank {len(shape)}: the NPU's DMA moves tensors of rank 1..{MAX_RANK}")
    if not names:
        cols = shape[-1]
        return UnaryOperand(tuple(shape), max(math.prod(shape) // cols, 1), cols)
    symbol, tail = symbolic_axes(what, (shape, shape), names, names)
    _, extents, _, _ = eltwise_view(tuple(shape), tuple(shape), keep_first=symbol is not None, tail=len(tail))
    factor = extents[-1] // math.prod(shape[len(shape) - len(tail):]) if tail else 1
    return UnaryOperand(tuple(shape), *extents[-2:], extents=extents, symbol=symbol, tail=tail, tail_factor=factor)


def same_operand(x, result, what: str) -> None:
    """Refuse a chain whose result is not shaped and typed as its input (a constant broadcasts it)."""
    (shape, names), (out_shape, out_names) = (read_shape(value, role, range(-MAX_RANK, 0), f"{what}: ", True)
                                              for value, role in ((x, "operand"), (result, "result")))
    if (shape, names, dtype_of(x)) != (out_shape, out_names, dtype_of(result)):
        raise UnsupportedOperator(f"{what}: its result {out_shape} {dtype_of(result)} is not shaped as its input "
                                  f"{shape} {dtype_of(x)} (a constant broadcasts it)")


def halvings(extent: int):
    """The extent (at least 2), then halvings of it down to 2."""
    size = max(extent, 2)
    while True:
        yield size
        if size == 2:
            return
        size = max(-(-size // 2), 2)


def fastest_tiling(spec, arch: HardwareDescription, tile_cycles) -> Tiling:
    """tm x tn tiles (an input and an output tile, each double-buffered, in the scratchpad) with
    the fewest estimated cycles, `tile_cycles(elements)` the work on one tile: the first tile's
    load, work and store, then one step per further tile: the slowest of the three (they
    overlap), or half of a load's latency, its transfer and the work, which two buffers cannot
    overlap. So a tile is small enough for the DMA engines and the fabric to work side by side,
    and large enough to amortise each DMA's latency and the body's pipeline fill.

    A symbolic operand: the tile whose estimate, at 1, 2, 4, ... rows (a symbolic axis 0) and
    columns (trailing symbolic axes) up to the bounds, is the closest to the fastest tile at that
    size (minimax regret, as the eltwise family's), a last tile cut to what exists."""
    size = DType.from_name(spec.dtype).itemsize
    fitting = [(tm, tn) for tm in halvings(spec.rows) for tn in halvings(spec.cols)
               if 2 * aligned(2 * tm * tn * size) <= arch.spad_bytes]
    if not fitting:
        raise ScratchpadTooSmall(f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold two "
                                 f"2x2 {spec.dtype} tiles twice: describe a larger scratchpad")
    work = functools.lru_cache(maxsize=None)(tile_cycles)

    def estimate(tm: int, tn: int, rows: int, cols: int, cut: bool = False) -> int:
        return estimate_unary_cycles(spec, arch, work, tm, tn, rows, cols, cut)

    operand = spec.operand
    if not operand.extents:
        tm, tn = min(fitting, key=lambda t: estimate(*t, spec.rows, spec.cols))  # ties: the first, the larger
    else:
        rows = _powers(spec.rows) if operand.symbol is not None and len(operand.extents) == 2 else [spec.rows]
        sizes = [(r, c) for r in rows for c in (_powers(spec.cols) if operand.tail else [spec.cols])]
        fastest = {rc: min(estimate(*t, *rc, cut=True) for t in fitting) for rc in sizes}
        tm, tn = min(fitting, key=lambda t: (max(estimate(*t, *rc, cut=True) / fastest[rc] for rc in sizes),
                                             estimate(*t, spec.rows, spec.cols)))
    return Tiling(tm, tn, 1, round_up(spec.rows, tm), round_up(spec.cols, tn), 1)


def estimate_unary_cycles(spec, arch: HardwareDescription, tile_cycles, tm: int, tn: int, rows: int, cols: int,
                          cut: bool = False) -> int:
    """`fastest_tiling`'s estimate of tm x tn tiles over rows x cols elements, `tile_cycles(elements)`
    the work on one tile (`cut`: a last tile holds only what exists): a double-buffered loop of
    tile load, work and store. With two buffers a tile's load waits for the body of the tile two
    back, and the body of a tile for its load's latency: two tiles take at least latency +
    transfer + body (the "load" round trip)."""
    m, n = (min(tm, rows), min(tn, cols)) if cut else (tm, tn)
    tiles = -(-rows // tm) * -(-cols // tn)
    transfer = cost.dma_transfer_cycles(arch, m * n * DType.from_name(spec.dtype).itemsize)
    return cost.double_buffered_cycles(arch, cost.BufferedLoop(
        tiles, transfer, (tile_cycles(m * n),), transfer)).total


def _powers(extent: int) -> list:
    """1, 2, 4, ... up to `extent`, and `extent`."""
    return sorted({min(extent, 2 ** k) for k in range(extent.bit_length() + 1)})


def unary_compute(spec, tiling: Tiling, block: str, value, cut_calls: dict):
    """The TensorIR of a one-input elementwise kernel over its operand's view: `block` computes
    `value(element)` of the padded input. `cut_calls`: {device call: (its rows parameter, its
    columns parameter)} of the family's intrinsic, cut in the last tile of a symbolic axis."""
    operand = spec.operand
    if operand.extents:  # symbolic: the views.py view, the caller's shape with its variables
        extents, whole = view_extents(operand, tiling)
        caller = symbolic_shape(operand, operand.shape, rank=len(operand.shape))
    else:
        extents, whole = (operand.rows, operand.cols), (tiling.mp, tiling.np)
        caller = operand.shape if operand.shape != extents else None
    x = te.placeholder(extents, spec.dtype, name="lhs")
    a_pad = te.compute(whole, lambda *i: padded(x, extents, i), name="a_pad")
    result = te.compute(whole, lambda *i: value(a_pad(*i)), name=block)
    out = te.compute(extents, lambda *i: result(*i), name="out")
    func = prim_func(spec.param_roles, {"lhs": x}, out, caller and {"lhs": caller, "out": caller}, spec.shape_args)
    if not operand.extents:
        return func
    levels = cut_levels(operand, tiling, extents)
    return func.with_attr(CUT_PARAMS, {call: [params[["rows", "cols"].index(level)] for level in levels]
                                       for call, params in cut_calls.items()})


def schedule_unary(sch, tiling: Tiling, block: str, intrin: str) -> None:
    """Tiles of `unary_compute`'s kernel (under its outer view loops): the input tile staged in
    the scratchpad per tile, the tile tensorized onto `intrin`, the output stored."""
    result = sch.get_sblock(block)
    *_, rows, cols = sch.get_loops(result)
    row_outer, row_inner = sch.split(rows, [None, tiling.tm])
    col_outer, col_inner = sch.split(cols, [None, tiling.tn])
    sch.reorder(row_outer, col_outer, row_inner, col_inner)
    a_pad = sch.get_sblock("a_pad")
    sch.compute_at(a_pad, col_outer)
    sch.set_scope(a_pad, 0, SPAD)
    sch.reverse_compute_at(sch.get_sblock("out"), col_outer)
    sch.set_scope(result, 0, SPAD)
    sch.tensorize(row_inner, intrin)
