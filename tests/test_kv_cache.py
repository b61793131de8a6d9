"""A decode step's KV caches preallocated for the bound and written in place on the NPU (issue 36):
frontend/kv_cache.py turns an attention step whose caches grow by concat into one whose caches
(1, KV heads, bound, d) are written at the position by a DMA kernel (kernels/layout/cache_write.py,
called in place: device/in_place.py) and read for their first t + 1 rows by q Kᵀ and P V
(kernels/gemm/symbolic_matmul.py). One compile serves every length; the cache tensors the caller
passes are the ones written, step after step, and never cross to the host."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import npu_backend
from npu_backend.frontend.kv_cache import preallocate_kv_cache

KV_HEADS, GROUP, DEPTH, BOUND = 2, 2, 16, 32
_INVERSE = (1.0 / 10000 ** (np.arange(DEPTH) / DEPTH)).astype("float32")


def _grown_step(rotate: bool = False) -> tvm.IRModule:
    """One attention layer of a decode step as an exporter writes it: the caches of length t in,
    each grown by the new token's row (concat), attention over them, the grown caches out
    (`rotate`: the new key first multiplied by cos(pos * inverse frequencies), RoPE's part)."""
    t = tirx.Var("t", "int64")
    q = relax.Var("q", relax.TensorType([1, KV_HEADS, GROUP, DEPTH], "float32"))
    k = relax.Var("k", relax.TensorType([1, KV_HEADS, 1, DEPTH], "float32"))
    v = relax.Var("v", relax.TensorType([1, KV_HEADS, 1, DEPTH], "float32"))
    pos = relax.Var("pos", relax.TensorType([1], "int64"))
    caches = [relax.Var(name, relax.TensorType([1, KV_HEADS, t, DEPTH], "float32")) for name in ("keys", "values")]
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k, v, pos, *caches]):
        with bb.dataflow():
            if rotate:
                angles = relax.op.multiply(relax.op.astype(pos, "float32"), relax.const(_INVERSE))
                k = bb.emit(relax.op.multiply(k, relax.op.cos(relax.op.reshape(angles, (1, 1, 1, DEPTH)))))
            keys = bb.emit(relax.op.concat([caches[0], k], axis=2))
            values = bb.emit(relax.op.concat([caches[1], v], axis=2))
            scores = bb.emit(relax.op.nn.softmax(relax.op.matmul(q, relax.op.permute_dims(keys, [0, 1, 3, 2])), -1))
            out = bb.emit_output(relax.Tuple([relax.op.matmul(scores, values), keys, values]))
        bb.emit_func_output(out)
    return bb.get()


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def step():
    mod = preallocate_kv_cache(_grown_step(), BOUND)
    return relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())


def test_the_preallocated_step_runs_every_op_on_the_npu():
    mod = preallocate_kv_cache(_grown_step(), BOUND)
    params = {str(p.name): [int(d) for d in p.ty.shape.values] for p in mod["main"].params if p.name != "pos"}
    assert params["keys"] == params["values"] == [1, KV_HEADS, BOUND, DEPTH]
    for t in (1, 9, BOUND - 1):
        placements = npu_backend.explain(mod, "cgra-8x8", dims={"t": t})
        host = {p.op: p.reason for p in placements if p.where != "npu"}
        assert set(host) <= {"reshape", "tensor_to_shape"}, host  # a view, and the VM's read of the position
        assert host["tensor_to_shape"].startswith("reads a tensor's values as a shape")
        assert {"scatter_elements", "strided_slice"} <= {p.op for p in placements if p.where == "npu"}


def test_steps_write_the_callers_caches_in_place_and_match_numpy(step):
    rng = np.random.default_rng(0)
    caches = [tvm.runtime.tensor(np.full((1, KV_HEADS, BOUND, DEPTH), np.nan, "float32")) for _ in range(2)]
    keys, values = (np.zeros((1, KV_HEADS, 0, DEPTH), "float32") for _ in range(2))
    for t in (0, 1, 2, 3, 4, 5, 6, 7, 8):
        q, k, v = (rng.standard_normal(s).astype("float32") for s in ((1, KV_HEADS, GROUP, DEPTH),
                                                                          (1, KV_HEADS, 1, DEPTH), (1, KV_HEADS, 1, DEPTH)))
        keys, values = np.concatenate([keys, k], 2), np.concatenate([values, v], 2)
        with npu_backend.profile() as prof:
            out = step["main"](*[tvm.runtime.tensor(a) for a in (q, k, v, np.array([t]))], *caches)
        expected = _softmax(q @ keys.transpose(0, 1, 3, 2)) @ values
        np.testing.assert_allclose(out[0].numpy(), expected, rtol=1e-5, atol=1e-6)
        # the rows past t were never written (NaN) and never read: the GEMMs are cut to t + 1
        np.testing.assert_array_equal(caches[0].numpy()[:, :, :t + 1], keys)
        np.testing.assert_array_equal(caches[1].numpy()[:, :, :t + 1], values)
        assert np.isnan(caches[0].numpy()[:, :, t + 1:]).all()
        assert prof.crossings == 0 and prof.host_calls == []
        writes = [k for k in prof.kernels if "scatter_elements" in k.source_ops]
        assert len(writes) == 2 and len(prof.kernels) == 5  # two row writes, q Kᵀ, softmax, P V
        row = KV_HEADS * DEPTH * 4
        assert all(k.dma_load_bytes == k.dma_store_bytes == row for k in writes)  # the row alone, not the cache


def test_a_position_past_the_cache_says_the_bound_and_writes_nothing_past_it(step):
    caches = [tvm.runtime.tensor(np.zeros((1, KV_HEADS, BOUND, DEPTH), "float32")) for _ in range(2)]
    args = [np.ones((1, KV_HEADS, GROUP, DEPTH), "float32"), np.ones((1, KV_HEADS, 1, DEPTH), "float32"),
            np.ones((1, KV_HEADS, 1, DEPTH), "float32"), np.array([BOUND])]
    with pytest.raises(ValueError, match=f"past its bound {BOUND}: the cache holds {BOUND} positions: preallocate it for more "
                       r"\(preallocate_kv_cache\(mod, bound=...\)\)"):
        step["main"](*[tvm.runtime.tensor(a) for a in args], *caches)
    assert not any(cache.numpy().any() for cache in caches)  # not even the last row: the write was dropped


def test_what_the_step_computes_from_the_position_alone_is_looked_up_by_it_on_the_npu():
    """frontend/position_tables.py: cos(pos * inverse) (astype, multiply, cos: cos on the host
    before) is a row of a table of the bound's positions, an NPU gather; the values the host's."""
    mod = preallocate_kv_cache(_grown_step(rotate=True), BOUND)
    placements = npu_backend.explain(mod, "cgra-8x8", dims={"t": 5})
    assert {p.op for p in placements if p.where != "npu"} <= {"reshape", "tensor_to_shape"}
    assert "take" in {p.op for p in placements if p.where == "npu"}
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    caches = [tvm.runtime.tensor(np.zeros((1, KV_HEADS, BOUND, DEPTH), "float32")) for _ in range(2)]
    k = np.ones((1, KV_HEADS, 1, DEPTH), "float32")
    args = [np.ones((1, KV_HEADS, GROUP, DEPTH), "float32"), k, k, np.array([7])]
    vm["main"](*[tvm.runtime.tensor(a) for a in args], *caches)
    np.testing.assert_allclose(caches[0].numpy()[0, :, 7], np.cos(7 * _INVERSE)[None].repeat(KV_HEADS, 0), rtol=1e-6)


def test_a_step_without_the_position_parameter_is_refused_with_its_parameters():
    with pytest.raises(npu_backend.InvalidModel, match="no parameter 'position'.*q, k, v, pos, keys, values"):
        preallocate_kv_cache(_grown_step(), BOUND, position="position")


def test_a_matmul_reading_a_static_slice_of_rows_keeps_the_slice_a_layout_copy():
    """The cache roots take a slice to a symbolic length only; a static one (a model slicing a
    weight or an activation) is the layout family's copy, as before."""
    q = relax.Var("q", relax.TensorType([1, KV_HEADS, GROUP, DEPTH], "float32"))
    rows = relax.Var("rows", relax.TensorType([1, KV_HEADS, BOUND, DEPTH], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [q, rows]):
        with bb.dataflow():
            first = bb.emit(relax.op.strided_slice(rows, [2], [0], [10]))
            out = bb.emit_output(relax.op.matmul(q, relax.op.permute_dims(first, [0, 1, 3, 2])))
        bb.emit_func_output(out)
    kernels = {p.op: p.kernel for p in npu_backend.explain(bb.get(), "cgra-8x8")}
    assert kernels["strided_slice"].startswith("cgra.strided_slice") and kernels["matmul"].startswith("cgra.linear ")
