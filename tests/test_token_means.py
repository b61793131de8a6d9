"""A mean over the tokens of a transposed activation is a mean over the channels-last map
(normalise/token_means.py): Swin's pooler and an NCHW global average, built in Relax, lose their
transpose and match the unrewritten module on the host; a mean over the channels keeps it."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.token_means import token_means
from models import host_output, main_op_names


def _pooled(shape: tuple, form: str):
    """main(x) -> a mean of a transpose of x: "swin" mean(expand_dims(x^T, -2), [-1, -2], keepdims)
    of (1, N, C); "nchw" mean(permute(x, NCHW), [2, 3]) of (1, H, W, C); "channels" the same
    transpose averaged over its channel axis (not the tokens)."""
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            if form == "swin":
                h = bb.emit(relax.op.permute_dims(x, [0, 2, 1]))
                h = bb.emit(relax.op.expand_dims(h, axis=[-2]))
                out = bb.emit_output(relax.op.mean(h, axis=[-1, -2], keepdims=True))
            else:
                h = bb.emit(relax.op.permute_dims(x, [0, 3, 1, 2]))
                out = bb.emit_output(relax.op.mean(h, axis=[2, 3] if form == "nchw" else [1], keepdims=False))
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=8)
@given(form=st.sampled_from(["swin", "nchw", "channels"]), sizes=st.tuples(st.integers(1, 5), st.integers(1, 5)),
       channels=st.integers(1, 6))
def test_a_mean_over_tokens_loses_its_transpose(form, sizes, channels):
    shape = (1, sizes[0] * sizes[1], channels) if form == "swin" else (1, *sizes, channels)
    mod = _pooled(shape, form)
    rewritten = token_means(mod)
    # A mean over the channels keeps its transpose (unless there is one channel and one token).
    kept = form == "channels" and (channels, sizes) != (1, (1, 1))
    assert ("relax.permute_dims" in main_op_names(rewritten)) == kept, rewritten
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(host_output(rewritten, x), host_output(mod, x), rtol=1e-6, atol=1e-6)


def test_swins_pooler_is_one_mean_kernel_on_the_npu():
    mod = _pooled((1, 64, 32), "swin")
    x = np.random.default_rng(1).standard_normal((1, 64, 32)).astype(np.float32)
    with npu_backend.profile() as prof:
        vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
    assert [k.name.split("_cgra")[0] for k in prof.kernels] == ["fused_relax_mean"], prof.kernels
    np.testing.assert_allclose(out, host_output(mod, x), rtol=1e-6, atol=1e-6)
