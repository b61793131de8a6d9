"""Row kernels: a program of vector-unit steps over tiles of whole rows (softmax, norms, reductions).

Stage: partition (`read_rows`: the operand's view, or the reason it stays on the host), kernel
definition (`row_compute`), tiling (`choose_row_tiling`) and schedule (`schedule_rows`). A
family describes its op as `Step`s over the last axis of a float32 tensor read as (rows, cols):
REDUCE a row into a column (its start a FILL), VFUNC a tile or column, ELTWISE two of them (a
column broadcast along the row, a gamma / beta row along the rows). Per tile of tm whole rows the
kernel loads x (and the row vectors) by DMA, runs the steps in order, every intermediate in the
scratchpad (one copy each: only the loads and the result are double-buffered), and stores the
result: one pass over DRAM. A row must fit the scratchpad with the
steps' intermediates (a longer row stays on the host, saying so).

A row of symbolic length (a softmax's, a sum's or a max's: `read_rows(symbolic_row=True)`) is held
whole in a tile as wide as its bound; every command as wide as the tile is cut to the length at
run time (CUT_EXTENTS), the store's loop is the tile's with the halo dropping what lies past the
tensor (lower/dma.py), and a length past the bound is a ValueError before any command (BOUNDED).
"""

from __future__ import annotations

import dataclasses
import math

from tvm import te, tirx

from cgra_sim import cost
from cgra_sim.arch import HardwareDescription

from ...errors import ScratchpadTooSmall, UnsupportedOperator
from ...relax_info import dtype_of, shape_dims
from ..common.dynamic import BOUNDED, CUT_EXTENTS, CUT_PARAMS, dim_var, least_regret, read_shape, with_vars
from ..intrinsics import SPAD, get_intrin
from ..intrinsics.row_ops import reducer, reduce_start, vfunc_value
from ..intrinsics.vector_unit import eltwise_value
from ..common.operands import padded, prim_func
from .rows_long import long_compute, long_cycles, long_footprint, schedule_long
from ..common.spec import SINGLE_BUFFERED, Tiling, aligned, round_up
from ..common.unary import MAX_RANK, halvings

F32 = "float32"


@dataclasses.dataclass(frozen=True)
class Step:
    """One vector-unit command per tile: `kind` "reduce" (func sum / max / sum_squares of one
    input into a column), "vfunc" (func of one input, `scale` and `offset` optional) or
    "eltwise" (func of two inputs), or "cast" (an EPILOGUE rounding its float32 input to `dtype`, a
    16-bit float). Inputs name earlier steps, "x" (the tile) or a row role. `dtype`: what an
    eltwise step computes in (a 16-bit float's: widened, rounded to nearest even) or a cast's result."""

    name: str
    kind: str
    func: str
    inputs: tuple
    scale: float | None = None
    offset: float | None = None
    dtype: str = F32


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """A row kernel's spec: `kind` (softmax, layer_norm, rms_norm, sum, mean, max) over x of
    `shape` read as (rows, cols); `out_shape` the caller's output; `eps` a norm's epsilon;
    `row_roles` the (cols,) operands (gamma, beta) beside x ("lhs")."""

    op: str
    kind: str
    shape: tuple
    out_shape: tuple
    rows: int
    cols: int
    eps: float = 0.0
    row_roles: tuple = ()
    param_roles: tuple = ("lhs",)
    source_ops: tuple = ()
    shape_args: tuple = ()
    symbols: tuple = ()  # ((axis, variable name), ...): x's symbolic leading axes (kernels/dynamic.py)
    # The output's dtype: float32, or a 16-bit float (half_norms.py); ((row role, dtype), ...) of
    # the row roles not float32.
    out_dtype: str = F32
    role_dtypes: tuple = ()
    in_dtype: str = F32  # x's: float32, or a 16-bit float a first "cast" step widens (half_norms.py)
    scale: float | None = None  # a scaled sum or max's constant (row_reduce.py)
    dtype = F32
    acc_dtype = F32
    macs = 0

    @property
    def symbolic_row(self) -> bool:
        """Whether the row (the last axis) has a symbolic length: held whole in a tile as wide as
        its bound, the commands cut to it (`row_compute`)."""
        return any(axis == len(self.shape) - 1 for axis, _ in self.symbols)

    @property
    def unchecked_schedule(self) -> bool:
        """Whether TVM's schedule checks cannot prove the tiles cover the rows: a row of symbolic
        length, or rows that are a variable times static axes (kernels/stage.py)."""
        leading = [axis for axis, _ in self.symbols if axis < len(self.shape) - 1]
        return self.symbolic_row or any(math.prod(self.shape[:-1]) != self.shape[axis] for axis in leading)


def read_rows(x, what: str, symbolic_row: bool = False, dtype: str = F32) -> tuple:
    """(shape, rows, cols, symbols) of a float32 (`dtype`) operand reduced or normalised along its last
    axis, symbolic axes at their bounds and named in `symbols` ((axis, variable), ...): one
    leading axis (the rows: its product with the static ones), and with `symbolic_row` the last
    (a row of symbolic length, held whole in a tile as wide as its bound: `row_compute`); raises
    UnsupportedOperator saying why it stays on the host."""
    if dtype_of(x) != dtype:
        raise UnsupportedOperator(f"{what} on {dtype_of(x) or 'an unknown dtype'}: the vector unit's REDUCE "
                                  "and VFUNC compute float32")
    dims = shape_dims(x) or ()
    axes = range(len(dims)) if symbolic_row and len(dims) > 1 else range(len(dims) - 1)
    shape, names = read_shape(x, "operand", symbolic_axes=axes, prefix=f"{what}: ", expressions=symbolic_row)
    if not 1 <= len(shape) <= MAX_RANK:
        raise UnsupportedOperator(f"{what} of rank {len(shape)}: the NPU's DMA moves tensors of rank 1..{MAX_RANK}")
    leading = [axis for axis in names if axis < len(shape) - 1]
    if len(leading) > 1 or (leading and not symbolic_row and math.prod(shape[:-1]) != shape[leading[0]]):
        raise UnsupportedOperator(f"{what} of shape {tuple(dims)}: its row kernel takes one symbolic axis as its "
                                  "rows, the other leading axes 1 (bind the other sizes)")
    cols = shape[-1]
    return tuple(shape), max(math.prod(shape) // max(cols, 1), 1), cols, tuple(sorted(names.items()))


def last_axis(axes, rank: int, what: str) -> None:
    """Refuse a reduction or normalisation over anything but the last axis."""
    axes = [int(a) % rank for a in (axes if isinstance(axes, (list, tuple)) else [axes])]
    if axes != [rank - 1]:
        raise UnsupportedOperator(f"{what} over axes {axes} of a rank-{rank} tensor: the NPU's row kernels "
                                  "reduce the last axis only")


def shapes_of(steps, rows_roles) -> dict:
    """Each step's and input's shape kind: "full" (rows x cols), "column" or "row"."""
    kinds = {"x": "full", **{role: "row" for role in rows_roles}}
    for step in steps:
        if step.kind == "reduce":
            kinds[step.name] = "column"
        elif step.kind == "vfunc":
            kinds[step.name] = kinds[step.inputs[0]]
        else:
            kinds[step.name] = "full" if "full" in (kinds[i] for i in step.inputs) else "column"
    return kinds


def _read(tensor, kind: str, i, j):
    return tensor[i, j] if kind == "full" else tensor[i, 0] if kind == "column" else tensor[0, j]


def row_compute(spec, tiling: Tiling, steps, out_shape: tuple):
    """The TensorIR of a row program: x viewed as (rows, cols), row roles (gamma, beta) as
    (cols,), the last step's tile (or column) stored into the output viewed as (rows, cols) or
    (rows, 1); parameters in spec.param_roles order."""
    if tiling.tn < spec.cols:
        return long_compute(spec, tiling, steps, shapes_of(steps, spec.row_roles), out_shape, stage_of, _row_load)
    rows, cols, mp = spec.rows, spec.cols, tiling.mp
    names = dict(spec.symbols)
    row_name = names.get(len(spec.shape) - 1)
    width_of = dim_var(row_name) if row_name is not None else cols  # x's columns: a row of symbolic length
    if set(names) - {len(spec.shape) - 1}:  # a symbolic row count: tiles of tm rows, the last one cut (ragged.py)
        rows = math.prod(dim_var(names[axis]) if axis in names else extent
                         for axis, extent in enumerate(spec.shape[:-1]))
        mp = tirx.ceildiv(rows, tiling.tm) * tiling.tm
    x = te.placeholder((rows, width_of), getattr(spec, "in_dtype", F32), name="lhs")
    inputs, tensors = {"lhs": x}, {"x": te.compute((mp, cols), lambda i, j: padded(x, (rows, width_of), (i, j)),
                                                   name="a_pad")}
    for role in spec.row_roles:
        inputs[role] = te.placeholder((cols,), dict(getattr(spec, "role_dtypes", ())).get(role, F32), name=role)
        tensors[role] = _row_load(inputs[role], cols, f"{role}_pad")
    kinds = shapes_of(steps, spec.row_roles)
    for step in steps:
        tensors[step.name] = stage_of(step, tensors, kinds, mp, cols)
    last = tensors[steps[-1].name]
    full = kinds[steps[-1].name] == "full"
    out = te.compute((rows, width_of if full else 1), lambda i, j: last[i, j], name="out")
    views = {"lhs": with_vars(spec.shape, names)} if spec.shape != (spec.rows, cols) or names else {}
    if out_shape != (spec.rows, cols if full else 1) or names:
        views["out"] = with_vars(out_shape, names if full else {a: n for a, n in names.items() if a < len(spec.shape) - 1})
    func = prim_func(spec.param_roles, inputs, out, views or None, spec.shape_args)
    func = func.with_attr(SINGLE_BUFFERED, [step.name for step in steps[:-1]])
    if row_name is not None:  # every command as wide as the row computes its s columns (ragged.py)
        calls = ("cgra_eltwise", "cgra_reduce", "cgra_vfunc", "cgra_fill")
        func = func.with_attr(CUT_EXTENTS, {call: [["cols", cols, row_name]] for call in calls})
        func = func.with_attr(BOUNDED, [[row_name, cols, spec.kind]])
    if set(names) - {len(spec.shape) - 1}:
        func = func.with_attr(CUT_PARAMS, {call: "rows" for call in ("cgra_fill", "cgra_eltwise", "cgra_reduce",
                                                                      "cgra_vfunc")})
    return func


def _element(func: str, value):
    """What a REDUCE folds of one element: the element, or its square."""
    return value * value if func == "sum_squares" else value


def _row_load(vector, cols: int, name: str):
    """A (cols,) operand as the (1, cols) row its ELTWISE broadcasts along the rows."""
    return te.compute((1, cols), lambda z, j: vector[j], name=name)


def stage_of(step: Step, tensors: dict, kinds: dict, mp: int, cols: int, name: str = ""):
    """One step's TE stage (block `name`, default the step's), reading `tensors` by input name."""
    name = name or step.name
    if step.kind == "reduce":
        src, k = tensors[step.inputs[0]], te.reduce_axis((0, cols), name="k")
        fold = reducer(step.func)
        return te.compute((mp, 1), lambda i, z: fold(_element(step.func, src[i, k]), axis=k), name=name)
    if step.kind == "vfunc":
        src = tensors[step.inputs[0]]
        kind = kinds[step.inputs[0]]
        return te.compute((mp, cols if kind == "full" else 1), lambda i, j: vfunc_value(
            step.func, _read(src, kind, i, j), step.scale, step.offset), name=name)
    if step.kind == "cast":
        src = tensors[step.inputs[0]]
        return te.compute((mp, cols), lambda i, j: src[i, j].astype(step.dtype), name=name)
    a, b = (tensors[name] for name in step.inputs)
    ka, kb = (kinds[name] for name in step.inputs)
    width = cols if kinds[step.name] == "full" else 1
    return te.compute((mp, width), lambda i, j: eltwise_value(step.func, _read(a, ka, i, j), _read(b, kb, i, j)),
                      name=name)


def footprint(spec, steps, tm: int) -> int:
    """Scratchpad bytes of a tile of tm rows: x, the result and the row vectors twice (double
    buffering: the DMA of the next tile overlaps this one's steps), every other step's tile or
    column once (SINGLE_BUFFERED: the vector unit runs the steps in order anyway)."""
    kinds = shapes_of(steps, spec.row_roles)
    size = {"full": aligned(tm * spec.cols * 4), "column": aligned(tm * 4)}
    inner = sum(size[kinds[s.name]] for s in steps[:-1])
    return 2 * (size["full"] + size[kinds[steps[-1].name]] + len(spec.row_roles) * aligned(spec.cols * 4)) + inner


def step_cycles(arch: HardwareDescription, steps, kinds: dict, tm: int, cols: int) -> int:
    """The vector unit's cycles for one tile's steps (cost.py's closed forms)."""
    total = 0
    for step in steps:
        width = cols if kinds[step.name] == "full" else 1
        if step.kind == "reduce":
            total += cost.reduce_cycles(arch, tm, cols) + cost.vector_cycles(arch, tm, 1)  # and its FILL
        elif step.kind == "vfunc":
            total += cost.vfunc_cycles(arch, tm * width, step.func, step.scale is not None, step.offset is not None)
        else:
            reads = sum(tm * width if kinds[i] == "full" else tm if kinds[i] == "column" else cols
                        for i in step.inputs)
            total += cost.eltwise_cycles(arch, tm * width, reads)
    return total


def choose_row_tiling(spec, arch: HardwareDescription, steps) -> Tiling:
    """tm whole rows a tile: the fitting tm (the row count, its halvings, or one row: a decode
    step's scores over a long cache) with the fewest estimated cycles (the first tile's load,
    steps and store, then per further tile the slowest of the DMA and the vector unit).
    Rows too long for that: passes over tm x tn tiles (rows_long.py), tn the largest divisor of
    the row that fits."""
    fitting = [tm for tm in (*halvings(spec.rows), 1) if footprint(spec, steps, tm) <= arch.spad_bytes]
    kinds = shapes_of(steps, spec.row_roles)
    if not fitting and spec.symbols:
        row = dict(spec.symbols).get(len(spec.shape) - 1)
        held = f" (its symbolic length {row} held at its bound)" if row is not None else ""
        fix = f"lower the bound of {row} (shape_bounds, tir_var_upper_bound) or " if row is not None else ""
        raise ScratchpadTooSmall(f"{spec.kind}: a row of {spec.cols} float32{held} does not fit the "
                                 f"{arch.spad_bytes}-byte scratchpad of '{arch.name}' with its intermediates; the "
                                 f"passes over column tiles take static shapes only ({fix}bind the symbolic sizes)")
    if not fitting and (getattr(spec, "out_dtype", F32) != F32 or getattr(spec, "in_dtype", F32) != F32):
        raise ScratchpadTooSmall(f"{spec.kind}: a row of {spec.cols} {getattr(spec, 'in_dtype', F32)} written as "
                                 f"{spec.out_dtype} does not fit the {arch.spad_bytes}-byte scratchpad of "
                                 f"'{arch.name}' whole (the passes over column tiles read and write float32): "
                                 "describe a larger scratchpad")
    if not fitting:
        return _long_tiling(spec, arch, steps, kinds)

    if any(axis < len(spec.shape) - 1 for axis, _ in spec.symbols):  # a symbolic row count (dynamic.least_regret)
        tm = least_regret(fitting, lambda tm, n: estimate_row_cycles(
            dataclasses.replace(spec, rows=n), arch, steps, min(tm, n), spec.cols), spec.rows)
    else:
        tm = min(fitting, key=lambda tm: estimate_row_cycles(spec, arch, steps, tm, spec.cols))
    return Tiling(tm, spec.cols, 1, round_up(spec.rows, tm), spec.cols, 1)


def estimate_row_cycles(spec, arch: HardwareDescription, steps, tm: int, tn: int) -> int:
    """The tile search's estimate of tiles of tm rows (tn: the row, or a column tile of the
    passes, rows_long.py): the double-buffered loop over the row tiles (cost.double_buffered_cycles),
    loading x and the row vectors, running the steps and storing the result (a tile, or a column)."""
    kinds = shapes_of(steps, spec.row_roles)
    if tn < spec.cols:
        return long_cycles(arch, spec, steps, kinds, tm, tn, step_cycles)
    load = cost.dma_transfer_cycles(arch, tm * spec.cols * 4) + \
        len(spec.row_roles) * cost.dma_transfer_cycles(arch, spec.cols * 4)
    store = cost.dma_transfer_cycles(arch, tm * (spec.cols if kinds[steps[-1].name] == "full" else 1) * 4)
    work = step_cycles(arch, steps, kinds, tm, spec.cols)
    return cost.double_buffered_cycles(arch, cost.BufferedLoop(-(-spec.rows // tm), load, (work,), store)).total


def _long_tiling(spec, arch: HardwareDescription, steps, kinds: dict) -> Tiling:
    divisors = [tn for tn in range(spec.cols // 2, 1, -1) if spec.cols % tn == 0]
    for tn in divisors:
        fitting = [tm for tm in halvings(spec.rows) if long_footprint(spec, steps, kinds, tm, tn) <= arch.spad_bytes]
        if fitting:
            tm = min(fitting, key=lambda tm: long_cycles(arch, spec, steps, kinds, tm, tn, step_cycles))
            return Tiling(tm, tn, 1, round_up(spec.rows, tm), spec.cols, 1)
    raise ScratchpadTooSmall(f"{spec.kind}: a row of {spec.cols} float32 does not fit the {arch.spad_bytes}-byte "
                             f"scratchpad of '{arch.name}' with its intermediates, and no column tile (a divisor "
                             "of the row) does either: the op stays on the host")


def schedule_rows(sch, spec, tiling: Tiling, steps) -> None:
    """Per tile of tm rows: the loads, every step tensorized onto its command, the store."""
    kinds = shapes_of(steps, spec.row_roles)
    if tiling.tn < spec.cols:
        schedule_long(sch, spec, tiling, steps, kinds)
        return
    names = ["a_pad", *(f"{role}_pad" for role in spec.row_roles), *(s.name for s in steps)]
    if getattr(spec, "symbolic_row", False) and kinds[steps[-1].name] == "full":
        # A row of symbolic length: the last step's whole-width tile is the anchor (the store
        # reads only s of its columns, which would make every step's loops s wide).
        anchor = sch.get_sblock(steps[-1].name)
        outer, _ = sch.split(sch.get_loops(anchor)[0], [None, tiling.tm])
        sch.reverse_compute_at(sch.get_sblock("out"), outer)
        sch.set_scope(anchor, 0, SPAD)
        names = names[:-1]
    else:
        rows, _ = sch.get_loops(sch.get_sblock("out"))
        outer, _ = sch.split(rows, [None, tiling.tm])
    for name in reversed(names):
        block = sch.get_sblock(name)
        sch.compute_at(block, outer)
        sch.set_scope(block, 0, SPAD)
    tm, cols = tiling.tm, spec.cols
    if tm == 1:  # compute_at dropped the tile's row loop too: a unit loop in its place
        for step in steps:
            block, full = sch.get_sblock(step.name), step.kind == "reduce" or kinds[step.name] == "full"
            loops = sch.get_loops(block)
            if len(loops) < (3 if full and cols > 1 else 2):
                sch.add_unit_loop(loops[1] if len(loops) > 1 else block)
    # A column's tile has a column loop of extent 1, which compute_at dropped: a unit loop
    # above the block (or above the reduction's column loop) gives each nest the intrinsic's.
    for step in steps:
        block = sch.get_sblock(step.name)
        width = cols if kinds[step.name] == "full" else 1
        if step.kind == "reduce":
            init = sch.decompose_reduction(block, sch.get_loops(block)[1])
            while len(sch.get_loops(init)) < 3:  # its (tm, 1) tile: a unit column, and a unit row at tm 1
                sch.add_unit_loop(init)
            sch.tensorize(sch.get_loops(init)[1], get_intrin("fill", tm, 1, F32,
                                                             value=tirx.const(reduce_start(step.func), F32)))
            loops = sch.get_loops(block)
            for _ in range(1 if len(loops) > 2 else 2):  # a row of one column lost that loop too
                sch.add_unit_loop(loops[2] if len(loops) > 2 else block)
            sch.tensorize(sch.get_loops(block)[1], get_intrin("reduce", tm, cols, step.func))
            continue
        if width == 1:
            sch.add_unit_loop(block)
        first = sch.get_loops(block)[1]
        if step.kind == "vfunc":
            sch.tensorize(first, get_intrin("vfunc", tm, width, step.func, scale=step.scale, offset=step.offset))
        elif step.kind == "cast":  # of x loaded in a 16-bit float, or of a float32 step
            source = getattr(spec, "in_dtype", F32) if step.inputs[0] == "x" else F32
            sch.tensorize(first, get_intrin("epilogue", tm, width, source, bias=False, relu=False, residual=False,
                                            clip=None, zero_point=None, out_dtype=step.dtype))
        else:
            full = {"full": (True, True), "column": (True, False), "row": (False, True)}
            a_full, b_full = (full[kinds[i]] for i in step.inputs)
            sch.tensorize(first, get_intrin("eltwise", tm, width, step.func, step.dtype, a_full=a_full, b_full=b_full))
