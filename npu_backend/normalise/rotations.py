"""RoPE's negation folded into its constant sine.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which every

    multiply(R, S)        R a layout tree (concat, expand_dims, reshape) over slices of q or k,
                          some leaves negative(a); S a constant (through expand_dims,
                          broadcast_to, reshape of a constant)

is `multiply(R', S')`: R' the same tree with each negative(a) leaf read as a, S' the constant
with the sign of every element R's negation reached flipped. Hugging Face's rotate_half
(Llama, Qwen2, Mistral, Gemma, Phi-3, GPT-NeoX's partial rotary, Falcon: concat(-x2, x1)) and
GPT-J's rotate_every_two (stack(-x2, x1).flatten: expand_dims, concat, reshape) are such trees.

Exact: IEEE multiplication rounds symmetrically, so (-a) * s and a * (-s) are the same float32
for every a and s (a NaN's sign aside); the layout tree only moves elements. The sign pattern is
found by running the tree over +1 / -1 arrays with numpy; the fold is made only when the pattern
is one vector along the last axis (the same for every row: true of both rotations), so S' is S
broadcast along that axis and no larger.

With a symbolic length (a prefill compiled for any length) the sine is computed at run time: the
signs are read at a trial length (attention_lengths.TRIAL_LENGTHS; they are one row along the
head dim whatever the length) and the sine, under its per-layer views, is multiplied once by
that row for every layer, q and k.

Why: the four `negative`s of a 2-layer Llama (q and k per layer) were the only arithmetic of RoPE
left on the host, each between two NPU kernels; folded, RoPE is two multiplies and an add the
NPU already runs (the slices and the concat are layout: DMA boxes and strides).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of, shape_dims
from .attention_lengths import TRIAL_LENGTHS, at_lengths, static_dims as static_shape
from .chain_match import Chain
from .rewrite import as_pass, rewrite_functions

_MULTIPLY = tvm.ir.Op.get("relax.multiply")
_LAYOUT = ("relax.concat", "relax.expand_dims", "relax.reshape")
_CONSTANT_LAYOUT = ("relax.expand_dims", "relax.broadcast_to", "relax.reshape")


def rotations_folded(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every negation under a rotation's layout tree folded into its constant factor
    (the negations and constant layouts removed if nothing else reads them)."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _RotationRewriter))


rotations_pass = as_pass(rotations_folded, "cgra.RotationSignsFolded", ops=("relax.negative",))


@relax.expr_functor.mutator
class _RotationRewriter(relax.PyExprMutator):
    def __init__(self, mod=None):
        super().__init__(mod)
        self.constants = {}  # one flipped sine for q and k and every layer that share it

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not (isinstance(call, relax.Call) and call.op.same_as(_MULTIPLY) and dtype_of(call) == "float32"):
            return call
        chain = Chain(self)
        for tree, factor in (call.args, reversed(call.args)):
            folded = _folded(chain, tree, factor, static_shape(call))
            if folded is not None:
                unsigned, flipped = folded
                key = (flipped.shape, flipped.tobytes())
                constant = self.constants.setdefault(key, relax.const(flipped))
                return relax.Call(call.op, [unsigned, constant], call.attrs, call.ty_args, call.span)
            folded = self._folded_at_length(chain, tree, factor, call)
            if folded is not None:
                return folded
        return call

    def _folded_at_length(self, chain: Chain, tree, factor, call):
        """With a symbolic length and a sine computed at run time (a prefill's RoPE): the signs read
        at a trial length (they are one row along the head dim, whatever the length), the tree's
        negations removed and the sine times that row of signs, once per sine (exact)."""
        names = {v.name for d in shape_dims(call) or () if not isinstance(d, int) for v in _free(d)}
        if len(names) != 1 or dtype_of(factor) != "float32" or str(shape_dims(tree)) != str(shape_dims(call)):
            return None
        with at_lengths({names.pop(): TRIAL_LENGTHS[0]}):
            shape = static_shape(tree)
            found = _signs(chain, tree, depth=0) if shape is not None else None
        if found is None or not found[1]:
            return None
        row = found[0].reshape(-1, shape[-1])
        factor_dims = shape_dims(factor)
        if not (row == row[:1]).all() or factor_dims is None or factor_dims[-1] != shape[-1]:
            return None
        # The sine under its views (every layer's expand_dims of one sine): signed once for all.
        view = chain.call(factor, "relax.expand_dims", "relax.reshape")
        base = view.args[0] if view is not None and (shape_dims(view.args[0]) or [0])[-1] == shape[-1] else factor
        key = (base, row[0].tobytes())
        if key not in self.constants:
            self.constants[key] = self.builder_.emit(relax.op.multiply(base, relax.const(row[0].astype(np.float32))))
        signed = self.constants[key]
        if base is not factor:
            signed = self.builder_.emit(relax.Call(view.op, [signed, *view.args[1:]], view.attrs, view.ty_args))
        return relax.Call(call.op, [found[2], signed], call.attrs, call.ty_args, call.span)


def _free(dim):
    from tvm import tirx
    return tirx.analysis.undefined_vars(dim)


def _folded(chain: Chain, tree, factor, out_shape):
    """(R', the numpy value of S') for multiply(tree, factor) when the tree negates some leaves
    and the factor is a constant, else None."""
    value = constant_value(chain, factor)
    shape = static_shape(tree)
    if value is None or shape is None or out_shape is None or shape != out_shape or value.dtype != np.float32:
        return None
    found = _signs(chain, tree, depth=0)
    if found is None or not found[1]:
        return None
    signs, _, unsigned = found
    row = signs.reshape(-1, shape[-1])
    if not (row == row[:1]).all():  # the pattern differs between rows: S' would grow to R's shape
        return None
    flipped = (value * row[0].astype(np.float32)).astype(np.float32)
    if len(np.broadcast_shapes(flipped.shape, shape)) != len(shape):
        return None
    return unsigned, flipped


def _signs(chain: Chain, expr, depth: int):
    """(the sign array over expr's shape, whether a negation was found, expr with its negations
    removed) for a layout tree of static shapes, else None. A leaf that is no layout op is +1."""
    shape = static_shape(expr)
    if shape is None or depth > 8:
        return None
    negated = chain.call(expr, "relax.negative")
    if negated is not None:
        return -np.ones(shape, np.int8), True, negated.args[0]
    call = chain.call(expr, *_LAYOUT)
    if call is None:
        return np.ones(shape, np.int8), False, expr
    if call.op.name == "relax.concat":
        parts = [_signs(chain, part, depth + 1) for part in call.args[0].fields]
        if any(part is None for part in parts):
            return None
        axis = int(call.attrs.axis) if call.attrs.axis is not None else 0
        signs = np.concatenate([part[0] for part in parts], axis=axis)
        if not any(part[1] for part in parts):
            return signs, False, expr
        return signs, True, _emit(chain, relax.op.concat([part[2] for part in parts], axis=axis))
    inner = _signs(chain, call.args[0], depth + 1)
    if inner is None:
        return None
    signs = inner[0].reshape(shape)  # expand_dims and reshape keep the elements' order
    if not inner[1]:
        return signs, False, expr
    return signs, True, _emit(chain, relax.Call(call.op, [inner[2], *call.args[1:]], call.attrs, call.ty_args,
                                                call.span))


def _emit(chain: Chain, call):
    """`call` bound to a new variable of the function being rewritten (its arguments stay leaves)."""
    return chain.mutator.builder_.emit(call)


def constant_value(chain: Chain, expr, depth: int = 0) -> np.ndarray | None:
    """The numpy value of a constant, or of expand_dims / broadcast_to / reshape of one, else None."""
    array = chain.array(expr)
    if array is not None:
        return array
    call = chain.call(expr, *_CONSTANT_LAYOUT)
    shape = static_shape(expr)
    if call is None or shape is None or depth > 8:
        return None
    inner = constant_value(chain, call.args[0], depth + 1)
    if inner is None:
        return None
    if call.op.name == "relax.broadcast_to":
        return np.broadcast_to(inner, shape).copy()
    return inner.reshape(shape)
