"""What a decode step computes from the token's position alone, looked up in a table by position.

Stage: frontend (kv_cache.py's last step). In: a decode step whose caches are preallocated for
`bound` positions, so that its position is one integer in [0, bound). Out: the same step where
every float tensor computed from the position and constants alone (RoPE's angles, their concat,
cos and sin: `cos(pos.float() * inverse)`), and read by the rest of the step, is
`reshape(take(table, position, axis=0))`, the table holding that tensor for each of the bound's
positions: an NPU gather (the layout family's take of one row of a constant table) instead of
the host's astype, concat, cos and sin (no NPU kernel computes cos or sin).

How: those bindings are copied into a function of the position alone, built once for llvm
(each op legalized as the host would run it, so the table's rows are the values the host
computed, bit for bit) and run for every position; a table over 1 MB is left as it was.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, static_shape

#: The largest table put in place of a position's computation (bytes).
MAX_TABLE_BYTES = 1 << 20
_VIEWS = ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.astype", "relax.permute_dims")


def tabulate_positions(mod: tvm.IRModule, position: str, bound: int) -> tvm.IRModule:
    """`mod` with main's tensors computed from parameter `position` alone looked up by it (the
    module docstring); `mod` itself when there are none."""
    func = mod["main"]
    param = next((p for p in func.params if str(p.name) == position), None)
    if param is None or static_shape(param) is None or math.prod(static_shape(param)) != 1:
        return mod
    bound_values = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    closure, reads = _closure(bound_values, param)
    frontier = [var for var in _frontier(func, bound_values, closure) if var in reads
                and dtype_of(var).startswith("float") and not _views_only(var, closure, param)
                and bound * math.prod(static_shape(var)) * 4 <= MAX_TABLE_BYTES]
    if not frontier:
        return mod
    tables = _tables(mod, func, param, closure, frontier, bound)
    rewriter = _Lookup(param, dict(zip(frontier, tables)))
    out = mod.clone()
    out["main"] = relax.analysis.remove_all_unused(rewriter.visit_expr(func))
    return relax.transform.Normalize()(out)


def _closure(bound_values: dict, param) -> tuple[dict, set]:
    """(var -> call for the bindings of static shape computed from `param` and constants alone,
    the variables of those that read `param`: a weight's transpose reads constants alone)."""
    closure = {}

    def free(expr) -> bool:
        if isinstance(expr, relax.Var):
            return expr.same_as(param) or isinstance(bound_values.get(expr), tvm.ir.GenericConst) or expr in closure
        if isinstance(expr, relax.Tuple):
            return all(free(field) for field in expr.fields)
        if isinstance(expr, relax.ShapeExpr):
            return all(isinstance(dim, tvm.tirx.IntImm) for dim in expr.values)
        if isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm, tvm.ir.GenericConst)):
            return True
        return False

    for var, value in bound_values.items():
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and static_shape(var) is not None \
                and value.op.name not in ("relax.call_pure_packed", "relax.tensor_to_shape") \
                and all(free(arg) for arg in value.args):
            closure[var] = value
    reads = set()
    for var, value in closure.items():
        if any(v.same_as(param) or v in reads for v in relax.analysis.free_vars(value)):
            reads.add(var)
    return closure, reads


def _frontier(func, bound_values: dict, closure: dict) -> list:
    """The closure's variables read by a binding outside it or by the result, in binding order."""
    read = set()
    for var, value in bound_values.items():
        if var not in closure:
            read.update(relax.analysis.free_vars(value))
    read.update(relax.analysis.free_vars(func.body.body))
    return [var for var in closure if var in read]


def _views_only(var, closure: dict, param) -> bool:
    """Whether `var` is the position through views and casts alone (a table would be the position)."""
    value = closure[var]
    while isinstance(value, relax.Call) and value.op.name in _VIEWS:
        arg = value.args[0]
        if arg.same_as(param):
            return True
        value = closure.get(arg)
    return False


def _tables(mod, func, param, closure: dict, frontier: list, bound: int) -> list:
    """Per frontier variable its value at every position, stacked: (bound, *its shape)."""
    from tvm.relax.pipeline import default_build_pipeline

    position = relax.Var("position", param.ty)
    copies = {param: position}
    builder = relax.BlockBuilder()
    with builder.function("tables", [position]):
        with builder.dataflow():
            for var, call in closure.items():
                args = [_copied(arg, copies, builder) for arg in call.args]
                copies[var] = builder.emit(relax.Call(call.op, args, call.attrs, call.ty_args, call.span))
            out = builder.emit_output(relax.Tuple([copies[var] for var in frontier]))
        builder.emit_func_output(out)
    small = builder.get()
    for gvar, other in mod.functions.items():
        if gvar.name_hint != "main":
            small[gvar] = other
    run = relax.VirtualMachine(tvm.compile(small, target="llvm", relax_pipeline=default_build_pipeline()),
                               tvm.cpu())["tables"]
    shape, kind = static_shape(param), dtype_of(param)
    rows = [[r.numpy() for r in run(tvm.runtime.tensor(np.full(shape, i, kind)))] for i in range(bound)]
    return [np.stack([row[k] for row in rows]) for k in range(len(frontier))]


def _copied(expr, copies: dict, builder):
    if isinstance(expr, relax.Var):
        return copies.get(expr, expr)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_copied(field, copies, builder) for field in expr.fields])
    return expr


@relax.expr_functor.mutator
class _Lookup(relax.PyExprMutator):
    """Each frontier variable bound to its table's row at the position instead."""

    def __init__(self, param, tables: dict):
        super().__init__()
        self.param, self.tables = param, tables
        self.looked_up = []  # (table, the variable holding its row)

    def visit_var_binding_(self, binding):
        table = self.tables.get(binding.var)
        if table is None:
            return super().visit_var_binding_(binding)
        same = next((var for seen, var in self.looked_up if seen.shape == table.shape and np.array_equal(seen, table)),
                    None)  # RoPE's q and k of every layer read the same cos and sin: one lookup each
        if same is None:
            bb = self.builder_
            index = bb.emit(relax.op.reshape(self.param, (1,)))
            row = bb.emit(relax.op.take(relax.const(table, str(table.dtype)), index, axis=0))
            same = bb.emit(relax.op.reshape(row, table.shape[1:]))
            self.looked_up.append((table, same))
        self.set_var_remap(binding.var, same)


def tabulate_prefix(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` whose main computes the float tensors it derives from a bounded symbolic length s
    alone (a prefill's RoPE cos and sin of arange(s): `cos(arange(s).float() * inverse)`) as
    the first s rows of a table computed for the bound: a view of its first bytes (R.memory.view,
    the axes before s being 1), instead of the host's arange, astype, concat, cos and sin.
    A tensor is tabulated only when, computed at a short length, it is the table's prefix (no
    reduction over s) and the table is at most MAX_TABLE_BYTES; `mod` itself when none is."""
    func = mod["main"]
    bounds = {str(k): int(v) for k, v in dict((func.attrs or {}).get("tir_var_upper_bound", {})).items()}
    if not bounds:
        return mod
    bound_values = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    closure = _length_closure(bound_values, bounds)
    frontier = []
    for var in _frontier(func, bound_values, closure):
        if not hasattr(var.ty, "shape"):  # a split read whole: its parts stay as they are
            continue
        axes = [axis for axis, dim in enumerate(var.ty.shape.values) if isinstance(dim, tvm.tirx.Var)]
        rest = [dim for dim in var.ty.shape.values if not isinstance(dim, tvm.tirx.Var)]
        leading = var.ty.shape.values[:axes[0]] if len(axes) == 1 else ()
        if dtype_of(var).startswith("float") and len(axes) == 1 and all(isinstance(d, tvm.tirx.IntImm) for d in rest) \
                and all(int(d) == 1 for d in leading):  # the first s rows are the table's first bytes: a view
            length = var.ty.shape.values[axes[0]]
            if bounds[length.name] * math.prod(int(d) for d in rest) * 4 <= MAX_TABLE_BYTES:
                frontier.append((var, axes[0], length))
    if not frontier:
        return mod
    tables = _prefix_tables(mod, closure, frontier, bounds)
    if not tables:
        return mod
    rewriter = _Prefix(tables)
    out = mod.clone()
    out["main"] = relax.analysis.remove_all_unused(rewriter.visit_expr(func))
    return relax.transform.Normalize()(out)


def _length_closure(bound_values: dict, bounds: dict) -> dict:
    """var -> call for the bindings computed from constants, shapes and bounded lengths alone."""
    closure = {}

    def free(expr) -> bool:
        if isinstance(expr, relax.Var):  # a tensor, or a length (one class in TVM 0.27)
            return isinstance(bound_values.get(expr), tvm.ir.GenericConst) or expr in closure or (
                expr not in bound_values and str(expr.name) in bounds and not hasattr(expr.ty, "shape"))
        if isinstance(expr, relax.Tuple):
            return all(free(field) for field in expr.fields)
        if isinstance(expr, relax.ShapeExpr):
            return all(isinstance(d, tvm.tirx.IntImm) or (isinstance(d, tvm.tirx.Var) and d.name in bounds)
                       for d in expr.values)
        return isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm, tvm.ir.GenericConst))

    for var, value in bound_values.items():
        # A split's parts too (GPT-J's torch.split of its sincos rows into sin and cos): the
        # tuple and each part read from it, so that the frontier is what the layers read.
        if isinstance(value, relax.TupleGetItem) and value.tuple_value in closure:
            closure[var] = value
        elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name not in (
                "relax.call_pure_packed", "relax.tensor_to_shape") and (
                hasattr(var.ty, "shape") or value.op.name == "relax.split") \
                and all(free(arg) for arg in value.args):
            closure[var] = value
    return closure


def _prefix_tables(mod, closure: dict, frontier: list, bounds: dict) -> dict:
    """var -> (table at the bound, axis, length) for each frontier variable whose value at a
    short length is the table's prefix; the closure built once for llvm per length."""
    from tvm.relax.pipeline import default_build_pipeline

    lengths = list({str(length.name): length for _, _, length in frontier}.values())
    params = [relax.Var(f"length_{n.name}", relax.TensorType([n], "int64")) for n in lengths]  # defines n
    needed = _ancestors(closure, [var for var, _, _ in frontier])
    builder = relax.BlockBuilder()
    with builder.function("tables", params):
        with builder.dataflow():
            copies = {}
            for var, call in closure.items():
                if var not in needed:  # (an encoder's bool padding mask: llvm need not build it)
                    continue
                if isinstance(call, relax.TupleGetItem):
                    copies[var] = builder.emit(relax.TupleGetItem(copies[call.tuple_value], call.index))
                    continue
                args = [_copied(arg, copies, builder) for arg in call.args]
                copies[var] = builder.emit(relax.Call(call.op, args, call.attrs, call.ty_args, call.span))
            out = builder.emit_output(relax.Tuple([copies[var] for var, _, _ in frontier]))
        builder.emit_func_output(out)
    small = tvm.IRModule({gvar: f for gvar, f in mod.functions.items() if gvar.name_hint != "main"})
    small["tables"] = builder.get()["tables"]
    try:
        run = relax.VirtualMachine(tvm.compile(small, target="llvm", relax_pipeline=default_build_pipeline()),
                                   tvm.cpu())["tables"]
        values = {which: [r.numpy() for r in run(*[tvm.runtime.tensor(np.zeros(
            bounds[n.name] if which == "bound" else min(bounds[n.name], 3), "int64")) for n in lengths])]
            for which in ("bound", "short")}
    except Exception:  # noqa: BLE001 (TVM raises several types) another symbolic variable among them: left as it was
        return {}
    tables = {}
    for (var, axis, length), table, short in zip(frontier, values["bound"], values["short"]):
        prefix = np.take(table, range(short.shape[axis]), axis=axis)
        if prefix.shape == short.shape and np.array_equal(prefix, short):
            tables[var] = (table, axis, length)
    return tables


def _ancestors(closure: dict, roots: list) -> set:
    """The closure's variables `roots` are computed from, the roots included."""
    seen, stack = set(), list(roots)
    while stack:
        var = stack.pop()
        if var in seen or var not in closure:
            continue
        seen.add(var)
        call = closure[var]
        args = [call.tuple_value] if isinstance(call, relax.TupleGetItem) else list(call.args)
        for arg in args:
            stack += list(arg.fields) if isinstance(arg, relax.Tuple) else [arg]
    return seen


@relax.expr_functor.mutator
class _Prefix(relax.PyExprMutator):
    """Each tabulated variable bound to its table's first `length` rows instead."""

    def __init__(self, tables: dict):
        super().__init__()
        self.tables = tables
        self.sliced = []  # (table, axis, the variable holding its prefix)

    def visit_var_binding_(self, binding):
        entry = self.tables.get(binding.var)
        if entry is None:
            return super().visit_var_binding_(binding)
        table, axis, length = entry
        same = next((var for seen, at, var in self.sliced if at == axis and seen.shape == table.shape
                     and np.array_equal(seen, table)), None)
        if same is None:
            shape = [length if at == axis else extent for at, extent in enumerate(table.shape)]
            same = self.builder_.emit(relax.op.memory.view(relax.const(table, str(table.dtype)), relax.ShapeExpr(shape),
                                                           str(table.dtype), tvm.tirx.IntImm("int64", 0)))
            self.sliced.append((table, axis, same))
        self.set_var_remap(binding.var, same)


def scale_prefix_tables(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` whose multiplies of a table prefix (`tabulate_prefix`'s view, through reshapes) by a
    constant row (normalise/rotations.py's signs on RoPE's sine at a symbolic length) are a view of
    the product table, computed once here in float32 (the rounding the NPU's multiply makes): one
    small kernel less per prefill."""
    mutator = _ScaledPrefix(mod)
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function) and "Composite" not in (func.attrs or {}):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return relax.transform.DeadCodeElimination()(mutator.builder_.get())


@relax.expr_functor.mutator
class _ScaledPrefix(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if getattr(call.op, "name", "") != "relax.multiply":
            return call
        shape = list(call.ty.shape.values) if hasattr(call.ty, "shape") and call.ty.shape is not None else []
        for table_side, row in (call.args, reversed(call.args)):
            table = self._prefix_table(table_side)
            scale = row.value.numpy() if isinstance(row, tvm.ir.GenericConst) else None
            if table is None or scale is None or scale.dtype != table.dtype or scale.ndim == 0 or \
                    scale.size != table.shape[-1] or any(d != 1 for d in scale.shape[:-1]) or \
                    str(table_side.ty.shape) != str(call.ty.shape):
                continue
            product = (table * scale.reshape(-1)).astype(table.dtype)
            return relax.op.memory.view(relax.const(product, str(product.dtype)), relax.ShapeExpr(shape),
                                        str(product.dtype), tvm.tirx.IntImm("int64", 0))
        return call

    def _prefix_table(self, expr):
        """The constant table whose first bytes `expr` views (a memory.view at offset 0, through
        reshapes), else None."""
        for _ in range(4):
            value = self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr
            name = getattr(getattr(value, "op", None), "name", "")
            if name == "relax.reshape":
                expr = value.args[0]
                continue
            if name == "relax.memory.view" and isinstance(value.args[0], tvm.ir.GenericConst):
                offset = value.args[3] if len(value.args) > 3 else 0
                while hasattr(offset, "value"):  # a PrimValue of an IntImm
                    offset = offset.value
                return value.args[0].value.numpy() if isinstance(offset, int) and offset == 0 else None
            return None
        return None
