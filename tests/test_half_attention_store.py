"""A 16-bit float model's attention output rounded by the attention kernel's own store
(kernels/attention/rows.py, flash.py: an EPILOGUE rounding O * 1 / l to nearest even), where
`astype(attention(q, k, v), h)` ran the float32 kernel and a cast kernel after it
(normalise/half_attention_outputs.py moves the cast onto the attention's result; the rounded
attention patterns, kernels/attention/attention.py).

Stated bound: bit for bit ml_dtypes' round-to-nearest-even of the float32 kernel's output (the
same commands compute O; the rounding is the cast's), so within half an ulp of h of the float32
kernel, which is within 4e-6 of float64 (tests/test_attention.py). Hypothesis draws sizes, groups,
masks, both 16-bit formats, both chips' tile searches and the key-tile kernel.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.errors import ScratchpadTooSmall
from npu_backend.kernels.attention import attention_tiles
from npu_backend.normalise.half_attention_outputs import half_attention_outputs_moved
from test_attention import _graph as _attention_graph
from test_attention import _reference, _run

NUMPY_HALF = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _graph(h, hk, sq, sk, d, scale, mask_shape, mask_const, cast):
    """tests/test_attention.py's safe-softmax graph (batch 1), its result [viewed as the output
    projection's rows (HF's reshape before `.to(h)`) and] cast to `cast` (None: float32)."""
    def tail(bb, o):
        return relax.op.astype(bb.emit(relax.op.reshape(o, (h * sq, d))), cast)
    return _attention_graph(1, h, hk, sq, sk, d, scale, mask_shape, mask_const, safe=True,
                            tail=tail if cast is not None else None)


@pytest.fixture
def key_tiles(monkeypatch):
    """A switch: the whole-row kernel refused, so that the attention runs over key tiles."""
    def refuse(spec, arch):
        raise ScratchpadTooSmall("the test takes the key-tile kernel")

    def use(flash: bool):
        npu_backend.kernels.registry._TILINGS.clear()
        if flash:  # (the kernel cache's key holds the chip, not the tiling: no cached whole-row kernel)
            monkeypatch.setattr(attention_tiles, "whole_row_tiling", refuse)
            monkeypatch.setenv("CGRA_KERNEL_CACHE", "off")
        else:
            monkeypatch.undo()
    yield use
    monkeypatch.undo()
    npu_backend.kernels.registry._TILINGS.clear()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kv=st.integers(1, 2), group=st.sampled_from([1, 2]), sq=st.integers(1, 33), sk=st.integers(2, 40),
       d=st.sampled_from([8, 16]), mask=st.sampled_from(["none", "causal", "row"]),
       dtype=st.sampled_from(["bfloat16", "float16"]), arch=st.sampled_from(["cgra-4x4", "cgra-8x8"]),
       flash=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_the_rounding_store_is_the_cast_of_the_float32_kernel_bit_for_bit(key_tiles, kv, group, sq, sk, d, mask,
                                                                          dtype, arch, flash, seed):
    key_tiles(flash)
    rng = np.random.default_rng(seed)
    h, scale = kv * group, float(d) ** -0.5
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((1, h, sq, d), (1, kv, sk, d),
                                                                           (1, kv, sk, d)))
    arrays, mask_value, mask_shape, mask_const = [q, k, v], None, None, None
    if mask == "causal":
        mask_const = mask_value = np.triu(np.full((sq, sk), -np.inf, np.float32), 1)[None, None]
    elif mask == "row":
        mask_shape = (1, 1, 1, sk)
        mask_value = np.where(rng.random(mask_shape) < 0.3, np.finfo(np.float32).min, 0).astype(np.float32)
        arrays.append(mask_value)
    wide, _ = _run(_graph(h, kv, sq, sk, d, scale, mask_shape, mask_const, None), arrays, arch)
    narrow, prof = _run(_graph(h, kv, sq, sk, d, scale, mask_shape, mask_const, dtype), arrays, arch)
    assert [kernel.source_ops[-1] for kernel in prof.kernels if "nn.softmax" in kernel.source_ops] == ["astype"]
    assert not [kernel.name for kernel in prof.kernels if kernel.source_ops == ("astype",)]
    expected = wide.astype(NUMPY_HALF[dtype]).reshape(narrow.shape)
    assert narrow.dtype == expected.dtype
    assert np.array_equal(narrow.view(np.uint16), expected.view(np.uint16))
    exact = _reference(q, k, v, mask_value, scale, safe=True).reshape(narrow.shape)
    ulp = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    assert np.abs(narrow.astype(np.float64) - exact).max() <= (ulp + 4e-6) * np.abs(exact).max()


def test_a_cast_to_float32_or_of_another_value_stays_where_it_is():
    """Only a 16-bit cast of an attention's P V (through reshapes) moves; a cast of a reshaped
    linear's result does not (its GEMM rounds it: half_casts.py)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 8), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            r = bb.emit(relax.op.reshape(y, (8, 8)))
            out = bb.emit_output(relax.op.astype(r, "bfloat16"))
        bb.emit_func_output(out)
    mod = bb.get()
    moved = half_attention_outputs_moved(mod)
    assert str(moved["main"].body.blocks[0].bindings[-1].value.op.name) == "relax.astype"
