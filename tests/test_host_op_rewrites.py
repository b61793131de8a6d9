"""The exact normalise rewrites that take a transformer's last compute ops off the host: RoPE's
negation folded into its sine (rotations.py), an index_tensor of constant indices as a reshape or
a row gather (constant_indices.py), a boolean mask's arithmetic as float32 {0, 1} arithmetic the
NPU runs (masks.py). Each is checked for its structure and for bit-identical numbers on llvm
(Hypothesis draws the inputs, infinities and signed zeros among them); forms they do not cover
are left alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tvm import relax

from npu_backend.normalise.constant_indices import constant_indices_as_views, flat_rows
from npu_backend.normalise.empty_operands import empty_operands_dropped
from npu_backend.normalise.index_casts import index_casts_removed
from npu_backend.normalise.masks import masks_as_float
from npu_backend.normalise.rotations import rotations_folded
from test_transformer_rewrites import _module, _ops, _run

op = relax.op
FLOATS = st.floats(width=32, allow_nan=False)


_VMS: dict = {}


def _on_llvm(mod, *inputs):
    """`mod`'s output on llvm, each module compiled once (Hypothesis draws inputs for the same one)."""
    key = mod.script(show_meta=True)  # the constants too: a module differing only in one is another
    if key not in _VMS:
        _VMS[key] = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return _VMS[key]["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


def _identical(before, after, *inputs):
    """Both modules give the same float32 bits (NaN's sign and payload aside) on llvm."""
    expected, got = _on_llvm(before, *inputs), _on_llvm(after, *inputs)
    assert expected.dtype == got.dtype and expected.shape == got.shape
    same = (expected.view(np.uint32) == got.view(np.uint32)) | (np.isnan(expected) & np.isnan(got)) \
        if expected.dtype == np.float32 else expected == got
    assert same.all(), (expected[~same][:4], got[~same][:4])


# --------------------------------------------------------------------------------- rotations

SIN = np.random.default_rng(1).standard_normal((1, 1, 6, 8)).astype(np.float32)


def _rotate_half(bb, x, sin=SIN, negate_first=True):
    """x * cos + concat(-x2, x1) * sin, Llama's apply_rotary_pos_emb (cos = sin here)."""
    x1 = bb.emit(op.strided_slice(x, [3], [0], [4]))
    x2 = bb.emit(op.strided_slice(x, [3], [4], [8]))
    parts = (bb.emit(op.negative(x2)), x1) if negate_first else (x2, bb.emit(op.negative(x1)))
    rotated = bb.emit(op.concat(parts, axis=-1))
    return op.add(bb.emit(op.multiply(x, relax.const(sin))), bb.emit(op.multiply(rotated, relax.const(sin))))


def _rotate_every_two(bb, x):
    """GPT-J's interleaved form: stack(-x[..., 1::2], x[..., ::2], -1).flatten(-2), sin a layout of a constant."""
    even = bb.emit(op.strided_slice(x, [3], [0], [8], [2]))
    odd = bb.emit(op.strided_slice(x, [3], [1], [8], [2]))
    pair = bb.emit(op.concat((bb.emit(op.expand_dims(bb.emit(op.negative(odd)), [4])),
                              bb.emit(op.expand_dims(even, [4]))), axis=-1))
    rotated = bb.emit(op.reshape(pair, (1, 2, 6, 8)))
    half = relax.const(SIN[..., :4].copy())
    sin = bb.emit(op.reshape(bb.emit(op.broadcast_to(bb.emit(op.expand_dims(half, [4])), (1, 1, 6, 4, 2))),
                             (1, 1, 6, 8)))
    return op.add(bb.emit(op.multiply(x, relax.const(SIN))), bb.emit(op.multiply(rotated, sin)))


@pytest.mark.parametrize("build", [_rotate_half, lambda bb, x: _rotate_half(bb, x, negate_first=False),
                                   _rotate_every_two])
@settings(max_examples=10, deadline=None)
@given(x=hnp.arrays(np.float32, (1, 2, 6, 8), elements=FLOATS | st.sampled_from([0.0, -0.0, np.inf, -np.inf])))
def test_a_rotations_negation_folds_into_its_sine_exactly(build, x):
    before = _module(build, shapes=((1, 2, 6, 8),))
    after = rotations_folded(before)
    assert _ops(after)["negative"] == 0 and _ops(after)["multiply"] == 2
    _identical(before, after, x)


def test_a_negation_times_a_run_time_value_is_left_alone():
    def build(bb, x, s):
        return op.multiply(bb.emit(op.concat((bb.emit(op.negative(x)), x), axis=-1)), s)

    before = _module(build, shapes=((2, 4), (2, 8)))
    assert _ops(rotations_folded(before))["negative"] == 1


# -------------------------------------------------------------------------- constant indices

def test_hf_padding_mask_index_is_a_reshape():
    def build(bb, mask):  # mask[arange(1)[:, None, None, None], arange(32)[None, None, None, :]]
        rows, cols = np.zeros((1, 1, 1, 1), np.int64), np.arange(32, dtype=np.int64).reshape(1, 1, 1, 32)
        return op.index_tensor(mask, relax.Tuple([relax.const(rows), relax.const(cols)]))

    before = _module(build, shapes=((1, 32),))
    after = constant_indices_as_views(before)
    assert _ops(after) == {"reshape": 1}
    _identical(before, after, np.random.default_rng(0).standard_normal((1, 32)).astype(np.float32))


@settings(max_examples=15, deadline=None)
@given(rows=hnp.arrays(np.int64, (3, 1), elements=st.integers(0, 3)),
       cols=hnp.arrays(np.int64, (1, 2), elements=st.integers(0, 4)))
def test_other_constant_indices_are_a_row_gather(rows, cols):
    def build(bb, x):
        return op.index_tensor(x, relax.Tuple([relax.const(rows), relax.const(cols)]))

    before = _module(build, shapes=((4, 5, 3),))
    after = constant_indices_as_views(before)
    assert "index_tensor" not in _ops(after)
    x = np.arange(60, dtype=np.float32).reshape(4, 5, 3)
    np.testing.assert_array_equal(_run(after, x), x[rows, cols])
    _identical(before, after, x)


def test_indices_out_of_range_or_not_constant_are_left_alone():
    assert flat_rows([np.array([0, 4])], (4,)) is None
    before = _module(lambda bb, x, i: op.index_tensor(x, relax.Tuple([i])), shapes=((4, 3), (2,)),
                     dtypes=["float32", "int64"])
    assert _ops(constant_indices_as_views(before))["index_tensor"] == 1


# ------------------------------------------------------------------------------------- masks

CAUSAL = np.tril(np.ones((8, 8), bool)).reshape(1, 1, 8, 8)


def _padding_mask(bb, mask, lowest=-np.inf, combine="bitwise_and", cast=True):
    """HF's decoder mask: where(causal & mask[None, None, None, :], 0, lowest), plus (`cast`) the
    safe softmax guard's astype of it."""
    padding = bb.emit(op.reshape(bb.emit(op.astype(mask, "bool")), (1, 1, 1, 8)))
    both = bb.emit(getattr(op, combine)(relax.const(CAUSAL), padding))
    additive = op.where(both, relax.const(np.float32(0)), relax.const(np.float32(lowest)))
    return op.add(bb.emit(additive), bb.emit(op.astype(both, "float32"))) if cast else additive


@pytest.mark.parametrize("lowest, combine", [(-np.inf, "bitwise_and"), (float(np.finfo(np.float32).min), "bitwise_and"),
                                             (-3.0, "logical_or")])
@settings(max_examples=10, deadline=None)
@given(mask=hnp.arrays(np.int64, (1, 8), elements=st.sampled_from([0, 1, -1, 2, 1 << 40, -(1 << 63)])))
def test_a_boolean_mask_is_float_arithmetic_exactly(lowest, combine, mask):
    before = _module(lambda bb, m: _padding_mask(bb, m, lowest, combine), shapes=((1, 8),), dtypes=["int64"])
    after = masks_as_float(before)
    ops = _ops(after)
    assert not {"where", "bitwise_and", "logical_or", "astype"} & set(ops), ops
    _identical(before, after, mask)


def test_the_mask_of_every_layer_is_built_once():
    def build(bb, mask):
        both = bb.emit(op.bitwise_and(relax.const(CAUSAL), bb.emit(op.reshape(bb.emit(op.astype(mask, "bool")),
                                                                               (1, 1, 1, 8)))))
        layers = [bb.emit(op.where(both, relax.const(np.float32(0)), relax.const(np.float32(-np.inf))))
                  for _ in range(3)]
        return op.add(bb.emit(op.add(layers[0], layers[1])), layers[2])

    after = masks_as_float(_module(build, shapes=((1, 8),), dtypes=["int64"]))
    # the row from the words (masks.py's padding_row): their chain (* -1, + 1, * bits), the pair's max
    # times 4; the select: where(causal, 0, -inf) + that row
    assert "subtract" not in _ops(after) and _ops(after)["memory.view"] == 2 and _ops(after)["multiply"] == 3
    assert _ops(after)["add"] == 1 + 1 + 2  # the chain's + 1, the select's one add, the layers' two
    assert _ops(after)["max"] == 1 and "strided_slice" not in _ops(after)  # an int64's words as pairs, not slices


def test_a_where_of_other_values_or_a_float_condition_is_left_alone():
    def build(bb, x, mask):
        cond = bb.emit(op.astype(mask, "bool"))
        picked = bb.emit(op.where(cond, x, relax.const(np.float32(0))))  # a guarded value, not a mask
        return op.add(picked, bb.emit(op.where(bb.emit(op.astype(x, "bool")), relax.const(np.float32(0)),
                                               relax.const(np.float32(-1)))))

    after = masks_as_float(_module(build, shapes=((1, 8), (1, 8)), dtypes=["float32", "int64"]))
    assert _ops(after)["where"] == 2


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_the_mask_runs_on_the_npu_with_no_host_arithmetic(dtype):
    import npu_backend
    import tvm

    mod = _module(lambda bb, m: _padding_mask(bb, m, cast=False), shapes=((1, 8),), dtypes=[dtype])
    host = [p.op for p in npu_backend.explain(mod, "cgra-8x8") if p.where == "host"]
    assert not set(host) - {"reshape", "memory.view", "strided_slice"}, host  # views and the words' slices
    mask = np.array([[1, 1, 0, 1 << 31 if dtype == "int64" else -1, 1, 1, 0, 0]], dtype)
    with npu_backend.profile() as prof:
        vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(mask)).numpy()
    assert prof.kernels
    expected = _run(mod, mask)
    assert (got.view(np.uint32) == expected.view(np.uint32)).all()


# ---------------------------------------------------------------------------- index casts

def test_an_embedding_lookup_reads_its_int64_ids_uncast():
    table = np.random.default_rng(2).standard_normal((10, 4)).astype(np.float32)

    def build(bb, ids):
        flat = bb.emit(op.reshape(bb.emit(op.astype(ids, "int32")), (6,)))
        return op.take(relax.const(table), flat, axis=0)

    before = _module(build, shapes=((1, 6),), dtypes=["int64"])
    after = index_casts_removed(before)
    assert "astype" not in _ops(after)
    ids = np.array([[0, 9, 3, 3, 1, 7]], np.int64)
    _identical(before, after, ids)


def test_a_float_index_cast_is_left_alone():
    before = _module(lambda bb, x: op.take(x, bb.emit(op.astype(x, "int32")), axis=0), shapes=((4,),))
    assert _ops(index_casts_removed(before))["astype"] == 1


@settings(max_examples=15, deadline=None)
@given(ids=hnp.arrays(np.int64, (1, 8), elements=st.sampled_from([0, 1, 2, -1, 1 + (1 << 32), 1 << 40, -(1 << 63)])),
       pad=st.sampled_from([1, 0, -1, 1 << 33]), equal=st.booleans())
def test_roberta_style_positions_compare_int64_ids_in_int32_words(ids, pad, equal):
    def build(bb, x):  # astype(ids != pad, int32) * 3 + 1, RoBERTa's position ids' first steps
        kept = bb.emit((op.equal if equal else op.not_equal)(x, relax.const(pad, "int64")))
        return op.add(bb.emit(op.multiply(bb.emit(op.astype(kept, "int32")), relax.const(3, "int32"))),
                      relax.const(1, "int32"))

    before = _module(build, shapes=((1, 8),), dtypes=["int64"])
    after = masks_as_float(before)
    assert not {"equal", "not_equal", "astype"} & set(_ops(after)), _ops(after)
    _identical(before, after, ids)


# --------------------------------------------------------------------- index arithmetic

def test_an_index_computed_in_int64_from_int32_values_is_computed_in_int32():
    table = np.random.default_rng(3).standard_normal((300, 4)).astype(np.float32)

    def build(bb, p):  # RoBERTa: astype(astype(p, int64) + pad, int32) as the position table's index
        shifted = bb.emit(op.add(bb.emit(op.astype(p, "int64")), relax.const(np.full((1, 1), 1), "int64")))
        return op.take(relax.const(table), bb.emit(op.reshape(bb.emit(op.astype(shifted, "int32")), (6,))), axis=0)

    before = _module(build, shapes=((1, 6),), dtypes=["int32"])
    after = index_casts_removed(before)
    assert "astype" not in _ops(after) and _ops(after)["add"] == 1
    _identical(before, after, np.array([[0, 5, 298, 7, 1, 2]], np.int32))


def test_a_gather_from_a_constant_of_one_value_is_that_value():
    def build(bb, i):
        return op.gather_elements(relax.const(np.zeros((1, 40), np.int64), "int64"), i, axis=1)

    before = _module(build, shapes=((1, 6),), dtypes=["int64"])
    after = constant_indices_as_views(before)
    assert "gather_elements" not in _ops(after)
    _identical(before, after, np.array([[0, 5, 39, 7, 1, 2]], np.int64))


# ------------------------------------------------------------------------------------ cumsum

@settings(max_examples=10, deadline=None)
@given(ids=hnp.arrays(np.int64, (2, 40), elements=st.sampled_from([0, 1, 2, 1 + (1 << 32), -(1 << 63)])))
def test_a_cumsum_of_a_mask_is_a_triangular_int8_matmul_exactly(ids):
    def build(bb, x):  # RoBERTa: cumsum(astype(ids != 1, int32), axis=1)
        kept = bb.emit(op.astype(bb.emit(op.not_equal(x, relax.const(1, "int64"))), "int32"))
        return op.cumsum(kept, axis=1)

    before = _module(build, shapes=((2, 40),), dtypes=["int64"])
    after = masks_as_float(before)
    assert "cumsum" not in _ops(after) and _ops(after)["matmul"] == 1
    _identical(before, after, ids)


def test_a_cumsum_of_other_values_is_left_alone():
    before = _module(lambda bb, x: op.cumsum(x, axis=1), shapes=((2, 8),), dtypes=["int32"])
    assert _ops(masks_as_float(before))["cumsum"] == 1


def test_the_mask_cumsum_runs_on_the_npu():
    import npu_backend
    import tvm

    def build(bb, x):
        return op.cumsum(bb.emit(op.astype(bb.emit(op.not_equal(x, relax.const(1, "int64"))), "int32")), axis=1)

    mod = _module(build, shapes=((1, 32),), dtypes=["int64"])
    host = [p.op for p in npu_backend.explain(mod, "cgra-8x8") if p.where == "host"]
    assert not set(host) - {"reshape", "memory.view", "strided_slice"}, host
    ids = np.random.default_rng(4).integers(0, 3, (1, 32)).astype(np.int64)
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(ids)).numpy(), np.cumsum(ids != 1, axis=1))


# ------------------------------------------------------------------- empty concat operands

@pytest.mark.parametrize("kept", [1, 2])
def test_a_concats_empty_operands_are_dropped(kept):
    """Phi-3's partial rotary with the rotary dims the whole head: concat(rotated, x[..., 8:]),
    the slice empty. The concat of one operand is it; of two, a concat of those two."""
    def build(bb, x):
        empty = bb.emit(op.strided_slice(x, [3], [8], [8]))
        full = (bb.emit(op.multiply(x, x)), x)[:kept]
        parts = (full[0], empty, *full[1:], empty)
        return op.concat(parts, axis=-1)

    before = _module(build, shapes=((1, 2, 6, 8),))
    after = empty_operands_dropped(before)
    assert _ops(after)["concat"] == kept - 1
    _identical(before, after, np.random.default_rng(kept).standard_normal((1, 2, 6, 8)).astype(np.float32))


def test_a_concat_with_nothing_empty_is_left_alone():
    before = _module(lambda bb, x: op.concat((x, x), axis=1), shapes=((2, 3),))
    assert _ops(empty_operands_dropped(before))["concat"] == 1
