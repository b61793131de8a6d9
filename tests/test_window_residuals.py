"""A residual add after a window reverse runs in window order (normalise/window_residuals.py):
Swin's block, built in Relax, adds the residual to the output projection before the reverse,
normalises the partitioned residual, and matches the unrewritten module run on the host."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.rewrite import op_name
from npu_backend.relax_info import type_of
from npu_backend.normalise.window_residuals import row_order, window_residuals
from models import host_output

WINDOW_AXES = [0, 1, 3, 2, 4, 5]


def _swin_block(windows: tuple, window: int, channels: int, seed: int, moved=WINDOW_AXES):
    """main(x (1, H W, C)) -> (1, H W, C): t = norm(x); t + reverse(linear(partition(norm(t))))
    (HF's SwinLayer's attention half, the attention itself left out), windows of window x window
    tokens on a windows[0] x windows[1] grid; `moved`: the reverse's axis order."""
    rng = np.random.default_rng(seed)
    const = lambda *shape: relax.const(rng.standard_normal(shape).astype(np.float32))  # noqa: E731
    (nh, nw), w, c = windows, window, channels
    height, width = nh * w, nw * w
    x = relax.Var("x", relax.TensorType((1, height * width, c), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(relax.op.nn.layer_norm(x, const(c), const(c), axes=[-1]))
            h = bb.emit(relax.op.nn.layer_norm(t, const(c), const(c), axes=[-1]))
            h = bb.emit(relax.op.reshape(h, (1, height, width, c)))
            h = bb.emit(relax.op.reshape(h, (1, nh, w, nw, w, c)))
            h = bb.emit(relax.op.permute_dims(h, WINDOW_AXES))
            h = bb.emit(relax.op.reshape(h, (nh * nw * w * w, c)))
            o = bb.emit(relax.op.matmul(h, const(c, c)))
            o = bb.emit(relax.op.add(const(c), o))
            o = bb.emit(relax.op.reshape(o, (1, nh, nw, w, w, c)))
            o = bb.emit(relax.op.permute_dims(o, moved))
            o = bb.emit(relax.op.reshape(o, (1, height * width, c)))
            out = bb.emit_output(relax.op.add(t, o))
        bb.emit_func_output(out)
    return bb.get()


def _calls(mod, name: str) -> list:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if op_name(e) == name else None)
    return found


def _bound(mod) -> dict:
    return {b.var: b.value for block in mod["main"].body.blocks for b in block.bindings}


@settings(max_examples=6)
@given(windows=st.tuples(st.integers(1, 3), st.integers(1, 3)), window=st.integers(2, 4),
       channels=st.sampled_from([4, 8, 12]), seed=st.integers(0, 2**16))
def test_the_residual_joins_the_projection_and_the_result_is_unchanged(windows, window, channels, seed):
    mod = _swin_block(windows, window, channels, seed)
    rewritten = window_residuals(mod)
    values = _bound(rewritten)
    adds = [call for call in _calls(rewritten, "relax.add") if call.args[0] in values]
    # The residual add reads the projection's bias add (the GEMM's epilogue takes both) ...
    assert any(op_name(values[call.args[0]]) == "relax.add" for call in adds), rewritten
    # ... and the norm before the partition reads the partitioned residual, not the other way round.
    norms = _calls(rewritten, "relax.nn.layer_norm")
    assert sorted(op_name(values.get(n.args[0])) for n in norms) == ["", "relax.reshape"], rewritten
    x = np.random.default_rng(seed).standard_normal((1, windows[0] * windows[1] * window**2, channels))
    x = x.astype(np.float32)
    np.testing.assert_allclose(host_output(rewritten, x), host_output(mod, x), rtol=1e-6, atol=1e-6)


def test_a_reverse_that_moves_elements_inside_a_row_is_left_alone():
    """The reverse's transpose moves the channel axis too: no row order, no rewrite."""
    mod = _swin_block((2, 2), 4, 4, 0, moved=[0, 1, 3, 2, 5, 4])
    assert window_residuals(mod).same_as(mod)


def test_a_partition_that_is_not_the_reverses_inverse_keeps_its_norm():
    """The reverse keeps the windows' rows in window order (its transpose moves nothing): the
    residual's rows in that order are not the norm's partition, so the norm stays before it."""
    mod = _swin_block((2, 2), 2, 4, 0, moved=[0, 1, 2, 3, 4, 5])
    rewritten = window_residuals(mod)
    values = _bound(rewritten)
    norms = _calls(rewritten, "relax.nn.layer_norm")
    assert sorted(op_name(values.get(n.args[0])) for n in norms) == ["", "relax.nn.layer_norm"], rewritten
    x = np.random.default_rng(0).standard_normal((1, 16, 4)).astype(np.float32)
    np.testing.assert_allclose(host_output(rewritten, x), host_output(mod, x), rtol=1e-6, atol=1e-6)


@settings(max_examples=25)
@given(shape=st.lists(st.integers(1, 4), min_size=2, max_size=4), channels=st.integers(1, 5),
       data=st.data())
def test_row_order_is_the_numpy_gather_of_rows(shape, channels, data):
    """row_order of a reshape and a transpose keeping the channel axis last against numpy."""
    axes = data.draw(st.permutations(range(len(shape)))) + [len(shape)]
    full = (*shape, channels)
    x = relax.Var("x", relax.TensorType(full, "float32"))
    bb = relax.BlockBuilder()
    moved = bb.normalize(relax.op.permute_dims(x, axes))
    rows = bb.normalize(relax.op.reshape(relax.Var("moved", type_of(moved)), (-1, channels)))
    order = row_order(full, [(None, moved), (None, rows)], channels)
    table = np.arange(np.prod(full)).reshape(-1, channels)
    gathered = table.reshape(full).transpose(axes).reshape(-1, channels)
    np.testing.assert_array_equal(table[order], gathered)


def test_swins_residual_add_runs_in_the_projection_kernel_on_the_npu():
    """On cgra-8x8 no add kernel of its own is left, and the result matches the host's."""
    mod = _swin_block((2, 2), 4, 16, 3)
    x = np.random.default_rng(3).standard_normal((1, 64, 16)).astype(np.float32)
    with npu_backend.profile() as prof:
        vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
    names = [k.name for k in prof.kernels]
    assert not [n for n in names if n.startswith("fused_relax_add")], names
    np.testing.assert_allclose(out, host_output(mod, x), rtol=1e-5, atol=1e-5)
