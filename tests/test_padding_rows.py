"""HF's run-time padding row `where(mask != 0, 0, -inf)` of an int64 or int32 attention_mask is
built straight from the mask's 32-bit words (normalise/masks.py, `padding_row`): one int32 chain
on the PE fabric (-2^127's bits where a word is zero, else +0.0; -inf's for an int32) and, for an
int64's pair of words, one row kernel: their maximum times 4 (kernels/rows/row_reduce.py's scaled
max, -2^127 * 4 overflowing to -inf). Before: the twin B (an int32 chain, a float32 chain, a row
max) and (B - 1) * 2 * FLT_MAX, four kernels of launch latency (about 930 cycles on cgra-8x8).
Both exact: the same bits as the where on the host.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tvm import relax

import npu_backend
from npu_backend.normalise.masks import masks_as_float
from test_host_op_rewrites import _identical
from test_transformer_rewrites import _module, _ops, _run

op = relax.op
WORDS = st.sampled_from([0, 1, -1, 2, -2, 1 << 31, (1 << 31) - 1, 1 << 32, 1 << 40, -(1 << 63), (1 << 63) - 1])
_VMS: dict = {}


def _on_npu(mod, *inputs):
    """(output, the NPU kernels' launches) of `mod` compiled for cgra-8x8, each module compiled once."""
    key = mod.script(show_meta=True)
    if key not in _VMS:
        _VMS[key] = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    with npu_backend.profile() as prof:
        out = _VMS[key]["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()
    return out, [k.name for k in prof.kernels]


def _padding_row(dtype: str, keys: int = 8):
    """where(reshape(astype(mask, bool)), 0, -inf): HF's padding row over the keys."""
    def build(bb, mask):
        row = bb.emit(op.reshape(bb.emit(op.astype(mask, "bool")), (1, 1, 1, keys)))
        return op.where(row, relax.const(np.float32(0)), relax.const(np.float32(-np.inf)))
    return _module(build, shapes=((1, keys),), dtypes=[dtype])


@settings(max_examples=12, deadline=None)
@given(mask=hnp.arrays(np.int64, (1, 8), elements=WORDS))
def test_the_padding_row_is_its_words_chain_and_a_scaled_max(mask):
    before = _padding_row("int64")
    after = masks_as_float(before)
    ops = _ops(after)
    assert not {"where", "astype", "subtract", "sum"} & set(ops), ops
    assert ops["max"] == 1 and ops["memory.view"] == 2, ops  # the words as pairs, the chain's bits as float32
    _identical(before, after, mask)
    got, kernels = _on_npu(after, mask)
    assert len(kernels) == 2, kernels  # the words' chain, the pair's max times 4
    expected = _run(before, mask)
    assert (got.view(np.uint32) == expected.view(np.uint32)).all(), (got, expected)


@settings(max_examples=8, deadline=None)
@given(mask=hnp.arrays(np.int32, (1, 8), elements=st.sampled_from([0, 1, -1, 7, -(1 << 31), (1 << 31) - 1])))
def test_an_int32_padding_row_is_one_chain(mask):
    before = _padding_row("int32")
    after = masks_as_float(before)
    assert "max" not in _ops(after) and "where" not in _ops(after)
    got, kernels = _on_npu(after, mask)
    assert len(kernels) == 1, kernels
    expected = _run(before, mask)
    assert (got.view(np.uint32) == expected.view(np.uint32)).all(), (got, expected)


def _scaled(kind: str, shape: tuple, scale: float):
    return _module(lambda bb, x: op.multiply(bb.emit(getattr(op, kind)(x, axis=[-1])), relax.const(np.float32(scale))),
                   shapes=(shape,))


def _sequential(x: np.ndarray, kind: str) -> np.ndarray:
    """The REDUCE's fold: column by column, from 0 (a sum) or -inf (a max), in float32."""
    out = np.full(x.shape[:-1], 0 if kind == "sum" else -np.inf, np.float32)
    for j in range(x.shape[-1]):
        out = out + x[..., j] if kind == "sum" else np.maximum(out, x[..., j])
    return out


@pytest.mark.parametrize("kind, shape", [("max", (1, 32, 2)), ("max", (5, 12)), ("sum", (3, 4, 7))])
@settings(max_examples=6, deadline=None)
@given(data=st.data(), scale=st.sampled_from([4.0, 0.5, -3.0, 1e-3]))
def test_a_scaled_row_reduction_is_one_kernel_as_numpy(kind, shape, data, scale):
    x = data.draw(hnp.arrays(np.float32, shape, elements=st.one_of(
        st.floats(-1e3, 1e3, width=32), st.sampled_from([np.float32(-2.0 ** 127), np.float32(0)]))))
    mod = _scaled(kind, shape, scale)
    got, kernels = _on_npu(mod, x)
    assert len(kernels) == 1, kernels
    with np.errstate(over="ignore"):
        expected = _sequential(x, kind) * np.float32(scale)
    assert (got.view(np.uint32) == expected.view(np.uint32)).all(), (got, expected)


def test_a_reduction_times_a_tensor_is_two_kernels():
    mod = _module(lambda bb, x, y: op.multiply(bb.emit(op.max(x, axis=[-1])), y), shapes=((4, 8), (4,)))
    placements = npu_backend.explain(mod, "cgra-8x8")
    assert all(p.where == "npu" for p in placements if p.op in ("max", "multiply")), placements
    assert len({p.symbol for p in placements if p.op in ("max", "multiply")}) == 2, placements
