"""A ViT's position embedding added to [CLS (, distillation) token; patches] is split
(normalise/position_embeddings.py): the tokens' rows a constant, the patches' rows the patch
conv's residual add. Bit-equal to the unsplit graph on llvm; on the NPU one conv kernel and the
concat, no add kernel, within 1e-5 of float64."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.position_embeddings import split_position_embeddings


def _embeddings(image, weight, bias, tokens, positions):
    """concat([tokens..., permute(reshape(conv(image) + bias))], 1) + positions, as HF's ViT writes it."""
    hidden, grid = weight.shape[0], image.shape[2] // weight.shape[2]
    bb = relax.BlockBuilder()
    x = relax.Var("pixels", relax.TensorType(image.shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, relax.const(weight), strides=weight.shape[2]))
            y = bb.emit(relax.op.add(conv, relax.const(bias.reshape(1, hidden, 1, 1))))
            y = bb.emit(relax.op.reshape(y, (1, hidden, grid * grid)))
            y = bb.emit(relax.op.permute_dims(y, [0, 2, 1]))
            y = bb.emit(relax.op.concat([*(relax.const(t) for t in tokens), y], axis=1))
            out = bb.emit_output(relax.op.add(y, relax.const(positions)))
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=4, deadline=None)
@given(tokens=st.integers(1, 2), hidden=st.sampled_from([16, 64]), grid=st.integers(2, 4), seed=st.integers(0, 99))
def test_position_embeddings_join_the_patch_conv(tokens, hidden, grid, seed):
    rng = np.random.default_rng(seed)
    patch = 4
    image = rng.standard_normal((1, 3, grid * patch, grid * patch)).astype("float32")
    weight = (rng.standard_normal((hidden, 3, patch, patch)) / 8).astype("float32")
    bias = rng.standard_normal(hidden).astype("float32")
    cls = [rng.standard_normal((1, 1, hidden)).astype("float32") for _ in range(tokens)]
    positions = rng.standard_normal((1, tokens + grid * grid, hidden)).astype("float32")
    mod = _embeddings(image, weight, bias, cls, positions)
    split = split_position_embeddings(mod)
    assert "R.concat" in str(split["main"]) and str(split["main"]).count("R.add") == 2
    outputs = [relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(image)).numpy()
               for m in (mod, split)]
    np.testing.assert_array_equal(outputs[0], outputs[1])  # the same float32 additions
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](
            tvm.runtime.tensor(image)).numpy()
    # conv[i, j, o] = sum over c, p, q of image[c, i patch + p, j patch + q] weight[o, c, p, q]
    conv = np.einsum("cipjq,ocpq->ijo", image[0].reshape(3, grid, patch, grid, patch).astype(np.float64), weight)
    patches = conv.reshape(grid * grid, hidden) + bias
    expected = np.concatenate([t[0] for t in cls] + [patches]) + positions[0]
    assert np.abs(got[0] - expected).max() <= 1e-5 * np.abs(expected).max()
    assert not any(k.name == "fused_relax_add_cgra" for k in prof.kernels), [k.name for k in prof.kernels]
