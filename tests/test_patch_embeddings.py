"""normalise/patch_embeddings.py: a ViT's patch conv + bias [+ positions], flattened and transposed
to tokens, is the conv storing channels-last (kernels/gemm/patchify.py): one kernel, no
transposing copy, within float32 rounding of numpy; a conv the patch GEMM does not take keeps its
transpose."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.patch_embeddings import patch_embeddings_pass


def _embedding(channels: int, size: int, patch: int, width: int, positions: bool, stride=None, seed=0):
    """(module, image, numpy reference): transpose(flatten(conv(x) + b [+ p])) as torch.export writes it."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, channels, size, size)).astype("float32")
    w = (rng.standard_normal((width, channels, patch, patch)) / patch).astype("float32")
    b = rng.standard_normal((1, width, 1, 1)).astype("float32")
    side = (size - patch) // (stride or patch) + 1
    p = rng.standard_normal((1, width, side, side)).astype("float32")
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(xv, relax.const(w), strides=stride or patch))
            y = bb.emit(relax.op.add(y, relax.const(b)))
            if positions:
                y = bb.emit(relax.op.add(relax.const(p), y))
            y = bb.emit(relax.op.reshape(y, (1, width, side * side)))
            out = bb.emit_output(relax.op.permute_dims(y, [0, 2, 1]))
        bb.emit_func_output(out)
    patches = np.stack([x[0, :, i * (stride or patch):i * (stride or patch) + patch,
                          j * (stride or patch):j * (stride or patch) + patch].reshape(-1)
                        for i in range(side) for j in range(side)]).astype(np.float64)
    expected = patches @ w.reshape(width, -1).T.astype(np.float64) + b.reshape(-1)
    if positions:
        expected = expected + p.reshape(width, -1).T
    return bb.get(), x, expected[None]


def _run(mod, x):
    with npu_backend.profile() as prof:
        vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
    return out, [kernel.name for kernel in prof.kernels]


@settings(max_examples=6)
@given(channels=st.sampled_from([1, 3, 8]), patch=st.sampled_from([2, 4, 16]), side=st.integers(1, 5),
       width=st.sampled_from([16, 64]), positions=st.booleans(), seed=st.integers(0, 9))
def test_a_patch_embedding_is_one_conv_storing_tokens(channels, patch, side, width, positions, seed):
    mod, x, expected = _embedding(channels, patch * side, patch, width, positions, seed=seed)
    out, names = _run(mod, x)
    assert len(names) == 1 and "conv2d" in names[0] and "permute" not in names[0], names
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_the_rewrite_is_the_channels_last_conv():
    mod, _, _ = _embedding(3, 64, 16, 64, True)
    rewritten = patch_embeddings_pass(8)(mod)
    ops = [str(b.value.op.name) for b in rewritten["main"].body.blocks[0].bindings if hasattr(b.value, "op")]
    assert "relax.permute_dims" not in ops and ops[-1] == "relax.reshape", ops
    convs = [b.value for b in rewritten["main"].body.blocks[0].bindings
             if getattr(b.value, "op", None) is not None and str(b.value.op.name) == "relax.nn.conv2d"]
    assert [str(c.attrs.out_layout) for c in convs] == ["NHWC"]


def test_overlapping_patches_or_many_channels_keep_their_transpose():
    for mod in (_embedding(3, 16, 4, 16, False, stride=2)[0], _embedding(16, 16, 4, 16, False)[0]):
        tvm.ir.assert_structural_equal(patch_embeddings_pass(8)(mod), mod)


def test_vits_patches_are_finished_in_pieces_of_the_arrays_rows():
    """16 patches of 3 x 16 x 16 px: the kernel is bound by its weights' load; its tile is added
    and stored in two pieces of 8 rows (gemm_pieces.patch_pieces), the first while the array
    computes the second."""
    from cgra_sim import isa

    mod, x, expected = _embedding(3, 64, 16, 64, True)
    with npu_backend.profile(keep_timelines=True) as prof:
        vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    fields = isa.FIELDS[isa.Op.EPILOGUE]
    rows = [int(r[fields.index("m")]) for r in prof.timelines[0].commands if int(r[0]) == isa.Op.EPILOGUE]
    assert rows == [8, 8], rows
