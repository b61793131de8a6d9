"""A (.., s, s) tensor computed from a symbolic length alone as the top-left box of a constant.

Stage: normalise (before softmaxes.py and attentions.py). In: a Relax IRModule whose functions
have a symbolic length s with an upper bound T (`tir_var_upper_bound`: torch.export's
`Dim("s", max=T)`). Out: the same module in which each float32 tensor of shape (A.., s, s) (A
static) that is computed from s alone (arange(0, s), constants, elementwise ops, comparisons,
where, casts, views, a take from a constant table: T5's relative-position bias, its bucket graph
of int64 arithmetic, log, where and a lookup, then its open padding mask) and read by anything
else is

    strided_slice(B, axes [-2, -1], begin [0, 0], end [s, s])    B the (A.., T, T) float32 constant

the box the kernels read (kernels/attention/length_rows.py's box patterns: the symbolic
attention adds it to its scores, a DMA box of B per query tile).

Exact: B is the tensor at s = T, computed by the same TVM operators built for llvm as the host
would run them (fold_constants.py's machinery, the bindings copied into a function of their own
with s a parameter's length), and the tensor at every length n from the lower bound to T is
checked to be B's top-left n x n box bit for bit (every length while H T^3 / 3 elements take
at most CHECKED; past that, each length up to 64 and a ladder of the others, then the rewrite
rests on the ops being position-wise, which the allowed operators are: none mixes two
positions but a take's lookup by one position's index). A tensor whose box differs at a length
stays as it was.

Only finite B are taken: a mask with -inf entries (a causal one, which length_masks.py and the
kernel's own pattern build whole) stays as it is; and only up to MAX_BYTES of B (the bias is
read by DMA from DRAM: H x T x T x 4 bytes).

Why: under a symbolic length T5's bias (arange, int64 arithmetic, log, where, a lookup of s * s
indices) and, as it is no constant, its layers' safe-softmax guards ran on the host: 31 host
compute ops, where the static-length model folds the bias to a constant and runs none.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx

from ..relax_info import dtype_of, shape_dims
from .length_rows import module_bounds
from .rewrite import as_pass

#: The largest box table taken, in bytes: 4 heads at a bound of 512 (4 MiB of DRAM); past it the
#: tensor stays on the host.
MAX_BYTES = 4 << 20
#: Elements computed to check every length from the lower bound to T (H T^3 / 3 at most): 4 heads
#: up to T = 145; past it a ladder of lengths (every length took 6 / 23 s of T5's compile at T =
#: 256 / 512 under load; the ladder 1 / 2 s).
CHECKED = 1 << 22
#: Operators whose value at a position reads the same position of their operands (or a lookup
#: by it), the length's arange, and views: what a tensor of the length alone is computed by.
_OPS = frozenset("relax." + name for name in (
    "arange", "add", "subtract", "multiply", "divide", "floor_divide", "floor_mod", "power", "minimum", "maximum",
    "abs", "negative", "log", "exp", "sqrt", "floor", "ceil", "round", "sign", "tanh", "sigmoid", "clip",
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_or",
    "logical_not", "where", "astype", "full_like", "zeros_like", "ones_like", "reshape", "expand_dims", "squeeze",
    "permute_dims", "broadcast_to", "take"))


def length_boxes(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with each tensor of a bounded symbolic length alone as a constant's box (module doc)."""
    bounds = module_bounds(mod)
    lowers = _lower_bounds(mod)
    updates = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function) and bounds:
            boxes = _boxes(func, bounds, lowers)
            if boxes:
                updates[gvar] = _Boxed(mod, boxes).visit_expr(func)
    if not updates:
        return mod
    mod = mod.clone()
    for gvar, func in updates.items():
        mod[gvar] = func
    return relax.transform.DeadCodeElimination()(mod)


length_boxes_pass = as_pass(length_boxes, "cgra.LengthBoxes", ops=("relax.arange",))


def _lower_bounds(mod) -> dict:
    lowers = {}
    for func in mod.functions.values():
        attrs = getattr(func, "attrs", None)
        if isinstance(func, relax.Function) and attrs is not None and "tir_var_lower_bound" in attrs:
            lowers.update({str(name): int(bound) for name, bound in attrs["tir_var_lower_bound"].items()})
    return lowers


def _box_length(var):
    """s when `var` is float32 of shape (A.., s, s), A static and s a variable, else None."""
    dims = shape_dims(var)
    if dtype_of(var) != "float32" or not dims or len(dims) < 2 or not isinstance(dims[-1], tirx.Var) or \
            not isinstance(dims[-2], tirx.Var) or not dims[-1].same_as(dims[-2]) or \
            not all(isinstance(d, int) for d in dims[:-2]):
        return None
    return dims[-1]


def _length_only(func) -> dict:
    """var -> value of the bindings computed from constants and symbolic shapes alone by `_OPS`."""
    found = {}

    def free(expr) -> bool:
        if isinstance(expr, relax.Var) and not isinstance(getattr(expr, "ty", None), tvm.ir.PrimType):
            return expr in found
        if isinstance(expr, relax.Tuple):
            return all(free(field) for field in expr.fields)
        # (a constant, a shape, a symbolic value: TIR variables are Relax Vars of a PrimType here)
        return isinstance(expr, (tvm.ir.GenericConst, relax.ShapeExpr, tvm.ir.expr.ExprWithOp))

    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, tvm.ir.GenericConst) or (
                    isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in _OPS
                    and all(free(arg) for arg in value.args)):
                found[binding.var] = value
    return found


def _readers(func, inside: dict) -> set:
    """The variables of `inside` that a binding outside it (or the function's result) reads."""
    read = set()

    def visit(expr):
        if isinstance(expr, relax.Var) and expr in inside:
            read.add(expr)

    for block in func.body.blocks:
        for binding in block.bindings:
            if binding.var not in inside:
                relax.analysis.post_order_visit(binding.value, visit)
    relax.analysis.post_order_visit(func.body.body, visit)
    return read


def _boxes(func, bounds: dict, lowers: dict) -> dict:
    """var -> (its constant table B, the length) for the tensors the module doc rewrites."""
    inside = _length_only(func)
    candidates = [var for var in _readers(func, inside) if _box_length(var) is not None
                  and isinstance(inside[var], relax.Call)]
    by_length = {}
    for var in candidates:
        length = _box_length(var)
        bound = bounds.get(str(length.name))
        lead = int(np.prod([int(d) for d in shape_dims(var)[:-2]], dtype=np.int64))
        if bound is not None and 1 <= bound and lead * bound * bound * 4 <= MAX_BYTES:
            by_length.setdefault(length, []).append(var)
    boxes = {}
    for length, variables in by_length.items():
        bound, lower = bounds[str(length.name)], max(1, lowers.get(str(length.name), 1))
        values = _evaluator(func, inside, variables, length)
        if values is None:
            continue
        tables = values(bound)
        kept = [i for i, table in enumerate(tables) if np.isfinite(table).all()]
        for n in checked_lengths(lower, bound, max(t.size // (bound * bound) for t in tables)):
            if not kept:
                break
            at = values(n)
            kept = [i for i in kept if np.array_equal(at[i], tables[i][..., :n, :n])]
        for i in kept:  # (one constant for equal tables: T5's layers each compute the same bias)
            same = [table for table, _ in boxes.values() if np.array_equal(table, tables[i])]
            boxes[variables[i]] = (same[0] if same else np.ascontiguousarray(tables[i]), length)
    return boxes


def checked_lengths(lower: int, bound: int, lead: int) -> list:
    """The lengths the box is checked at (module doc): every one from `lower` to `bound` while
    lead * bound^3 / 3 elements are at most CHECKED, else those up to 64, then a ladder."""
    if lead * bound ** 3 // 3 <= CHECKED:
        return list(range(lower, bound))
    ladder = {n for n in range(lower, min(bound, 65))} | {bound - 1}
    n = 64
    while n < bound:
        ladder |= {n - 1, n, n + 1}
        n += max(1, n // 8)
    return sorted(x for x in ladder if lower <= x < bound)


def _evaluator(func, inside: dict, outputs: list, length):
    """A function n -> [the outputs' numpy values at s = n], the bindings they need copied into a
    function whose parameter's length is s, built once for llvm; None if it cannot be built."""
    from tvm.relax.pipeline import default_build_pipeline

    needed, order = set(), []

    def need(var):
        if var in needed or var not in inside:
            return
        needed.add(var)
        relax.analysis.post_order_visit(inside[var], lambda e: need(e) if e in inside else None)

    for var in outputs:
        need(var)
    order = [var for var in inside if var in needed]
    copies = {}

    def copied(expr):
        if isinstance(expr, relax.Var) and expr in copies:
            return copies[expr]
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([copied(field) for field in expr.fields])
        return expr

    builder = relax.BlockBuilder()
    probe = relax.Var("probe", relax.TensorType([length], "int8"))
    try:
        with builder.function("boxes", [probe]):
            with builder.dataflow():
                for var in order:
                    value = inside[var]
                    copies[var] = builder.emit(value if not isinstance(value, relax.Call) else
                                               relax.Call(value.op, [copied(a) for a in value.args], value.attrs,
                                                          value.ty_args))
                out = builder.emit_output(relax.Tuple([copies[var] for var in outputs]))
            builder.emit_func_output(out)
        executable = tvm.compile(builder.get(), target="llvm", relax_pipeline=default_build_pipeline())
    except (tvm.error.TVMError, ValueError):
        return None
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return lambda n: [r.numpy() for r in vm["boxes"](tvm.runtime.tensor(np.zeros(n, "int8")))]


def box_table(chain, expr) -> np.ndarray | None:
    """The constant B of `expr` = box_of(B, s) (through the variable it is bound to), else None."""
    call = chain.call(expr, "relax.strided_slice")
    if call is None or len(call.args) < 4:
        return None
    table = chain.array(call.args[0])
    dims = shape_dims(expr)
    if table is None or table.ndim < 2 or dims is None or len(dims) != table.ndim:
        return None
    axes, begin, end = (_values(arg) for arg in call.args[1:4])
    rank = table.ndim
    if axes is None or [a % rank for a in axes] != [rank - 2, rank - 1] or begin != [0, 0] or end is None or \
            len(end) != 2 or not all(str(e) == str(dims[-1]) for e in end) or str(dims[-1]) != str(dims[-2]):
        return None
    return table


def _values(arg):
    values = getattr(arg, "fields", None) or getattr(arg, "values", None)
    if values is None:
        return None
    out = []
    for value in values:
        value = getattr(value, "value", value)
        out.append(int(value.value) if isinstance(value, tirx.IntImm) else
                   int(value) if isinstance(value, int) else value)
    return out


@relax.expr_functor.mutator
class _Boxed(relax.PyExprMutator):
    """Each boxed variable's binding as the box of its table."""

    def __init__(self, mod, boxes: dict):
        super().__init__(mod)
        self.boxes, self.constants = boxes, {}

    def visit_var_binding_(self, binding):
        found = self.boxes.get(binding.var)
        if found is None:
            return super().visit_var_binding_(binding)
        table, length = found
        constant = self.constants.setdefault(id(table), relax.const(table))
        rank = table.ndim
        value = self.builder_.normalize(relax.op.strided_slice(constant, [rank - 2, rank - 1], [0, 0],
                                                               [length, length], assume_inbound=True))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, value))
