"""normalise/half_powers.py: a bfloat16 power (GPT-2's NewGELU, x ** 3) computed as PyTorch's CPU
does (widened to float32, raised, rounded once), bit for bit against numpy / ml_dtypes on every
preset (x ** 3 and x ** -2 as PyTorch special-cases them); before, TVM's legalisation refused it ("power only applies to float") and a bfloat16
GPT-2 did not compile."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.half_powers import half_powers_in_float32
from npu_backend.tools.workloads import relax_module, run

SHAPE = (4, 16)


def _module(exponent: float, dtype: str = "bfloat16"):
    return relax_module([("x", SHAPE, dtype)], lambda bb, x: bb.emit(
        relax.op.power(x, relax.const(exponent, dtype))))


@functools.lru_cache(maxsize=None)
def _compiled(arch: str, exponent: float):
    return npu_backend.compile(_module(exponent), arch)


def test_the_rewrite_leaves_a_float32_and_a_float16_power_alone():
    for dtype in ("float32", "float16"):
        mod = _module(3.0, dtype)
        assert half_powers_in_float32(mod)["main"].same_as(mod["main"]) or \
            "astype" not in half_powers_in_float32(mod)["main"].script()


def test_a_bfloat16_power_is_raised_in_float32_between_casts():
    script = half_powers_in_float32(_module(1.5))["main"].script()
    assert script.count("R.astype") == 3 and 'R.power' in script and "float32" in script


def _pytorchs(x, exponent: float):
    """PyTorch's CPU bfloat16 pow (torch 2.13, checked on every finite bfloat16): float32, rounded
    once, except x ** 3 = round(round(x * x) * x) and x ** -2 = round(1 / round(x * x))."""
    bf16, wide = ml_dtypes.bfloat16, x.astype(np.float32)
    square = (wide * wide).astype(bf16).astype(np.float32)
    if exponent == 3.0:
        return (square * wide).astype(bf16)
    if exponent == -2.0:
        return (np.float32(1.0) / square).astype(bf16)
    return np.power(wide, np.float32(exponent)).astype(bf16)


def test_pytorchs_cube_rounds_the_square_first():
    """An input where one rounding and PyTorch's two differ, pinned (found by torch.pow)."""
    x = np.array([1.0390625], ml_dtypes.bfloat16)  # torch.pow: 1.1171875, one rounding 1.125
    once = np.power(x.astype(np.float32), np.float32(3)).astype(ml_dtypes.bfloat16)
    assert _pytorchs(x, 3.0) != once


@pytest.mark.parametrize("arch", npu_backend.preset_names())
@pytest.mark.parametrize("exponent", [3.0, 2.0, 0.5, -2.0])
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_a_bfloat16_power_matches_pytorchs_float32_then_round(arch, exponent, data):
    low = 0.0 if exponent == 0.5 else -60.0
    values = data.draw(st.lists(st.floats(low, 60.0, width=32).filter(lambda v: exponent > 0 or abs(v) > 1e-3),
                                min_size=SHAPE[0] * SHAPE[1], max_size=SHAPE[0] * SHAPE[1]))
    x = np.array(values, np.float32).reshape(SHAPE).astype(ml_dtypes.bfloat16)
    expected = _pytorchs(x, exponent)
    out = run(_compiled(arch, exponent), [x])
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))
