"""A window reverse before row-by-row work moves after it and joins the copy that follows
(normalise/window_sinks.py): Swin's stage end, built in Relax (reverse, MLP with its residual,
patch merging), keeps one transpose, and the result is unchanged."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from models import host_output
from npu_backend.normalise.window_sinks import window_sinks
from test_window_residuals import WINDOW_AXES, _calls


def _stage_end(windows: tuple, window: int, channels: int, seed: int, merge: bool = True):
    """main(u (windows x tokens, C)) -> merged patches @ W3: r = reverse(u); e = r + mlp(norm(r));
    patch merging of e (`merge`: else e itself is the result)."""
    rng = np.random.default_rng(seed)
    const = lambda *shape: relax.const(rng.standard_normal(shape).astype(np.float32))  # noqa: E731
    (nh, nw), w, c = windows, window, channels
    height, width = nh * w, nw * w
    u = relax.Var("u", relax.TensorType((height * width, c), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [u]):
        with bb.dataflow():
            r = bb.emit(relax.op.reshape(u, (1, nh, nw, w, w, c)))
            r = bb.emit(relax.op.permute_dims(r, WINDOW_AXES))
            r = bb.emit(relax.op.reshape(r, (1, height * width, c)))
            h = bb.emit(relax.op.nn.layer_norm(r, const(c), const(c), axes=[-1]))
            h = bb.emit(relax.op.add(bb.emit(relax.op.matmul(h, const(c, 2 * c))), const(2 * c)))
            h = bb.emit(relax.op.nn.gelu(h))
            h = bb.emit(relax.op.add(bb.emit(relax.op.matmul(h, const(2 * c, c))), const(c)))
            e = bb.emit(relax.op.add(h, r))
            if merge:
                m = bb.emit(relax.op.reshape(e, (1, height // 2, 2, width // 2, 2, c)))
                m = bb.emit(relax.op.permute_dims(m, [0, 1, 3, 4, 2, 5]))
                m = bb.emit(relax.op.reshape(m, (1, height * width // 4, 4 * c)))
                e = bb.emit(relax.op.matmul(m, const(4 * c, c)))
            out = bb.emit_output(e)
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=6)
@given(windows=st.tuples(st.integers(1, 3), st.integers(1, 3)), window=st.sampled_from([2, 4]),
       channels=st.sampled_from([4, 8]), seed=st.integers(0, 2**16))
def test_the_reverse_joins_the_patch_merging_and_the_result_is_unchanged(windows, window, channels, seed):
    mod = _stage_end(windows, window, channels, seed)
    rewritten = window_sinks(mod)
    assert len(_calls(rewritten, "relax.permute_dims")) == 1, rewritten
    u = np.random.default_rng(seed).standard_normal((windows[0] * windows[1] * window**2, channels))
    u = u.astype(np.float32)
    np.testing.assert_allclose(host_output(rewritten, u), host_output(mod, u), rtol=1e-5, atol=1e-5)


def test_a_reverse_whose_result_no_copy_reads_is_left_alone():
    """The MLP's result is the function's: nothing to join, no rewrite."""
    mod = _stage_end((2, 2), 4, 8, 0, merge=False)
    tvm.ir.assert_structural_equal(window_sinks(mod), mod)


def test_swins_stage_end_runs_one_copy_on_the_npu():
    mod = _stage_end((2, 2), 4, 16, 3)
    u = np.random.default_rng(3).standard_normal((64, 16)).astype(np.float32)
    with npu_backend.profile() as prof:
        out = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(u))
    expected = host_output(mod, u)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    copies = [k.name for k in prof.kernels if k.source_ops == ("permute_dims",)]
    assert len(copies) == 1 and prof.host_calls == [], [k.name for k in prof.kernels]
