"""A padding mask over the keys stays a row (normalise/masks.py): HF's bidirectional mask (BERT's
`where(ones & mask[None, None, None, :], 0, -inf)`, broadcast over the queries) added to scores
reads the row itself, so the attention kernel takes it as a row (a GEMM of k = 1 on the PE array,
kernels/attention/rows.py), no s x s copy; the causal form (a constant triangle & the row) is the
constant where(c, 0, -inf) plus the row's select, added to the scores one after the other
(causal_rows.py: the kernel builds the triangle). Both exact: the same bits as before.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tvm import relax

from npu_backend.normalise.masks import masks_as_float
from npu_backend.relax_info import dtype_of
from test_host_op_rewrites import _identical
from test_transformer_rewrites import _module, _ops

op = relax.op
WORDS = st.sampled_from([0, 1, -1, 2, 1 << 40, -(1 << 63), 1 << 31])


def _scores_plus_mask(keep, attention: bool = False):
    """scores (1, 2, 1, 8, 8) + reshape(where(keep & mask row, 0, -inf)), the attention form's add
    (`attention`: the scores a matmul(q, kᵀ) as the form's, here the input times I, exactly)."""
    def build(bb, scores, mask):
        if attention:
            eye = bb.emit(op.permute_dims(relax.const(np.eye(8, dtype=np.float32).reshape(1, 1, 1, 8, 8)), [0, 1, 2, 4, 3]))
            scores = bb.emit(op.matmul(scores, eye))
        row = bb.emit(op.reshape(bb.emit(op.astype(mask, "bool")), (1, 1, 1, 8)))
        both = bb.emit(op.bitwise_and(relax.const(keep), row))
        additive = bb.emit(op.where(both, relax.const(np.float32(0)), relax.const(np.float32(-np.inf))))
        same = bb.emit(op.reshape(additive, (1, 1, 8, 8)))  # HF's mask[:, :, :, :s]
        return op.add(scores, bb.emit(op.reshape(same, (1, 1, 1, 8, 8))))
    return _module(build, shapes=((1, 2, 1, 8, 8), (1, 8)), dtypes=["float32", "int64"])


def _float_adds(mod) -> list:
    """The float32 adds of `mod`'s main (the scores' adds; the mask's words' chain adds int32)."""
    return [b.value for b in mod["main"].body.blocks[0].bindings
            if isinstance(b.value, relax.Call) and b.value.op.name == "relax.add" and dtype_of(b.value) == "float32"]


@settings(max_examples=10, deadline=None)
@given(mask=hnp.arrays(np.int64, (1, 8), elements=WORDS), scores=hnp.arrays(np.float32, (1, 2, 1, 8, 8),
                                                                            elements=st.floats(-4, 4, width=32)))
def test_a_bidirectional_padding_mask_is_added_as_a_row(mask, scores):
    before = _scores_plus_mask(np.ones((1, 1, 8, 1), bool))
    after = masks_as_float(before)
    ops = _ops(after)
    assert "broadcast_to" not in ops and "where" not in ops, ops
    (add,) = _float_adds(after)
    assert [int(d) for d in add.args[1].ty.shape] == [1, 1, 1, 1, 8]  # the attention's mask is a row
    _identical(before, after, scores, mask)


@settings(max_examples=10, deadline=None)
@given(mask=hnp.arrays(np.int64, (1, 8), elements=WORDS), scores=hnp.arrays(np.float32, (1, 2, 1, 8, 8),
                                                                            elements=st.floats(-4, 4, width=32)))
def test_a_causal_padding_mask_is_a_constant_plus_the_rows_select(mask, scores):
    before = _scores_plus_mask(np.tril(np.ones((8, 8), bool)).reshape(1, 1, 8, 8), attention=True)
    after = masks_as_float(before)
    ops = _ops(after)
    # no causal * row product: the row's multiplies are the words' chain's two and the pair's max times 4
    assert ops["multiply"] == 3 and "where" not in ops, ops
    # the scores take the triangle (a constant) and the row one at a time (causal_rows.py): no s x s mask
    causal, row = _float_adds(after)
    assert causal.args[1].value.numpy().shape == (1, 1, 1, 8, 8)  # a constant
    assert [int(d) for d in row.args[1].ty.shape] == [1, 1, 1, 1, 8]
    _identical(before, after, scores, mask)
