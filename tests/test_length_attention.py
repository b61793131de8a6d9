"""A causal attention over a symbolic sequence length runs as one fused NPU kernel
(kernels/attention/flash_length.py, read by normalise/attention_lengths.py): compiled once, equal
to numpy at every length, the ragged last tile cut."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st
import tvm
from tvm import relax, tirx

import npu_backend
from npu_backend.tools.explain import explain, npu_mac_fraction

ARCH = "cgra-8x8"
HEADS, KV_HEADS, DEPTH = 4, 2, 16


def _attention(causal: bool = True, bound: int = 256, scale: float | None = 0.25, batch: int = 1):
    """Hugging Face's eager grouped-query attention over (1, H, s, d) with repeat_kv, the scale
    after Q Kᵀ and the causal mask as length_masks.py computes it (arange, less_equal, where);
    `causal` False: a mask that keeps j < i, which is not causal (its diagonal is masked)."""
    s = tirx.Var("s", "int64")
    q = relax.Var("q", relax.TensorType([batch, HEADS, s, DEPTH], "float32"))
    k = relax.Var("k", relax.TensorType([batch, KV_HEADS, s, DEPTH], "float32"))
    v = relax.Var("v", relax.TensorType([batch, KV_HEADS, s, DEPTH], "float32"))
    bb = relax.BlockBuilder()
    op = relax.op
    with bb.function("main", [q, k, v], attrs={"tir_var_upper_bound": {"s": bound}, "tir_var_lower_bound": {"s": 1}}):
        with bb.dataflow():
            def repeat(x):
                x = bb.emit(op.expand_dims(x, [2]))
                x = bb.emit(op.broadcast_to(x, relax.ShapeExpr([batch, KV_HEADS, HEADS // KV_HEADS, s, DEPTH])))
                return bb.emit(op.reshape(x, relax.ShapeExpr([batch, HEADS, s, DEPTH])))
            positions = bb.emit(op.arange(tirx.IntImm("int64", 0), s, tirx.IntImm("int64", 1), dtype="int64"))
            rows = bb.emit(op.reshape(positions, relax.ShapeExpr([s, 1])))
            columns = bb.emit(op.reshape(positions, relax.ShapeExpr([1, s])))
            kept = bb.emit((op.less_equal if causal else op.less)(columns, rows))
            mask = bb.emit(op.where(kept, relax.const(np.float32(0)), relax.const(np.float32(-np.inf))))
            mask = bb.emit(op.reshape(mask, relax.ShapeExpr([1, 1, s, s])))
            scores = bb.emit(op.matmul(q, bb.emit(op.permute_dims(repeat(k), [0, 1, 3, 2]))))
            if scale is not None:
                scores = bb.emit(op.multiply(scores, relax.const(np.float32(scale))))
            scores = bb.emit(op.add(scores, mask))
            out = bb.emit_output(op.matmul(bb.emit(op.nn.softmax(scores, axis=-1)), repeat(v)))
        bb.emit_func_output(out)
    return bb.get()


def _expected(q, k, v, scale: float | None = 0.25):
    k, v = np.repeat(k, HEADS // KV_HEADS, axis=1), np.repeat(v, HEADS // KV_HEADS, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) * np.float32(1.0 if scale is None else scale)
    n = q.shape[2]
    scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _kernels(placements) -> set:
    return {p.kernel.split(" ")[0] for p in placements if p.where == "npu"}


@pytest.mark.parametrize("scale", [0.25, None])
def test_a_causal_attention_of_symbolic_length_is_one_kernel_equal_at_every_length(scale):
    mod = _attention(scale=scale)
    placements = explain(mod, ARCH, dims={"s": 45})
    assert npu_mac_fraction(placements) == 1.0
    assert ("cgra.attention_scale_length" if scale else "cgra.attention_length") in _kernels(placements)
    # the mask is built in the kernel: none of its ops on the host
    assert not [p.op for p in placements if p.where == "host" and p.op in ("arange", "less_equal", "where")]
    vm = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 33, 64, 130):  # one row, ragged tiles, a whole tile, past one tile of keys
        q = rng.standard_normal((1, HEADS, n, DEPTH)).astype("float32")
        k, v = (rng.standard_normal((1, KV_HEADS, n, DEPTH)).astype("float32") for _ in range(2))
        with npu_backend.profile() as prof:
            out = vm["main"](*(tvm.runtime.tensor(a) for a in (q, k, v))).numpy()
        np.testing.assert_allclose(out, _expected(q, k, v, scale), rtol=2e-5, atol=2e-6, err_msg=f"s = {n}")
        assert len(prof.kernels) == 1, n


def test_a_batch_of_prompts_runs_the_whole_row_items_of_each():
    """Two prompts a call: the items' batch index, a quotient by the length's expression, is
    clamped to the batch (lower/dma.py could not bound it: 'reaches outside dimension 0')."""
    vm = relax.VirtualMachine(npu_backend.compile(_attention(batch=2), ARCH), tvm.cpu())
    rng = np.random.default_rng(2)
    for n in (1, 7, 64):
        q = rng.standard_normal((2, HEADS, n, DEPTH)).astype("float32")
        k, v = (rng.standard_normal((2, KV_HEADS, n, DEPTH)).astype("float32") for _ in range(2))
        out = vm["main"](*(tvm.runtime.tensor(a) for a in (q, k, v))).numpy()
        np.testing.assert_allclose(out, _expected(q, k, v), rtol=2e-5, atol=2e-6, err_msg=f"s = {n}")


def test_the_ragged_last_tile_costs_what_its_rows_do():
    """One row more than a whole number of query tiles costs about one row's work, not a tile's."""
    from npu_backend.kernels.attention.flash_length import choose_length_tiling
    from npu_backend.kernels.attention.spec import AttentionSpec

    tiling = choose_length_tiling(AttentionSpec(1, KV_HEADS, 2, 256, 256, DEPTH, DEPTH, scale=0.25, causal=0,
                                                length="s"), npu_backend.load_arch(ARCH))
    vm = relax.VirtualMachine(npu_backend.compile(_attention(), ARCH), tvm.cpu())
    cycles = {}
    for n in (tiling.tq, tiling.tq + 1, 2 * tiling.tq):
        arrays = [np.ones((1, h, n, DEPTH), "float32") for h in (HEADS, KV_HEADS, KV_HEADS)]
        with npu_backend.profile() as prof:
            vm["main"](*(tvm.runtime.tensor(a) for a in arrays))
        cycles[n] = prof.total_cycles
    whole, one_more, two = cycles[tiling.tq], cycles[tiling.tq + 1], cycles[2 * tiling.tq]
    assert one_more - whole < 0.5 * (two - whole), cycles


@pytest.mark.parametrize("causal", [False])
def test_a_mask_not_proven_causal_keeps_the_separate_kernels(causal):
    placements = explain(_attention(causal=causal), ARCH, dims={"s": 9})
    assert not any(k.startswith("cgra.attention") for k in _kernels(placements))


def test_explain_says_why_a_softmax_row_held_at_its_bound_stays_on_the_host():
    """At bound 4096 a (1, H, s, s) softmax's row does not fit cgra-4x4's scratchpad even one row a
    tile: explain gives that reason (it said "matched no cgra pattern": it priced the row at the
    default bound). At 2048 one row a tile fits (tests/test_row_kernels.py)."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([1, HEADS, s, s], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_upper_bound": {"s": 4096}}):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.softmax(x, axis=-1))
        bb.emit_func_output(out)
    (placement,) = explain(bb.get(), "cgra-4x4", dims={"s": 16})
    assert placement.where == "host"
    assert "a row of 4096 float32" in placement.reason and "lower the bound of s" in placement.reason


def _projected_attention(bound: int = 256, length: int | None = None):
    """_attention's over a merged q / k / v projection's output x (1, s, H + 2 Hk, D), as Llama
    reads it: q, k and v head splits of slices of x (V's a box of x), the result merged back to
    (1, s, H, D) (kernels/attention/length_layouts.py); `length`: s static instead."""
    s = tirx.Var("s", "int64") if length is None else length
    x = relax.Var("x", relax.TensorType([1, s, HEADS + 2 * KV_HEADS, DEPTH], "float32"))
    bb = relax.BlockBuilder()
    op = relax.op
    attrs = {"tir_var_upper_bound": {"s": bound}, "tir_var_lower_bound": {"s": 1}} if length is None else None
    with bb.function("main", [x], attrs=attrs):
        with bb.dataflow():
            def heads(begin, end):
                return bb.emit(op.permute_dims(bb.emit(op.strided_slice(x, [2], [begin], [end])), [0, 2, 1, 3]))

            def repeat(x):
                x = bb.emit(op.expand_dims(x, [2]))
                x = bb.emit(op.broadcast_to(x, relax.ShapeExpr([1, KV_HEADS, HEADS // KV_HEADS, s, DEPTH])))
                return bb.emit(op.reshape(x, relax.ShapeExpr([1, HEADS, s, DEPTH])))
            q = heads(0, HEADS)
            k, v = heads(HEADS, HEADS + KV_HEADS), heads(HEADS + KV_HEADS, HEADS + 2 * KV_HEADS)
            positions = bb.emit(op.arange(tirx.IntImm("int64", 0), s, tirx.IntImm("int64", 1), dtype="int64"))
            rows = bb.emit(op.reshape(positions, relax.ShapeExpr([s, 1])))
            columns = bb.emit(op.reshape(positions, relax.ShapeExpr([1, s])))
            mask = bb.emit(op.where(bb.emit(op.less_equal(columns, rows)), relax.const(np.float32(0)),
                                    relax.const(np.float32(-np.inf))))
            mask = bb.emit(op.reshape(mask, relax.ShapeExpr([1, 1, s, s])))
            scores = bb.emit(op.matmul(q, bb.emit(op.permute_dims(repeat(k), [0, 1, 3, 2]))))
            scores = bb.emit(op.add(bb.emit(op.multiply(scores, relax.const(np.float32(0.25)))), mask))
            out = bb.emit(op.matmul(bb.emit(op.nn.softmax(scores, axis=-1)), repeat(v)))
            out = bb.emit_output(op.permute_dims(out, [0, 2, 1, 3]))
        bb.emit_func_output(out)
    return bb.get()


_PROJECTED: dict = {}


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 80))
@example(n=1)
@example(n=17)
def test_head_splits_and_merge_over_a_symbolic_length_are_the_kernels_boxes(n):
    """q, k and v read as boxes of the projection's output and the result written merged: one
    kernel, no transposing copy, equal to numpy at every length (ragged last tiles included)."""
    if not _PROJECTED:
        _PROJECTED["vm"] = relax.VirtualMachine(npu_backend.compile(_projected_attention(), ARCH), tvm.cpu())
    x = np.random.default_rng(n).standard_normal((1, n, HEADS + 2 * KV_HEADS, DEPTH)).astype("float32")
    with npu_backend.profile() as prof:
        out = _PROJECTED["vm"]["main"](tvm.runtime.tensor(x)).numpy()
    assert len(prof.kernels) == 1
    q, k, v = (x[:, :, a:b].transpose(0, 2, 1, 3) for a, b in
               ((0, HEADS), (HEADS, HEADS + KV_HEADS), (HEADS + KV_HEADS, HEADS + 2 * KV_HEADS)))
    np.testing.assert_allclose(out, _expected(q, k, v).transpose(0, 2, 1, 3), rtol=2e-5, atol=2e-6)


def _cycles(mod, n: int, arch: str = ARCH) -> int:
    """The cycles of `mod` (one kernel) at length n on `arch`."""
    x = np.random.default_rng(n).standard_normal((1, n, HEADS + 2 * KV_HEADS, DEPTH)).astype("float32")
    with npu_backend.profile() as prof:
        relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())["main"](tvm.runtime.tensor(x))
    assert len(prof.kernels) == 1
    return prof.total_cycles


@pytest.mark.parametrize("n", [16, 128])
def test_a_prompt_whose_keys_fit_whole_costs_what_a_static_compile_does(n):
    """Up to the length whose K and V head fit the scratchpad whole (1,024 on cgra-8x8) the kernel
    runs rows.py's whole-row items (rows_length.py: keys to each tile's diagonal, a group's heads
    stacked, the items pipelined), the command stream of a static compile for that length: at
    bound 2048, 1,523 / 46,784 cycles at 16 / 128 tokens, as static. Over key tiles at every
    length it took 3,396 / 79,752."""
    assert _cycles(_projected_attention(2048), n) == _cycles(_projected_attention(length=n), n)


def test_the_whole_row_limits_follow_the_tiling_and_the_key_tiles_the_lengths_past_them():
    """One whole-row branch per tiling, each at the longest length it fits: a short prompt's two
    copies of K and V up to 512 on cgra-8x8, one copy up to 1,024 (a branch at 1,024 alone held
    one copy at 16 tokens: 1,565 cycles against 1,523), tiles of 3 and 2 rows up to 1,408 and
    1,536 (at 1,100 tokens as a static compile's against the key tiles' 4.48 M), the key tiles
    past it (one query head a tile, which fits to 1,760, estimated slower than they are)."""
    from npu_backend.kernels.attention.flash_length import choose_length_tiling
    from npu_backend.kernels.attention.spec import AttentionSpec

    spec = AttentionSpec(1, KV_HEADS, HEADS // KV_HEADS, 2048, 2048, DEPTH, DEPTH, scale=0.25, causal=0, length="s")
    tiling = choose_length_tiling(spec, npu_backend.load_arch(ARCH))
    assert [(limit, t.kv_copies, t.stack) for limit, t in tiling.rows] == \
        [(512, 2, 2), (1024, 1, 2), (1408, 1, 2), (1536, 1, 2)]
    # the key tiles chosen for the lengths past the whole rows: 64 x 64 (at 1,600 / 2,048 tokens
    # 8.23 M / 13.18 M cycles), not the 16 x 16 of every length from 16 (9.34 M / 15.20 M)
    assert (tiling.tq, tiling.tk) == (64, 64)


_BRANCHES: dict = {}


@settings(max_examples=5, deadline=None)
@given(n=st.integers(1, 200))
@example(n=1)
@example(n=129)  # past the first whole-row branch (cgra-4x4, bound 512: 128, 384 and 416)
@example(n=400)  # the third: one query head a tile
@example(n=417)  # past the last: the key tiles
def test_every_branch_of_the_kernel_equals_numpy(n):
    """cgra-4x4 at bound 512 holds K and V whole up to 128 tokens with two copies, up to 384 with
    one, up to 416 one query head a tile, and runs key tiles past that: each branch, its ragged
    last query tile (a FILL of the Q rows past the length) and its boundaries equal numpy, one
    kernel."""
    if not _BRANCHES:
        _BRANCHES["vm"] = relax.VirtualMachine(npu_backend.compile(_projected_attention(512), "cgra-4x4"), tvm.cpu())
    x = np.random.default_rng(n).standard_normal((1, n, HEADS + 2 * KV_HEADS, DEPTH)).astype("float32")
    with npu_backend.profile() as prof:
        out = _BRANCHES["vm"]["main"](tvm.runtime.tensor(x)).numpy()
    assert len(prof.kernels) == 1
    q, k, v = (x[:, :, a:b].transpose(0, 2, 1, 3) for a, b in
               ((0, HEADS), (HEADS, HEADS + KV_HEADS), (HEADS + KV_HEADS, HEADS + 2 * KV_HEADS)))
    np.testing.assert_allclose(out, _expected(q, k, v).transpose(0, 2, 1, 3), rtol=2e-5, atol=2e-6)


@pytest.mark.slow
def test_the_key_tiles_past_the_whole_rows_equal_numpy():
    """At bound 2048 on cgra-8x8, 1,537 tokens: one past the last whole-row branch, the key tiles
    of 64 x 64 chosen for the lengths past it, their last query tile ragged (about 30 s)."""
    n = 1537
    x = np.random.default_rng(n).standard_normal((1, n, HEADS + 2 * KV_HEADS, DEPTH)).astype("float32")
    out = relax.VirtualMachine(npu_backend.compile(_projected_attention(2048), ARCH), tvm.cpu())["main"](
        tvm.runtime.tensor(x)).numpy()
    q, k, v = (x[:, :, a:b].transpose(0, 2, 1, 3) for a, b in
               ((0, HEADS), (HEADS, HEADS + KV_HEADS), (HEADS + KV_HEADS, HEADS + 2 * KV_HEADS)))
    np.testing.assert_allclose(out, _expected(q, k, v).transpose(0, 2, 1, 3), rtol=2e-5, atol=2e-6)


def test_a_prompt_of_one_query_tile_runs_its_heads_back_to_back(key_tiles_only):
    """Over key tiles at 16 tokens (one query tile; bound 2048, Llama's) 3,396 cycles, what
    flash.py's static kernel of these tiles took: the output buffers were allocated after the
    diagonal key tile's `if`, on the bytes of its K and V tiles (the code generator's stack), so
    each head's K load waited for the head before it to be stored (3,918)."""
    assert _cycles(_projected_attention(2048), 16) <= 3_500


def test_key_tiles_below_the_diagonal_are_pipelined(key_tiles_only):
    """Over key tiles at 128 tokens (eight query tiles of 16 at bound 2048) 79.8 k cycles;
    unpipelined, the PE array and the vector unit took turns on every key tile: 91 k
    (length_pipeline.py)."""
    assert _cycles(_projected_attention(2048), 128) <= 85_000
