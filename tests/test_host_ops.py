"""Host concatenations, splits and transposes run as the runtime's cgra.host.* (npu_backend/device/
host_ops.py, runtime/src/host_ops.cc), not as host code TVM compiles per model. The layout family
(npu_backend/kernels/layout/) runs those it can as NPU copy kernels; these tests take it away, so
that the runtime's copies, which still run what it declines (float64, symbolic shapes, a split),
are tested on every shape."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from npu_backend.kernels import registry
from npu_backend.kernels.layout.layout import LAYOUT
from npu_backend.device.host_ops import HOST_ANCHOR
from npu_backend.target.tags import HOST_OPT_LEVEL
from npu_backend.target.relax_pipeline import cgra_pipeline, run_stages

DTYPES = ["float32", "int8", "int32", "float16"]


@pytest.fixture(autouse=True)
def _host_layout_ops():
    with registry.unregistered(LAYOUT):
        yield


def _module(shapes, dtype: str, body, symbolic: bool = False):
    """main(x0, x1, ...) = body(params); with `symbolic`, dimension 0 is `n`."""
    n = tvm.tirx.Var("n", "int64")
    builder = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType([n, *shape[1:]] if symbolic else shape, dtype))
              for i, shape in enumerate(shapes)]
    with builder.function("main", params):
        with builder.dataflow():
            out = builder.emit_output(body(params))
        builder.emit_func_output(out)
    return builder.get()


def _concat_module(shapes, axis: int, dtype: str, symbolic: bool = False):
    return _module(shapes, dtype, lambda params: relax.op.concat(params, axis=axis), symbolic)


def _on_runtime(mod, name: str) -> None:
    lowered = run_stages(mod, npu_backend.load_arch(None), npu_backend.CompileOptions())["main"].script()
    assert f"cgra.host.{name}" in lowered and f"R.{name}" not in lowered


def _run(mod, arrays):
    ex = tvm.compile(mod, target="cgra")
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return out.numpy() if hasattr(out, "numpy") else [part.numpy() for part in out]


@st.composite
def concat_cases(draw):
    rank = draw(st.integers(1, 4))
    axis = draw(st.integers(-rank, rank - 1))
    base = [draw(st.integers(1, 5)) for _ in range(rank)]
    count = draw(st.integers(1, 4))
    shapes = []
    for _ in range(count):
        shape = list(base)
        shape[axis] = draw(st.integers(1, 6))
        shapes.append(tuple(shape))
    return shapes, axis, draw(st.sampled_from(DTYPES))


@settings(max_examples=12, deadline=None)
@given(concat_cases())
def test_host_concat_matches_numpy(case):
    shapes, axis, dtype = case
    rng = np.random.default_rng(len(shapes))
    arrays = [(rng.standard_normal(shape) * 50).astype(dtype) for shape in shapes]
    mod = _concat_module(shapes, axis, dtype)
    _on_runtime(mod, "concat")
    np.testing.assert_array_equal(_run(mod, arrays), np.concatenate(arrays, axis=axis))


@pytest.mark.parametrize("batch", [1, 5])
def test_host_concat_symbolic_batch(batch):
    mod = _concat_module([(1, 4, 3), (1, 2, 3)], 1, "float32", symbolic=True)
    arrays = [np.arange(batch * 12, dtype="float32").reshape(batch, 4, 3),
              -np.arange(batch * 6, dtype="float32").reshape(batch, 2, 3)]
    np.testing.assert_array_equal(_run(mod, arrays), np.concatenate(arrays, axis=1))


def test_host_concat_refuses_a_mismatch():
    concat = tvm.get_global_func("cgra.host.concat")
    a = tvm.runtime.tensor(np.zeros((2, 3), "float32"))
    out = tvm.runtime.tensor(np.zeros((2, 5), "float32"))
    with pytest.raises(ValueError, match=r"cgra.host.concat: the inputs give 3 along axis 1"):
        concat(1, a, out)
    with pytest.raises(ValueError, match=r"input 1 of shape \(3, 2\) does not fit the output \(2, 5\)"):
        concat(1, a, tvm.runtime.tensor(np.zeros((3, 2), "float32")), out)


@st.composite
def split_cases(draw):
    rank = draw(st.integers(1, 4))
    axis = draw(st.integers(-rank, rank - 1))
    shape = [draw(st.integers(1, 5)) for _ in range(rank)]
    shape[axis] = draw(st.integers(2, 9))
    cuts = sorted(draw(st.sets(st.integers(1, shape[axis] - 1), min_size=1, max_size=3)))
    return tuple(shape), axis, cuts, draw(st.sampled_from(DTYPES))


@settings(max_examples=12, deadline=None)
@given(split_cases())
def test_host_split_matches_numpy(case):
    shape, axis, cuts, dtype = case
    array = (np.random.default_rng(len(cuts)).standard_normal(shape) * 50).astype(dtype)
    mod = _module([shape], dtype, lambda params: relax.op.split(params[0], cuts, axis=axis))
    _on_runtime(mod, "split")
    for part, expected in zip(_run(mod, [array]), np.split(array, cuts, axis=axis), strict=True):
        np.testing.assert_array_equal(part, expected)


@st.composite
def permute_cases(draw):
    rank = draw(st.integers(1, 5))
    shape = tuple(draw(st.integers(1, 5)) for _ in range(rank))
    axes = draw(st.none() | st.permutations(range(rank)))
    return shape, axes, draw(st.sampled_from(DTYPES + ["float64"]))


@settings(max_examples=12, deadline=None)
@given(permute_cases())
def test_host_permute_dims_matches_numpy(case):
    shape, axes, dtype = case
    array = (np.random.default_rng(len(shape)).standard_normal(shape) * 50).astype(dtype)
    mod = _module([shape], dtype, lambda params: relax.op.permute_dims(params[0], axes))
    order = list(reversed(range(len(shape)))) if axes is None else list(axes)
    if order != sorted(order):  # one that moves nothing is its operand (normalise/permute_chains.py)
        _on_runtime(mod, "permute_dims")
    np.testing.assert_array_equal(_run(mod, [array]), np.transpose(array, axes))


def test_channel_shuffle_on_the_runtime_at_a_symbolic_batch():
    # ShuffleNet's shuffle: (n, 2, 4, 3, 3) -> transpose -> split in two along the channels.
    def body(params):
        shuffled = relax.op.permute_dims(params[0], [0, 2, 1, 3, 4])
        return relax.op.split(shuffled, 2, axis=1)

    mod = _module([(1, 2, 4, 3, 3)], "float32", body, symbolic=True)
    array = np.arange(3 * 72, dtype="float32").reshape(3, 2, 4, 3, 3)
    for part, expected in zip(_run(mod, [array]), np.split(array.transpose(0, 2, 1, 3, 4), 2, axis=1), strict=True):
        np.testing.assert_array_equal(part, expected)


def test_host_split_and_permute_dims_refuse_a_mismatch():
    split, permute = tvm.get_global_func("cgra.host.split"), tvm.get_global_func("cgra.host.permute_dims")
    a = tvm.runtime.tensor(np.zeros((2, 3), "float32"))
    with pytest.raises(ValueError, match=r"cgra.host.split: the outputs give 2 along axis 1"):
        split(1, a, tvm.runtime.tensor(np.zeros((2, 2), "float32")))
    with pytest.raises(ValueError, match=r"cgra.host.permute_dims: axes that are not a permutation"):
        permute(a, 0, 0, tvm.runtime.tensor(np.zeros((2, 2), "float32")))


def test_reshapes_that_became_views_are_not_built_for_the_host():
    # ShuffleNet's shuffle as ONNX writes it: reshape, transpose, reshape, split. LegalizeOps
    # makes both reshapes PrimFuncs, RewriteDataflowReshape turns their calls back into views;
    # the PrimFuncs, called by nothing, are left out of the host build (the anchor remains).
    def body(params):
        grouped = relax.op.reshape(params[0], (1, 2, 4, 3, 3))
        shuffled = relax.op.reshape(relax.op.permute_dims(grouped, [0, 2, 1, 3, 4]), (1, 8, 3, 3))
        return relax.op.split(shuffled, 2, axis=1)

    mod = relax.transform.Normalize()(_module([(1, 8, 3, 3)], "float32", body))
    built = cgra_pipeline(npu_backend.load_arch(None))(mod)
    assert [gvar.name_hint for gvar, func in built.functions.items() if isinstance(func, tvm.tirx.PrimFunc)] \
        == [HOST_ANCHOR]
    array = np.arange(72, dtype="float32").reshape(1, 8, 3, 3)
    expected = np.split(array.reshape(1, 2, 4, 3, 3).transpose(0, 2, 1, 3, 4).reshape(1, 8, 3, 3), 2, axis=1)
    for part, want in zip(_run(mod, [array]), expected, strict=True):
        np.testing.assert_array_equal(part, want)


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic-batch"])
def test_a_returned_reshape_is_a_view_of_a_storage_of_its_own(symbolic):
    # SqueezeNet's last op, a flatten the function returns: TVM keeps a returned reshape as a
    # PrimFunc it compiles for the host; here the function returns a view (no host call, no
    # copy), whose storage no later call reuses: each result stays right after the next calls.
    def body(params):
        shape = (params[0].ty.shape[0], 72) if symbolic else (1, 72)
        return relax.op.reshape(relax.op.nn.relu(params[0]), shape)

    mod = relax.transform.Normalize()(_module([(1, 8, 3, 3)], "float32", body, symbolic=symbolic))
    lowered = run_stages(mod, npu_backend.load_arch(None), npu_backend.CompileOptions())["main"].script()
    assert "cgra.host.concat" not in lowered
    built = cgra_pipeline(npu_backend.load_arch(None))(mod)
    assert not [gvar.name_hint for gvar, func in built.functions.items()
                if isinstance(func, tvm.tirx.PrimFunc) and "reshape" in gvar.name_hint]
    vm = tvm.relax.VirtualMachine(tvm.compile(mod, target="cgra"), tvm.cpu())
    arrays = [np.arange(batch * 72, dtype="float32").reshape(batch, 8, 3, 3) - 30 - call
              for call, batch in enumerate((1, 3, 1, 3) if symbolic else (1, 1, 1))]
    with npu_backend.profile() as prof:
        results = [vm["main"](tvm.runtime.tensor(array)) for array in arrays]
    assert prof.host_calls == []
    gc.collect()  # the VM's and the calls' temporaries freed: a result aliasing one would show it
    for array, result in zip(arrays, results, strict=True):
        np.testing.assert_array_equal(result.numpy(), np.maximum(array, 0).reshape(array.shape[0], 72))


def test_a_returned_reshape_of_a_parameter_is_the_runtimes_copy():
    # A view would return the caller's own input under another shape: the runtime copies it.
    mod = relax.transform.Normalize()(_module([(1, 8, 3, 3)], "float32",
                                              lambda params: relax.op.reshape(params[0], (1, 72))))
    _on_runtime(mod, "concat")
    array = np.arange(72, dtype="float32").reshape(1, 8, 3, 3)
    np.testing.assert_array_equal(_run(mod, [array]), array.reshape(1, 72))


@pytest.mark.parametrize("host_opt_level, expected", [(0, 1), (1, 1), (3, 3)])
def test_the_host_operators_build_at_O1_unless_asked_for_more(monkeypatch, host_opt_level, expected):
    # -O1 runs softmax and layer norm as fast as -O3 and builds in half the time (target/tags.py).
    assert tvm.target.Target("cgra").attrs["opt-level"] == HOST_OPT_LEVEL == 1
    targets, build = [], tvm.relax.build
    monkeypatch.setattr(tvm.relax, "build", lambda mod, target, **kw: targets.append(target) or build(mod, target, **kw))
    mod = _module([(1, 4, 3, 3)], "float32", lambda params: relax.op.nn.softmax(params[0], axis=1))
    array = np.arange(36, dtype="float32").reshape(1, 4, 3, 3) / 10
    ex = npu_backend.compile(mod, host_opt_level=host_opt_level)
    out = tvm.relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(array)).numpy()
    assert int(targets[0].attrs["opt-level"]) == expected and list(targets[0].keys)[:1] == ["cgra"]
    np.testing.assert_allclose(out, np.exp(array) / np.exp(array).sum(axis=1, keepdims=True), rtol=1e-6)
