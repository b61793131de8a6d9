"""A parallel block's (attn + mlp) + x is attn + (mlp + x) (normalise/parallel_residuals.py): GPT-J's,
GPT-NeoX's and Falcon's residual joins the first linear's epilogue and the sum the second's, no
add kernel left, within a few float32 roundings of the two adds; a sum read elsewhere stays."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.parallel_residuals import reassociate_parallel_residuals


def _linear(bb, rows, weight, bias=None):
    """(1, s, n) = reshape(rows @ weight.T [+ bias]), as torch.export imports nn.Linear."""
    out = bb.emit(relax.op.matmul(rows, relax.op.permute_dims(relax.const(weight))))
    if bias is not None:
        out = bb.emit(relax.op.add(out, relax.const(bias)))
    return bb.emit(relax.op.reshape(out, (1, int(rows.ty.shape[0]), weight.shape[0])))


def _parallel_block(x_shape, wa, wm, bm, *, residual_first=False, flatten_sum=False, expose_sum=False):
    """x + attn + mlp in the parallel block's order: (a + m) + x (Falcon: x + view(view(m + a)))."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            rows = bb.emit(relax.op.reshape(x, x_shape[1:]))
            a = _linear(bb, rows, wa)
            m = _linear(bb, rows, wm, bm)
            total = bb.emit(relax.op.add(m, a) if residual_first else relax.op.add(a, m))
            if flatten_sum:
                total = bb.emit(relax.op.reshape(bb.emit(relax.op.reshape(total, x_shape[1:])), x_shape))
            y = bb.emit(relax.op.add(x, total) if residual_first else relax.op.add(total, x))
            out = bb.emit_output(relax.Tuple([y, total]) if expose_sum else y)
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=5, deadline=None)
@given(rows=st.integers(1, 40), width=st.sampled_from([16, 64]), residual_first=st.booleans(),
       flatten_sum=st.booleans(), seed=st.integers(0, 99))
def test_both_residual_adds_join_gemm_epilogues(rows, width, residual_first, flatten_sum, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, rows, width)).astype("float32")
    wa, wm = (rng.standard_normal((width, width)).astype("float32") / 8 for _ in range(2))
    bm = rng.standard_normal(width).astype("float32")
    mod = _parallel_block(x.shape, wa, wm, bm, residual_first=residual_first, flatten_sum=flatten_sum)
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](
            tvm.runtime.tensor(x)).numpy()
    a, m = x[0] @ wa.T, x[0] @ wm.T + bm
    two_adds = (a + m) + x[0]  # float32, as PyTorch adds them
    bound = 2.0 ** -24 * (np.abs(a + m) + np.abs(m + x[0]) + 2 * np.abs(two_adds)) + 1e-6 * np.abs(two_adds).max()
    assert np.all(np.abs(got[0].astype(np.float64) - two_adds) <= bound)
    assert len(prof.kernels) == 2, [k.name for k in prof.kernels]  # the two GEMMs, no add kernel


def test_a_sum_read_elsewhere_stays():
    w = np.eye(8, dtype="float32")
    exposed = _parallel_block((1, 4, 8), w, w, np.zeros(8, "float32"), expose_sum=True)
    tvm.ir.assert_structural_equal(reassociate_parallel_residuals(exposed), exposed)
    rewritten = str(reassociate_parallel_residuals(_parallel_block((1, 4, 8), w, w, np.zeros(8, "float32")))["main"])
    assert "_residual" in rewritten and rewritten.count("R.add") == 3  # bias, a + x, m + (a + x)


def test_a_block_of_symbolic_length_reassociates():
    """Symbolic dims compare as expressions (a symbolic Falcon's export raised AttributeError:
    tvm.ir has no structural_equal in this TVM)."""
    s = tvm.tirx.Var("s", "int64")
    w = relax.const(np.eye(8, dtype="float32"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, s, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            rows = bb.emit(relax.op.reshape(x, (s, 8)))
            a, m = (bb.emit(relax.op.reshape(bb.emit(relax.op.matmul(rows, w)), (1, s, 8))) for _ in range(2))
            y = bb.emit_output(bb.emit(relax.op.add(bb.emit(relax.op.add(a, m)), x)))
        bb.emit_func_output(y)
    assert "_residual" in str(reassociate_parallel_residuals(bb.get())["main"])
