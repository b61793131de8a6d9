"""The elementwise family: standalone add, subtract, multiply, maximum, minimum on ELTWISE, and
prelu as a two-input FABRIC body on the PE fabric.

Stage: partition (its patterns and spec), kernel definition, tiling and schedule. Input: a Relax
`add`, `subtract`, `multiply`, `maximum` or `minimum` of two tensors of one dtype whose shapes
broadcast numpy's way (rank <= 4), not fused into a conv2d / matmul epilogue: the family comes
last in registry.FAMILIES, so an add that a kernel's epilogue fuses as a bias or a residual is
taken by that kernel first.

The kernel reads every tensor through a compact view (`cgra.arg_shapes`): the output's axes of
extent 1 are dropped and neighbouring axes on which each operand is either walked or broadcast
alike are merged, so (1, 64, 56, 56) + (1, 64, 1, 1) becomes (64, 3136) + (64, 1). The last two
view axes are an ELTWISE tile's rows and columns (tm x tn); any axes before them are loops
around the tiles. A broadcast operand has extent 1 on its broadcast axes and is read there with
stride 0. Per tile the operand tiles (blocks a_pad, b_pad) are loaded by DMA, one ELTWISE
(block elt) computes the tile on the vector unit, and the output tile is stored by DMA; the
lowering's double buffering overlaps the next tile's loads with this tile's ELTWISE and store.
"""

from __future__ import annotations

import dataclasses
import math

from tvm import te
from tvm.relax.dpl import is_op, wildcard

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription
from cgra_sim.isa import DType

from ...errors import ScratchpadTooSmall, UnsupportedOperator
from ...relax_info import dtype_of, require_static_shape
from ..common.chains import require_program
from ..common.dynamic import CUT_PARAMS, read_shape
from ..family import OpFamily
from ..intrinsics import SPAD, get_intrin
from ..intrinsics.fabric import FabricBody, body_value
from ..intrinsics.vector_unit import eltwise_value
from ..common.operands import padded, prim_func
from ..common.spec import Tiling, aligned
from ..common.views import cut_levels, eltwise_view, symbolic_axes, symbolic_shape, view_extents

#: Pattern name suffix -> the Relax operator it offloads.
ELTWISE_OPS = {"add": "relax.add", "subtract": "relax.subtract", "multiply": "relax.multiply",
               "maximum": "relax.maximum", "minimum": "relax.minimum", "prelu": "relax.nn.prelu"}
#: prelu(x, slope) = max(x, 0) + slope min(x, 0), exactly select(x > 0, x, slope x): a FABRIC body
#: (the vector unit has no command for it), its slope streamed as input B.
PRELU_BODY = (("max", "a", 0.0), ("min", "a", 0.0), ("mul", "n1", "b"), ("add", "n0", "n2"))
#: bfloat16 and float16 as the host computes them: in float32, rounded to nearest even.
ELTWISE_DTYPES = ("float32", "int32", "int8", "bfloat16", "float16")
PREFIX = "cgra.eltwise_"
MAX_RANK = 4


@dataclasses.dataclass(frozen=True)
class EltwiseSpec:
    """One standalone elementwise kernel, independent of the hardware."""

    func: str  # "add", "subtract", "multiply", "maximum" or "minimum"
    dtype: str  # of both operands and the output
    lhs_shape: tuple  # as the caller passes them (numpy broadcasting)
    rhs_shape: tuple
    output_shape: tuple
    # The kernel's view: per view axis its extent, and whether lhs / rhs walk it (else broadcast).
    extents: tuple = ()
    lhs_full: tuple = ()
    rhs_full: tuple = ()
    source_ops: tuple = ()
    shape_args: tuple = ()  # positions of symbolic sizes passed beside the tensors (KernelSpec's)
    param_roles: tuple = ("lhs", "rhs")
    # The output's axis 0 when it is symbolic (kernels/common/dynamic.py): its variable's name. It is the
    # view's axis 0 too, never merged with another, and the shapes above hold it at its bound.
    symbol: str | None = None
    # The output's trailing symbolic axes other than axis 0 (an NCHW map's height and width):
    # their variables' names. They are the view's last axis, merged into one: their product
    # times `tail_factor`, the static axes before them walked alike.
    tail: tuple = ()
    tail_factor: int = 1
    # prelu: the slope's shape as it broadcasts against lhs (its axis), rhs_shape the caller's (C,)
    rhs_broadcast: tuple = ()
    op = "eltwise"
    # A static factor times a variable as a tile's extent: TVM's region-cover check cannot prove
    # whole tiles cover it (as for a conv2d's symbolic image), the schedule runs unchecked
    # (kernels/stage.py: schedule) and the tests check the kernel at many sizes.
    symbolic_image = property(lambda self: bool(self.tail) and self.tail_factor > 1)
    compute_name = "eltwise"
    acc_dtype = property(lambda self: self.dtype)  # what the target hook and explain read off a spec
    macs = 0

    def view(self, role: str) -> tuple:
        """The shape the kernel reads `role` ("lhs", "rhs", "out") as."""
        full = {"lhs": self.lhs_full, "rhs": self.rhs_full}.get(role)
        return self.extents if full is None else tuple(e if f else 1 for e, f in zip(self.extents, full))


def eltwise_spec_from_match(name: str, annotated: dict) -> EltwiseSpec:
    """The kernel a matched elementwise op would become; raises `UnsupportedOperator` with the reason."""
    func = name.removeprefix(PREFIX)
    if func == "prelu":
        return _prelu_spec(annotated)
    lhs, rhs = annotated["lhs"], annotated["rhs"]
    if lhs.same_as(rhs):
        raise UnsupportedOperator(f"{func} takes the same tensor as both operands; the NPU kernel loads each "
                                  "operand from its own tensor: the op runs on the host")
    dtypes = dtype_of(lhs), dtype_of(rhs)
    if dtypes[0] != dtypes[1]:
        raise UnsupportedOperator(f"{func} mixes {dtypes[0]} and {dtypes[1]}; the vector unit computes on "
                                  "one dtype (cast an operand first)")
    if dtypes[0] not in ELTWISE_DTYPES:
        raise UnsupportedOperator(f"{func} on {dtypes[0] or 'an unknown dtype'} is not supported (the vector "
                                  f"unit computes {', '.join(ELTWISE_DTYPES)})")
    (lhs_shape, lhs_names), (rhs_shape, rhs_names) = (
        read_shape(expr, role, symbolic_axes=range(-MAX_RANK, 0), prefix=f"{func}: ", expressions=True)
        for expr, role in ((lhs, "left operand"), (rhs, "right operand")))
    shapes = lhs_shape, rhs_shape
    symbol, tail = symbolic_axes(func, shapes, lhs_names, rhs_names)
    for role, shape in zip(("left", "right"), shapes):
        if not shape:
            raise UnsupportedOperator(f"{func} with a scalar {role} operand (shape ()): the NPU's DMA moves "
                                      "tensors of rank 1..4; the op runs on the host (a tensor of shape (1,) "
                                      "would broadcast on the NPU)")
        if len(shape) > MAX_RANK:
            raise UnsupportedOperator(f"{func} of rank {len(shape)}: the NPU's DMA moves tensors of rank "
                                      f"1..{MAX_RANK}")
    out, extents, lhs_full, rhs_full = eltwise_view(*shapes, keep_first=symbol is not None, tail=len(tail))
    factor = extents[-1] // math.prod(out[len(out) - len(tail):]) if tail else 1
    return EltwiseSpec(func, dtypes[0], shapes[0], shapes[1], out, extents, lhs_full, rhs_full, symbol=symbol,
                       tail=tail, tail_factor=factor)


def _prelu_spec(annotated: dict) -> EltwiseSpec:
    """prelu(x, slope) over x's axis `axis`, on the PE fabric (PRELU_BODY): float32, static shapes,
    one slope per channel of that axis or one for all."""
    lhs, rhs = annotated["lhs"], annotated["rhs"]
    if dtype_of(lhs) != "float32" or dtype_of(rhs) != "float32":
        raise UnsupportedOperator(f"prelu of {dtype_of(lhs)} by a {dtype_of(rhs)} slope: the NPU's prelu is float32")
    shape = require_static_shape(lhs, "input", UnsupportedOperator, prefix="prelu: ")
    slope = require_static_shape(rhs, "slope", UnsupportedOperator, prefix="prelu: ")
    if not 1 <= len(shape) <= MAX_RANK:
        raise UnsupportedOperator(f"prelu of rank {len(shape)}: the NPU's DMA moves tensors of rank 1..{MAX_RANK}")
    axis = int(annotated["root"].attrs.axis) % len(shape)
    if tuple(slope) not in ((shape[axis],), (1,)):
        raise UnsupportedOperator(f"prelu with a slope of shape {tuple(slope)} over axis {axis} of {tuple(shape)}: "
                                  f"the NPU takes one slope per channel ({shape[axis]},) or one for all (1,)")
    broadcast = tuple(slope[0] if index == axis else 1 for index in range(len(shape)))
    out, extents, lhs_full, rhs_full = eltwise_view(tuple(shape), broadcast)
    return EltwiseSpec("prelu", "float32", tuple(shape), tuple(slope), out, extents, lhs_full, rhs_full,
                       rhs_broadcast=broadcast)


def _patterns() -> list:
    """(name, pattern, annotations) of every standalone elementwise op."""
    graphs = []
    for func, op in ELTWISE_OPS.items():
        lhs, rhs = wildcard(), wildcard()
        root = is_op(op)(lhs, rhs)
        graphs.append((PREFIX + func, root, {"root": root, "lhs": lhs, "rhs": rhs}))
    return graphs


def _tile_sizes(extent: int, minimum: int):
    """The whole extent, then halvings of it down to `minimum`; never below 2, since the
    scheduler cannot tensorize a tile loop of extent 1 (a one-row view is padded to two rows)."""
    size, seen = max(extent, 2), set()
    while size not in seen:
        seen.add(size)
        yield size
        size = max(-(-size // 2), min(minimum, extent), 2)


def choose_eltwise_tiling(spec: EltwiseSpec, arch: HardwareDescription) -> Tiling:
    """Tiles of tm view rows x tn view columns (tk = kp = 1): among tiles whose two operand
    tiles and output tile, each double-buffered, fit the scratchpad, the one with the fewest
    estimated cycles (ties: the larger). mp, np: the view's rows and columns padded to whole tiles."""
    *_, rows, cols = spec.extents
    if spec.func == "prelu":
        require_program(PRELU_BODY, spec.dtype, arch, "prelu")
    tiling = _choose_symbolic_columns(spec, arch) if spec.tail else \
        best_tiling(spec, arch, _tile_sizes(rows, 1), _tile_sizes(cols, arch.vector_lanes))
    if tiling is None:
        raise ScratchpadTooSmall(f"the {arch.spad_bytes}-byte scratchpad of '{arch.name}' cannot hold "
                                 f"three {spec.dtype} elements twice: describe a larger scratchpad")
    return tiling


def _choose_symbolic_columns(spec: EltwiseSpec, arch: HardwareDescription) -> Tiling | None:
    """Columns of a symbolic extent (the trailing symbolic axes), and rows too when they are the
    symbolic axis 0: the tm x tn whose estimate, at 1, 2, 4, 8, ... columns (and rows) up to the
    bound, is the closest to the tiling chosen for that size (minimax regret); a last tile is
    cut to what exists."""
    *outer, rows, cols = spec.extents
    size = DType.from_name(spec.dtype).itemsize
    candidates = [(tm, tn) for tm in _tile_sizes(rows, 1) for tn in _tile_sizes(cols, arch.vector_lanes)
                  if sum(aligned(2 * _elements(tm, tn, full[-2:]) * size)
                         for full in (spec.lhs_full, spec.rhs_full, (True, True))) <= arch.spad_bytes]
    if not candidates:
        return None

    def powers(extent: int) -> list:
        return sorted({min(extent, 2 ** k) for k in range(extent.bit_length() + 1)})

    row_counts = powers(rows) if spec.symbol is not None and not outer else [rows]
    sizes = [(r, c) for r in row_counts for c in powers(cols)]

    def at(r: int, c: int) -> EltwiseSpec:
        return dataclasses.replace(spec, extents=(*outer, r, c))

    def cycles(tm: int, tn: int, r: int, c: int) -> int:
        """One cut tile along an axis with fewer elements than the tile."""
        m, n = min(tm, r), min(tn, c)
        return _estimate_cycles(at(r, c), Tiling(m, n, 1, -(-r // tm) * m, -(-c // tn) * n, 1), math.prod(outer), arch)

    reference = {}
    for r, c in sizes:
        best = best_tiling(at(r, c), arch, _tile_sizes(r, 1), _tile_sizes(c, arch.vector_lanes))
        reference[r, c] = _estimate_cycles(at(r, c), best, math.prod(outer), arch)
    tm, tn = min(candidates, key=lambda t: (max(cycles(*t, *rc) / reference[rc] for rc in sizes),
                                            cycles(*t, rows, cols)))
    return Tiling(tm, tn, 1, -(-rows // tm) * tm, -(-cols // tn) * tn, 1)


def best_tiling(spec: EltwiseSpec, arch: HardwareDescription, row_sizes, col_sizes) -> Tiling | None:
    """Among tm in `row_sizes` x tn in `col_sizes`, the tiling whose operand and output tiles,
    double-buffered, fit the scratchpad with the fewest estimated cycles (ties: the larger), its
    extents padded to whole tiles; None when none fits. Also what kernels/tir/tir.py asks for a
    user's elementwise PrimFunc (its sizes: divisors, so nothing is padded)."""
    *outer, rows, cols = spec.extents
    size = DType.from_name(spec.dtype).itemsize
    col_sizes = list(col_sizes)
    best = None
    for tm in row_sizes:
        for tn in col_sizes:
            footprint = sum(aligned(2 * _elements(tm, tn, full[-2:]) * size)
                            for full in (spec.lhs_full, spec.rhs_full, (True, True)))
            if footprint > arch.spad_bytes:
                continue
            tiling = Tiling(tm, tn, 1, -(-rows // tm) * tm, -(-cols // tn) * tn, 1)
            key = (_estimate_cycles(spec, tiling, math.prod(outer), arch), -tm * tn)
            if best is None or key < best[0]:
                best = (key, tiling)
    return best[1] if best is not None else None


def _elements(tm: int, tn: int, full: tuple) -> int:
    """Elements of an operand's tile (extent 1 along the axes it is broadcast on)."""
    return cost.eltwise_operand_reads(tm, tn, *full)


def estimate_eltwise_cycles(spec: EltwiseSpec, tiling: Tiling, arch: HardwareDescription) -> int:
    """The search's estimate of an elementwise kernel on `tiling` (its extents padded to whole tiles)."""
    return _estimate_cycles(spec, tiling, math.prod(spec.extents[:-2]), arch)


def _estimate_cycles(spec: EltwiseSpec, t: Tiling, outer: int, arch: HardwareDescription) -> int:
    """First-order cycles, each command priced by the simulator's cost model (cgra_sim.cost), the
    tiles a double-buffered loop of operand loads, ELTWISE and store (cost.double_buffered_cycles):
    the busiest of the three per tile, or, for small tiles, half a buffer's round trip (operands:
    loaded with the DMA latency, then read; output: written, then stored with the latency); plus
    the first load and the last ELTWISE and store, which nothing overlaps."""
    size = DType.from_name(spec.dtype).itemsize
    tiles = outer * (t.mp // t.tm) * (t.np // t.tn)
    reads = _elements(t.tm, t.tn, spec.lhs_full[-2:]) + _elements(t.tm, t.tn, spec.rhs_full[-2:])
    load = cost.dma_transfer_cycles(arch, reads * size)
    vector = cost.eltwise_cycles(arch, t.tm * t.tn, reads)
    store = cost.dma_transfer_cycles(arch, t.tm * t.tn * size)
    return cost.double_buffered_cycles(arch, cost.BufferedLoop(tiles, load, (vector,), store)).total


def _loader(tensor, view):
    """A TE compute body reading `tensor` through its padded `view` at the given indices."""
    return lambda *indices: padded(tensor, view, indices)


def _walked(indices, full):
    """The indices of an operand: 0 on the axes it is broadcast along."""
    return tuple(i if walks else 0 for i, walks in zip(indices, full))


def eltwise_compute(spec: EltwiseSpec, tiling: Tiling):
    """out = func(lhs, rhs) over the view (outer..., rows, cols), rows and columns padded to
    whole tiles (mp, np). Each operand's tile keeps extent 1 on the axes it is broadcast along."""
    extents, padded = view_extents(spec, tiling)
    operands = {}
    for role, name, full in (("lhs", "a_pad", spec.lhs_full), ("rhs", "b_pad", spec.rhs_full)):
        view = tuple(e if walks else 1 for e, walks in zip(extents, full))
        tensor = te.placeholder(view, spec.dtype, name=role)
        shape = tuple(extent if walks else 1 for extent, walks in zip(padded, full))
        operands[role] = (tensor, te.compute(shape, _loader(tensor, view), name=name))
    (lhs, a_pad), (rhs, b_pad) = operands["lhs"], operands["rhs"]
    value = (lambda a, b: body_value(FabricBody(PRELU_BODY, spec.dtype), a, b)) if spec.func == "prelu" else \
        (lambda a, b: eltwise_value(spec.func, a, b))
    elt = te.compute(padded, lambda *i: value(a_pad(*_walked(i, spec.lhs_full)), b_pad(*_walked(i, spec.rhs_full))),
                     name="elt")
    out = te.compute(extents, lambda *i: elt(*i), name="out")
    caller = {"lhs": spec.lhs_shape, "rhs": spec.rhs_shape, "out": spec.output_shape}
    views = {role: symbolic_shape(spec, shape, rank=len(spec.output_shape)) for role, shape in caller.items()} \
        if any(tuple(shape) != tuple(spec.view(role)) for role, shape in caller.items()) or spec.tail else None
    func = prim_func(spec.param_roles, {"lhs": lhs, "rhs": rhs}, out, views, spec.shape_args)
    # The last tile of each symbolic tile loop is cut to what exists (lower/ragged.py).
    return func.with_attr(CUT_PARAMS, {"cgra_eltwise": cut_levels(spec, tiling, extents)}) if spec.tail else func


def tile_two_operands(sch, tiling: Tiling, block: str = "elt", operands: tuple = ("a_pad", "b_pad")):
    """Splits `block` into tm x tn tiles, computes its `operands` into the scratchpad per tile and
    stores "out" after it; returns the tile's row loop, the one to tensorize."""
    tiled = sch.get_sblock(block)
    *_, rows, cols = sch.get_loops(tiled)
    row_outer, row_inner = sch.split(rows, [None, tiling.tm])
    col_outer, col_inner = sch.split(cols, [None, tiling.tn])
    sch.reorder(row_outer, col_outer, row_inner, col_inner)
    for name in operands:
        operand = sch.get_sblock(name)
        sch.compute_at(operand, col_outer)
        sch.set_scope(operand, 0, SPAD)
    sch.reverse_compute_at(sch.get_sblock("out"), col_outer)
    sch.set_scope(tiled, 0, SPAD)
    return row_inner


def schedule_eltwise(sch, spec: EltwiseSpec, tiling: Tiling, arch: HardwareDescription) -> None:
    """Tiles of tm x tn under the outer view loops; per tile the operand tiles are loaded into
    the scratchpad and one ELTWISE computes the tile on the vector unit."""
    del arch
    row_inner = tile_two_operands(sch, tiling)
    if spec.func == "prelu":  # x is walked everywhere; the slope per row or per column
        sch.tensorize(row_inner, get_intrin("fabric", tiling.tm, tiling.tn, FabricBody(PRELU_BODY, spec.dtype),
                                            b_full=spec.rhs_full[-2:]))
        return
    sch.tensorize(row_inner, get_intrin("eltwise", tiling.tm, tiling.tn, spec.func, spec.dtype,
                                        a_full=spec.lhs_full[-2:], b_full=spec.rhs_full[-2:]))


ELTWISE = OpFamily(
    name="eltwise", ops=("eltwise",), patterns=_patterns, spec_from_match=eltwise_spec_from_match,
    choose_tiling=choose_eltwise_tiling, compute=eltwise_compute, schedule=schedule_eltwise,
    host_ops={op: PREFIX + func for func, op in ELTWISE_OPS.items()}, checks_pe_dtype=False)
