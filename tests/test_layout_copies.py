"""Layout ops between NPU kernels as DMA-only NPU kernels (npu_backend/kernels/layout/): every
transpose, slice, broadcast, concatenation, zero pad and embedding lookup matches numpy exactly
on random shapes and chips, runs as one NPU kernel and leaves no host call; and a reshape
between kernels is a view: no host call, no crossing, no cycles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tvm
from tvm import relax

import npu_backend
from npu_backend.kernels.layout.layout import Piece, compact
from npu_backend.tools.workloads import numpy_dtype

PRESETS = st.sampled_from(["cgra-4x4", "cgra-8x8", "cgra-16x16"])
DTYPES = st.sampled_from(["float32", "int32", "int8", "bfloat16", "float16"])


def _data(rng, shape, dtype):
    if dtype in ("float32", "bfloat16", "float16"):  # the 16-bit floats moved bit for bit like the others
        return rng.standard_normal(shape).astype(np.float32).astype(numpy_dtype(dtype))
    return rng.integers(-100, 100, shape).astype(dtype)


def _module(build, inputs):
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(a.shape, str(a.dtype))) for i, a in enumerate(inputs)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(*params))
        bb.emit_func_output(out)
    return bb.get()


def _run(build, inputs, arch):
    """(the NPU's result, the profile) of `build(*vars)` over `inputs`, compiled for `arch`."""
    executable = npu_backend.compile(_module(build, inputs), arch)
    with npu_backend.profile() as prof:
        result = relax.VirtualMachine(executable, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in inputs])
    return result.numpy(), prof


def _check(build, inputs, expected, arch, kernels=1):
    """Exact, and one NPU kernel, no host call; or, where the family's estimate says the host's
    copy is faster (a small tensor on a slow chip), one host call and that reason."""
    out, prof = _run(build, inputs, arch)
    np.testing.assert_array_equal(out, expected)
    if kernels and not prof.kernels:
        placements = npu_backend.explain(_module(build, inputs), arch)
        assert len(prof.host_calls) == 1 and "the host copies it faster" in placements[0].reason, placements
        return
    assert len(prof.kernels) == kernels and prof.host_calls == [], (prof.kernels, prof.host_calls)


shapes = st.lists(st.integers(1, 9), min_size=1, max_size=4).map(tuple)


@settings(max_examples=8)
@given(shape=st.lists(st.integers(1, 6), min_size=2, max_size=4).map(tuple), data=st.data(), dtype=DTYPES,
       arch=PRESETS)
def test_permute_dims_is_a_dma_copy(shape, data, dtype, arch):
    perm = data.draw(st.permutations(range(len(shape))))
    x = _data(np.random.default_rng(0), shape, dtype)
    identity = list(perm) == sorted(perm)  # moves nothing: normalise/permute_chains.py drops it
    _check(lambda a: relax.op.permute_dims(a, perm), [x], np.transpose(x, perm), arch, kernels=0 if identity else 1)


@settings(max_examples=8)
@given(shape=shapes, data=st.data(), dtype=DTYPES, arch=PRESETS)
def test_strided_slice_is_a_dma_box(shape, data, dtype, arch):
    axes = sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)))
    begin = [data.draw(st.integers(0, shape[a] - 1)) for a in axes]
    end = [data.draw(st.integers(b + 1, shape[a])) for a, b in zip(axes, begin)]
    steps = [data.draw(st.integers(1, 3)) for _ in axes]
    x = _data(np.random.default_rng(1), shape, dtype)
    index = [slice(None)] * len(shape)
    for a, b, e, s in zip(axes, begin, end, steps):
        index[a] = slice(b, e, s)
    _check(lambda v: relax.op.strided_slice(v, axes, begin, end, steps), [x], x[tuple(index)], arch)


@settings(max_examples=8)
@given(shape=shapes, data=st.data(), dtype=DTYPES, arch=PRESETS)
def test_broadcast_to_walks_a_broadcast_axis_at_step_zero(shape, data, dtype, arch):
    source = tuple(data.draw(st.sampled_from([1, e])) for e in shape)
    lead = data.draw(st.lists(st.integers(1, 3), max_size=4 - len(shape)))
    target = tuple(lead) + shape
    x = _data(np.random.default_rng(2), source, dtype)
    no_op = target == source  # normalise/no_op_broadcasts.py drops it
    _check(lambda v: relax.op.broadcast_to(v, target), [x], np.broadcast_to(x, target), arch, 0 if no_op else 1)


@settings(max_examples=8)
@given(shape=shapes, data=st.data(), dtype=DTYPES, arch=PRESETS)
def test_pad_is_a_zero_halo(shape, data, dtype, arch):
    widths = [data.draw(st.integers(0, 3)) for _ in range(2 * len(shape))]
    widths[-1] = widths[-1] or int(not any(widths))  # a pad of zero widths is no copy (normalise/no_op_pads.py)
    x = _data(np.random.default_rng(3), shape, dtype)
    expected = np.pad(x, list(zip(widths[0::2], widths[1::2])))
    _check(lambda v: relax.op.nn.pad(v, widths), [x], expected, arch)


@settings(max_examples=8)
@given(shape=shapes, data=st.data(), dtype=DTYPES, arch=PRESETS)
def test_concat_stores_each_input_into_its_region(shape, data, dtype, arch):
    axis = data.draw(st.integers(0, len(shape) - 1))
    sizes = data.draw(st.lists(st.integers(1, 5), min_size=2, max_size=4))
    rng = np.random.default_rng(4)
    inputs = [_data(rng, shape[:axis] + (n,) + shape[axis + 1:], dtype) for n in sizes]
    _check(lambda *v: relax.op.concat(list(v), axis=axis), inputs, np.concatenate(inputs, axis=axis), arch)


@settings(max_examples=4)
@given(shape=st.lists(st.integers(1, 4), min_size=5, max_size=6).map(tuple), data=st.data(), arch=PRESETS)
def test_a_concat_of_any_rank_is_one_of_three_axes(shape, data, arch):
    axis = data.draw(st.integers(0, len(shape) - 1))
    rng = np.random.default_rng(9)
    inputs = [_data(rng, shape[:axis] + (n,) + shape[axis + 1:], "float32") for n in (1, 2)]
    _check(lambda *v: relax.op.concat(list(v), axis=axis), inputs, np.concatenate(inputs, axis=axis), arch)


@settings(max_examples=8)
@given(table=st.lists(st.integers(1, 7), min_size=1, max_size=3).map(tuple), data=st.data(), dtype=DTYPES,
       index_dtype=st.sampled_from(["int32", "int64"]), arch=PRESETS)
def test_take_is_a_dma_gather_of_one_box_per_index(table, data, dtype, index_dtype, arch):
    axis = data.draw(st.integers(0, len(table) - 1))
    count = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=4 - len(table) + 1 if len(table) < 4 else 1))
    rng = np.random.default_rng(5)
    x = _data(rng, table, dtype)
    indices = rng.integers(0, table[axis], count).astype(index_dtype)
    _check(lambda v, i: relax.op.take(v, i, axis=axis), [x, indices], np.take(x, indices, axis=axis), arch)


def test_an_embedding_table_that_is_a_weight_is_looked_up_on_the_npu():
    table = np.random.default_rng(6).standard_normal((100, 24)).astype("float32")
    ids = np.array([[5, 99, 0, 5, 17]], "int64")
    _check(lambda i: relax.op.take(relax.const(table), i, axis=0), [ids], table[ids], "cgra-8x8")


def test_a_lookup_of_one_scalar_index_and_a_concat_of_rank_five():
    """BERT's token-type row (take(table, 0)) and GPT-J's interleaved RoPE (a rank-5 concat, read
    as (outer, axis, inner) views)."""
    rng = np.random.default_rng(8)
    table = rng.standard_normal((2, 16)).astype("float32")
    _check(lambda i: relax.op.take(relax.const(table), i, axis=0), [np.array(1, "int64")], table[1], "cgra-8x8")
    a, b = (rng.standard_normal((1, 8, 4, 4, 1)).astype("float32") for _ in range(2))
    _check(lambda x, y: relax.op.concat([x, y], axis=4), [a, b], np.concatenate([a, b], axis=4), "cgra-8x8")
    token = rng.standard_normal((1, 1, 16)).astype("float32")  # ViT's class token, a weight
    patches = rng.standard_normal((1, 9, 16)).astype("float32")
    _check(lambda x: relax.op.concat([relax.const(token), x], axis=1), [patches],
           np.concatenate([token, patches], axis=1), "cgra-8x8")


@pytest.mark.parametrize("indices", [np.array(0, "int64"), np.array([3, -1, 0, 3, 2], "int64"),
                                     np.array([0, 2, 4, 6], "int32")])
def test_constant_indices_are_origins_fixed_when_compiling(indices):
    """ViT's CLS token (take(x, 0, axis=1)) and any list of constant indices: no index read."""
    x = np.random.default_rng(10).standard_normal((2, 7, 5)).astype("float32")
    _check(lambda v: relax.op.take(v, relax.const(indices), axis=1), [x], np.take(x, indices, axis=1), "cgra-8x8")
    x = np.random.default_rng(11).standard_normal((1, 8, 4, 3, 4)).astype("float32")  # Bloom's fused qkv
    _check(lambda v: relax.op.take(v, relax.const(np.atleast_1d(indices)[:1] % 3), axis=3), [x],
           np.take(x, np.atleast_1d(indices)[:1] % 3, axis=3), "cgra-8x8")


@pytest.mark.parametrize("arch", ["cgra-4x4", "cgra-8x8", "cgra-16x16"])
def test_the_tile_search_times_a_copy_as_the_simulator_does(arch):
    """The estimate the tile search and the host comparison use is the simulated launch's cycles
    within 5% (the scoreboard's write-after-write waits it leaves out)."""
    from npu_backend.kernels.layout.layout import LAYOUT, layout_spec

    rng = np.random.default_rng(12)
    table = rng.standard_normal((1000, 64)).astype("float32")
    cases = [(lambda v: relax.op.permute_dims(v, [0, 2, 1, 3]), [rng.standard_normal((1, 32, 8, 64))]),
             (lambda v, w: relax.op.concat([v, w], axis=1), [rng.standard_normal((1, 64, 16, 16))] * 2),
             (lambda i: relax.op.take(relax.const(table), i, axis=0), [rng.integers(0, 1000, (1, 32))])]
    for build, inputs in cases:
        inputs = [a.astype("float32") if a.dtype == np.float64 else a for a in inputs]
        _, prof = _run(build, inputs, arch)
        bb = relax.BlockBuilder()
        with bb.function("f", []):
            call = bb.normalize(build(*[relax.Var(f"x{i}", relax.TensorType(a.shape, str(a.dtype)))
                                        for i, a in enumerate(inputs)]))
            bb.emit_func_output(relax.const(0))
        spec = layout_spec("", {"root": call})
        estimate = LAYOUT.choose_tiling(spec, npu_backend.load_arch(arch)).cycles
        assert abs(estimate - prof.kernels[0].cycles) <= 0.05 * prof.kernels[0].cycles, (estimate, prof.kernels[0])


def test_a_window_partition_of_rank_six_merges_into_four_axes():
    piece = Piece("lhs", (0,) * 6, (1, 2, 2, 4, 4, 3), tuple((a, 1) for a in (0, 1, 3, 2, 4, 5)), (0,) * 6)
    in_view, out_view, compacted, _ = compact(piece, (1, 2, 4, 2, 4, 3), (1, 2, 2, 4, 4, 3))
    assert (in_view, out_view) == ((2, 4, 2, 12), (2, 2, 4, 12))
    assert compacted.walks == ((0, 1), (2, 1), (1, 1), (3, 1))


def test_a_reshape_between_kernels_is_a_view_that_costs_nothing():
    """vm.builtin.reshape shares its tensor's memory: no host call, no crossing, no cycles."""
    rng = np.random.default_rng(7)
    x, w1, w2 = (rng.standard_normal(s).astype("float32") for s in ((16, 8), (8, 16), (8, 8)))

    def build(v, a, b):
        bb = relax.BlockBuilder.current()
        first = bb.emit(relax.op.matmul(v, a))
        viewed = bb.emit(relax.op.reshape(first, (32, 8)))
        return relax.op.matmul(viewed, b)

    out, prof = _run(build, [x, w1, w2], "cgra-8x8")
    np.testing.assert_allclose(out, (x @ w1).reshape(32, 8) @ w2, rtol=1e-5, atol=1e-5)
    assert len(prof.kernels) == 2
    assert prof.host_calls == [] and prof.crossings == 0 and prof.host_cycles == 0


def test_a_memory_view_between_kernels_costs_nothing():
    """R.memory.view (runtime.TVMTensorCreateView, normalise/masks.py's int64 words) is no host
    call and keeps its tensor's side: no crossing."""
    rng = np.random.default_rng(13)
    x, w1, w2 = (rng.standard_normal(s).astype("float32") for s in ((16, 8), (8, 16), (8, 8)))

    def build(v, a, b):
        bb = relax.BlockBuilder.current()
        first = bb.emit(relax.op.matmul(v, a))
        viewed = bb.emit(relax.op.memory.view(first, relax.ShapeExpr([32, 8])))
        return relax.op.matmul(viewed, b)

    out, prof = _run(build, [x, w1, w2], "cgra-8x8")
    np.testing.assert_allclose(out, (x @ w1).reshape(32, 8) @ w2, rtol=1e-5, atol=1e-5)
    assert len(prof.kernels) == 2
    assert prof.host_calls == [] and prof.crossings == 0 and prof.host_cycles == 0


@pytest.mark.parametrize("build, reason", [
    (lambda v: relax.op.nn.pad(v, [1, 1, 0, 0], pad_value=1.0), "zeros only"),
    (lambda v: relax.op.strided_slice(v, [0], [5], [0], [-1]), "positive steps"),
    (lambda v: relax.op.concat([v, v], axis=0), "with itself"),
])
def test_what_the_dma_cannot_do_stays_on_the_host_with_the_reason(build, reason):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((6, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(x))
        bb.emit_func_output(out)
    placements = npu_backend.explain(bb.get(), "cgra-8x8")
    assert [p.where for p in placements] == ["host"] and reason in placements[0].reason
