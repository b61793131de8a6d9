"""Host concatenations run as the runtime's cgra.host.concat (npu_backend/device/host_ops.py,
runtime/src/host_ops.cc), not as host code TVM compiles per model."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from npu_backend.pipeline import run_stages

DTYPES = ["float32", "int8", "int32", "float16"]


def _concat_module(shapes, axis: int, dtype: str, symbolic: bool = False):
    """main(x0, x1, ...) = concat((x0, x1, ...), axis); with `symbolic`, dimension 0 is `n`."""
    n = tvm.tirx.Var("n", "int64")
    builder = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType([n, *shape[1:]] if symbolic else shape, dtype))
              for i, shape in enumerate(shapes)]
    with builder.function("main", params):
        with builder.dataflow():
            out = builder.emit_output(relax.op.concat(params, axis=axis))
        builder.emit_func_output(out)
    return builder.get()


def _run(mod, arrays):
    ex = tvm.compile(mod, target="cgra")
    vm = tvm.relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


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
    lowered = run_stages(mod, npu_backend.load_arch(None), npu_backend.CompileOptions())
    assert "R.concat" not in lowered["main"].script() and "cgra.host.concat" in lowered["main"].script()
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
