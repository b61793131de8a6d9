"""What a mask computed from a symbolic length alone holds, proven for every length.

Stage: normalise (a helper of softmaxes.py and causal_masks.py). In: a boolean Relax expression
that reads no function input, only the symbolic length (Hugging Face's causal mask of a model
given `input_ids` alone: arange, the packed-sequence check's slices, concat, cumsum and compares,
index_tensor, bitwise_and). Out: whether every row keeps its diagonal entry, or whether it is the
causal pattern `j <= i`, proven for every length.

How: `element` writes the expression's element at symbolic indices as one TIR expression (a
select per concat, the index maps of the views, slices and lookups substituted), and TVM's
analyzer proves the claim with its Z3 fallback (ProofStrength.SYMBOLIC_BOUND), every index in
[0, extent). No claim is taken on evidence: an op outside the table below, a constant that is not
one value, or a claim the prover cannot show leaves the graph as it was.

softmaxes.py drops the safe softmax's guard for a mask that keeps every row's diagonal;
`causal_masks_pass` computes a mask proven causal as `where(less_equal(j, i), 0, -inf)` from one
arange, once for all layers (Hugging Face builds it from the packed-sequence check's slices, a
concat, a cumsum, four index_tensors, three compares and two ands, then a where per layer).

Why: a static compile folds the mask into a constant whose rows softmaxes.py can check; with a
symbolic length it is computed at run time, so the safe softmax's guard and the mask's (s, s)
arithmetic stayed on the host, both growing with s².
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, sym, tirx

from ..relax_info import dtype_of, shape_dims
from .chain_match import Chain
from .rewrite import as_pass, rewrite_calls, rewrite_functions

_DEPTH = 48
FLT_MIN = float(np.finfo(np.float32).min)
_WHERE = tvm.ir.Op.get("relax.where")
_COMPARE = {"relax.less": tirx.LT, "relax.less_equal": tirx.LE, "relax.greater": tirx.GT,
            "relax.greater_equal": tirx.GE, "relax.equal": tirx.EQ, "relax.not_equal": tirx.NE}
_ARITHMETIC = {"relax.add": lambda a, b: a + b, "relax.subtract": lambda a, b: a - b,
               "relax.multiply": lambda a, b: a * b}
_LOGIC = {"relax.bitwise_and": tirx.And, "relax.logical_and": tirx.And, "relax.bitwise_or": tirx.Or,
          "relax.logical_or": tirx.Or}


def _kind(expr) -> str:
    """A PrimExpr's dtype as a string ("bool", "int64")."""
    return str(expr.ty)


def _i64(value) -> tirx.PrimExpr:
    return tirx.IntImm("int64", int(value))


def _dim(d) -> tirx.PrimExpr:
    return _i64(d) if isinstance(d, int) else d.astype("int64")


def _ints(expr) -> list:
    values = getattr(expr, "fields", None) or getattr(expr, "values", None) or expr
    return [int(getattr(getattr(v, "value", v), "value", getattr(v, "value", v))) for v in values]


def _operand_index(index: list, out_rank: int, dims) -> list:
    """The index into a broadcast operand of shape `dims` (right-aligned, its unit axes 0)."""
    skip = out_rank - len(dims)
    return [_i64(0) if isinstance(d, int) and d == 1 else index[a + skip] for a, d in enumerate(dims)]


class Elements:
    """Elements of boolean and integer expressions at symbolic indices (module docstring)."""

    def __init__(self, chain: Chain):
        self.chain = chain

    def element(self, expr, index: list, depth: int = 0):
        """The element of `expr` at `index` (int64 PrimExprs) as a PrimExpr (bool or int64),
        else None."""
        if depth > _DEPTH or dtype_of(expr) not in ("bool", "int32", "int64"):
            return None
        array = self.chain.array(expr)
        if array is not None:
            if array.size == 0:
                return None
            if not np.all(array == array.reshape(-1)[0]):
                return _progression(array, index)
            value = array.reshape(-1)[0]
            return tirx.const(bool(value), "bool") if array.dtype == bool else _i64(value)
        call = self.chain.value(expr)
        if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)):
            return None
        rule = _RULES.get(call.op.name)
        dims = shape_dims(call)
        if rule is None or dims is None or len(dims) != len(index):
            return None
        return rule(self, call, index, dims, depth + 1)

    def operand(self, expr, index, out_rank: int, depth: int):
        dims = shape_dims(expr)
        return None if dims is None else self.element(expr, _operand_index(index, out_rank, dims), depth)


def _progression(array: np.ndarray, index: list):
    """An integer constant a + b j along its one axis longer than 1 (a table of positions,
    arange(N) as a (1, N) buffer) at `index`, else None."""
    long = [a for a, d in enumerate(array.shape) if d > 1]
    if array.dtype.kind not in "iu" or len(long) != 1 or len(index) != array.ndim:
        return None
    row = array.reshape(-1).astype(np.int64)
    start, step = int(row[0]), int(row[1] - row[0])
    if not np.array_equal(row, start + step * np.arange(row.size, dtype=np.int64)):
        return None
    return _i64(start) + index[long[0]] * _i64(step)


def _gather_elements(elements, call, index, dims, depth):
    """out[.., i, ..] = data[.., indices[.., i, ..], ..] along the axis (data of one value: that
    value, whatever the indices read, which a gather reads inside data: RoBERTa's token types,
    zeros gathered at position ids computed from the input)."""
    data = elements.chain.array(call.args[0])
    if data is not None and data.size and np.all(data == data.reshape(-1)[0]):
        return elements.element(call.args[0], [_i64(0)] * data.ndim, depth)
    at = elements.element(call.args[1], index, depth)
    if at is None or _kind(at) != "int64":
        return None
    inner = list(index)
    inner[int(call.attrs.axis) % len(dims)] = at
    return elements.element(call.args[0], inner, depth)


def _binary(elements, call, index, dims, depth):
    a, b = (elements.operand(arg, index, len(dims), depth) for arg in call.args[:2])
    if a is None or b is None:
        return None
    name = call.op.name
    if name in _COMPARE:
        return _COMPARE[name](a, b) if _kind(a) == _kind(b) == "int64" else None
    if name in _LOGIC:
        return _LOGIC[name](a, b) if _kind(a) == _kind(b) == "bool" else None
    return _ARITHMETIC[name](a, b) if _kind(a) == _kind(b) == "int64" else None


def _arange(elements, call, index, dims, depth):
    start, _, step = (getattr(arg, "value", None) for arg in call.args[:3])
    if start is None or step is None:
        return None
    return _dim(start) + index[0] * _dim(step)


def _astype(elements, call, index, dims, depth):
    value = elements.element(call.args[0], index, depth)
    if value is None:
        return None
    target = dtype_of(call)
    if _kind(value) == "bool":
        return tirx.Select(value, _i64(1), _i64(0)) if target != "bool" else value
    return tirx.NE(value, _i64(0)) if target == "bool" else value


def _not(elements, call, index, dims, depth):
    value = elements.element(call.args[0], index, depth)
    return tirx.Not(value) if value is not None and _kind(value) == "bool" else None


def _where(elements, call, index, dims, depth):
    parts = [elements.operand(arg, index, len(dims), depth) for arg in call.args]
    if any(p is None for p in parts) or _kind(parts[0]) != "bool" or _kind(parts[1]) != _kind(parts[2]):
        return None
    return tirx.Select(*parts)


def _expand_dims(elements, call, index, dims, depth):
    axes = {a % len(dims) for a in _ints(call.attrs.axis)}
    return elements.element(call.args[0], [i for a, i in enumerate(index) if a not in axes], depth)


def _reshape(elements, call, index, dims, depth):
    """A reshape that only adds or drops unit axes."""
    source = shape_dims(call.args[0])
    kept_out = [a for a, d in enumerate(dims) if not (isinstance(d, int) and d == 1)]
    kept_in = [a for a, d in enumerate(source or ()) if not (isinstance(d, int) and d == 1)]
    if source is None or len(kept_in) != len(kept_out) or \
            any(str(source[a]) != str(dims[b]) for a, b in zip(kept_in, kept_out)):
        return None
    inner = [_i64(0)] * len(source)
    for a, b in zip(kept_in, kept_out):
        inner[a] = index[b]
    return elements.element(call.args[0], inner, depth)


def _broadcast(elements, call, index, dims, depth):
    return elements.operand(call.args[0], index, len(dims), depth)


def _permute(elements, call, index, dims, depth):
    axes = call.attrs.axes
    axes = list(reversed(range(len(dims)))) if axes is None else [int(a) % len(dims) for a in axes]
    inner = [None] * len(dims)
    for out_axis, in_axis in enumerate(axes):
        inner[in_axis] = index[out_axis]
    return elements.element(call.args[0], inner, depth)


def _strided_slice(elements, call, index, dims, depth):
    source = shape_dims(call.args[0])
    args = list(call.args[1:])
    if source is None or len(args) < 3 or any(not isinstance(a, (relax.Tuple, relax.ShapeExpr)) for a in args[:3]):
        return None
    axes, begins = _ints(args[0]), _ints(args[1])
    steps = _ints(args[3]) if len(args) > 3 and args[3] is not None else [1] * len(axes)
    inner = list(index)
    for axis, begin, step in zip(axes, begins, steps):
        axis %= len(source)
        if step <= 0:
            return None
        start = _dim(source[axis]) + begin if begin < 0 else _i64(begin)
        inner[axis] = start + index[axis] * step
    return elements.element(call.args[0], inner, depth)


def _concat(elements, call, index, dims, depth):
    fields = getattr(elements.chain.value(call.args[0]), "fields", None)
    if not fields:
        return None
    axis = int(call.attrs.axis) % len(dims)
    parts, offset = [], _i64(0)
    for field in fields:
        inner = list(index)
        inner[axis] = index[axis] - offset
        value = elements.element(field, inner, depth)
        if value is None:
            return None
        offset = offset + _dim(shape_dims(field)[axis])
        parts.append((index[axis] < offset, value))
    result = parts[-1][1]
    for condition, value in reversed(parts[:-1]):
        result = tirx.Select(condition, value, result)
    return result


def _index_tensor(elements, call, index, dims, depth):
    """x[i0, i1, ...] with index tensors broadcast together (numpy's advanced indexing in front)."""
    indices = getattr(elements.chain.value(call.args[1]), "fields", None)
    source = shape_dims(call.args[0])
    if not indices or source is None:
        return None
    lead = len(dims) - (len(source) - len(indices))
    inner = [elements.operand(i, index[:lead], lead, depth) for i in indices]
    if any(i is None or _kind(i) != "int64" for i in inner):
        return None
    return elements.element(call.args[0], inner + list(index[lead:]), depth)


def _cumsum(elements, call, index, dims, depth):
    """A running sum of an operand proven zero everywhere is zero."""
    anywhere = [tirx.Var(f"c{a}", "int64") for a in range(len(dims))]
    operand = elements.element(call.args[0], anywhere, depth)
    if operand is None or _kind(operand) != "int64":
        return None
    return _i64(0) if prove(tirx.EQ(operand, _i64(0)), anywhere, dims) else None


_RULES = {**{name: _binary for name in (*_COMPARE, *_ARITHMETIC, *_LOGIC)},
          "relax.arange": _arange, "relax.astype": _astype, "relax.logical_not": _not, "relax.where": _where,
          "relax.expand_dims": _expand_dims, "relax.reshape": _reshape, "relax.broadcast_to": _broadcast,
          "relax.permute_dims": _permute, "relax.strided_slice": _strided_slice, "relax.concat": _concat,
          "relax.index_tensor": _index_tensor, "relax.cumsum": _cumsum, "relax.gather_elements": _gather_elements}


def prove(claim, index: list, dims) -> bool:
    """Whether `claim` holds for every `index` inside `dims` (each index var in [0, extent), each
    symbolic extent at least 1). The ranges are constraints, not bindings: bound to a range of
    symbolic extent, a variable is not seen by the Z3 fallback."""
    ranges = [tirx.all(var >= 0, var < _dim(extent)) for var, extent in zip(index, dims)]
    ranges += [var >= 1 for var in tirx.analysis.undefined_vars(claim) if not any(var.same_as(i) for i in index)]
    analyzer = sym.Analyzer()
    with analyzer.constraint_scope(tirx.all(*ranges) if ranges else tirx.const(True, "bool")):
        return bool(analyzer.can_prove(claim, sym.ProofStrength.SYMBOLIC_BOUND))


def _square_rows(expr):
    """(dims, row index, column index) of a boolean (.., s, s) tensor, else None."""
    dims = shape_dims(expr)
    if dims is None or len(dims) < 2 or isinstance(dims[-1], int) or str(dims[-1]) != str(dims[-2]) \
            or dtype_of(expr) != "bool":
        return None
    index = [tirx.Var(f"i{a}", "int64") for a in range(len(dims))]
    return dims, index


def keeps_diagonal(chain: Chain, mask) -> bool:
    """Whether the boolean (.., s, s) `mask` keeps entry (i, i) of every row, for every length."""
    square = _square_rows(mask)
    if square is None:
        return False
    dims, index = square
    diagonal = index[:-1] + [index[-2]]
    value = Elements(chain).element(mask, diagonal)
    return value is not None and prove(value, index[:-1], dims[:-1])


def is_causal(chain: Chain, mask) -> bool:
    """Whether the boolean (.., s, s) `mask` is j <= i at row i, column j, for every length."""
    square = _square_rows(mask)
    if square is None:
        return False
    dims, index = square
    value = Elements(chain).element(mask, index)
    if value is None:
        return False
    causal = index[-1] <= index[-2]
    return prove(tirx.Or(tirx.And(value, causal), tirx.And(tirx.Not(value), tirx.Not(causal))), index, dims)


def causal_masks_built_from_length(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every additive mask where(b, 0, -inf) whose b is proven causal (`is_causal`)
    computed as where(less_equal(j, i), 0, -inf) from one arange, once for every layer."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _CausalRewriter))


causal_masks_pass = as_pass(causal_masks_built_from_length, "cgra.CausalMasksFromLength", ops=("relax.where",))


@relax.expr_functor.mutator
class _CausalRewriter(relax.PyExprMutator):
    def __init__(self, mod=None):
        super().__init__(mod)
        self.masks = {}  # (the mask's shape, kept value) -> its additive mask, in this block

    def visit_dataflow_block_(self, block):
        self.masks = {}
        return super().visit_dataflow_block_(block)

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_WHERE)) or dtype_of(call) != "float32":
            return call
        chain = Chain(self)
        cond, kept, masked = call.args[0], chain.scalar(call.args[1]), chain.scalar(call.args[2])
        dims = shape_dims(call)
        # float32's minimum (Bloom's) is -inf here: every row keeps its diagonal key, so a masked
        # score x + min rounds to min (|x| < 2^103) and exp(min - max) is +0, as exp(-inf - max)
        # (normalise/finite_masks.py states it whole; there a padding row may mask a row whole)
        finite_min = masked == FLT_MIN and kept == 0.0
        if kept is None or (masked != -np.inf and not finite_min) or not np.isfinite(kept) or dims is None \
                or str(dims) != str(shape_dims(cond)) or not is_causal(chain, cond):
            return call
        key = (str(dims), kept)
        if key not in self.masks:
            self.masks[key] = self._causal(dims, kept)
        return self.masks[key]

    def _causal(self, dims, kept: float):
        emit = self.builder_.emit
        length = dims[-1]
        positions = emit(relax.op.arange(tirx.IntImm("int64", 0), length.astype("int64"), tirx.IntImm("int64", 1),
                                         dtype="int64"))
        rows = emit(relax.op.reshape(positions, relax.ShapeExpr([length, 1])))
        columns = emit(relax.op.reshape(positions, relax.ShapeExpr([1, length])))
        causal = emit(relax.op.less_equal(columns, rows))
        additive = emit(relax.op.where(causal, relax.const(np.float32(kept)), relax.const(np.float32(-np.inf))))
        return emit(relax.op.reshape(additive, relax.ShapeExpr(list(dims))))


def keeps_everything(chain: Chain, mask) -> bool:
    """Whether the boolean `mask` (symbolic extents) is true at every index, for every length (an
    encoder's padding mask given `input_ids` alone: arange(s) + 0 >= 0, broadcast to (s, s))."""
    dims = shape_dims(mask)
    if dims is None or dtype_of(mask) != "bool" or all(isinstance(d, int) for d in dims):
        return False
    index = [tirx.Var(f"i{a}", "int64") for a in range(len(dims))]
    value = Elements(chain).element(mask, index)
    return value is not None and _kind(value) == "bool" and prove(value, index, dims)


def open_masks_dropped(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every x + where(b, 0, m) whose b keeps everything (`keeps_everything`) and whose
    sum has x's shape as x: the mask adds 0 to every score (x + 0 is x, a -0 read as +0, which
    no softmax tells apart)."""
    return relax.transform.DeadCodeElimination()(rewrite_calls(mod, "relax.add", _open_add))


open_masks_pass = as_pass(open_masks_dropped, "cgra.OpenMasks", ops=("relax.where",))


def _open_add(mutator, call):
    """The operand of `call` (an add) that the other, an open mask, leaves as it is; else None."""
    chain = Chain(mutator)
    if dtype_of(call) != "float32":
        return None
    for kept, mask in ((call.args[0], call.args[1]), (call.args[1], call.args[0])):
        where = chain.call(mask, "relax.where")
        if where is None or dtype_of(where) != "float32" or chain.scalar(where.args[1]) != 0.0 or \
                str(shape_dims(kept)) != str(shape_dims(call)) or dtype_of(kept) != "float32":
            continue
        if keeps_everything(chain, where.args[0]):
            return kept
    return None
