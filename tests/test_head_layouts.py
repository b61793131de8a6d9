"""The head split and merge transposes around an attention folded into its kernel's DMA boxes
(kernels/attention/head_layouts.py): projections' outputs (B, S, H * D) split into heads,
attended, merged back, in one kernel with no layout copy, matching numpy, in the whole-row and
the key-tile (flash) kernels, multi-head and grouped-query.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import relax

import npu_backend
from npu_backend.errors import ScratchpadTooSmall
from npu_backend.kernels.attention import attention_tiles
from test_attention import BOUND, _reference, _run


def _graph(b, h, hk, s, d, merge=True):
    """HF's eager attention from projection outputs: view as heads, transpose, repeat_kv for
    grouped K / V, scores, softmax, times V, transposed back and viewed as (B, S, H * D)."""
    bb = relax.BlockBuilder()
    q_in = relax.Var("q", relax.TensorType((b, s, h * d), "float32"))
    k_in = relax.Var("k", relax.TensorType((b, s, hk * d), "float32"))
    v_in = relax.Var("v", relax.TensorType((b, s, hk * d), "float32"))
    g = h // hk
    with bb.function("main", [q_in, k_in, v_in]):
        with bb.dataflow():
            q, k, v = (bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(x, (b, s, heads, d))), [0, 2, 1, 3]))
                       for x, heads in ((q_in, h), (k_in, hk), (v_in, hk)))
            if g > 1:
                k, v = (bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(
                    bb.emit(relax.op.expand_dims(x, [2])), (b, hk, g, s, d))), (b, h, s, d))) for x in (k, v))
            scores = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))))
            scores = bb.emit(relax.op.multiply(scores, relax.const(np.float32(d ** -0.5))))
            o = bb.emit(relax.op.matmul(bb.emit(relax.op.nn.softmax(scores, axis=-1)), v))
            if merge:
                o = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(o, [0, 2, 1, 3])), (b, s, h * d)))
            out = bb.emit_output(o)
        bb.emit_func_output(out)
    return bb.get()


def _check(b, h, hk, s, d, arch, merge=True):
    rng = np.random.default_rng(s)
    arrays = [rng.standard_normal((b, s, heads * d)).astype(np.float32) for heads in (h, hk, hk)]
    out, prof = _run(_graph(b, h, hk, s, d, merge), arrays, arch)
    assert [kernel.name.count("softmax") for kernel in prof.kernels] == [1], [kernel.name for kernel in prof.kernels]
    q, k, v = (x.reshape(b, s, -1, d).transpose(0, 2, 1, 3) for x in arrays)
    expected = _reference(q, k, v, None, d ** -0.5, safe=False)
    if merge:
        expected = expected.transpose(0, 2, 1, 3).reshape(b, s, h * d)
    assert np.abs(out - expected).max() <= BOUND * np.abs(expected).max()
    return prof


@pytest.mark.parametrize("b, h, hk, s, d", [(1, 4, 4, 17, 16), (2, 4, 2, 24, 32), (1, 2, 1, 9, 16)])
def test_the_head_transposes_are_the_attention_kernels_boxes(b, h, hk, s, d):
    _check(b, h, hk, s, d, "cgra-8x8")


def test_without_the_merge_the_operands_are_still_read_in_place():
    _check(1, 4, 2, 12, 16, "cgra-8x8", merge=False)


@pytest.fixture
def flash_only(monkeypatch):
    """The whole-row kernel refused: the attention runs over key tiles."""
    def refuse(spec, arch):
        raise ScratchpadTooSmall("the test takes the key-tile kernel")
    monkeypatch.setattr(attention_tiles, "whole_row_tiling", refuse)
    npu_backend.kernels.registry._TILINGS.clear()
    yield
    npu_backend.kernels.registry._TILINGS.clear()


@pytest.mark.parametrize("b, h, hk, s, d", [(1, 4, 4, 40, 16), (2, 4, 2, 33, 32)])
def test_the_key_tile_kernel_reads_and_writes_sequence_major_tensors(flash_only, b, h, hk, s, d):
    # a chip no other test compiles for: the kernel cache's key holds the chip, not the tiling
    arch = dataclasses.replace(npu_backend.load_arch("cgra-4x4"), name="cgra-4x4-spad56k", spad_bytes=56 * 1024)
    _check(b, h, hk, s, d, arch)


def test_a_transposed_k_read_elsewhere_leaves_the_plain_attention():
    """A KV cache's K and V, transposed, are outputs too: the transposes stay copies and the
    attention is still one kernel (the plain patterns after the head splits' ones)."""
    b, h, s, d = 1, 4, 12, 16
    bb = relax.BlockBuilder()
    ins = [relax.Var(name, relax.TensorType((b, s, h * d), "float32")) for name in "qkv"]
    with bb.function("main", ins):
        with bb.dataflow():
            q, k, v = (bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(x, (b, s, h, d))), [0, 2, 1, 3]))
                       for x in ins)
            scores = bb.emit(relax.op.multiply(bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(
                k, [0, 1, 3, 2])))), relax.const(np.float32(d ** -0.5))))
            o = bb.emit(relax.op.matmul(bb.emit(relax.op.nn.softmax(scores, axis=-1)), v))
            out = bb.emit_output(relax.Tuple([o, k, v]))
        bb.emit_func_output(out)
    arrays = [np.random.default_rng(i).standard_normal((b, s, h * d)).astype(np.float32) for i in range(3)]
    executable = npu_backend.compile(bb.get(), "cgra-8x8")
    with npu_backend.profile() as prof:
        out = tvm.relax.VirtualMachine(executable, tvm.cpu())["main"](*map(tvm.runtime.tensor, arrays))
    assert [kernel.name.count("softmax") for kernel in prof.kernels].count(1) == 1, [k.name for k in prof.kernels]
    q, k, v = (x.reshape(b, s, h, d).transpose(0, 2, 1, 3) for x in arrays)
    expected = _reference(q, k, v, None, d ** -0.5, safe=False)
    assert np.abs(out[0].numpy() - expected).max() <= BOUND * np.abs(expected).max()
    np.testing.assert_array_equal(out[1].numpy(), k)


def _parts_graph(b, h, hk, s, d, blocks):
    """q, k and v as parts of one projection's output viewed as heads: `blocks` False, Llama's
    merged q / k / v (heads q, then k, then v: slices of the head axis); True, GPT-NeoX's fused
    form (each head's q, k and v side by side: slices of the last axis)."""
    bb = relax.BlockBuilder()
    width = h * d * 3 if blocks else (h + 2 * hk) * d
    x = relax.Var("qkv", relax.TensorType((b, s, width), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            if blocks:
                y = bb.emit(relax.op.reshape(x, (b, s, h, 3 * d)))
                boxes = [([3], [i * d], [(i + 1) * d]) for i in range(3)]
            else:
                y = bb.emit(relax.op.reshape(x, (b, s, h + 2 * hk, d)))
                boxes = [([2], [0], [h]), ([2], [h], [h + hk]), ([2], [h + hk], [h + 2 * hk])]
            q, k, v = (bb.emit(relax.op.permute_dims(bb.emit(relax.op.strided_slice(y, *box)), [0, 2, 1, 3]))
                       for box in boxes)
            if not blocks and h > hk:
                k, v = (bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(
                    bb.emit(relax.op.expand_dims(t, [2])), (b, hk, h // hk, s, d))), (b, h, s, d))) for t in (k, v))
            scores = bb.emit(relax.op.multiply(bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(
                k, [0, 1, 3, 2])))), relax.const(np.float32(d ** -0.5))))
            o = bb.emit(relax.op.matmul(bb.emit(relax.op.nn.softmax(scores, axis=-1)), v))
            o = bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(o, [0, 2, 1, 3])), (b, s, h * d)))
            out = bb.emit_output(o)
        bb.emit_func_output(out)
    return bb.get(), width


@pytest.mark.parametrize("b, h, hk, s, d, blocks", [(1, 4, 2, 16, 16, False), (2, 4, 4, 9, 16, True)])
def test_parts_of_one_projection_are_boxes_of_it(b, h, hk, s, d, blocks):
    """The q / k / v parts (slices) of a merged projection's output are the attention kernel's
    boxes of that one tensor: no slice copy kernel, the same numbers."""
    mod, width = _parts_graph(b, h, hk, s, d, blocks)
    x = np.random.default_rng(s).standard_normal((b, s, width)).astype(np.float32)
    out, prof = _run(mod, [x], "cgra-8x8")
    assert [kernel.name.count("softmax") for kernel in prof.kernels] == [1], [kernel.name for kernel in prof.kernels]
    if blocks:
        q, k, v = (x.reshape(b, s, h, 3 * d)[..., i * d:(i + 1) * d].transpose(0, 2, 1, 3) for i in range(3))
    else:
        y = x.reshape(b, s, h + 2 * hk, d).transpose(0, 2, 1, 3)
        q, k, v = y[:, :h], y[:, h:h + hk], y[:, h + hk:]
    expected = _reference(q, k, v, None, d ** -0.5, safe=False).transpose(0, 2, 1, 3).reshape(b, s, h * d)
    assert np.abs(out - expected).max() <= BOUND * np.abs(expected).max()
