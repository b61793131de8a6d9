"""Layout ops folded into the kernels around them: RoPE (x * cos + rotate_half(x) * sin, with the
heads' transpose before it) as one NPU kernel whose halves are operand offsets and whose
transpose is the DMA's strides (kernels/elementwise/rope.py), equal bit for bit to numpy's
float32 arithmetic; no layout kernel left for the pieces it took."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tvm
from tvm import relax

import npu_backend

PRESETS = st.sampled_from(["cgra-4x4", "cgra-8x8", "cgra-16x16"])


def _module(build, inputs):
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(a.shape, str(a.dtype))) for i, a in enumerate(inputs)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def _run(build, inputs, arch):
    executable = npu_backend.compile(_module(build, inputs), arch)
    with npu_backend.profile() as prof:
        result = relax.VirtualMachine(executable, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in inputs])
    return result.numpy(), prof


def _rope(transposed: bool, swapped: bool = False):
    """HF's rotary embedding after normalise/rotations.py (the negation inside the sine)."""
    def build(bb, y, cos, sin):
        x = bb.emit(relax.op.permute_dims(y, [0, 2, 1, 3])) if transposed else y
        width = int(x.ty.shape[-1])
        lo = bb.emit(relax.op.strided_slice(x, [3], [0], [width // 2]))
        hi = bb.emit(relax.op.strided_slice(x, [3], [width // 2], [width]))
        plain = bb.emit(relax.op.multiply(x, cos))
        turned = bb.emit(relax.op.multiply(relax.op.concat([hi, lo], axis=-1), sin))
        return relax.op.add(turned, plain) if swapped else relax.op.add(plain, turned)
    return build


def _expected(y, cos, sin, transposed):
    x = np.transpose(y, (0, 2, 1, 3)) if transposed else y
    half = x.shape[-1] // 2
    rotated = np.concatenate([x[..., half:], x[..., :half]], axis=-1)
    return (x * cos) + (rotated * sin)  # float32 throughout, each product and the sum rounded once


@settings(max_examples=6, deadline=None)
@given(heads=st.integers(1, 4), positions=st.sampled_from([1, 7, 32, 48]), width=st.sampled_from([4, 16, 32]),
       transposed=st.booleans(), swapped=st.booleans(), arch=PRESETS)
def test_rope_is_one_kernel_equal_to_numpy(heads, positions, width, transposed, swapped, arch):
    rng = np.random.default_rng(heads * positions + width)
    shape = (1, positions, heads, width) if transposed else (1, heads, positions, width)
    y = rng.standard_normal(shape).astype("float32")
    cos = rng.standard_normal((1, 1, positions, width)).astype("float32")
    sin = rng.standard_normal((1, 1, positions, width)).astype("float32")
    out, prof = _run(_rope(transposed, swapped), [y, cos, sin], arch)
    np.testing.assert_array_equal(out, _expected(y, cos, sin, transposed))
    assert len(prof.kernels) == 1 and prof.host_calls == [], (prof.kernels, prof.host_calls)
    assert "strided_slice" in prof.kernels[0].name and "concat" in prof.kernels[0].name


def test_rope_reads_a_table_of_positions_without_leading_axes():
    """cos and sin as (S, D): the kernel reads them as they are."""
    rng = np.random.default_rng(3)
    y = rng.standard_normal((1, 16, 2, 8)).astype("float32")
    cos, sin = (rng.standard_normal((16, 8)).astype("float32") for _ in range(2))
    out, prof = _run(_rope(True), [y, cos, sin], "cgra-8x8")
    np.testing.assert_array_equal(out, _expected(y, cos, sin, True))
    assert len(prof.kernels) == 1


def test_rope_with_a_per_head_table_stays_apart():
    """A sine that differs per head is not RoPE's table: the kernel refuses it, and the pieces run
    as before (equal results)."""
    rng = np.random.default_rng(4)
    y = rng.standard_normal((1, 2, 8, 8)).astype("float32")
    cos = rng.standard_normal((1, 1, 8, 8)).astype("float32")
    sin = rng.standard_normal((1, 2, 8, 8)).astype("float32")
    out, prof = _run(_rope(False), [y, cos, sin], "cgra-8x8")
    np.testing.assert_allclose(out, _expected(y, cos, sin, False), rtol=0, atol=0)
    assert len(prof.kernels) > 1


@pytest.mark.parametrize("arch", ["cgra-8x8"])
def test_rope_tiles_long_sequences(arch):
    """More positions than one tile holds (cgra-8x8's 256 KiB: 12 tiles of 2048 x 128 do not
    fit): the position loop reloads cos and sin per tile."""
    rng = np.random.default_rng(5)
    y = rng.standard_normal((1, 512, 2, 64)).astype("float32")
    cos, sin = (rng.standard_normal((1, 1, 512, 64)).astype("float32") for _ in range(2))
    out, prof = _run(_rope(True), [y, cos, sin], arch)
    np.testing.assert_array_equal(out, _expected(y, cos, sin, True))
    assert len(prof.kernels) == 1
