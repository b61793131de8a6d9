"""A pool's window taps that read only padding are cut (normalise/pool_taps.py): the cut pool
equals the uncut one on the host, and YOLOv8n's SPPF max pool on a 2 x 2 map (5 x 5, padding 2)
runs on the NPU as a 3 x 3 POOL, equal to the host's."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.pool_taps import pool_taps_cut
from npu_backend.normalise.rewrite import op_name
from models import host_output


def _pool(kind: str, shape: tuple, window: tuple, padding: list, stride: int, dtype: str = "float32"):
    """main(x) -> a max pool or an average without the padding counted, NCHW, of 3 channels."""
    x = relax.Var("x", relax.TensorType((1, 3, *shape), dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            if kind == "max":
                pooled = relax.op.nn.max_pool2d(x, window, stride, padding)
            else:
                pooled = relax.op.nn.avg_pool2d(x, window, stride, padding, count_include_pad=False)
            out = bb.emit_output(pooled)
        bb.emit_func_output(out)
    rng = np.random.default_rng(sum(shape) + sum(window))
    data = rng.integers(-128, 128, (1, 3, *shape)).astype(dtype) if dtype == "int8" else \
        rng.standard_normal((1, 3, *shape)).astype(dtype)
    return bb.get(), data


def _windows(mod) -> list:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(
        ([int(k) for k in e.attrs.pool_size], [int(p) for p in e.attrs.padding]))
        if op_name(e) in ("relax.nn.max_pool2d", "relax.nn.avg_pool2d") else None)
    return found


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(["max", "avg"]), shape=st.tuples(st.integers(1, 4), st.integers(1, 4)),
       window=st.tuples(st.integers(1, 6), st.integers(1, 6)),
       padding=st.lists(st.integers(0, 3), min_size=4, max_size=4), stride=st.integers(1, 2))
def test_the_cut_pool_matches_the_uncut_one(kind, shape, window, padding, stride):
    if any(shape[i] + padding[i] + padding[i + 2] < window[i] for i in range(2)) \
            or any(padding[i] >= window[i] or padding[i + 2] >= window[i] for i in range(2)):
        return  # no output, or a window wholly in the padding (relax's pools refuse those)
    mod, x = _pool(kind, shape, window, padding, stride)
    cut = pool_taps_cut(mod)
    np.testing.assert_array_equal(host_output(cut, x), host_output(mod, x))
    (kept, _), = _windows(cut)
    assert kept[0] <= window[0] and kept[1] <= window[1]


def test_a_pool_of_a_map_that_fills_the_window_is_left_alone():
    mod, _ = _pool("max", (7, 7), (5, 5), [2, 2, 2, 2], 1)
    assert _windows(pool_taps_cut(mod)) == [([5, 5], [2, 2, 2, 2])]


def test_yolos_sppf_max_pool_on_a_2x2_map_runs_on_the_npu():
    mod, x = _pool("max", (2, 2), (5, 5), [2, 2, 2, 2], 1, dtype="int8")
    assert _windows(pool_taps_cut(mod)) == [([3, 3], [1, 1, 1, 1])]
    with npu_backend.profile() as prof:
        vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(got, host_output(mod, x))
    assert [k.source_ops for k in prof.kernels] == [("nn.max_pool2d",)] and not prof.host_calls
