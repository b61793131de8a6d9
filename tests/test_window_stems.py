"""A window partition of a norm of a transposed tensor is one copy, the norm after it
(normalise/window_stems.py): Swin's stem, built in Relax, keeps one transpose (of 5 axes, a
layout kernel: kernels/layout/folds.py), the norm reads its rows, and the result is unchanged."""

from __future__ import annotations

import math

import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from models import host_output
from npu_backend.normalise.window_stems import as_one_transpose, window_stems
from test_window_residuals import WINDOW_AXES, _bound, _calls
from npu_backend.normalise.rewrite import op_name


def _swin_stem(windows: tuple, window: int, channels: int, seed: int, leak: bool = False):
    """main(x (1, C, H, W)) -> (windows x tokens, C): partition(norm(transpose(x))) @ W, HF's
    SwinEmbeddings' flatten(2).transpose(1, 2) and norm, then the first block's window partition
    (`leak`: the norm's result is an output too, so it must stay)."""
    rng = np.random.default_rng(seed)
    const = lambda *shape: relax.const(rng.standard_normal(shape).astype(np.float32))  # noqa: E731
    (nh, nw), w, c = windows, window, channels
    height, width = nh * w, nw * w
    x = relax.Var("x", relax.TensorType((1, c, height, width), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(relax.op.reshape(x, (1, c, height * width)))
            t = bb.emit(relax.op.permute_dims(t, [0, 2, 1]))
            t = bb.emit(relax.op.nn.layer_norm(t, const(c), const(c), axes=[-1]))
            h = bb.emit(relax.op.reshape(t, (1, nh, w, nw, w, c)))
            h = bb.emit(relax.op.permute_dims(h, WINDOW_AXES))
            h = bb.emit(relax.op.reshape(h, (nh * nw * w * w, c)))
            o = bb.emit(relax.op.matmul(h, const(c, c)))
            out = bb.emit_output(relax.Tuple([o, t]) if leak else o)
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=6)
@given(windows=st.tuples(st.integers(1, 3), st.integers(1, 3)), window=st.integers(2, 4),
       channels=st.sampled_from([4, 8, 12]), seed=st.integers(0, 2**16))
def test_the_stem_and_the_partition_are_one_transpose_and_the_result_is_unchanged(windows, window, channels, seed):
    mod = _swin_stem(windows, window, channels, seed)
    rewritten = relax.transform.DeadCodeElimination()(window_stems(mod))
    values = _bound(rewritten)
    permutes = _calls(rewritten, "relax.permute_dims")
    assert len(permutes) == 1 and op_name(values[permutes[0].args[0]]) == "relax.reshape", rewritten
    assert values[permutes[0].args[0]].args[0].name == "x", rewritten
    norm, = _calls(rewritten, "relax.nn.layer_norm")
    assert op_name(values[norm.args[0]]) == "relax.reshape" and values[norm.args[0]].args[0] in values
    x = np.random.default_rng(seed).standard_normal((1, channels, windows[0] * window, windows[1] * window))
    x = x.astype(np.float32)
    np.testing.assert_allclose(host_output(rewritten, x), host_output(mod, x), rtol=1e-6, atol=1e-6)


def test_swins_stem_runs_as_one_copy_on_the_npu():
    """16 channels, 4 x 4 windows of 4 x 4 tokens: one layout kernel (5 axes), the norm, the GEMM."""
    mod = _swin_stem((4, 4), 4, 16, 1)
    x = np.random.default_rng(1).standard_normal((1, 16, 16, 16)).astype(np.float32)
    with npu_backend.profile() as prof:
        out = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(x))
    np.testing.assert_allclose(out.numpy(), host_output(mod, x), rtol=1e-5, atol=1e-5)
    copies = [k.name for k in prof.kernels if k.source_ops == ("permute_dims",)]
    assert len(copies) == 1 and prof.host_calls == [], [k.name for k in prof.kernels]


def test_a_norm_read_elsewhere_is_left_alone():
    mod = _swin_stem((2, 2), 4, 8, 0, leak=True)
    tvm.ir.assert_structural_equal(window_stems(mod), mod)


@settings(max_examples=25)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=5).map(tuple), data=st.data())
def test_as_one_transpose_finds_every_transpose_of_a_view(shape, data):
    perm = data.draw(st.permutations(range(len(shape))))
    index = np.arange(math.prod(shape)).reshape(shape).transpose(perm)
    view, axes = as_one_transpose(index)
    np.testing.assert_array_equal(np.arange(index.size).reshape(view).transpose(axes).reshape(-1), index.reshape(-1))
    assert len(view) <= len(shape) or len(shape) == 0


def test_what_no_one_transpose_is_gives_none():
    assert as_one_transpose(np.arange(12)[::-1]) is None
    assert as_one_transpose(np.array([0, 2, 1, 3, 5, 4])) is None
