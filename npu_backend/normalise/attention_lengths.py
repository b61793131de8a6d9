"""An attention over a symbolic sequence length, read as attentions.py reads a static one.

Stage: normalise (a helper of attentions.py). In: the P V matmul of an attention whose scores are
(.., s, s) for a symbolic length s (a decoder's prefill exported with a symbolic length). Out:
attentions.py's parts with Sq = Sk = s, or None.

How: attentions.py checks each view of Q, K, V and the scores by carrying an index array through
it with numpy, which needs sizes. `read_at_lengths` runs that same reading with s read as each of
TRIAL_LENGTHS in turn (`dims` substitutes it), and takes the attention only where both readings
find the same Q, K, V, head split, scale and softmax: the views are the head split at two
lengths that are prime and unlike any static extent of a head split, so no view can pass by
mixing s with a static axis. The one mask it takes is the causal one, proven for every length
(length_masks.is_causal, normalise's Z3-backed prover, on the where(b, 0, -inf) it adds): the
form then holds a causal mask the kernel's pattern matches whole, `length_causal`, and the
attention kernel builds it in the scratchpad (kernels/attention/flash_length.py). An attention
with no mask at either length (an encoder's: its padding mask, computed from the length and
proven to keep every key, dropped by length_masks.open_masks_dropped) is taken as `open`: the
form has no mask and the kernel runs without its causal band. Besides the causal mask a
bias row per head over the keys (Bloom's ALiBi) is taken where it is the prefix of a constant table
at the bound (length_rows.py): the kernel reads that table's first s columns.

Why: with a symbolic length the attention ran as five kernels (Q Kᵀ, the scale, the mask add,
a softmax whose rows were held at the bound's width, P V), the scores crossing DRAM between them.
"""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np
from tvm import relax, sym, tirx

from ..relax_info import dtype_of, shape_dims
from .length_boxes import box_table
from .length_masks import is_causal
from .length_rows import module_bounds, row_table

#: The lengths a symbolic attention is read at: primes, unlike each other and every head split's
#: static extent (heads, head dims: powers of two and their multiples).
TRIAL_LENGTHS = (7, 11)
_LENGTHS: contextvars.ContextVar = contextvars.ContextVar("cgra_attention_lengths", default=None)
_SAME = ("B", "Hk", "G", "D", "Dv", "scale", "safe")
_OPEN = -1  # _causal_mask's reading of an attention with no mask: every key seen


def dims(expr):
    """shape_dims, with the symbolic length at the value it is being read at."""
    shape = shape_dims(expr)
    lengths = _LENGTHS.get()
    if shape is None or not lengths:
        return shape
    return [d if isinstance(d, int) else _at(d, lengths) for d in shape]


@contextlib.contextmanager
def at_lengths(lengths: dict):
    """Within the block, `dims` reads each symbolic variable named in `lengths` as its value."""
    token = _LENGTHS.set(dict(lengths))
    try:
        yield
    finally:
        _LENGTHS.reset(token)


def static_dims(expr):
    """`dims` as a tuple when every dimension is an int then, else None."""
    shape = dims(expr)
    return tuple(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None


def _at(dim, lengths: dict):
    free = tirx.analysis.undefined_vars(dim)
    if not free or any(var.name not in lengths for var in free):
        return dim
    value = dim
    for var in free:
        value = tirx.Let(var, tirx.IntImm(str(var.ty), lengths[var.name]), value)
    value = sym.Analyzer().simplify(value)
    return int(value.value) if isinstance(value, tirx.IntImm) else dim


def read_at_lengths(chain, call, read):
    """`read(chain, call)` (attentions.read_attention) for static scores; for (.., s, s) scores of
    a symbolic s, the parts found alike at every trial length with one causal mask (and maybe a
    bias row per head: `row` its (1, Hk, G, 1, bound) table, length_rows.py), Sq = Sk = s and
    `length` s; else None."""
    scores = shape_dims(call.args[0])
    if scores is None or len(scores) < 2 or all(isinstance(d, int) for d in scores):
        return read(chain, call)
    sq, sk = scores[-2:]
    if not isinstance(sq, tirx.Var) or not isinstance(sk, tirx.Var) or not sq.same_as(sk) or \
            any(not isinstance(d, int) for d in scores[:-2]):
        return None  # not a prefill's square of one length (a decode step's t + 1 keys)
    readings, parts_at = [], []
    for length in TRIAL_LENGTHS:
        token = _LENGTHS.set({sq.name: length})
        try:
            parts_at.append(read(chain, call))
        finally:
            _LENGTHS.reset(token)
    boxed = _boxed(chain, parts_at, sq)
    if boxed is not None:
        return boxed
    for length, parts in zip(TRIAL_LENGTHS, parts_at):
        causal = _causal_mask(parts, length)
        if causal is None:
            return None
        readings.append((parts, causal))
    (first, causal), (second, other) = readings
    if causal == _OPEN or other == _OPEN:  # every key seen (an encoder's: length_masks.open_masks_dropped)
        same = causal == other and all(first[role].same_as(second[role]) for role in ("q", "k", "v")) and \
            all(first[key] == second[key] for key in _SAME)
        return dict(first, masks=[], causal=None, length=sq, Sq=sq, Sk=sk, row=None, open=True) if same else None
    rows = [m for i, m in enumerate(first["masks"]) if i != causal]
    if any(not first[role].same_as(second[role]) for role in ("q", "k", "v")) or \
            any(first[key] != second[key] for key in _SAME) or causal != other or \
            any(not a[0].same_as(b[0]) for a, b in zip(first["masks"], second["masks"])) or \
            not _proven_causal(chain, first["masks"][causal][0], sq):
        return None
    row = None
    if rows:  # a bias row per head besides (Bloom's ALiBi): the prefix of a table (length_rows.py)
        bound = _bound(chain, sq.name)
        row = row_table(chain, rows[0][0], sq, bound, tuple(rows[0][1]), TRIAL_LENGTHS) if bound else None
        if row is None:
            return None
        full = (1, first["Hk"], first["G"], 1, bound)
        row = np.ascontiguousarray(np.broadcast_to(row, full)) if row.shape != full and \
            all(r in (1, f) for r, f in zip(row.shape, full)) else row
        if row.shape != full:
            return None
    return dict(first, masks=[], causal=None, length=sq, Sq=sq, Sk=sk, row=row)


def _boxed(chain, readings: list, length) -> dict | None:
    """The open form with a bias box (length_boxes.py: the scores plus the top-left s x s box of a
    constant (A.., T, T) table B, T5's relative-position bias) for readings alike at each trial
    length, `box` B as (1, Hk, G, T, T); else None. A safe softmax's guard is dropped: Q Kᵀ is
    finite (softmaxes.py takes a matmul's result to be never -inf) and B is, so every row of the
    scores holds finite entries, its max is finite and the guard picks the softmax in every row."""
    if any(p is None or len(p["masks"]) != 1 for p in readings):
        return None
    first = readings[0]
    (mask, shape), table = first["masks"][0], box_table(chain, first["masks"][0][0])
    if table is None or not np.isfinite(table).all() or any(
            p["Sq"] != n or p["Sk"] != n or not p["masks"][0][0].same_as(mask) or tuple(p["masks"][0][1][3:]) != (n, n)
            or any(not first[r].same_as(p[r]) for r in ("q", "k", "v")) or any(first[k] != p[k] for k in _SAME)
            for p, n in zip(readings, TRIAL_LENGTHS)):
        return None
    bound = _bound(chain, length.name)
    full = (1, first["Hk"], first["G"]) + table.shape[-2:]
    heads = tuple(shape[:3])
    if bound is None or table.shape[-1] < bound or heads[0] != 1 or table.size != int(np.prod(heads)) * table.shape[-1] ** 2:
        return None
    box = np.ascontiguousarray(np.broadcast_to(table.reshape(heads + table.shape[-2:]), full))
    return dict(first, masks=[], causal=None, length=length, Sq=length, Sk=length, row=None, open=True, box=box,
                safe=False, unseen=0.0)


def _causal_mask(parts, length: int) -> int | None:
    """The index of the (1, 1, 1, s, s) mask of a reading at `length` with Sq = Sk = s and that
    mask alone or with one row per head (1, Hk | 1, G | 1, 1, s); _OPEN for no mask; else None."""
    if parts is not None and parts["Sq"] == parts["Sk"] == length and not parts["masks"] and not parts["safe"]:
        return _OPEN
    if parts is None or parts["Sq"] != length or parts["Sk"] != length or len(parts["masks"]) not in (1, 2):
        return None
    square = [i for i, (_, shape) in enumerate(parts["masks"]) if tuple(shape) == (1, 1, 1, length, length)]
    if len(square) != 1:
        return None
    rows = [shape for i, (_, shape) in enumerate(parts["masks"]) if i != square[0]]
    if any(tuple(shape[i] for i in (0, 3, 4)) != (1, 1, length) for shape in rows):
        return None
    return square[0]


def _bound(chain, name: str) -> int | None:
    """The bound of symbolic variable `name`: the module's (normalise runs before any kernel's
    shape_bounds context, so the module's tir_var_upper_bound is what it has; a normalise module
    must not read the kernels' context either: tests/test_layout.py)."""
    return module_bounds(chain.mutator.builder_.get()).get(name)


def _proven_causal(chain, mask, length) -> bool:
    """Whether `mask` is, through reshapes, where(b, 0, -inf) over (s, s) with b proven j <= i."""
    node = mask
    for _ in range(8):
        view = chain.call(node, "relax.reshape", "relax.expand_dims")
        if view is None:
            break
        node = view.args[0]
    where = chain.call(node, "relax.where")
    if where is None or dtype_of(where) != "float32":
        return False
    cond, kept, masked = where.args
    shape = shape_dims(cond)
    return chain.scalar(kept) == 0.0 and chain.scalar(masked) == -np.inf and shape is not None and \
        len(shape) >= 2 and all(str(d) == str(length) for d in shape[-2:]) and \
        all(d == 1 for d in shape[:-2]) and is_causal(chain, cond)


def length_causal(emit, length):
    """The causal mask over `length` positions, (s, s), built where it is added: arange,
    less_equal(j, i), where(., 0, -inf); the attention kernel's pattern matches these ops whole
    (kernels/attention/flash_length.py) and builds the mask in the scratchpad instead."""
    positions = emit(relax.op.arange(tirx.IntImm("int64", 0), length.astype("int64"), tirx.IntImm("int64", 1),
                                     dtype="int64"))
    rows = emit(relax.op.reshape(positions, relax.ShapeExpr([length, 1])))
    columns = emit(relax.op.reshape(positions, relax.ShapeExpr([1, length])))
    kept = emit(relax.op.less_equal(columns, rows))
    return emit(relax.op.where(kept, relax.const(np.float32(0.0)), relax.const(np.float32(-np.inf))))
