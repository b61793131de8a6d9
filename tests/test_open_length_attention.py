"""An attention over a symbolic length in which every query sees every key (an encoder's, given
`input_ids` alone) runs as one NPU kernel: its padding mask, computed from the length and proven
to keep every key, is dropped (normalise/length_masks.py `open_masks_dropped`), and the
length-attention kernel runs without the causal band (kernels/attention/flash_length.py,
rows_length.py with spec.causal None): compiled once, equal to numpy at every length."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st
import tvm
from tvm import relax, tirx

import npu_backend
from npu_backend.normalise.length_masks import open_masks_dropped
from npu_backend.tools.explain import explain, npu_mac_fraction

ARCH = "cgra-8x8"
HEADS, DEPTH = 4, 16


def _attention(bound: int = 256, masked: str = "open", length: int | None = None, heads: int = HEADS,
               depth: int = DEPTH):
    """DistilBERT's attention over (1, H, s, d): the scale on Q, Q Kᵀ, the padding mask as HF
    computes it from the length (arange(s) + 0 >= first, per query row, broadcast over the keys,
    where(., 0, -inf)); `masked` "open" (first 0: every row kept), "first" (first 1: row 0
    masked whole, not open) or "" (no mask); `length` s static instead; `heads` x `depth`."""
    s = tirx.Var("s", "int64") if length is None else length
    q, k, v = (relax.Var(name, relax.TensorType([1, heads, s, depth], "float32")) for name in "qkv")
    bb = relax.BlockBuilder()
    op = relax.op
    attrs = {"tir_var_upper_bound": {"s": bound}, "tir_var_lower_bound": {"s": 1}} if length is None else {}
    with bb.function("main", [q, k, v], attrs=attrs):
        with bb.dataflow():
            scores = bb.emit(op.matmul(bb.emit(op.multiply(q, relax.const(np.float32(0.25)))),
                                       bb.emit(op.permute_dims(k, [0, 1, 3, 2]))))
            if masked:
                end = s if length is None else tirx.IntImm("int64", length)
                positions = bb.emit(op.arange(tirx.IntImm("int64", 0), end, tirx.IntImm("int64", 1), dtype="int64"))
                positions = bb.emit(op.add(positions, relax.const(np.zeros((1,), "int64"), "int64")))
                rows = bb.emit(op.reshape(positions, relax.ShapeExpr([1, 1, s, 1])))
                first = relax.const(0 if masked == "open" else 1, "int64")
                kept = bb.emit(op.broadcast_to(bb.emit(op.greater_equal(rows, first)), relax.ShapeExpr([1, 1, s, s])))
                mask = bb.emit(op.where(kept, relax.const(np.float32(0)), relax.const(np.float32(-np.inf))))
                scores = bb.emit(op.add(scores, mask))
            out = bb.emit_output(op.matmul(bb.emit(op.nn.softmax(scores, axis=-1)), v))
        bb.emit_func_output(out)
    return bb.get()


def _expected(q, k, v):
    scores = (q * np.float32(0.25)) @ k.transpose(0, 1, 3, 2)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _inputs(n: int, heads: int = HEADS, depth: int = DEPTH):
    rng = np.random.default_rng(n)
    return [rng.standard_normal((1, heads, n, depth)).astype("float32") for _ in range(3)]


def _wheres(mod) -> int:
    return mod.script().count("R.where(")


def test_a_mask_that_keeps_every_key_is_dropped_and_one_that_does_not_is_kept():
    assert _wheres(open_masks_dropped(_attention(masked="open"))) == 0
    assert _wheres(open_masks_dropped(_attention(masked="first"))) == 1


@pytest.mark.parametrize("masked", ["open", ""])
def test_an_open_attention_of_symbolic_length_is_one_kernel(masked):
    placements = explain(_attention(masked=masked), ARCH, dims={"s": 45})
    assert npu_mac_fraction(placements) == 1.0
    # (reshapes are the VM's views, no host call)
    assert not [p.op for p in placements if p.where == "host" and p.op not in ("reshape", "expand_dims")]
    assert {p.kernel.split(" ")[0] for p in placements if p.where == "npu"} == {"cgra.attention_scale"}


_VMS: dict = {}


def _run(key: str, n: int, build):
    """(the output, the inputs, the profile) of the kernel compiled once per key, at length n;
    checks it ran as one kernel."""
    if key not in _VMS:
        _VMS[key] = relax.VirtualMachine(build(), tvm.cpu())
    arrays = _inputs(n)
    with npu_backend.profile() as prof:
        out = _VMS[key]["main"](*(tvm.runtime.tensor(a) for a in arrays)).numpy()
    assert len(prof.kernels) == 1 and not prof.host_calls, n
    return out, arrays, prof


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 200))
@example(n=1)
@example(n=128)
@example(n=129)
@example(n=417)
@example(n=512)
def test_every_branch_of_the_open_kernel_equals_numpy(n):
    """cgra-4x4 at bound 512: the whole-row branches (keys 0 .. s - 1 of every item, no band) up
    to the longest length whose K and V fit whole, the key tiles past it (whole tiles, then the
    last cut to the keys that exist); each equal to numpy."""
    out, (q, k, v), _ = _run("4x4", n, lambda: npu_backend.compile(_attention(512), "cgra-4x4"))
    np.testing.assert_allclose(out, _expected(q, k, v), rtol=2e-5, atol=2e-6, err_msg=f"s = {n}")


@pytest.mark.parametrize("n", [1, 15, 16, 17, 33, 64, 100])
def test_the_key_tiles_without_a_mask_equal_numpy(key_tiles_only, n):
    """Over key tiles: floor(s / tk) whole ones (pipelined), then one cut to the s mod tk keys left."""
    out, (q, k, v), _ = _run("keys", n, lambda: npu_backend.compile(_attention(2048), ARCH))
    np.testing.assert_allclose(out, _expected(q, k, v), rtol=2e-5, atol=2e-6, err_msg=f"s = {n}")


@pytest.mark.parametrize("n", [16, 128])
def test_an_open_prompt_costs_what_a_static_compile_does(n):
    """At 16 and 128 tokens (bound 1024) the whole-row branch runs a static compile's commands
    for that length (DistilBERT's attention: 2,018 cycles a layer at 16 tokens as static; it was
    8,693 as nine kernels, its mask on the host), at 128 with the static kernel's share of its
    exps on the PE fabric (kernels/attention/length_exps.py: 85,596 -> 67,054 cycles, as static;
    1.28x of it without the share)."""
    symbolic, fabric = _run_counting(f"bound {n}", n, lambda: npu_backend.compile(_attention(1024), ARCH))
    static, static_fabric = _run_counting(f"static {n}", n,
                                          lambda: npu_backend.compile(_attention(masked="", length=n), ARCH))
    assert symbolic <= 1.02 * static, (symbolic, static)
    assert fabric == static_fabric and (fabric > 0) == (n == 128), (fabric, static_fabric)


def _run_counting(key: str, n: int, build) -> tuple:
    """(cycles, FABRIC commands) of _run's kernel at length n."""
    prof = _run(key, n, build)[2]
    return prof.total_cycles, sum(kernel.op_counts["FABRIC"] for kernel in prof.kernels)


def _embeddings(ids_from_length: bool = True, gathered_at_ids: bool = False):
    """ALBERT's word + token-type lookups given input_ids alone: the token types
    `token_type_ids[:, :s]` (a zeros buffer) gathered at the position ids `position_ids[:, :s]`
    (an arange buffer), or with `gathered_at_ids` at positions computed from the input (RoBERTa's);
    `ids_from_length` False: the token types read from a second input."""
    s = tirx.Var("s", "int64")
    ids = relax.Var("ids", relax.TensorType([1, s], "int64"))
    types = relax.Var("types", relax.TensorType([1, s], "int64"))
    rng = np.random.default_rng(0)
    words, kinds = (relax.const(rng.standard_normal((n, 8)).astype("float32")) for n in (50, 2))
    bb = relax.BlockBuilder()
    op = relax.op
    params = [ids] if ids_from_length else [ids, types]
    with bb.function("main", params, attrs={"tir_var_upper_bound": {"s": 64}, "tir_var_lower_bound": {"s": 1}}):
        with bb.dataflow():
            if ids_from_length:
                positions = bb.emit(op.strided_slice(relax.const(np.arange(64, dtype="int64")[None]), [1], [0], [s],
                                                     assume_inbound=True))
                if gathered_at_ids:  # (in range: ids < 50)
                    positions = bb.emit(op.multiply(ids, relax.const(1, "int64")))
                types = bb.emit(op.gather_elements(relax.const(np.zeros((1, 64), "int64")), positions, axis=1))
            word = bb.emit(op.take(words, bb.emit(op.reshape(ids, relax.ShapeExpr([s]))), axis=0))
            kind = bb.emit(op.take(kinds, bb.emit(op.reshape(types, relax.ShapeExpr([s]))), axis=0))
            out = bb.emit_output(op.add(bb.emit(op.reshape(word, relax.ShapeExpr([1, s, 8]))),
                                        bb.emit(op.reshape(kind, relax.ShapeExpr([1, s, 8])))))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("ids_from_length, gathered_at_ids", [(True, False), (True, True), (False, False)])
def test_token_types_from_the_length_are_one_constant_row(ids_from_length, gathered_at_ids):
    from npu_backend.normalise.length_lookups import length_lookups_as_rows

    text = length_lookups_as_rows(_embeddings(ids_from_length, gathered_at_ids)).script()
    assert text.count("R.take(") == (1 if ids_from_length else 2) and "gather_elements" not in text
    mod = _embeddings(ids_from_length, gathered_at_ids)
    vm = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())
    reference = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    for n in (1, 5, 33):
        ids = np.random.default_rng(n).integers(0, 50, (1, n)).astype("int64")
        args = [ids] if ids_from_length else [ids, np.ones((1, n), "int64")]
        with npu_backend.profile() as prof:
            out = vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()
        expected = reference["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()
        np.testing.assert_allclose(out, expected, rtol=1e-6, err_msg=f"s = {n}")
        if ids_from_length:  # (the gather on the host before)
            assert not [call.name for call in prof.host_calls if "gather" in call.name], n


#: The encoders exported with input_ids alone and Dim("s", max=256) (tests/test_symbolic_exports.py).
ENCODERS = ("distilbert", pytest.param("albert", marks=pytest.mark.slow))


@pytest.mark.parametrize("name", ENCODERS)
def test_an_encoder_of_symbolic_length_runs_its_attentions_as_one_kernel_each(name):
    """Compiled once: equal to PyTorch within 1e-5 at 5, 16, 33 and 100 tokens, nothing on the
    host (the padding mask dropped, the token types one row, the position embeddings a table's
    first rows: frontend/position_tables.py) and per layer one attention kernel (before: Q Kᵀ, the
    scale, the softmax and P V each a kernel, the mask, the position ids' slice and ALBERT's token
    types' gather on the host)."""
    torch = pytest.importorskip("torch")
    exports = pytest.importorskip("test_symbolic_exports")

    model, mod = exports._export(name)
    vm = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())
    for n in (5, 16, 33, 100):
        ids = torch.randint(0, 100, (1, n), generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            expected = model(ids).numpy()
        with npu_backend.profile() as prof:
            out = vm["main"](tvm.runtime.tensor(ids.numpy()))
        out = (out[0] if not hasattr(out, "numpy") else out).numpy()
        assert np.abs(out - expected).max() / np.abs(expected).max() < 1e-5, n
        assert not prof.host_calls, (n, [call.name for call in prof.host_calls])
        attentions = [k.source_ops for k in prof.kernels if "nn.softmax" in k.source_ops]
        assert len(attentions) == 2 and all(ops.count("matmul") == 2 for ops in attentions), (n, attentions)
