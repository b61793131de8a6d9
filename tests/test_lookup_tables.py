"""Lookups of constants fold, and a constant row added to an embedding lookup joins its table
(normalise/lookup_tables.py): RoBERTa's token-type embedding costs no kernel. Bit-equal to
numpy's float32 W[ids] + row; a constant that differs between positions stays an add."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.lookup_tables import fold_lookup_tables


def _embeddings(table, types, type_ids, tokens: int, addend=None):
    """take(table, ids) + take(types, reshape(type_ids)) [+ addend], as RoBERTa writes its embeddings."""
    bb = relax.BlockBuilder()
    ids = relax.Var("input_ids", relax.TensorType((1, tokens), "int64"))
    hidden = table.shape[1]
    with bb.function("main", [ids]):
        with bb.dataflow():
            words = bb.emit(relax.op.take(relax.const(table), relax.op.reshape(ids, (tokens,)), axis=0))
            words = bb.emit(relax.op.reshape(words, (1, tokens, hidden)))
            index = bb.emit(relax.op.reshape(relax.const(type_ids), (tokens,)))
            kinds = bb.emit(relax.op.reshape(bb.emit(relax.op.take(relax.const(types), index, axis=0)),
                                             (1, tokens, hidden)))
            out = bb.emit(relax.op.add(words, kinds))
            out = bb.emit_output(relax.op.add(out, relax.const(addend)) if addend is not None else out)
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=4, deadline=None)
@given(tokens=st.integers(1, 40), hidden=st.sampled_from([16, 64]), kind=st.integers(0, 1), seed=st.integers(0, 99))
def test_a_constant_token_type_joins_the_word_table(tokens, hidden, kind, seed):
    rng = np.random.default_rng(seed)
    table, types = (rng.standard_normal((n, hidden)).astype("float32") for n in (50, 2))
    type_ids = np.full((1, tokens), kind, "int64")
    ids = rng.integers(0, 50, (1, tokens))
    mod = _embeddings(table, types, type_ids, tokens)
    assert str(fold_lookup_tables(mod)["main"]).count("R.take(") == 1
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](
            tvm.runtime.tensor(ids)).numpy()
    np.testing.assert_array_equal(got[0], table[ids[0]] + types[kind])  # float32, the same additions
    assert len(prof.kernels) == 1 and "take" in prof.kernels[0].name, [k.name for k in prof.kernels]


def test_mixed_token_types_stay_an_add():
    rng = np.random.default_rng(1)
    table, types = rng.standard_normal((50, 16)).astype("float32"), rng.standard_normal((2, 16)).astype("float32")
    mixed = np.array([[0, 1, 0, 1]], "int64")  # rows differ: no one row to add to the table
    folded = fold_lookup_tables(_embeddings(table, types, mixed, 4))["main"]
    assert str(folded).count("R.take(") == 1 and str(folded).count("R.add(") == 1  # the types' lookup a constant


def _scaled_lookup(table, tokens: int, scale):
    """take(table, ids) * scale, as Gemma scales its embeddings by sqrt(hidden)."""
    bb = relax.BlockBuilder()
    ids = relax.Var("input_ids", relax.TensorType((1, tokens), "int64"))
    with bb.function("main", [ids]):
        with bb.dataflow():
            words = bb.emit(relax.op.take(relax.const(table), relax.op.reshape(ids, (tokens,)), axis=0))
            words = bb.emit(relax.op.reshape(words, (1, tokens, table.shape[1])))
            out = bb.emit_output(relax.op.multiply(words, relax.const(scale)))
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=4, deadline=None)
@given(tokens=st.integers(1, 40), hidden=st.sampled_from([16, 64]), per_channel=st.booleans(), seed=st.integers(0, 99))
def test_a_constant_scale_joins_the_word_table(tokens, hidden, per_channel, seed):
    """Gemma's embedding times sqrt(hidden) (or a per-channel row): one lookup of the scaled table,
    bit-equal to numpy's float32 W[ids] * c, no multiply kernel."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((50, hidden)).astype("float32")
    scale = rng.standard_normal(hidden).astype("float32") if per_channel else np.float32(np.sqrt(hidden))
    ids = rng.integers(0, 50, (1, tokens))
    mod = _scaled_lookup(table, tokens, scale)
    folded = str(fold_lookup_tables(mod)["main"])
    assert folded.count("R.take(") == 1 and "R.multiply(" not in folded
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](
            tvm.runtime.tensor(ids)).numpy()
    np.testing.assert_array_equal(got[0], table[ids[0]] * scale)
    assert len(prof.kernels) == 1 and "take" in prof.kernels[0].name, [k.name for k in prof.kernels]


def test_a_scale_that_differs_between_positions_stays_a_multiply():
    table = np.random.default_rng(2).standard_normal((50, 16)).astype("float32")
    scale = np.arange(4 * 16, dtype="float32").reshape(1, 4, 16)  # rows differ
    folded = str(fold_lookup_tables(_scaled_lookup(table, 4, scale))["main"])
    assert folded.count("R.multiply(") == 1


def test_a_scale_over_a_symbolic_length_joins_the_table_too():
    """A prefill's (1, s, H) lookup (Gemma exported with a symbolic length): the scalar still folds."""
    table = np.random.default_rng(4).standard_normal((50, 16)).astype("float32")
    s = tvm.tirx.Var("s", "int64")
    bb = relax.BlockBuilder()
    ids = relax.Var("input_ids", relax.TensorType((1, s), "int64"))
    with bb.function("main", [ids]):
        with bb.dataflow():
            words = bb.emit(relax.op.take(relax.const(table), relax.op.reshape(ids, (s,)), axis=0))
            words = bb.emit(relax.op.reshape(words, (1, s, 16)))
            out = bb.emit_output(relax.op.multiply(words, relax.const(np.float32(4.0))))
        bb.emit_func_output(out)
    folded = str(fold_lookup_tables(bb.get())["main"])
    assert folded.count("R.take(") == 1 and "R.multiply(" not in folded


@settings(max_examples=4, deadline=None)
@given(tokens=st.integers(1, 40), hidden=st.sampled_from([16, 64]), dtype=st.sampled_from(["bfloat16", "float16"]),
       positions=st.booleans(), seed=st.integers(0, 99))
def test_a_16_bit_token_type_joins_the_word_table_rounded_as_pytorch_adds(tokens, hidden, dtype, positions, seed):
    """A bf16 / fp16 BERT's embeddings: the token-type row added to the table as PyTorch's add in
    h (widened, added in float32, rounded to h), bit for bit; the position embedding's add after
    it (a constant differing per row) stays a kernel, rounding the same way."""
    import ml_dtypes

    half = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
    rng = np.random.default_rng(seed)
    table, types = (rng.standard_normal((n, hidden)).astype(half) for n in (50, 2))
    position = (rng.standard_normal((1, tokens, hidden)) * 4).astype(half) if positions else None
    ids = rng.integers(0, 50, (1, tokens))
    mod = _embeddings(table, types, np.zeros((1, tokens), "int64"), tokens, position)
    assert str(fold_lookup_tables(mod)["main"]).count("R.add(") == int(positions)
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](
            tvm.runtime.tensor(ids)).numpy()
    expected = (table[ids[0]].astype(np.float32) + types[0].astype(np.float32)).astype(half)
    if positions:
        expected = (expected.astype(np.float32) + position[0].astype(np.float32)).astype(half)
    assert got[0].view(np.uint16).tolist() == expected.view(np.uint16).tolist()
    assert len(prof.kernels) == 1 + int(positions), [k.name for k in prof.kernels]
