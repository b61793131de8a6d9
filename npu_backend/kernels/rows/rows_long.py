"""Row kernels whose rows do not fit the scratchpad: the same program in passes over column tiles.

Stage: kernel definition, tiling and schedule, for rows.py's programs when a tile of whole rows
and its intermediates do not fit (a softmax over thousands of columns, a layer norm of a wide
model on a small chip). A reduction's column is complete only after a pass over every column
tile of the row, so the program is cut into passes: pass q holds the reduction whose input needs
only columns complete before q, and the full-tile steps it reads, recomputed from x (reloaded by
DMA each pass: nothing of a tile outlives its pass); the column steps run between passes; the
last pass computes the output tile by tile and stores it. Softmax: max, then exp and its sum,
then the output (three loads of x, one store); layer norm four loads. A reduction is blocked: a
column per tile, then one REDUCE of those (its rounding grows with tn + cols / tn, not cols). The
column tile tn divides the row, so no padded column enters a reduction.
"""

from __future__ import annotations

from tvm import te, tirx

from cgra_sim import cost

from ...errors import UnsupportedOperator
from ..intrinsics import SPAD, get_intrin
from ..intrinsics.row_ops import reduce_start, reducer
from ..common.operands import padded, prim_func
from ..common.spec import SINGLE_BUFFERED, Tiling, aligned


def plan(steps, kinds: dict) -> tuple:
    """(needs, reduce_pass, last_pass): the full steps (and "x", row roles) each pass q computes,
    {q: set of names}; the pass of each reduction; the last pass (None for a column result)."""
    ready, reduce_pass, passes, needs = {}, {}, {}, {}  # column -> first pass that may read it
    for step in steps:
        if step.kind == "reduce":
            reduce_pass[step.name] = _pass(step.inputs, kinds, ready, passes)
            ready[step.name] = reduce_pass[step.name] + 1
        elif kinds[step.name] == "column":
            ready[step.name] = max(ready[name] for name in step.inputs)
        else:
            passes[step.name] = _pass(step.inputs, kinds, ready, passes)
    last = steps[-1]
    last_pass = passes[last.name] if kinds[last.name] == "full" else None
    roots = [(q, steps_by_name(steps)[name].inputs[0]) for name, q in reduce_pass.items()]
    if last_pass is not None:
        roots.append((last_pass, last.name))
    if len(reduce_pass) != len(set(reduce_pass.values())):
        raise UnsupportedOperator("a row program with two reductions in one pass has no long-row form")
    by_name = steps_by_name(steps)
    for q, name in roots:
        _need(name, q, by_name, kinds, needs.setdefault(q, set()))
    return needs, reduce_pass, last_pass


def steps_by_name(steps) -> dict:
    """{step name: step} of a row program."""
    return {step.name: step for step in steps}


def _pass(inputs, kinds, ready, passes) -> int:
    return max([passes.get(name, 0) if kinds[name] == "full" else ready[name] if kinds[name] == "column" else 0
                for name in inputs] or [0])


def _need(name, q, by_name, kinds, needed: set) -> None:
    """`name` and the full steps (or x, row roles) it reads, computed in pass q."""
    if name in needed or kinds.get(name) == "column":
        return
    needed.add(name)
    for source in by_name[name].inputs if name in by_name else ():
        _need(source, q, by_name, kinds, needed)


def copy_name(name: str, q: int, row_roles=()) -> str:
    """The block of step (or x, or a row operand) `name` in pass q."""
    return ("a_pad" if name == "x" else f"{name}_pad" if name in row_roles else name) + f"_p{q}"


def long_compute(spec, tiling: Tiling, steps, kinds: dict, out_shape: tuple, stage, row_load):
    """The TensorIR of the passes (`stage`, `row_load`: rows.py's builders of one step's TE
    stage and of a row operand)."""
    rows, cols, mp = spec.rows, spec.cols, tiling.mp
    needs, reduce_pass, last_pass = plan(steps, kinds)
    x = te.placeholder((rows, cols), F32, name="lhs")
    inputs = {"lhs": x, **{role: te.placeholder((cols,), F32, name=role) for role in spec.row_roles}}
    copies, columns = {}, {}
    for q, names in needs.items():
        if "x" in names:
            copies[("x", q)] = te.compute((mp, cols), lambda i, j: padded(x, (rows, cols), (i, j)),
                                          name=copy_name("x", q))
        for role in spec.row_roles:
            if role in names:
                copies[(role, q)] = row_load(inputs[role], cols, copy_name(role, q, spec.row_roles))
    for step in steps:
        if step.kind == "reduce":  # blocked: a column per column tile, then their fold
            source = copies[(step.inputs[0], reduce_pass[step.name])]
            columns[step.name] = _blocked_reduce(step.func, source, mp, cols, tiling.tn, step.name)
            continue
        if kinds[step.name] == "column":
            columns[step.name] = stage(step, columns, kinds, mp, cols, step.name)
            continue
        for q, names in needs.items():
            if step.name in names:
                view = {**columns, **{name: copies[(name, qq)] for name, qq in copies if qq == q}}
                copies[(step.name, q)] = stage(step, view, kinds, mp, cols, copy_name(step.name, q))
    last = steps[-1]
    result = copies[(last.name, last_pass)] if last_pass is not None else columns[last.name]
    width = cols if last_pass is not None else 1
    out = te.compute((rows, width), lambda i, j: result[i, j], name="out")
    views = {"lhs": spec.shape} if spec.shape != (rows, cols) else {}
    if out_shape != (rows, width):
        views["out"] = out_shape
    func = prim_func(spec.param_roles, inputs, out, views or None, spec.shape_args)
    single = [copy_name(name, q) for name, q in copies if name not in ("x", *spec.row_roles)
              and (name, q) != (last.name, last_pass)] + [name for name in columns if name != last.name] \
        + [f"{step.name}_part" for step in steps if step.kind == "reduce"]
    return func.with_attr(SINGLE_BUFFERED, single)


F32 = "float32"


def _blocked_reduce(func: str, source, mp, cols: int, tn: int, name: str):
    """A row's reduction over its column tiles, blocked: each tile's REDUCE into a column of
    `{name}_part` (mp, cols / tn), then one REDUCE of those (a sum's error grows with tn + cols / tn,
    not cols; a sum of squares adds its tiles' sums)."""
    k, tiles = te.reduce_axis((0, tn), name="k"), cols // tn
    fold = reducer(func)
    part = te.compute((mp, tiles), lambda i, t: fold(_square(func, source[i, t * tn + k]), axis=k),
                      name=f"{name}_part")
    kt = te.reduce_axis((0, tiles), name="kt")
    total = reducer("max" if func == "max" else "sum")
    return te.compute((mp, 1), lambda i, z: total(part[i, kt], axis=kt), name=name)


def _square(func: str, value):
    return value * value if func == "sum_squares" else value


def long_footprint(spec, steps, kinds: dict, tm: int, tn: int) -> int:
    """Scratchpad bytes of the passes' buffers at tm x tn tiles: every pass's x and row operands
    and the result twice, the other tiles and the columns once."""
    needs, _, last_pass = plan(steps, kinds)
    tile, column, row = aligned(tm * tn * 4), aligned(tm * 4), aligned(tn * 4)
    total = sum(2 * row if name in spec.row_roles else 2 * tile if name == "x" else tile
                for names in needs.values() for name in names)
    total += sum(column for step in steps if kinds[step.name] == "column")
    return total + (tile if last_pass is not None else column)  # the result's second copy


def long_cycles(arch, spec, steps, kinds: dict, tm: int, tn: int, step_cycles) -> int:
    """Estimated cycles of the passes: per tile of tm rows, each pass a double-buffered loop
    over the row's column tiles (cost.double_buffered_cycles: its loads, its steps, the last
    pass's stores), then the reductions' folds and the column steps."""
    needs, reduce_pass, last_pass = plan(steps, kinds)
    by_name, per_row = steps_by_name(steps), 0
    tile = cost.dma_transfer_cycles(arch, tm * tn * 4)
    for q, names in needs.items():
        in_pass = [by_name[n] for n in names if n in by_name] + [s for s in steps if reduce_pass.get(s.name) == q]
        load = tile + sum(cost.dma_transfer_cycles(arch, tn * 4) for name in spec.row_roles if name in names)
        loop = cost.BufferedLoop(spec.cols // tn, load, (step_cycles(arch, in_pass, kinds, tm, tn),),
                                 tile if q == last_pass else 0)
        per_row += cost.double_buffered_cycles(arch, loop).total
    folds = [s for s in steps if s.kind == "reduce"]
    columns = [s for s in steps if kinds[s.name] == "column" and s.kind != "reduce"]
    per_row += step_cycles(arch, columns, kinds, tm, 1) + sum(cost.reduce_cycles(arch, tm, spec.cols // tn)
                                                                 for _ in folds)
    return -(-spec.rows // tm) * per_row


def schedule_long(sch, spec, tiling: Tiling, steps, kinds: dict) -> None:
    """Per tile of tm rows: each pass a loop over the column tiles (its loads, steps and
    reduction), the column steps between, the last pass storing the output."""
    needs, reduce_pass, last_pass = plan(steps, kinds)
    tm, tn = tiling.tm, tiling.tn
    out = sch.get_sblock("out")
    loops = sch.get_loops(out)
    row_outer, row_inner = sch.split(loops[0], [None, tm])
    col_outer = None
    if last_pass is not None:
        col_outer, col_inner = sch.split(loops[1], [None, tn])
        sch.reorder(row_outer, col_outer, row_inner, col_inner)
    order = _creation_order(steps, needs, reduce_pass, kinds, spec.row_roles)
    pass_loop = {}
    for name, q, step_name in reversed(order):
        block = sch.get_sblock(name)
        if q is None:  # a column step, a reduction or its columns per tile: per row tile
            sch.compute_at(block, row_outer)
            if name.endswith("_part"):  # over the tiles, each tile's rows and columns: the pass
                rows_loop, tile_loop, k = sch.get_loops(block)[1:]
                sch.reorder(tile_loop, rows_loop, k)
                pass_loop[reduce_pass[step_name]] = tile_loop
        else:
            sch.compute_at(block, col_outer if q == last_pass else pass_loop[q])
        sch.set_scope(block, 0, SPAD)
    by_name = steps_by_name(steps)
    for name, q, step_name in order:
        _tensorize(sch, by_name.get(step_name), name, q, kinds, tm, tn)


def _creation_order(steps, needs, reduce_pass, kinds, row_roles) -> list:
    """(block name, pass or None, step name) in the order long_compute creates the stages."""
    order = [(copy_name(name, q, row_roles), q, name) for q, names in needs.items() for name in ("x", *row_roles)
             if name in names]
    for step in steps:
        if step.kind == "reduce":
            order += [(f"{step.name}_part", None, step.name), (step.name, None, step.name)]
        elif kinds[step.name] == "column":
            order.append((step.name, None, step.name))
        else:
            order += [(copy_name(step.name, q), q, step.name) for q, names in needs.items() if step.name in names]
    return order


def _tensorize(sch, step, name: str, q, kinds: dict, tm: int, tn: int) -> None:
    if step is None:  # a load: the DMA pass's
        return
    block = sch.get_sblock(name)
    if step.kind == "reduce":  # `{step}_part`: per tile under its pass loop; the step: the parts' fold
        part = name.endswith("_part")
        depth = 2 if part else 1
        func = step.func if part else "max" if step.func == "max" else "sum"
        init = sch.decompose_reduction(block, sch.get_loops(block)[depth])
        sch.add_unit_loop(init)
        sch.tensorize(sch.get_loops(init)[depth], get_intrin("fill", tm, 1, F32, value=tirx.const(reduce_start(func), F32)))
        sch.add_unit_loop(sch.get_loops(block)[depth + 1])
        cols = tn if part else int(sch.get(sch.get_loops(block)[-1]).extent)  # the parts: a column a tile
        sch.tensorize(sch.get_loops(block)[depth], get_intrin("reduce", tm, cols, func))
        return
    full = kinds[step.name] == "full"
    if not full:
        sch.add_unit_loop(block)
    first = sch.get_loops(block)[2 if full else 1]
    width = tn if full else 1
    if step.kind == "vfunc":
        sch.tensorize(first, get_intrin("vfunc", tm, width, step.func, scale=step.scale, offset=step.offset))
        return
    forms = {"full": (True, True), "column": (True, False), "row": (False, True)}
    a_full, b_full = (forms[kinds[i]] for i in step.inputs)
    sch.tensorize(first, get_intrin("eltwise", tm, width, step.func, F32, a_full=a_full, b_full=b_full))
