"""A prefill step's KV rows written into caches preallocated for the bound (issue 36):
frontend/kv_prefill.py turns a step returning a prompt's keys and values (1, KV heads, s, d)
into one writing them into the caches' first s rows in place, one NPU kernel per cache
(kernels/layout/cache_write.py's `cgra.cache_rows`): the rows past s are not written, and a
prompt past the bound is an error naming it before anything is allocated or written.
examples/generate.py's prefill (tests/test_generate.py) is the end-to-end case."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import npu_backend
from npu_backend.frontend.kv_prefill import prefill_kv_cache

KV_HEADS, DEPTH, BOUND = 2, 16, 24


def _rows_step() -> tvm.IRModule:
    """A step returning its prompt's keys and values (the KV rows) as they are."""
    s = tirx.Var("s", "int64")
    keys, values = (relax.Var(name, relax.TensorType([1, KV_HEADS, s, DEPTH], "float32")) for name in ("k", "v"))
    bb = relax.BlockBuilder()
    with bb.function("main", [keys, values]):
        with bb.dataflow():
            out = bb.emit_output(relax.Tuple([keys, values]))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def step():
    return relax.VirtualMachine(npu_backend.compile(prefill_kv_cache(_rows_step(), BOUND, outputs=0), "cgra-8x8"),
                                tvm.cpu())


def _caches():
    return [tvm.runtime.tensor(np.full((1, KV_HEADS, BOUND, DEPTH), np.nan, "float32")) for _ in range(2)]


def test_a_prompts_rows_land_in_the_callers_caches_and_nothing_past_them(step):
    rng = np.random.default_rng(0)
    for s in (2, 9, BOUND):
        rows = [rng.standard_normal((1, KV_HEADS, s, DEPTH)).astype("float32") for _ in range(2)]
        caches = _caches()
        with npu_backend.profile() as prof:
            out = step["main"](*[tvm.runtime.tensor(r) for r in rows], *caches)
        for cache, written, expected in zip(caches, out, rows):
            assert written.same_as(cache)  # in place: the result is the caller's tensor
            np.testing.assert_array_equal(cache.numpy()[:, :, :s], expected)
            assert np.isnan(cache.numpy()[:, :, s:]).all()
        assert prof.host_calls == [] and len(prof.kernels) == 2
        row = KV_HEADS * DEPTH * 4
        assert all(k.dma_load_bytes == k.dma_store_bytes == s * row for k in prof.kernels)  # s rows, not the cache


def test_a_prompt_past_the_bound_names_it_and_writes_nothing(step):
    rows = [np.ones((1, KV_HEADS, BOUND + 1, DEPTH), "float32") for _ in range(2)]
    caches = _caches()
    with pytest.raises(npu_backend.LengthPastBound, match=f"a prompt's length s = {BOUND + 1} is past its bound {BOUND}: "
                       f".*; the KV caches hold {BOUND} positions: preallocate them for more "
                       r"\(prefill_kv_cache\(mod, bound=...\), and the export's Dim\(max=...\)\)"):
        step["main"](*[tvm.runtime.tensor(r) for r in rows], *caches)
    assert all(np.isnan(cache.numpy()).all() for cache in caches)


def test_a_step_without_kv_rows_is_refused_saying_what_to_return():
    with pytest.raises(npu_backend.InvalidModel, match="no tuple of 2 output"):
        prefill_kv_cache(_rows_step(), BOUND, outputs=2)


def test_a_cache_another_op_reads_is_not_written_in_place():
    """The write is in place only when nothing else reads the cache (partition/composite.py
    cache_read_elsewhere): here an add reads it too, and must see it unwritten."""
    s = tirx.Var("s", "int64")
    rows = relax.Var("k", relax.TensorType([1, KV_HEADS, s, DEPTH], "float32"))
    cache = relax.Var("cache", relax.TensorType([1, KV_HEADS, BOUND, DEPTH], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [rows, cache], attrs={"tir_var_upper_bound": {"s": BOUND}}):
        with bb.dataflow():
            written = bb.emit(relax.op.slice_scatter(cache, rows, 0, s, 1, axis=2))
            out = bb.emit_output(relax.Tuple([written, relax.op.add(cache, cache)]))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(npu_backend.compile(bb.get(), "cgra-8x8"), tvm.cpu())
    zeros = tvm.runtime.tensor(np.zeros((1, KV_HEADS, BOUND, DEPTH), "float32"))
    out = vm["main"](tvm.runtime.tensor(np.ones((1, KV_HEADS, 5, DEPTH), "float32")), zeros)
    assert not out[1].numpy().any() and not zeros.numpy().any()
    assert out[0].numpy()[:, :, :5].all() and not out[0].numpy()[:, :, 5:].any()
