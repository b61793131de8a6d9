"""A boolean attention mask's arithmetic as float32 {0, 1} arithmetic the NPU runs.

Stage: normalise (after softmaxes.py, before scalars.py). In: a Relax IRModule. Out: the same
module in which every

    where(b, 0.0, y)        y a negative constant (-inf or a finite one: Bloom's float32 min)
    astype(b, "float32")        astype(b, "int32")

whose boolean `b` is built from constants and integer casts by the ops below is computed from
`b`'s twin B, a float32 (or int32) tensor holding 1 where b is true and +0 where it is false:

    b                                   B
    a constant                          the constant as float32
    astype(x, "bool"), x int32, int64   per 32-bit word w of x (an int64 viewed as pairs of words,
                                        little-endian), as float32 max(n, -1) * -0x3F800000
                                        viewed as float32, n = min(max(w, 0) * -1, w) = -|w| (an
                                        int32 chain, no overflow), an int64's pair's maximum (a row
                                        max): two kernels; as int32 N, the maximum over the words
                                        of max(s, -s), s = max(min(w, 1), -1)
    not_equal(x, c), c an int constant  N of the words of x - c (wrapping int32 subtracts)
    equal(x, c)                         1 - that
    bitwise_and / logical_and(a, c)     A * C
    bitwise_or / logical_or(a, c)       maximum(A, C)
    logical_not / bitwise_not(a)        1 - A
    reshape, expand_dims, broadcast_to, permute_dims, squeeze of a: the same op on A

A cumsum of an int32 twin along its last axis (RoBERTa's position ids: cumsum(ids != pad)) is
a matmul: B's low bytes (int8: a view, a strided slice) times the n x n upper triangle of ones,
int8 x int8 -> int32 on the PE array; exact, as every product is 0 or 1 and integer sums do not
round (n^2 MACs a row, counted as the model's). A scan on the vector unit would take n ELTWISE
adds a row; the matmul is one GEMM kernel and sums in any order as exactly.

where(b, 0, -inf) of such a cast (HF's padding row) skips B: -2^127's bits where a word is zero,
the pair's maximum times 4 (-inf where both are: two kernels, `padding_row`; an int32's -inf's
bits, one). Else where(b, 0, y) = (B - 1) * -y (B - 1 is -1 or +0), for y = -inf (B - 1) * 2 * FLT_MAX
(-2 * FLT_MAX overflows to -inf, 0 * FLT_MAX is 0); astype(b, "float32" or "int32") = B.
where(c & r, 0, -inf) of a constant c and a run-time r is where(c, 0, -inf) (a constant) plus
r's select on r's own shape: HF's causal triangle and padding row make the s x s mask in one add.

Exact: every value above is 0, 1 or -1 until the last step, and each step's float32 result is
exactly the integer one; an int64 is nonzero exactly when one of its words is, a word minus
c's word (wrapping) is 0 exactly where they are equal, and the clamps cannot overflow. The twins are shared: a mask every layer reads is computed once. The
views and slices are layout (no arithmetic): the int64 input's words are read by the NPU's DMA,
which computes no int64.

What stays: `where(kept, softmax(x), 0)`, the guard of a padding-masked softmax and
the `greater` that makes `kept`, are the attention op's to fold (softmaxes.py).

Why: HF's decoders build their padding mask as `causal & mask[None, None, None, :]` and turn it
into an additive mask with `where(m, 0, -inf)` in every layer: bitwise_and, where x layers and an
astype per model stayed on the host between NPU kernels, none of them with an NPU kernel;
RoBERTa's position ids start from `astype(ids != pad, int32)`.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import dtype_of, shape_dims, static_shape
from .causal_rows import causal_row_add
from .chain_match import Chain
from .finite_masks import safe_softmax, splits_finite, unseen_rows
from .length_rows import module_bounds
from .length_scans import length_bound, length_dims, length_scan, length_words, scannable
from .mask_words import nonzero_float, padding_row_of_words
from .rewrite import as_pass, rewrite_functions

_WHERE, _ASTYPE = tvm.ir.Op.get("relax.where"), tvm.ir.Op.get("relax.astype")
_CUMSUM, _ADD = tvm.ir.Op.get("relax.cumsum"), tvm.ir.Op.get("relax.add")
_SOFTMAX = tvm.ir.Op.get("relax.nn.softmax")
_AND = ("relax.bitwise_and", "relax.logical_and")
_OR = ("relax.bitwise_or", "relax.logical_or")
_NOT = ("relax.logical_not", "relax.bitwise_not")
_LAYOUT = ("relax.reshape", "relax.expand_dims", "relax.broadcast_to", "relax.permute_dims", "relax.squeeze")
_FLT_MAX = np.finfo(np.float32).max
_ONE_BITS = int(np.float32(1).view(np.int32))  # 0x3F800000


def masks_as_float(mod: tvm.IRModule, causal_fits=None) -> tvm.IRModule:
    """`mod` with every boolean mask's where and cast computed from its float twin (the boolean
    ops removed when nothing else reads them); with `causal_fits(q_shape, scores_shape, offset,
    row_shape)` (the chip's attention kernel takes a causal triangle and a mask row), a causal &
    padding mask is split into an attention's triangle and row where it says so (causal_rows.py)."""
    made = []

    def rewriter(module, finite=True):
        made.append(_MaskRewriter(module, causal_fits, finite))
        return made[-1]

    rewritten = relax.transform.DeadCodeElimination()(rewrite_functions(mod, rewriter))
    # A finite split is exact only inside an attention whose softmax gives its rows that see no key
    # HF's weights (finite_masks.safe_softmax): redo without splits if an attention's softmax did
    # not, or anything else reads a split (a mask that is itself an output holds float32's minimum,
    # not -inf).
    if any(m.unseen for m in made) or _reads_finite_split(rewritten, [s for m in made for s in m.seen]):
        rewritten = relax.transform.DeadCodeElimination()(
            rewrite_functions(mod, lambda module: rewriter(module, finite=False)))
    return rewritten


def _reads_finite_split(mod: tvm.IRModule, splits: list) -> bool:
    """Whether a binding of `mod` still reads one of `splits` (after dead code elimination, an
    attention that took its split reads the triangle and row instead)."""
    if not splits:
        return False
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            if any(var.same_as(split) for var in relax.analysis.all_vars(func) for split in splits):
                return True
    return False


def masks_pass(causal_fits=None) -> tvm.transform.Pass:
    """masks_as_float as a normalise pass (`causal_fits`: masks_as_float's)."""
    return as_pass(lambda mod: masks_as_float(mod, causal_fits), "cgra.MasksAsFloat",
                   ops=("relax.where", "relax.astype", "relax.cumsum"))


def _i32(value) -> relax.Expr:
    return relax.const(np.int32(value))


def _f32(value) -> relax.Expr:
    return relax.const(np.float32(value))


def _one(dtype: str) -> relax.Expr:
    return _f32(1) if dtype == "float32" else _i32(1)


@relax.expr_functor.mutator
class _MaskRewriter(relax.PyExprMutator):
    def __init__(self, mod=None, causal_fits=None, finite=True):
        super().__init__(mod)
        self.causal_fits, self.finite = causal_fits, finite
        self.bounds = module_bounds(mod) if mod is not None else {}  # a symbolic length's (length_scans.py)
        self.twins, self.selects, self.binary, self.broadcasts = {}, {}, set(), []
        self.splits = {}  # a split select's add(causal constant, row) -> (the constant, the row)
        self.seen = {}  # a finite split (finite_masks.py) -> c, fl(1 / Sk): the weights of a row that sees no key
        self.unseen = {}  # an attention's add(scores, causal constant) of a finite split: its softmax to guard
        self.seen_of = {}  # such an add -> its split's c

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not isinstance(call, relax.Call) or dtype_of(call) not in ("float32", "int32"):
            return call
        chain = Chain(self)
        if call.op.same_as(_ASTYPE) and dtype_of(call.args[0]) == "bool":
            twin = self.twin(chain, call.args[0], 0, dtype_of(call))
            return twin if twin is not None else call
        if call.op.same_as(_CUMSUM):
            scan = self.scan(call)
            return with_span(scan, call.span) if scan is not None else call
        if dtype_of(call) != "float32":
            return call
        if call.op.same_as(_WHERE) and dtype_of(call.args[0]) == "bool":
            select = self.select(chain, call)
            return with_span(select, call.span) if select is not None else call
        if call.op.same_as(_ADD):
            split = causal_row_add(self, chain, call)
            return split if split is not None else self.unbroadcast(chain, call)
        if call.op.same_as(_SOFTMAX) and self.unseen:
            safe = safe_softmax(self, chain, call)
            return safe if safe is not None else call
        return call

    def unbroadcast(self, chain: Chain, call):
        """add(x, reshape(broadcast_to(row))) of x's shape, the broadcast a select's (a padding row
        over the queries: the attention form's scores plus its mask), as add(x, reshape(row)): the
        add broadcasts the row itself, so the attention reads a row, not an s x s copy."""
        x, mask = call.args
        reshape = chain.call(mask, "relax.reshape")
        source = reshape.args[0] if reshape is not None else None
        for _ in range(4):  # through reshapes that keep the shape (HF's mask[:, :, :, :s])
            inner = chain.call(source, "relax.reshape") if source is not None else None
            if inner is None or static_shape(inner.args[0]) != static_shape(inner):
                break
            source = inner.args[0]
        source = chain.value(source) if source is not None else None
        if source is None or not any(source.same_as(b) for b in self.broadcasts) \
                or static_shape(call) != static_shape(x):
            return call
        row, target, wanted = source.args[0], static_shape(source), static_shape(reshape)
        shape = [1] * (len(target) - len(static_shape(row))) + list(static_shape(row))
        if [t for t in target if t != 1] != [t for t in wanted if t != 1]:
            return call
        kept = iter(r for r, t in zip(shape, target) if t != 1)
        row_shape = [1 if t == 1 else next(kept) for t in wanted]
        return relax.op.add(x, self.emit(relax.op.reshape(row, row_shape)))

    def emit(self, expr):
        return self.builder_.emit(expr)

    def select(self, chain: Chain, call):
        """(B - 1) * -y for where(b, +0.0, y < 0) of b's shape, else None."""
        cond, x, y = (chain.scalar(arg) if i else arg for i, arg in enumerate(call.args))
        if x is None or y is None or not (x == 0 and np.signbit(np.float32(x)) == 0 and y < 0) \
                or static_shape(call) is None or static_shape(call) != static_shape(cond):
            return None
        key = (chain.value(cond), float(y))
        if key not in self.selects:
            split = self._split_select(chain, cond, y)
            row = self.padding_row(chain, cond) if split is None and y == -np.inf else None
            twin = self.twin(chain, cond, 0) if split is None and row is None else None
            if split is None and row is None and twin is None:
                return None
            self.selects[key] = split if split is not None else row if row is not None else self._additive(twin, y)
        return self.selects[key]

    def _additive(self, twin, y: float):
        """where(b, 0, y) from b's twin: (B - 1) * -y, for -inf (B - 1) * 2 * FLT_MAX."""
        less_one = self.emit(relax.op.subtract(twin, _f32(1)))
        if np.isfinite(y):
            return self.emit(relax.op.multiply(less_one, _f32(-y)))
        return self.emit(relax.op.multiply(self.emit(relax.op.multiply(less_one, _f32(2))), _f32(_FLT_MAX)))

    def _split_select(self, chain: Chain, cond, y: float):
        """where(c & r, 0, -inf) of a constant c and a run-time r as where(c, 0, -inf) (a constant)
        + where(r, 0, -inf) of r's own shape (HF's causal & padding row: the row's arithmetic on
        1 x s, one add makes the s x s mask, where c * R and three ops on it took two s x s
        kernels), else None. Exact: 0 + 0 = +0, and -inf plus 0 or -inf is -inf. A finite y
        (float32's minimum, Bloom's) splits so for a causal c only, its softmax made safe and
        its rows that see no key put back after the attention (finite_masks.py)."""
        if np.isfinite(y):
            return self._split_finite(chain, cond, y) if self.finite else None
        call = chain.call(cond, *_AND)
        if call is None:
            return None
        arrays = [chain.array(arg) for arg in call.args[:2]]
        if sum(array is not None for array in arrays) != 1:
            return None
        constant, other = (arrays[0], call.args[1]) if arrays[0] is not None else (arrays[1], call.args[0])
        if constant.dtype != np.bool_ or static_shape(other) is None:
            return None
        row = self.padding_row(chain, other)
        twin = self.twin(chain, other, 0) if row is None else None
        if row is None and twin is None:
            return None
        row = row if row is not None else self._additive(twin, -np.inf)
        if constant.all():  # a bidirectional mask (BERT's): the row broadcast, which the attention reads as a row
            broadcast = relax.op.broadcast_to(row, np.broadcast_shapes(constant.shape, tuple(static_shape(other))))
            self.broadcasts.append(self.builder_.normalize(broadcast))
            return self.emit(self.broadcasts[-1])
        return self._split_add(constant, row)

    def _split_add(self, constant: np.ndarray, row):
        """where(constant, 0, -inf) + row, recorded for an attention's scores to take one at a time
        (causal_rows.py)."""
        additive = np.where(constant, 0, -np.inf).astype(np.float32)
        split = self.emit(relax.op.add(relax.const(additive), row))
        self.splits[split] = (additive, row)
        return split

    def _split_finite(self, chain: Chain, cond, y: float):
        """where(c & r, 0, y) as where(c, 0, -inf) + where(r, 0, -inf), with D, the rows that see
        no key put back (finite_masks.py), else None."""
        call = chain.call(cond, *_AND)
        arrays = [chain.array(arg) for arg in call.args[:2]] if call is not None else [None, None]
        if sum(array is not None for array in arrays) != 1:
            return None
        constant, other = (arrays[0], call.args[1]) if arrays[0] is not None else (arrays[1], call.args[0])
        if not splits_finite(constant, y) or static_shape(other) is None:
            return None
        twin = self.twin(chain, other, 0)
        unseen = unseen_rows(self, constant, twin) if twin is not None else None
        if unseen is None:
            return None
        split = self._split_add(constant, self._additive(twin, -np.inf))
        self.seen[split] = unseen
        return split

    def scan(self, call):
        """cumsum(B) along the last axis of an int32 twin B as B's low bytes (int8, a view and a
        strided slice) times the upper triangle of ones (int8 x int8 -> int32 on the PE array),
        else None."""
        source, shape = call.args[0], static_shape(call)
        for _ in range(8):  # through variables bound to variables (the twin replaced a cast's binding)
            bound = self.lookup_binding(source) if isinstance(source, relax.Var) else None
            if not isinstance(bound, relax.Var):
                break
            source = bound
        axis = call.attrs.axis
        dims = shape_dims(call)
        if source not in self.binary or not dims or bool(call.attrs.exclusive) \
                or axis is None or int(axis) % len(dims) != len(dims) - 1 or dtype_of(call) != "int32":
            return None
        if shape is None:  # a symbolic length: the triangle at its bound (length_scans.py)
            return length_scan(self.emit, source, length_bound(self.bounds, length_dims(call)))
        n = shape[-1]
        rows = (int(np.prod(shape[:-1])), n)
        flat = self.emit(relax.op.reshape(source, rows)) if tuple(shape) != rows else source
        viewed = self.emit(relax.op.memory.view(flat, shape=(rows[0], 4 * n), dtype="int8"))
        low = self.emit(relax.op.strided_slice(viewed, [1], [0], [4 * n], [4]))
        summed = relax.op.matmul(low, relax.const(np.triu(np.ones((n, n), np.int8))), out_dtype="int32")
        return summed if tuple(shape) == rows else relax.op.reshape(self.emit(summed), shape)

    def twin(self, chain: Chain, expr, depth: int, dtype: str = "float32"):
        """B, the {0, 1} tensor of the boolean `expr` in `dtype` (float32 or int32), emitted
        once; None if `expr` is built by an op the table of the module docstring lacks."""
        value = chain.value(expr)
        cast = chain.call(value, "relax.astype")
        # casts of one variable to bool are one mask, however many bindings wrote them
        # (mask_positions.py's and the padding mask's of one attention_mask)
        key = (("nonzero", cast.args[0]) if cast is not None and isinstance(cast.args[0], relax.Var) else value, dtype)
        if key in self.twins:
            return self.twins[key]
        # an int32 twin of a symbolic length too (length_scans.py: RoBERTa's position ids' mask)
        shaped = static_shape(expr) is not None or (dtype == "int32" and scannable(self.bounds, expr))
        twin = self._make_twin(chain, expr, depth, dtype) if depth < 16 and shaped else None
        if twin is not None:
            twin = self.emit(twin) if isinstance(twin, relax.Call) else twin
            self.twins[key] = twin
            if dtype == "int32":
                self.binary.add(twin)
        return twin

    def _words(self, source):
        """The int32 words of an int32 or int64 tensor (an int64 read as its two words, low
        first: a view and two strided slices), else None."""
        dtype, shape = dtype_of(source), static_shape(source)
        if shape is None:
            return length_words(self.emit, source)
        if dtype not in ("int32", "int64") or not shape:
            return None
        if dtype == "int32":
            return [source]
        pairs = self.emit(relax.op.memory.view(source, shape=(*shape[:-1], 2 * shape[-1]), dtype="int32"))
        return [self.emit(relax.op.strided_slice(pairs, [len(shape) - 1], [start], [2 * shape[-1]], [2]))
                for start in (0, 1)]

    def _nonzero(self, words, dtype: str):
        """1 where any of the int32 `words` is nonzero, else 0, in `dtype`: per word
        |max(min(w, 1), -1)|, their maximum; for float32 times 0x3F800000 (the bits of 1.0f)
        viewed as float32."""
        nonzero = None
        for word in words:
            sign = self.emit(relax.op.maximum(self.emit(relax.op.minimum(word, _i32(1))), _i32(-1)))
            magnitude = self.emit(relax.op.maximum(sign, self.emit(relax.op.multiply(sign, _i32(-1)))))
            nonzero = magnitude if nonzero is None else self.emit(relax.op.maximum(nonzero, magnitude))
        if dtype == "int32":
            return nonzero
        return relax.op.memory.view(self.emit(relax.op.multiply(nonzero, _i32(_ONE_BITS))), dtype="float32")

    def _nonzero_float(self, source):
        """1.0 where the int32 or int64 `source` is nonzero, else +0.0 (float32): mask_words.py."""
        return nonzero_float(self.emit, source)

    def padding_row(self, chain: Chain, expr, depth: int = 0):
        """where(b, 0, -inf) for the boolean `expr` an int32 or int64 cast to bool under layout
        ops (HF's padding row), straight from the words (mask_words.py: two kernels, where the twin
        B and (B - 1) * 2 * FLT_MAX took four), else None."""
        call = chain.call(chain.value(expr), "relax.astype", *_LAYOUT) if depth < 16 else None
        if call is None or static_shape(expr) is None:
            return None
        if call.op.name != "relax.astype":
            inner = self.padding_row(chain, call.args[0], depth + 1)
            return None if inner is None else self.emit(
                relax.Call(call.op, [inner, *call.args[1:]], call.attrs, call.ty_args, call.span))
        source = call.args[0]
        key = (("padding", source) if isinstance(source, relax.Var) else chain.value(expr), "row")
        if key not in self.twins:
            row = padding_row_of_words(self.emit, source)
            if row is None:
                return None
            self.twins[key] = row
        return self.twins[key]

    def _differs(self, chain: Chain, call):
        """The words of x - c for not_equal / equal(x, c), c an integer constant of one value
        (x differs from c exactly where a word of x differs from c's), else None."""
        value = chain.array(call.args[1])
        words = self._words(call.args[0])
        if value is None or value.size != 1 or value.dtype.kind != "i" or words is None:
            return None
        constant = np.array(value.reshape(()), dtype_of(call.args[0]))
        parts = constant.reshape(1).view(np.int32) if len(words) == 2 else constant.reshape(1).astype(np.int32)
        # a word of c that is 0 subtracts nothing: over a symbolic length, one kernel fewer (length_scans.py)
        return [word if part == 0 and static_shape(word) is None else self.emit(relax.op.subtract(word, _i32(part)))
                for word, part in zip(words, parts)]

    def _make_twin(self, chain: Chain, expr, depth: int, dtype: str):
        array = chain.array(expr)
        if array is not None:
            return relax.const(array.astype(dtype))
        call = chain.call(expr, "relax.astype", "relax.not_equal", "relax.equal", *_AND, *_OR, *_NOT, *_LAYOUT)
        if call is None:
            return None
        name = call.op.name
        if name == "relax.astype":
            if dtype == "float32" and dtype_of(call.args[0]) in ("int32", "int64"):
                return self._nonzero_float(call.args[0])
            words = self._words(call.args[0])
            return None if words is None else self._nonzero(words, dtype)
        if name in ("relax.not_equal", "relax.equal"):
            words = self._differs(chain, call)
            if words is None:
                return None
            differs = self._nonzero(words, dtype)
            return differs if name == "relax.not_equal" else relax.op.subtract(_one(dtype), self.emit(differs))
        operands = [self.twin(chain, arg, depth + 1, dtype)
                    for arg in (call.args[:2] if name in _AND + _OR else call.args[:1])]
        if any(operand is None for operand in operands):
            return None
        if name in _AND:
            return relax.op.multiply(*operands)
        if name in _OR:
            return relax.op.maximum(*operands)
        if name in _NOT:
            return relax.op.subtract(_one(dtype), operands[0])
        return relax.Call(call.op, [operands[0], *call.args[1:]], call.attrs, call.ty_args, call.span)
