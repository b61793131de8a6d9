"""A take's index is read as it is, without its cast to int32.

Stage: normalise (before partition). In: a Relax IRModule. Out: the same module in which every

    take(x, astype(i, "int32"), axis)        i an integer tensor (int64 token ids), a reshape
                                             between the cast and the take kept

is `take(x, i, axis)`.

Exact on every index the take defines: an index in [0, n) is the same number as int64 and as
int32. One outside it is an error in PyTorch (nn.Embedding raises) and undefined for take's
"fast" mode whatever its dtype; only there could the cast differ (int64 2^32 + 5 wraps to row 5).

Why: torch.export casts the int64 token ids of every embedding lookup to int32 first (BERT,
ALBERT, DistilBERT, T5: their one compute op left on the host; every decoder too); the lookup
reads int64 indices as well (the take itself is a layout op: a row gather).

Also: an int32 index computed in int64 from int32 values and constants (RoBERTa's position ids:
astype(astype(p, int64) + 1, int32)) is computed in int32: casts between int32 and int64 dropped,
int64 constants wrapped to int32. Exact for every input: truncation to 32 bits commutes with
add, subtract and multiply (arithmetic modulo 2^32), and the NPU's int32 ELTWISE wraps.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..relax_info import dtype_of
from .chain_match import Chain
from .rewrite import as_pass, rewrite_calls

_INTEGERS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")


def index_casts_removed(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every take reading its integer index uncast (the cast removed if unused)."""
    return relax.transform.DeadCodeElimination()(rewrite_calls(mod, "relax.take", _uncast_index))


index_casts_pass = as_pass(index_casts_removed, "cgra.TakeIndexCastsRemoved", ops=("relax.take",))


def _uncast_index(mutator, call):
    """The take reading its index uncast, else None."""
    chain = Chain(mutator)
    narrowed = _narrowed(mutator, chain, call.args[1], 0) if dtype_of(call.args[1]) == "int32" else None
    index = narrowed[0] if narrowed is not None and narrowed[1] else _uncast(mutator, chain, call.args[1])
    if index is None:
        return None
    return relax.Call(call.op, [call.args[0], index], call.attrs, call.ty_args, call.span)


def _uncast(mutator, chain: Chain, index):
    """The index without its int32 cast of an integer tensor (through a reshape after the
    cast, kept), else None."""
    reshape = chain.call(index, "relax.reshape")
    if reshape is not None:
        inner = _uncast(mutator, chain, reshape.args[0])
        return None if inner is None else mutator.builder_.emit(relax.op.reshape(inner, reshape.args[1]))
    cast = chain.call(index, "relax.astype")
    if cast is None or dtype_of(cast) != "int32" or dtype_of(cast.args[0]) not in _INTEGERS:
        return None
    return cast.args[0]


_RING = ("relax.add", "relax.subtract", "relax.multiply")
_WORDS = ("int32", "int64")


def _narrowed(mutator, chain: Chain, expr, depth: int):
    """(an int32 expression equal to `expr` modulo 2^32, whether it dropped a cast) for integer
    arithmetic of int32 values and constants through casts between int32 and int64, reshapes,
    adds, subtracts and multiplies; None when a leaf is wider than int32 (an int64 input)."""
    if depth > 16:
        return None
    array = chain.array(expr)
    if array is not None and array.dtype.kind == "i":
        return (expr, False) if array.dtype == np.int32 else (relax.const(array.astype(np.int32)), True)
    call = chain.call(expr, "relax.astype", "relax.reshape", *_RING)
    if call is None:
        return (expr, False) if dtype_of(expr) == "int32" else None
    if call.op.name == "relax.astype":
        if not (dtype_of(call) in _WORDS and dtype_of(call.args[0]) in _WORDS):  # bool -> int32: a leaf
            return (expr, False) if dtype_of(expr) == "int32" else None
        inner = _narrowed(mutator, chain, call.args[0], depth + 1)
        return None if inner is None else (inner[0], True)
    operands = [_narrowed(mutator, chain, arg, depth + 1)
                for arg in (call.args[:1] if call.op.name == "relax.reshape" else call.args[:2])]
    if any(operand is None for operand in operands):
        return None
    if not any(operand[1] for operand in operands):
        return (expr, False) if dtype_of(expr) == "int32" else None
    args = [operand[0] for operand in operands] + list(call.args[len(operands):])
    return mutator.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args, call.span)), True
