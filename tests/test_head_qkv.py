"""A fused q / k / v projection laid out per head (Bloom's query_key_value) becomes one laid out
per part, its parts boxes of the output instead of take kernels (normalise/head_qkv.py): the
parts equal numpy's, and a projection something else reads too keeps its layout."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.head_qkv import parts_first_projections


def _per_head(weight, bias, tokens: int, heads: int, parts: int, depth: int, also_read: bool = False):
    """take(reshape(x @ weight.T + bias, (1, tokens, heads, parts, depth)), i, axis=3) for each part
    (Bloom's split of its fused projection), summed as p0 * p1 + p2 ... so that one output reads all."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((tokens, weight.shape[1]), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(relax.const(weight), [1, 0]))))
            y = bb.emit(relax.op.add(relax.const(bias), y))
            flat = bb.emit(relax.op.reshape(y, (1, tokens, heads * parts * depth)))
            cut = bb.emit(relax.op.reshape(flat, (1, tokens, heads, parts, depth)))
            found = [bb.emit(relax.op.take(cut, relax.const(i, "int64"), axis=3)) for i in range(parts)]
            out = found[0]
            for part in found[1:]:
                out = bb.emit(relax.op.add(relax.op.multiply(out, relax.const(0.5, "float32")), part))
            if also_read:  # the per-head layout read as it is: the rewrite must leave it
                out = bb.emit(relax.op.add(out, relax.op.reshape(bb.emit(relax.op.sum(flat, axis=[2])), (1, tokens, 1, 1))))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def _reference(x, weight, bias, heads, parts, depth):
    cut = (x @ weight.T + bias).reshape(1, x.shape[0], heads, parts, depth)
    out = cut[:, :, :, 0]
    for i in range(1, parts):
        out = out * np.float32(0.5) + cut[:, :, :, i]
    return out


@settings(max_examples=4, deadline=None)
@given(tokens=st.integers(1, 24), heads=st.sampled_from([2, 4]), parts=st.sampled_from([2, 3]),
       depth=st.sampled_from([8, 16]), seed=st.integers(0, 99))
def test_per_head_parts_become_boxes(tokens, heads, parts, depth, seed):
    rng = np.random.default_rng(seed)
    width = heads * parts * depth
    weight, bias = rng.standard_normal((width, 32)).astype("float32"), rng.standard_normal(width).astype("float32")
    x = rng.standard_normal((tokens, 32)).astype("float32")
    mod = _per_head(weight, bias, tokens, heads, parts, depth)
    rewritten = str(parts_first_projections(mod)["main"])
    assert "R.take(" not in rewritten and rewritten.count("R.strided_slice(") == parts
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](
            tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, _reference(x, weight, bias, heads, parts, depth), rtol=1e-5, atol=1e-5)
    assert not any("take" in k.name for k in prof.kernels), [k.name for k in prof.kernels]


def test_a_projection_read_as_it_is_keeps_its_layout():
    rng = np.random.default_rng(3)
    weight, bias = rng.standard_normal((96, 32)).astype("float32"), rng.standard_normal(96).astype("float32")
    mod = _per_head(weight, bias, 8, 2, 3, 16, also_read=True)
    assert str(parts_first_projections(mod)["main"]).count("R.take(") == 3
