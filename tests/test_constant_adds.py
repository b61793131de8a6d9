"""Two constant adds in a row are one (normalise/constant_adds.py): BERT's token-type and
position embeddings added to the word embeddings as one elementwise kernel, within a few float32
roundings of the two adds; an inner add read elsewhere stays."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.constant_adds import fold_constant_adds


def _embeddings(x_shape, c1, c2, *, swap=False, expose_inner=False):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            inner = bb.emit(relax.op.add(relax.const(c1), x) if swap else relax.op.add(x, relax.const(c1)))
            outer = relax.op.add(relax.const(c2), inner) if swap else relax.op.add(inner, relax.const(c2))
            out = bb.emit_output(relax.Tuple([bb.emit(outer), inner]) if expose_inner else outer)
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=5, deadline=None)
@given(rows=st.integers(1, 40), cols=st.sampled_from([8, 64]), row_constant=st.booleans(), swap=st.booleans(),
       seed=st.integers(0, 99))
def test_two_constant_adds_are_one_kernel(rows, cols, row_constant, swap, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, rows, cols)).astype("float32")
    c1 = rng.standard_normal((cols,) if row_constant else (1, rows, cols)).astype("float32")
    c2 = rng.standard_normal((1, rows, cols)).astype("float32")
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(npu_backend.compile(_embeddings(x.shape, c1, c2, swap=swap), "cgra-8x8"),
                                   tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    two_adds = (x + c1) + c2  # float32, as PyTorch adds them
    bound = 2.0 ** -24 * (np.abs(x + c1) + np.abs(c1.astype(np.float64) + c2) + np.abs(two_adds))
    assert np.all(np.abs(got.astype(np.float64) - two_adds) <= bound)
    assert len(prof.kernels) == 1, [k.name for k in prof.kernels]


def test_an_inner_add_read_elsewhere_stays_and_broadcast_constants_join():
    c = np.ones((1, 4, 8), "float32")
    exposed = _embeddings((1, 4, 8), c, c, expose_inner=True)
    tvm.ir.assert_structural_equal(fold_constant_adds(exposed), exposed)
    # x (1, 1, 8) + c1 (8,) + c2 (1, 4, 8) is x + (c1 + c2) (1, 4, 8): the same (1, 4, 8) result
    broadcast = _embeddings((1, 1, 8), np.ones(8, "float32"), c)
    assert str(fold_constant_adds(broadcast)["main"]).count("R.add") == 1
    narrow = _embeddings((1, 4, 8), np.ones((4, 8), "float32"), np.ones(8, "float32"))
    assert str(fold_constant_adds(narrow)["main"]).count("R.add") == 1
