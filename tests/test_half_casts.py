"""float32 <-> bfloat16 / float16 casts on the NPU (kernels/elementwise/cast.py) and the graph
rewrites that leave PyTorch's bfloat16 casts to it (normalise/half_casts.py).

The cast kernel is one EPILOGUE a tile: float32 rounded to nearest even into the 16-bit format
(ties to even, overflow to infinity, NaN kept a NaN), a 16-bit float widened exactly. Hypothesis
draws shapes and float32 bit patterns (specials included: infinities, NaNs, subnormals, ties) and
holds the NPU to numpy's model of the conversion (cgra_sim/half_floats.py) bit for bit; numpy's
model itself is held to ml_dtypes' / numpy's own round-to-nearest-even conversion.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from cgra_sim import half_floats
from npu_backend.tools.workloads import numpy_dtype, relax_module, run

HALVES = ["bfloat16", "float16"]


def _float32_bits(rng, shape, specials: bool):
    """float32 values: normal ones of every scale, or any bit pattern (specials included)."""
    if specials:
        return rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return (rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)).astype(np.float32)


def _same_bits(out, expected):
    """Equal bit for bit, except that any NaN equals any NaN."""
    nan = np.isnan(expected.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(out.astype(np.float32)), nan)
    width = np.uint16 if out.dtype.itemsize == 2 else np.uint32
    np.testing.assert_array_equal(out.view(width)[~nan], expected.view(width)[~nan])


@given(dtype=st.sampled_from(HALVES), seed=st.integers(0, 2**16), specials=st.booleans())
@example(dtype="bfloat16", seed=0, specials=True)
def test_numpy_model_rounds_to_nearest_even_as_ml_dtypes_and_numpy_do(dtype, seed, specials):
    values = _float32_bits(np.random.default_rng(seed), (257,), specials)
    ties = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -(1 + 2.0 ** -8), 2.0 ** -133, 3.4e38], np.float32)
    values = np.concatenate([values, ties])
    model = half_floats.narrow(values, dtype)
    stored = model.view(numpy_dtype(dtype)) if dtype == "bfloat16" else model
    _same_bits(stored, values.astype(numpy_dtype(dtype)))
    _same_bits(half_floats.widen(model, dtype), stored.astype(np.float32))


def _cast_module(shape, source, target):
    return relax_module([("x", shape, source)], lambda bb, x: bb.emit(relax.op.astype(x, target)))


@settings(max_examples=6, deadline=None)  # a compile each: about 2 s
@given(dtype=st.sampled_from(HALVES), narrowing=st.booleans(), shape=st.lists(st.integers(1, 40), min_size=1,
       max_size=3).map(tuple), specials=st.booleans(), seed=st.integers(0, 2**16))
@example(dtype="bfloat16", narrowing=True, shape=(16, 64), specials=True, seed=1)
def test_a_cast_runs_on_the_npu_bit_exact_to_numpys_model(dtype, narrowing, shape, specials, seed):
    rng = np.random.default_rng(seed)
    wide = _float32_bits(rng, shape, specials)
    if narrowing:
        source, target, x = "float32", dtype, wide
        expected = half_floats.narrow(wide, dtype)
    else:
        source, target = dtype, "float32"
        x = wide.astype(numpy_dtype(dtype))
        expected = half_floats.widen(x.view(np.uint16) if dtype == "bfloat16" else x, dtype)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(_cast_module(shape, source, target), "cgra-8x8"), [x])
    assert [k.source_ops for k in prof.kernels] == [("astype",)]
    _same_bits(out.view(np.uint16) if narrowing and dtype == "bfloat16" else out, expected)


def test_a_cast_the_epilogue_has_no_conversion_for_stays_on_the_host_saying_why():
    mod = _cast_module((4, 8), "float32", "int8")
    [host] = [p for p in npu_backend.explain(mod, "cgra-8x8") if p.where == "host"]
    assert "float32 to bfloat16 / float16" in host.reason


def test_a_widening_epilogue_takes_no_other_step():
    """The simulator refuses a 16-bit accumulator with a flag (a relu): EPILOGUE only widens it."""
    from cgra_sim import load_arch, simulate
    from cgra_sim.isa import DType, Op, encode

    record = encode(Op.EPILOGUE, flags=2, acc_dtype=int(DType.BFLOAT16), out_dtype=int(DType.FLOAT32), m=1, n=4,
                    acc_addr=0, acc_stride=4, out_addr=64, out_stride=4)
    with pytest.raises(Exception, match="only widened to float32"):
        simulate(load_arch("cgra-8x8"), np.array([record], dtype=np.int64), [])
