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


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_transposes_in_a_row_are_one_copy(data):
    """permute_dims(permute_dims(x, a), b) is one transpose (c[i] = a[b[i]]), and none at all when
    c is the identity (normalise/permute_chains.py): one layout kernel or none, numpy's result."""
    a = data.draw(st.permutations(range(4)))
    b = data.draw(st.permutations(range(4)))
    x = np.random.default_rng(6).standard_normal((2, 3, 4, 5)).astype("float32")

    def build(bb, x):
        return relax.op.permute_dims(bb.emit(relax.op.permute_dims(x, a)), b)

    out, prof = _run(build, [x], "cgra-8x8")
    np.testing.assert_array_equal(out, np.transpose(np.transpose(x, a), b))
    composed = [a[i] for i in b]
    assert len(prof.kernels) == (0 if composed == [0, 1, 2, 3] else 1), prof.kernels


def _fused_qkv(bb, y, heads=(4, 2, 2), width=16):
    """GPT-2 / Phi-3's fused projection output (1, S, (Hq + 2 Hkv) D) split into q, k, v, each
    cut into heads and transposed to (1, H, S, D); the three returned as one sum-free tuple's
    concat so the graph has one output."""
    tokens = int(y.ty.shape[1])
    cuts = [heads[0] * width, (heads[0] + heads[1]) * width]
    parts = bb.emit(relax.op.split(y, cuts, axis=2))
    out = []
    for index, count in enumerate(heads):
        part = bb.emit(relax.TupleGetItem(parts, index))
        cut = bb.emit(relax.op.reshape(part, (1, tokens, count, width)))
        out.append(bb.emit(relax.op.permute_dims(cut, [0, 2, 1, 3])))
    return relax.op.concat(out, axis=1)


def test_a_fused_projections_split_is_three_boxes_of_one_tensor():
    """split -> reshape -> transpose of each part (normalise/split_slices.py, then the layout
    family's permute_dims(strided_slice(x))): no host split, one copy kernel per part reading its
    box of the projection's output, no slice copy; numpy's result."""
    y = np.random.default_rng(7).standard_normal((1, 8, 128)).astype("float32")
    out, prof = _run(_fused_qkv, [y], "cgra-8x8")
    q, k, v = np.split(y, [64, 96], axis=2)
    expected = np.concatenate([np.transpose(p.reshape(1, 8, -1, 16), (0, 2, 1, 3)) for p in (q, k, v)], axis=1)
    np.testing.assert_array_equal(out, expected)
    assert prof.host_calls == [], prof.host_calls
    names = [kernel.name for kernel in prof.kernels]
    assert sum("strided_slice_relax_permute_dims" in name for name in names) == 3, names
    assert not any(name.endswith("strided_slice_cgra") for name in names), names


def test_a_fused_projections_rotary_parts_read_their_slice():
    """Phi-3: RoPE on the q and k parts of the fused projection is one kernel each, its box's
    origin the part's place in the projection's output."""
    rng = np.random.default_rng(8)
    y = rng.standard_normal((1, 8, 128)).astype("float32")
    cos, sin = (rng.standard_normal((1, 1, 8, 16)).astype("float32") for _ in range(2))

    def build(bb, y, cos, sin):
        parts = bb.emit(relax.op.split(y, [64, 96], axis=2))
        out = []
        for index, count in enumerate((4, 2)):
            cut = bb.emit(relax.op.reshape(bb.emit(relax.TupleGetItem(parts, index)), (1, 8, count, 16)))
            out.append(bb.emit(_rope(True)(bb, cut, cos, sin)))
        return relax.op.concat(out, axis=1)

    out, prof = _run(build, [y, cos, sin], "cgra-8x8")
    q, k, _ = np.split(y, [64, 96], axis=2)
    expected = np.concatenate([_expected(p.reshape(1, 8, -1, 16), cos, sin, True) for p in (q, k)], axis=1)
    np.testing.assert_array_equal(out, expected)
    names = [kernel.name for kernel in prof.kernels]
    assert prof.host_calls == [] and sum("concat_relax_multiply_relax_add" in n for n in names) == 2, names
    assert not any("split" in n or n.endswith("strided_slice_cgra") for n in names), names


def test_a_split_transpose_and_its_partial_rotary_parts_are_boxes():
    """GPT-NeoX: the fused projection is transposed, then split, then each part cut into its
    rotary and pass-through columns: every part becomes a slice of the projection's output
    under the transpose (normalise/split_slices.py), read by one copy kernel or the RoPE kernel;
    no host split, no slice of a slice; numpy's result."""
    rng = np.random.default_rng(9)
    y = rng.standard_normal((1, 8, 2, 48)).astype("float32")
    cos, sin = (rng.standard_normal((1, 1, 8, 8)).astype("float32") for _ in range(2))

    def build(bb, y, cos, sin):
        heads = bb.emit(relax.op.permute_dims(y, [0, 2, 1, 3]))
        parts = bb.emit(relax.op.split(heads, [16, 32], axis=3))
        q, k, v = (bb.emit(relax.TupleGetItem(parts, i)) for i in range(3))
        rotary = bb.emit(relax.op.strided_slice(q, [3], [0], [8]))
        passed = bb.emit(relax.op.strided_slice(q, [3], [8], [16]))
        turned = bb.emit(_rope(False)(bb, rotary, cos, sin))
        return relax.op.concat([turned, passed, k, v], axis=-1)

    out, prof = _run(build, [y, cos, sin], "cgra-8x8")
    q, k, v = np.split(np.transpose(y, (0, 2, 1, 3)), [16, 32], axis=3)
    expected = np.concatenate([_expected(q[..., :8], cos, sin, False), q[..., 8:], k, v], axis=-1)
    np.testing.assert_array_equal(out, expected)
    names = [kernel.name for kernel in prof.kernels]
    assert prof.host_calls == [], prof.host_calls
    assert sum("concat_relax_multiply_relax_add" in n for n in names) == 1, names
    assert not any(n.endswith("strided_slice_cgra") or "permute_dims_cgra" in n and "slice" not in n for n in names), names


def test_a_split_read_by_compute_is_npu_slices():
    """ShuffleNet's channel split before convolutions (here a multiply): its parts are slices,
    NPU copies, no host call (normalise/split_slices.py); numpy's result."""
    x = np.random.default_rng(10).standard_normal((16, 64)).astype("float32")

    def build(bb, x):
        parts = bb.emit(relax.op.split(x, 2, axis=1))
        a, b = (bb.emit(relax.TupleGetItem(parts, i)) for i in range(2))
        return relax.op.multiply(a, b)

    out, prof = _run(build, [x], "cgra-8x8")
    np.testing.assert_array_equal(out, x[:, :32] * x[:, 32:])
    assert prof.host_calls == [], prof.host_calls


def test_a_split_of_a_constant_folds():
    """GPT-J splits its position table, folded to a constant, into sin and cos halves:
    FoldConstant leaves a split (a tuple) alone, so it was a host call; its parts are constants
    now (normalise/split_slices.py), no host call, numpy's result."""
    table = np.random.default_rng(11).standard_normal((1, 8, 8)).astype("float32")
    x = np.random.default_rng(12).standard_normal((1, 8, 4)).astype("float32")

    def build(bb, x):
        parts = bb.emit(relax.op.split(relax.const(table), [4], axis=-1))
        sin, cos = (bb.emit(relax.TupleGetItem(parts, i)) for i in range(2))
        return relax.op.add(relax.op.multiply(x, cos), sin)

    out, prof = _run(build, [x], "cgra-8x8")
    np.testing.assert_array_equal(out, x * table[..., 4:] + table[..., :4])
    assert prof.host_calls == [], prof.host_calls
