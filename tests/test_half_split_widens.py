"""A 16-bit fused q / k / v projection's parts, each sliced, cut into heads and widened, widened
once before the slices (normalise/half_split_widens.py): GPT-2's c_attn.

Hypothesis holds the compiled graph, on every preset and both formats, bit for bit to numpy's
model of PyTorch's sequence (the biased float32 sum rounded to h, each part widened, the parts
added in float32), through a signed permutation W (each sum one value, exact in any order); the
rewrite leaves one round trip and no cast after a slice, and leaves alone what it must not.
"""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.half_split_widens import half_split_widens_moved
from npu_backend.tools.workloads import numpy_dtype, relax_module, run

PRESETS = ["cgra-4x4", "cgra-8x8", "cgra-16x16"]
HALVES = ["bfloat16", "float16"]


def _parts(bb, rounded, rows: int, heads: int, dim: int, dtype: str):
    """q, k, v of a (rows, 3 heads dim) h value: sliced on the (1, rows, 3 heads, dim) view, each
    (1, heads, rows, dim), widened (GPT-2's split, view and transpose after split_slices.py)."""
    view = bb.emit(relax.op.reshape(bb.emit(relax.op.reshape(rounded, (1, rows, 3 * heads * dim))),
                                    (1, rows, 3 * heads, dim)))
    parts = []
    for index in range(3):
        part = bb.emit(relax.op.strided_slice(view, [2], [index * heads], [(index + 1) * heads]))
        moved = bb.emit(relax.op.permute_dims(part, [0, 2, 1, 3]))
        parts.append(bb.emit(relax.op.astype(moved, "float32")) if dtype != "float32" else moved)
    return parts


def _module(dtype: str, rows: int, heads: int, dim: int, w, bias):
    """main(x_h) = (q + k) + v in float32 of the rounded biased projection x W + b's parts."""
    def body(bb, x):
        product = bb.emit(relax.op.matmul(x, relax.const(w, dtype), out_dtype="float32"))
        summed = bb.emit(relax.op.add(relax.const(bias.astype(np.float32)), product))
        rounded = bb.emit(relax.op.astype(summed, dtype)) if dtype != "float32" else summed
        q, k, v = _parts(bb, rounded, rows, heads, dim, dtype)
        return bb.emit(relax.op.add(bb.emit(relax.op.add(q, k)), v))
    return relax_module([("x", (rows, w.shape[0]), dtype)], body)


@settings(max_examples=6, deadline=None)  # a compile each: about 3 s
@given(arch=st.sampled_from(PRESETS), dtype=st.sampled_from(HALVES), rows=st.integers(1, 40),
       heads=st.sampled_from([1, 2, 4]), dim=st.sampled_from([8, 16]), seed=st.integers(0, 2**16))
@example(arch="cgra-8x8", dtype="bfloat16", rows=32, heads=4, dim=16, seed=0)  # GPT-2's
@example(arch="cgra-16x16", dtype="float16", rows=17, heads=2, dim=8, seed=1)
@example(arch="cgra-4x4", dtype="bfloat16", rows=5, heads=1, dim=8, seed=2)
def test_the_parts_widened_before_the_split_are_the_models_values_bit_for_bit(arch, dtype, rows, heads, dim, seed):
    rng = np.random.default_rng(seed)
    half, width = numpy_dtype(dtype), 3 * heads * dim
    x = (rng.standard_normal((rows, width)) * 4).astype(half)
    perm, signs = rng.permutation(width), rng.choice([-1.0, 1.0], width)
    picks = np.zeros((width, width), np.float32)
    picks[perm, np.arange(width)] = signs  # output column j is x's column perm[j], signed
    bias = rng.uniform(-4, 4, width).astype(half)
    out = run(npu_backend.compile(_module(dtype, rows, heads, dim, picks.astype(half), bias), arch), [x])
    z = x.astype(np.float32)[:, perm] * signs.astype(np.float32) + bias.astype(np.float32)
    parts = z.astype(half).astype(np.float32).reshape(1, rows, 3, heads, dim).transpose(2, 0, 3, 1, 4)
    np.testing.assert_array_equal(out, (parts[0] + parts[1]) + parts[2])


def test_the_rewrite_leaves_one_round_trip_and_no_cast_after_a_slice():
    rng = np.random.default_rng(0)
    w, bias = rng.standard_normal((48, 48)).astype(np.float16), rng.standard_normal(48).astype(np.float16)
    text = half_split_widens_moved(_module("float16", 8, 1, 16, w, bias))["main"].script()
    assert text.count('R.astype(') == 2 and text.count('dtype="float32")') >= 1
    casts = [line for line in text.splitlines() if "R.astype(" in line]
    assert any("float16" in line and "R.astype(lv" in line for line in casts)  # the rounding, then its widening
    assert text.count("R.strided_slice(") == 3 and text.count("R.reshape(") == 2  # the view once, shared


def test_a_float32_graph_and_a_widened_input_are_left_alone():
    rng = np.random.default_rng(1)
    w, bias = rng.standard_normal((48, 48)).astype(np.float32), rng.standard_normal(48).astype(np.float32)
    float32 = _module("float32", 8, 1, 16, w, bias)
    tvm.ir.assert_structural_equal(half_split_widens_moved(float32), float32)
    # x_h itself sliced and widened: no float32 value was rounded to make it, nothing to move onto
    def body(bb, x):
        q, k, v = _parts(bb, x, 8, 1, 16, "bfloat16")
        return bb.emit(relax.op.add(bb.emit(relax.op.add(q, k)), v))
    raw = relax_module([("x", (8, 48), "bfloat16")], body)
    tvm.ir.assert_structural_equal(half_split_widens_moved(raw), raw)
