"""An attention, however the model wrote it, becomes one normal form the attention family takes.

Stage: normalise (after softmaxes.py: a safe softmax is already `softmax` or
`where(kept, softmax(x), 0)`). In: a Relax IRModule. Out: the same module in which each

    matmul(view(P), view(V)),  P = softmax(X, -1) or where(kept, softmax(X, -1), 0),
    X = view(scale * matmul(view(scale * Q), view(scale * K)ᵀ)) [+ mask]

(PyTorch's SDPA decomposition with its scale split between Q and Kᵀ, Hugging Face's eager
`matmul(q, kᵀ) * scaling + mask`, divisions by sqrt(d), repeat_kv's expand_dims + broadcast_to +
reshape of grouped-query K / V, Falcon's broadcast_to of one K / V head) is, with Q (B, H, Sq, D),
K (B, Hk, Sk, D), V (B, Hk, Sk, Dv) the tensors the views start from and G = H / Hk,

    q5 = reshape(Q, (B, Hk, G, Sq, D)); k5 = reshape(K, (B, Hk, 1, Sk, D)); v5 likewise
    s = matmul(q5, permute_dims(k5, [0, 1, 2, 4, 3]))      # (B, Hk, G, Sq, Sk): a group shares K
    s = multiply(s, scale)                                  # if scale != 1
    s = add(s, reshape(mask, rank 5))                       # if masked (several: added first;
                                                            # a constant of zeros: none)
    p = softmax(s, -1)
    p = where(greater(max(astype(not_equal(s, -inf), float32), -1, keepdims), 0), p, 0)  # if safe
    o = reshape(matmul(p, v5), the old result's shape)

which computes what the source graph did (a scale applied once to the scores instead of split
between Q and K rounds differently: about 1e-7 relative). Every view is checked by evaluating it
on an index array with numpy, so a view chain that is not the head split the form assumes is left
alone. The kernel (kernels/attention/) reads this chain as one op; if it refuses, the chain is an
ordinary graph the other families and the host compute.

Why: the scores went to DRAM between three kernels (Q Kᵀ, softmax, P V), the K transpose and the
repeat_kv copies were host copies, and a padding-masked softmax's where stayed on the host.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from ..frontend.provenance import with_span
from ..relax_info import dtype_of, shape_dims
from .attention_lengths import dims as _dims, length_causal, read_at_lengths
from .length_rows import length_row
from .chain_match import Chain
from .rewrite import as_pass, rewrite_functions
from .softmaxes import kept_condition

_MATMUL = tvm.ir.Op.get("relax.matmul")
_RESHAPES = ("relax.reshape", "relax.expand_dims", "relax.squeeze")
_VIEWS = _RESHAPES + ("relax.permute_dims", "relax.broadcast_to")
_DEPTH = 16
_MAX_INDEX = 1 << 26  # index arrays up to this many elements (256 MiB of int32 at most)


def attentions_as_normal_form(mod: tvm.IRModule, accepts=None) -> tvm.IRModule:
    """Every attention of `mod` in the normal form (module docstring); with `accepts`, only those
    for which `accepts(parts)` (read_attention's dict) is true: the ones the kernel takes, so that
    one it refuses keeps the form the other kernels took before (a grouped one's rank-5 matmuls
    would stay on the host)."""
    rewriter = lambda module: _AttentionRewriter(module, accepts or (lambda parts: True))  # noqa: E731
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, rewriter))


def attentions_pass(accepts=None) -> tvm.transform.Pass:
    """attentions_as_normal_form as a normalise pass."""
    return as_pass(lambda mod: attentions_as_normal_form(mod, accepts), "cgra.Attentions", ops=("relax.nn.softmax",))


@relax.expr_functor.mutator
class _AttentionRewriter(relax.PyExprMutator):
    def __init__(self, mod, accepts):
        super().__init__(mod)
        self.accepts = accepts
        self.boxes = {}  # a bias box's table -> its one constant (T5's layers add the same bias)

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_MATMUL) and dtype_of(call) == "float32"):
            return call
        chain = Chain(self)
        found = read_at_lengths(chain, call, read_attention)
        if found is None or not self.accepts(found):
            return call
        return with_span(self._emit(found, shape_dims(call)), call.span)

    def _emit(self, a: dict, out_shape):
        emit = self.builder_.emit
        b, hk, g, sq, sk, d, dv = (a[k] for k in ("B", "Hk", "G", "Sq", "Sk", "D", "Dv"))
        q5 = emit(relax.op.reshape(a["q"], (b, hk, g, sq, d)))
        k5 = emit(relax.op.reshape(a["k"], (b, hk, 1, sk, d)))
        v5 = emit(relax.op.reshape(a["v"], (b, hk, 1, sk, dv)))
        s = emit(relax.op.matmul(q5, emit(relax.op.permute_dims(k5, [0, 1, 2, 4, 3]))))
        if a["scale"] != 1.0:
            s = emit(relax.op.multiply(s, relax.const(np.float32(a["scale"]))))
        if a.get("open"):  # every key at any length: no mask (flash_length.py, causal None)
            if a.get("box") is not None:  # but a bias box of a constant (length_boxes.py, kernels' length_rows.py)
                table = self.boxes.setdefault((a["box"].shape, a["box"].tobytes()), relax.const(a["box"]))
                box = relax.op.strided_slice(table, [3, 4], [0, 0], [sq, sq], assume_inbound=True)
                s = emit(relax.op.add(s, emit(box)))
        elif a.get("length") is not None:  # causal at any length: a mask the kernel's pattern holds
            s = emit(relax.op.add(s, length_causal(emit, sq)))
            if a.get("row") is not None:  # and a bias row per head (Bloom's ALiBi): a table's prefix
                s = emit(relax.op.add(s, length_row(emit, a["row"], sq)))
        elif a.get("causal") is not None:  # a constant causal triangle: the kernel reads its offset
            mask = self.builder_.normalize(relax.const(Chain(self).array(a["masks"][0][0]).reshape(1, 1, 1, sq, sk)))
            s = emit(relax.op.add(s, mask))
        elif a["masks"]:  # several (ALiBi and a mask) are added together first, in rank 4: one mask
            shapes = [(m[0], m[1] * m[2], m[3], m[4]) for _, m in a["masks"]]
            mask = emit(relax.op.reshape(a["masks"][0][0], shapes[0]))
            for (other, _), shape in zip(a["masks"][1:], shapes[1:]):
                mask = emit(relax.op.add(mask, emit(relax.op.reshape(other, shape))))
            mb, mh, msq, msk = (max(dims) for dims in zip(*shapes))
            s = emit(relax.op.add(s, emit(relax.op.reshape(mask, (mb,) + ((hk, g) if mh > 1 else (1, 1)) + (msq, msk)))))
        p = emit(relax.op.nn.softmax(s, axis=-1))
        if a["safe"]:
            finite = emit(relax.op.astype(emit(relax.op.not_equal(s, relax.const(-np.inf, "float32"))), "float32"))
            kept = emit(relax.op.greater(emit(relax.op.max(finite, axis=[-1], keepdims=True)),
                                         relax.const(0.0, "float32")))
            p = emit(relax.op.where(kept, p, relax.const(np.float32(a.get("unseen", 0.0)))))
        out = emit(relax.op.matmul(p, v5))
        return relax.op.reshape(out, out_shape)


def read_attention(chain: Chain, call) -> dict | None:
    """The parts of the attention whose P V matmul is `call`, else None: Q, K, V, the mask (or
    None) and its rank-5 shape, the scale, whether the softmax is safe, and the sizes."""
    p_operand, v_operand = call.args
    p_nodes, p_ops = walk(chain, p_operand, scales=False)
    softmax, safe, unseen = _softmax_of(chain, p_nodes[-1])
    if softmax is None:
        return None
    x = softmax.args[0]
    x_shape, p_shape, v_shape = _dims(x), _dims(p_operand), _dims(v_operand)
    if not _static(x_shape, p_shape, v_shape) or len(p_shape) < 3 or len(x_shape) < 2 or \
            not _is_plain_view(p_nodes, p_ops, x_shape, p_shape):
        return None
    scores, biases = _scores_and_biases(chain, x)
    if scores is None:
        return None
    parts = _parts(chain, scores, biases, x_shape, v_operand, safe)
    return dict(parts, unseen=unseen) if parts is not None else None


def _parts(chain: Chain, scores, biases, x_shape, v_operand, safe: bool) -> dict | None:
    s_nodes, s_ops = walk(chain, scores)
    qk = chain.call(s_nodes[-1], "relax.matmul")
    if qk is None or dtype_of(qk) != "float32":
        return None
    qk_shape = _dims(qk)
    if not _static(qk_shape) or len(qk_shape) < 3 or not _is_plain_view(s_nodes, s_ops, qk_shape, _dims(scores)):
        return None
    sq, sk, bh = qk_shape[-2], qk_shape[-1], math.prod(qk_shape[:-2])
    q = _query(chain, qk.args[0], bh, sq)
    if q is None:
        return None
    q_node, q_scale, (b, h, _, d) = q
    k = _shared_head(chain, qk.args[1], b, h, sk, d, transposed=True)
    if k is None:
        return None
    k_node, k_scale, hk = k
    v_shape = _dims(v_operand)
    v = _shared_head(chain, v_operand, b, h, sk, v_shape[-1], transposed=False, kv_heads=hk)
    if v is None or v[2] != hk:
        return None
    # A constant bias of zeros (SDPA's attn_bias without a mask, folded: ViT, BERT without an
    # attention mask) adds nothing: no mask tile to load and add.
    biases = [(bias, space) for bias, space in biases if not _zeros(chain, bias)]
    masks = [(bias, _mask_shape(bias, b, hk, h // hk, sq, sk, space)) for bias, space in biases]
    if any(shape is None for _, shape in masks):
        return None
    causal = causal_offset(chain.array(masks[0][0]), sq, sk) if len(masks) == 1 else None
    return dict(q=q_node, k=k_node, v=v[0], masks=masks, safe=safe, causal=causal,
                scale=q_scale * k_scale * _scale_of(s_ops), B=b, Hk=hk, G=h // hk, Sq=sq, Sk=sk, D=d, Dv=v_shape[-1])


def causal_offset(mask, sq: int, sk: int) -> int | None:
    """k for a constant mask that is 0 where key j <= query i + k and -inf elsewhere, the same for
    every batch and head (a causal triangle; k = Sk - Sq for the last Sq queries of Sk keys), else
    None (a run-time mask, or any other constant)."""
    if mask is None or mask.dtype != np.float32 or mask.shape[-2:] != (sq, sk) or mask.size != sq * sk:
        return None
    mask = mask.reshape(sq, sk)
    seen = int(np.count_nonzero(mask[0] == 0)) - 1
    if seen < 0 or seen >= sk - 1:
        return None
    rows, cols = np.indices((sq, sk))
    expected = np.where(cols > rows + seen, np.float32(-np.inf), np.float32(0))
    return seen if np.array_equal(mask, expected) else None


def _zeros(chain: Chain, expr) -> bool:
    array = chain.array(expr)
    return array is not None and array.dtype.kind == "f" and not np.any(array)


def walk(chain: Chain, expr, scales: bool = True) -> tuple[list, list]:
    """(nodes, ops) back from `expr` through views (and with `scales` multiplications or divisions
    by a float scalar): nodes[0] is `expr`, ops[i] the call making nodes[i] from nodes[i + 1]
    ("scale", factor) or ("view", call)."""
    nodes, ops = [expr], []
    for _ in range(_DEPTH):
        value = chain.uncast(nodes[-1])
        call = chain.call(value, *_VIEWS, "relax.multiply", "relax.divide")
        if call is None:
            if value is not nodes[-1]:
                nodes[-1] = value
            break
        if call.op.name in _VIEWS:
            ops.append(("view", call))
            nodes.append(call.args[0])
            continue
        step = _scalar_step(chain, call) if scales else None
        if step is None:
            break
        ops.append(("scale", step[0]))
        nodes.append(step[1])
    return nodes, ops


def _scalar_step(chain: Chain, call):
    """(factor, tensor) for tensor * c, c * tensor or tensor / c of the call's own shape."""
    pairs = [(call.args[1], call.args[0]), (call.args[0], call.args[1])] if call.op.name == "relax.multiply" \
        else [(call.args[1], call.args[0])]
    for constant, tensor in pairs:
        c = chain.scalar(constant)
        if c is None or not np.isfinite(c) or c == 0 or _dims(tensor) != _dims(call):
            continue
        return (c if call.op.name == "relax.multiply" else 1.0 / c), tensor
    return None


def _scale_of(ops) -> float:
    return math.prod(factor for kind, factor in ops if kind == "scale")


def _static(*shapes) -> bool:
    return all(s is not None and all(isinstance(d, int) for d in s) for s in shapes)


def apply_views(array: np.ndarray, ops) -> np.ndarray:
    """`array` carried through `ops` (walk's, the innermost last) as their views move its
    elements; scales keep them where they are."""
    for kind, call in reversed(ops):
        if kind != "view":
            continue
        out = tuple(_dims(call))
        if call.op.name == "relax.permute_dims":
            axes = call.attrs.axes
            array = np.transpose(array, None if axes is None else [int(a) for a in axes])
        elif call.op.name == "relax.broadcast_to":
            array = np.broadcast_to(array, out)
        else:
            array = np.reshape(array, out)
    return array


def _is_plain_view(nodes, ops, inner_shape, outer_shape) -> bool:
    """Whether the views from nodes[-1] (of `inner_shape`) to nodes[0] only reshape it."""
    if math.prod(inner_shape) != math.prod(outer_shape) or math.prod(inner_shape) > _MAX_INDEX:
        return False
    index = np.arange(math.prod(inner_shape), dtype=np.int64).reshape(inner_shape)
    try:
        return np.array_equal(apply_views(index, ops).reshape(-1), index.reshape(-1))
    except ValueError:
        return False


def _softmax_of(chain: Chain, expr):
    """(softmax call over the last axis, safe, c) for softmax(x) or a guarded where(kept, softmax(x), c),
    c a finite scalar: 0, or fl(1 / Sk), the weight of every key in a row a finite mask's split
    left without one (normalise/finite_masks.py)."""
    safe, unseen = False, 0.0
    where = chain.call(expr, "relax.where")
    if where is not None:
        cond, picked, zeros = where.args
        unseen = chain.scalar(zeros)
        if unseen is None or not np.isfinite(unseen):
            return None, False, 0.0
        expr, safe = picked, True
    softmax = chain.call(expr, "relax.nn.softmax")
    rank = len(_dims(softmax) or ()) if softmax is not None else 0
    if softmax is None or not rank or int(softmax.attrs.axis) % rank != rank - 1 or dtype_of(softmax) != "float32":
        return None, False, 0.0
    if safe and not _row_has_finite_entry(chain, where.args[0], softmax.args[0]):
        return None, False, 0.0
    return softmax, safe, float(unseen)


def _row_has_finite_entry(chain: Chain, cond, x) -> bool:
    """Whether `cond` is softmaxes.py's guard of x: greater(max(astype(y, float32), -1, keepdims), 0)
    with y = not_equal(x, -inf), or y = b for x = finite + where(b, c, -inf)."""
    greater = chain.call(cond, "relax.greater")
    if greater is None or chain.scalar(greater.args[1]) != 0.0:
        return False
    row_max = chain.call(greater.args[0], "relax.max")
    cast = chain.call(row_max.args[0], "relax.astype") if row_max is not None else None
    if cast is None:
        return False
    y = cast.args[0]
    not_equal = chain.call(y, "relax.not_equal")
    if not_equal is not None and chain.same_value(not_equal.args[0], x) and chain.scalar(not_equal.args[1]) == -np.inf:
        return True
    kept = kept_condition(chain, x)
    return kept is not None and chain.value(kept).same_as(chain.value(y))


def _scores_and_biases(chain: Chain, x):
    """(the scores below every bias, [(bias, the shape of the sum it is added to)]): x = scores
    [+ bias] ..., with views between (Bloom adds ALiBi to the (B * H, Sq, Sk) scores, then the
    mask to their (B, H, Sq, Sk) view), each add's scores the operand leading back to a matmul;
    (None, []) if there is none. A scale above a bias stops the walk there, and the scores'
    own walk (`_parts`) then finds the add instead of a matmul: such a graph is left alone."""
    biases, node = [], x
    for _ in range(_DEPTH):
        add = chain.call(node, "relax.add")
        if add is not None:
            for scores, bias in (add.args, reversed(add.args)):
                if _leads_to_matmul(chain, scores) and _dims(scores) == _dims(add):
                    biases.append((bias, _dims(add)))
                    node = scores
                    break
            else:
                return None, []
            continue
        view = chain.call(chain.uncast(node), *_RESHAPES)
        if view is None:
            break
        node = view.args[0]
    return (node, biases) if _leads_to_matmul(chain, node) else (None, [])


def _leads_to_matmul(chain: Chain, expr, depth: int = 4) -> bool:
    """Whether `expr` is a matmul through views, scales and adds of biases."""
    nodes, _ = walk(chain, expr)
    if chain.call(nodes[-1], "relax.matmul") is not None:
        return True
    add = chain.call(nodes[-1], "relax.add")
    return depth > 0 and add is not None and any(_leads_to_matmul(chain, arg, depth - 1) for arg in add.args)


def _query(chain: Chain, operand, bh: int, sq: int):
    """(Q, its scale, (B, H, Sq, D)): the farthest rank-4 tensor up `operand`'s views that the
    operand is a reshape of, with B * H = bh."""
    nodes, ops = walk(chain, operand)
    d = (_dims(operand) or [0])[-1]
    for at in range(len(nodes) - 1, -1, -1):
        shape = _dims(nodes[at])
        if not _static(shape) or len(shape) != 4 or shape[0] * shape[1] != bh or tuple(shape[2:]) != (sq, d):
            continue
        if _is_plain_view(nodes[:at + 1], ops[:at], shape, _dims(operand)):
            return nodes[at], _scale_of(ops[:at]), tuple(shape)
    return None


def _shared_head(chain: Chain, operand, b: int, h: int, sk: int, d: int, transposed: bool, kv_heads=None):
    """(K or V, its scale, Hk): the farthest rank-4 (B, Hk, Sk, D) tensor up `operand`'s views
    such that the operand is it with each head repeated H / Hk times (repeat_kv, a broadcast
    head), transposed in its last two axes for K."""
    nodes, ops = walk(chain, operand)
    out_shape = _dims(operand)
    if not _static(out_shape):
        return None
    for at in range(len(nodes) - 1, -1, -1):
        shape = _dims(nodes[at])
        if not _static(shape) or len(shape) != 4 or shape[0] != b or tuple(shape[2:]) != (sk, d) or \
                h % shape[1] or (kv_heads is not None and shape[1] != kv_heads) or \
                math.prod(shape) * (h // shape[1]) > _MAX_INDEX:
            continue
        index = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
        expected = np.repeat(index, h // shape[1], axis=1)
        if transposed:
            expected = np.swapaxes(expected, 2, 3)
        try:
            carried = apply_views(index, ops[:at])
        except ValueError:
            continue
        if carried.size == expected.size and carried.size == math.prod(out_shape) and \
                np.array_equal(carried.reshape(-1), expected.reshape(-1)):
            return nodes[at], _scale_of(ops[:at]), shape[1]
    return None


def _mask_shape(mask, b: int, hk: int, g: int, sq: int, sk: int, x_shape) -> tuple | None:
    """The rank-5 shape (Bm, Hkm, Gm, Sqm, Skm) the mask broadcasts against (B, Hk, G, Sq, Sk) as,
    given that it broadcast against the scores' `x_shape` ((B, H, Sq, Sk) or (B * H, Sq, Sk)); None
    when it is not a float32 tensor broadcasting along whole heads."""
    if mask is None:
        return None
    shape = _dims(mask)
    if not _static(shape) or dtype_of(mask) != "float32" or len(shape) > len(x_shape):
        return None
    shape = [1] * (len(x_shape) - len(shape)) + list(shape)
    if any(m not in (1, x) for m, x in zip(shape, x_shape)):
        return None
    rows, cols = shape[-2:]
    if len(x_shape) == 4:
        heads = (1, 1) if shape[1] == 1 else (hk, g)
        return (shape[0],) + heads + (rows, cols)
    if len(x_shape) == 3:
        return (1, 1, 1, rows, cols) if shape[0] == 1 else (b, hk, g, rows, cols)
    return None
