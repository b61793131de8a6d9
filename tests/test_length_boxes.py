"""A bias computed from a symbolic length alone (T5's relative-position bias) is the top-left s x s
box of a constant at the bound (normalise/length_boxes.py), which the length attention reads by
DMA (kernels/attention/length_rows.py's box patterns): equal to numpy at every length, nothing on
the host; refused above MAX_BYTES (the bias stays as it was)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import tvm
from tvm import relax, tirx

import npu_backend
from npu_backend.normalise.length_boxes import MAX_BYTES, checked_lengths, length_boxes
from npu_backend.tools.explain import explain, npu_mac_fraction

ARCH = "cgra-8x8"
DEPTH = 16
REACH = 3  # relative positions clipped to -REACH .. REACH (T5's buckets, in small)


def _table(heads: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2 * REACH + 1, heads)).astype("float32")


def _bias(bb, s, heads: int, table: np.ndarray):
    """(1, H, s, s) table[clip(j - i, -REACH, REACH) + REACH, h], as torch.export writes T5's:
    int64 arange arithmetic, a take of s * s indices, the heads moved first."""
    op = relax.op
    one = tirx.IntImm("int64", 1)
    zero = tirx.IntImm("int64", 0)
    queries = bb.emit(op.expand_dims(bb.emit(op.arange(zero, s, one, dtype="int64")), [1]))
    keys = bb.emit(op.expand_dims(bb.emit(op.arange(zero, s, one, dtype="int64")), [0]))
    relative = bb.emit(op.subtract(keys, queries))
    clipped = bb.emit(op.minimum(bb.emit(op.maximum(relative, relax.const(-REACH, "int64"))),
                                 relax.const(REACH, "int64")))
    index = bb.emit(op.astype(bb.emit(op.add(clipped, relax.const(REACH, "int64"))), "int32"))
    looked = bb.emit(op.take(relax.const(table), bb.emit(op.reshape(index, relax.ShapeExpr([s * s]))), axis=0))
    per_head = bb.emit(op.permute_dims(bb.emit(op.reshape(looked, relax.ShapeExpr([s, s, heads]))), [2, 0, 1]))
    return bb.emit(op.expand_dims(per_head, [0]))


def _expected_bias(table: np.ndarray, n: int) -> np.ndarray:
    rows, cols = np.indices((n, n))
    return table[np.clip(cols - rows, -REACH, REACH) + REACH].transpose(2, 0, 1)[None]


def _added(heads: int, bound: int, table: np.ndarray):
    """main(x (1, H, s, s)) = x + the bias."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([1, heads, s, s], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_upper_bound": {"s": bound}, "tir_var_lower_bound": {"s": 1}}):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, _bias(bb, s, heads, table)))
        bb.emit_func_output(out)
    return bb.get()


def _attention(heads: int, bound: int, table: np.ndarray, scale: float = 0.25):
    """T5's attention in small: softmax(Q Kᵀ * scale + bias) V over (1, H, s, D)."""
    s = tirx.Var("s", "int64")
    q, k, v = (relax.Var(name, relax.TensorType([1, heads, s, DEPTH], "float32")) for name in "qkv")
    bb = relax.BlockBuilder()
    op = relax.op
    with bb.function("main", [q, k, v], attrs={"tir_var_upper_bound": {"s": bound}, "tir_var_lower_bound": {"s": 1}}):
        with bb.dataflow():
            bias = _bias(bb, s, heads, table)
            q3, k3, v3 = (bb.emit(op.reshape(x, relax.ShapeExpr([heads, s, DEPTH]))) for x in (q, k, v))
            scores = bb.emit(op.multiply(bb.emit(op.matmul(q3, bb.emit(op.permute_dims(k3, [0, 2, 1])))),
                                         relax.const(np.float32(scale))))
            scores = bb.emit(op.add(bb.emit(op.reshape(scores, relax.ShapeExpr([1, heads, s, s]))), bias))
            p = bb.emit(op.reshape(bb.emit(op.nn.softmax(scores, axis=-1)), relax.ShapeExpr([heads, s, s])))
            out = bb.emit_output(op.reshape(bb.emit(op.matmul(p, v3)), relax.ShapeExpr([1, heads, s, DEPTH])))
        bb.emit_func_output(out)
    return bb.get()


def _expected(q, k, v, table, scale: float = 0.25):
    scores = (q @ k.transpose(0, 1, 3, 2)) * np.float32(scale) + _expected_bias(table, q.shape[2])
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _slices(mod) -> list:
    return [b.value for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.strided_slice"]


@settings(max_examples=6, deadline=None)
@given(heads=st.integers(1, 4), bound=st.integers(4, 40), data=st.data())
def test_the_bias_is_a_box_of_its_table_at_the_bound_equal_to_numpy(heads, bound, data):
    table = _table(heads, bound)
    rewritten = length_boxes(_added(heads, bound, table))
    (box,) = _slices(rewritten)
    np.testing.assert_array_equal(box.args[0].value.numpy(), _expected_bias(table, bound))
    assert not any(getattr(b.value.op, "name", "") in ("relax.arange", "relax.take")
                   for block in rewritten["main"].body.blocks for b in block.bindings
                   if isinstance(b.value, relax.Call))
    vm = relax.VirtualMachine(tvm.compile(rewritten, "llvm"), tvm.cpu())
    for n in sorted({1, bound, data.draw(st.integers(1, bound))}):
        x = np.random.default_rng(n).standard_normal((1, heads, n, n)).astype("float32")
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), x + _expected_bias(table, n))


def test_a_table_past_max_bytes_stays_as_it_was():
    heads = 4
    bound = int(np.sqrt(MAX_BYTES / 4 / heads)) + 1  # one row past the bound's 4 MiB
    mod = _added(heads, bound, _table(heads))
    assert heads * bound * bound * 4 > MAX_BYTES
    assert length_boxes(mod).same_as(mod)
    assert _slices(length_boxes(_added(heads, bound - 1, _table(heads)))), "just below: a box"


def test_a_mask_with_minus_inf_is_no_box():
    """A causal mask (-inf above the diagonal) is length_masks.py's and the kernel's own pattern's."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([1, 1, s, s], "float32"))
    bb = relax.BlockBuilder()
    op = relax.op
    with bb.function("main", [x], attrs={"tir_var_upper_bound": {"s": 64}}):
        with bb.dataflow():
            positions = bb.emit(op.arange(tirx.IntImm("int64", 0), s, tirx.IntImm("int64", 1), dtype="int64"))
            kept = bb.emit(op.less_equal(bb.emit(op.reshape(positions, relax.ShapeExpr([1, s]))),
                                         bb.emit(op.reshape(positions, relax.ShapeExpr([s, 1])))))
            mask = bb.emit(op.where(kept, relax.const(np.float32(0)), relax.const(np.float32(-np.inf))))
            out = bb.emit_output(op.add(x, bb.emit(op.reshape(mask, relax.ShapeExpr([1, 1, s, s])))))
        bb.emit_func_output(out)
    mod = bb.get()
    assert length_boxes(mod).same_as(mod)


def test_every_length_is_checked_up_to_the_budget_then_a_ladder():
    assert checked_lengths(2, 128, 4) == list(range(2, 128))
    ladder = checked_lengths(1, 4096, 16)
    assert ladder[:64] == list(range(1, 65)) and ladder[-1] == 4095 and len(ladder) < 200


def _check_attention(arch: str, heads: int, bound: int, lengths, scale: float = 0.25):
    table = _table(heads, heads)
    mod = _attention(heads, bound, table, scale)
    placements = explain(mod, arch, dims={"s": max(lengths)})
    assert npu_mac_fraction(placements) == 1.0
    assert any(p.kernel.startswith("cgra.attention_scale_length_box") for p in placements if p.where == "npu")
    assert not [p.op for p in placements if p.where == "host" and p.op not in ("reshape", "permute_dims")]
    vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    for n in lengths:
        q, k, v = (np.random.default_rng(n + i).standard_normal((1, heads, n, DEPTH)).astype("float32")
                   for i in range(3))
        with npu_backend.profile() as prof:
            out = vm["main"](*(tvm.runtime.tensor(a) for a in (q, k, v))).numpy()
        assert prof.host_cycles == 0
        np.testing.assert_allclose(out, _expected(q, k, v, table, scale), rtol=1e-5, atol=1e-5)


def test_an_attention_with_a_bias_box_is_one_kernel_equal_to_numpy_at_every_length():
    """The whole-row branch (cgra-8x8 holds a head's K and V whole up to the bound)."""
    _check_attention(ARCH, 4, 64, (1, 2, 17, 64))


@pytest.mark.slow
def test_past_the_whole_rows_the_key_tiles_read_the_box_too():
    """cgra-4x4 at bound 512: whole rows up to 416 tokens, key tiles of 64 past them."""
    _check_attention("cgra-4x4", 2, 512, (3, 417, 450))


@pytest.mark.slow
def test_t5_of_a_symbolic_length_keeps_no_compute_op_on_the_host_and_matches_pytorch():
    """tests/transformer_models.py's T5 encoder given input_ids alone, Dim("s", min=2, max=256):
    its bias (31 host compute ops with the safe softmaxes' guards before) a box read by the
    attention kernel; within 1e-5 of PyTorch at the shortest length, an odd one and the bound."""
    torch = pytest.importorskip("torch")
    from test_symbolic_exports import _export

    model, mod = _export("t5", 256)
    (length,) = relax.analysis.defined_symbolic_vars(mod["main"])
    placements = explain(mod, ARCH, dims={length.name: 32})
    views = ("reshape", "permute_dims", "expand_dims", "squeeze")
    assert not [p.op for p in placements if p.where == "host" and p.op not in views]
    vm = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())
    for n in (2, 17, 256):
        ids = torch.randint(0, 100, (1, n), generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            expected = model(ids).numpy()
        with npu_backend.profile() as prof:
            out = vm["main"](tvm.runtime.tensor(ids.numpy()))
        out = (out[0] if not hasattr(out, "numpy") else out).numpy()
        assert prof.host_cycles == 0
        assert np.abs(out - expected).max() / np.abs(expected).max() < 1e-5
