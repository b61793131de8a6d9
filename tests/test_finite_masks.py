"""Bloom's causal & padding mask of float32's minimum as a -inf triangle and row, with the rows
that see no key put back (normalise/finite_masks.py).

The argument checked against numpy with Hypothesis (float32 softmax, the module's formula): in
every row that sees a key the finfo.min form and the -inf form give the same bits; in a row that
sees none (left padding) they differ (a uniform softmax over every key against none), which the
put back D V restores. Then Bloom itself against PyTorch with left, random and no padding (the
mask is a run-time input: one compile), its attention one kernel under the causal triangle.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from npu_backend.normalise.finite_masks import FLT_MIN, splits_finite

F32 = np.float32


def _softmax(x: np.ndarray, safe: bool = False) -> np.ndarray:
    """Row softmax in float32 (max, subtract, exp, sum, divide), 0 for an all -inf row when safe."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = x.max(-1, keepdims=True)
        e = np.exp((x - m).astype(F32)).astype(F32)
        p = (e / e.sum(-1, keepdims=True, dtype=F32)).astype(F32)
    if safe:
        p = np.where(np.isneginf(x).all(-1, keepdims=True), F32(0), p)
    return p


def _forms(scores, alibi, keep, causal):
    """(HF's probabilities, the -inf form's, the rows that see a key)."""
    both = causal[None] & keep[:, None, :]
    hf = _softmax((scores + (np.where(both, F32(0), F32(FLT_MIN)) + alibi[:, None, :]).astype(F32)).astype(F32))
    row = np.where(keep, F32(0), F32(-np.inf))[:, None, :]
    split = ((scores + np.where(causal, F32(0), F32(-np.inf))[None]).astype(F32) + (row + alibi[:, None, :])).astype(F32)
    return hf, _softmax(split, safe=True), both.any(-1)


@settings(max_examples=60, deadline=None)
@given(s=st.integers(1, 24), heads=st.integers(1, 3), magnitude=st.sampled_from([1.0, 30.0, 1e4, 1e30]),
       padding=st.sampled_from(["none", "left", "random"]), seed=st.integers(0, 2 ** 16))
@example(s=8, heads=2, magnitude=1e30, padding="left", seed=0)
def test_the_minus_inf_form_is_exact_in_every_row_that_sees_a_key(s, heads, magnitude, padding, seed):
    rng = np.random.default_rng(seed)
    scores = (rng.standard_normal((heads, s, s)) * magnitude).astype(F32)
    alibi = (np.arange(s)[None] * rng.random((heads, 1))).astype(F32)  # slope * position, per head
    keep = np.ones(s, bool)
    if padding == "left":
        keep[:rng.integers(1, s + 1)] = False
    elif padding == "random":
        keep = rng.random(s) < 0.6
    causal = np.tril(np.ones((s, s), bool))
    hf, split, seen = _forms(scores, alibi, keep[None].repeat(heads, 0), causal)
    assert np.array_equal(hf[:, seen[0]], split[:, seen[0]])  # the same bits
    unseen = ~seen[0]
    # a row that sees no key: HF's is uniform over every key, the -inf form's 0 (NaN unsafe): the
    # safe softmax's where(kept, P, c) gives it c = fl(1 / s) for every key (the kernel: c 1ᵀ V)
    assert np.all(hf[:, unseen] == F32(1) / F32(s)) and np.all(split[:, unseen] == 0)
    v = rng.standard_normal((heads, s, 4)).astype(F32)
    d = np.where(unseen[:, None], F32(1) / F32(s), F32(0)) * np.ones((1, s), F32)
    put_back = (np.where(unseen[:, None], d, split) @ v).astype(F32)
    expected = hf.astype(np.float64) @ v
    assert np.abs(put_back - expected).max() <= 1e-6 * max(np.abs(expected).max(), 1.0)


def test_only_causal_triangles_of_float32s_minimum_split():
    causal = np.tril(np.ones((1, 1, 5, 5), bool))
    assert splits_finite(causal, FLT_MIN)
    assert not splits_finite(causal, -1e9)  # another constant: x + y need not round to y, nor exp to 0
    assert not splits_finite(np.ones((1, 1, 5, 5), bool), FLT_MIN)  # no triangle: nothing to skip
    assert not splits_finite(np.triu(np.ones((1, 1, 5, 5), bool)), FLT_MIN)  # not causal


@pytest.fixture(scope="module")
def bloom():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import tvm
    from tvm.relax.frontend.torch import from_exported_program

    import npu_backend
    from transformer_models import build, first_output

    model, inputs = build("bloom", 24)
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(model, inputs))
    vm = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    return torch, tvm, npu_backend, model, inputs[0], vm, first_output


@pytest.mark.parametrize("padding", ["none", "left", "random", "all"])
def test_bloom_with_padding_matches_pytorch(bloom, padding):
    torch, tvm, npu_backend, model, ids, vm, first_output = bloom
    mask = torch.ones_like(ids)
    if padding == "left":
        mask[:, :7] = 0
    elif padding == "random":
        mask = (torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.6).long()
        mask[:, 0] = 0
    elif padding == "all":
        mask[:] = 0
    with torch.no_grad():
        expected = first_output(model(ids, mask)).numpy()
    with npu_backend.profile() as prof:
        out = first_output(vm["main"](tvm.runtime.tensor(ids.numpy()), tvm.runtime.tensor(mask.numpy()))).numpy()
    attention = [k.name for k in prof.kernels if "softmax" in k.name]
    assert attention and all("where" in name for name in attention), attention  # the safe, causal form
    error = np.abs(out.astype(np.float64) - expected).max() / np.abs(expected).max()
    assert error < 1e-5, error


@pytest.mark.slow
def test_bloom_over_key_tiles_with_left_padding_matches_pytorch():
    """128 tokens on cgra-4x4: the key-tile kernel (flash.py) under the triangle, its mask row
    one per head (padding + ALiBi), the first 40 queries seeing no key."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import tvm
    from tvm.relax.frontend.torch import from_exported_program

    import npu_backend
    from transformer_models import build, first_output

    model, (ids, mask) = build("bloom", 128)
    mask[:, :40] = 0
    with torch.no_grad():
        expected = first_output(model(ids, mask)).numpy()
        mod = from_exported_program(torch.export.export(model, (ids, mask)))
    vm = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-4x4"), tvm.cpu())
    with npu_backend.profile() as prof:
        out = first_output(vm["main"](tvm.runtime.tensor(ids.numpy()), tvm.runtime.tensor(mask.numpy()))).numpy()
    attention = [k.name for k in prof.kernels if "softmax" in k.name]
    assert attention and all("where" in name for name in attention), attention
    error = np.abs(out.astype(np.float64) - expected).max() / np.abs(expected).max()
    assert error < 1e-5, error


@pytest.mark.parametrize("masked, rewritten", [(FLT_MIN, True), (-1e9, False)])
def test_a_causal_mask_of_float32s_minimum_at_a_symbolic_length_is_the_minus_inf_one(masked, rewritten):
    """Bloom's input_ids export: where(j <= i, 0, finfo.min) over a symbolic length, every row
    keeping its diagonal, becomes the causal mask of -inf (normalise/length_masks.py); another
    finite value stays (x + y need not round to y)."""
    import tvm
    from tvm import relax, tirx

    from npu_backend.normalise.length_masks import causal_masks_built_from_length

    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((1, s), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            positions = bb.emit(relax.op.arange(0, s, 1, "int64"))
            mask = bb.emit(relax.op.less_equal(bb.emit(relax.op.expand_dims(positions, [0])),
                                               bb.emit(relax.op.expand_dims(positions, [1]))))
            out = bb.emit_output(relax.op.where(mask, relax.const(F32(0)), relax.const(F32(masked))))
        bb.emit_func_output(out)
    rebuilt = causal_masks_built_from_length(bb.get())
    vm = relax.VirtualMachine(tvm.compile(rebuilt, "llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(np.zeros((1, 5), "int64"))).numpy()
    i, j = np.indices((5, 5))
    np.testing.assert_array_equal(got, np.where(j <= i, F32(0), F32(-np.inf) if rewritten else F32(masked)))
