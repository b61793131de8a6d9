"""RoBERTa's position ids over a symbolic length run on the NPU (normalise/length_scans.py).

`cumsum(x != pad) * (x != pad) + pad` with x an int32 or int64 (rows, s) tensor, s symbolic: the
mask's words, its int32 twin and the running count along s (the first s rows of the bound's
triangle of ones, int8 x int8 -> int32) leave no compute op on the host and equal numpy's for
random rows, lengths and pad positions, int64 words that differ from the pad's in one word only
among them. The model test compiles Hugging Face's RobertaModel with a symbolic length.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax, tirx

import npu_backend

ARCH = "cgra-8x8"
BOUND = 64
PAD = 1


def _positions_module(rows: int, dtype: str, bound: int = BOUND):
    """main(x: (rows, s) dtype) = cumsum(x != PAD, -1) * (x != PAD) + PAD in int32, s in [2, bound]."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((rows, s), dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_lower_bound": {"s": 2}, "tir_var_upper_bound": {"s": bound}}):
        with bb.dataflow():
            mask = bb.emit(relax.op.astype(relax.op.not_equal(x, relax.const(PAD, dtype)), "int32"))
            counts = bb.emit(relax.op.cumsum(mask, axis=-1, dtype="int32"))
            out = bb.emit_output(relax.op.add(relax.op.multiply(counts, mask), relax.const(PAD, "int32")))
        bb.emit_func_output(out)
    return bb.get()


@functools.lru_cache(maxsize=None)
def _compiled(rows: int, dtype: str):
    return relax.VirtualMachine(npu_backend.compile(_positions_module(rows, dtype), ARCH), tvm.cpu())


def _expected(x: np.ndarray) -> np.ndarray:
    mask = (x != PAD).astype(np.int32)
    return np.cumsum(mask, axis=-1, dtype=np.int32) * mask + PAD


@pytest.mark.parametrize("rows, dtype", [(1, "int64"), (1, "int32"), (3, "int64")])
def test_the_position_ids_leave_no_compute_op_on_the_host(rows, dtype):
    placements = npu_backend.explain(_positions_module(rows, dtype), ARCH, dims={"s": 16})
    host = [p.op for p in placements if p.where == "host" and p.op.split(".")[-1] not in
            ("memory.view", "view", "reshape", "strided_slice")]
    assert host == []
    assert any(p.op.endswith("matmul") and p.where == "npu" for p in placements)


@st.composite
def _ids(draw, dtype):
    """(rows, s) ids: random tokens, pads at random positions (runs at either end, holes), and for
    int64 values whose low or high word alone equals the pad's."""
    rows = draw(st.sampled_from([1, 3])) if dtype == "int64" else 1
    length = draw(st.integers(2, BOUND))
    x = np.array(draw(st.lists(st.integers(-3, 3), min_size=rows * length, max_size=rows * length)),
                 dtype=dtype).reshape(rows, length)
    if dtype == "int64":
        words = draw(st.lists(st.sampled_from([0, PAD + (1 << 32), PAD - (1 << 32), 1 << 32, -(1 << 40), 2**63 - 1,
                                               -2**63]), min_size=rows * length, max_size=rows * length))
        x = np.where(np.array(draw(st.lists(st.booleans(), min_size=rows * length, max_size=rows * length)))
                     .reshape(rows, length), np.array(words, dtype).reshape(rows, length), x)
    lead = draw(st.integers(0, length))  # a left-padded prompt
    trail = draw(st.integers(0, length - lead))  # a right-padded one
    x[:, :lead] = PAD
    x[:, length - trail:] = PAD
    return x


@pytest.mark.parametrize("dtype", ["int64", "int32"])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_the_position_ids_equal_numpy_at_every_length(dtype, data):
    x = data.draw(_ids(dtype))
    out = _compiled(x.shape[0], dtype)["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(out, _expected(x))


def test_a_bound_past_the_triangle_s_limit_leaves_the_position_ids_as_they_were():
    """Past MAX_BOUND the scan's GEMM (about s * bound / 8 cycles a row) would cost more than the
    host's: the mask's twin is not made either, the three ops stay together on the host."""
    from npu_backend.normalise.length_scans import MAX_BOUND

    placements = npu_backend.explain(_positions_module(1, "int64", MAX_BOUND + 1), ARCH, dims={"s": 16})
    assert [p.op.split(".")[-1] for p in placements if p.where == "host"][:3] == ["not_equal", "astype", "cumsum"]


def test_a_length_past_the_triangle_s_limit_keeps_the_scan_on_the_host():
    from npu_backend.normalise.length_scans import MAX_BOUND, length_scan

    s = tirx.Var("s", "int64")
    twin = relax.Var("b", relax.TensorType((1, s), "int32"))
    assert length_scan(lambda e: e, twin, MAX_BOUND + 1) is None
    assert length_scan(lambda e: e, twin, None) is None


def test_a_static_length_keeps_the_n_by_n_triangle():
    """The static rewrite is masks.py's own: one (n, n) triangle, no slice of a larger one."""
    x = relax.Var("x", relax.TensorType((1, 12), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            mask = bb.emit(relax.op.astype(relax.op.not_equal(x, relax.const(PAD, "int64")), "int32"))
            out = bb.emit_output(relax.op.cumsum(mask, axis=-1, dtype="int32"))
        bb.emit_func_output(out)
    from npu_backend.normalise.masks import masks_as_float

    text = masks_as_float(bb.get()).script()
    assert "cumsum" not in text
    ids = np.array([[1, 1, 5, 7, 1, 9, 1, 2, 3, 1, 1, 4]], "int64")
    vm = relax.VirtualMachine(npu_backend.compile(bb.get(), ARCH), tvm.cpu())
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(ids)).numpy(), np.cumsum(ids != PAD, -1))


def _roberta_error(lengths_and_pads) -> tuple:
    """RobertaModel exported with input_ids alone and a symbolic length (bound 256), compiled
    once: (host compute ops, worst error relative to PyTorch's largest output)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_symbolic_exports import _export
    from transformer_models import host_op_counts

    model, mod = _export("roberta", 256)
    (length,) = relax.analysis.defined_symbolic_vars(mod["main"])
    compute, _, names = host_op_counts(npu_backend.explain(mod, ARCH, dims={length.name: 16}))
    vm = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())
    worst = 0.0
    for n, lead, trail in lengths_and_pads:
        ids = torch.randint(2, 100, (1, n), generator=torch.Generator().manual_seed(n))
        ids[0, :lead] = PAD
        ids[0, n - trail:] = PAD
        with torch.no_grad():
            expected = model(ids).numpy().astype(np.float64)
        out = vm["main"](tvm.runtime.tensor(ids.numpy()))
        out = (out[0] if not hasattr(out, "numpy") else out).numpy()
        worst = max(worst, float(np.abs(out - expected).max() / np.abs(expected).max()))
    return compute, names, worst


@pytest.mark.slow
def test_roberta_with_a_symbolic_length_keeps_no_compute_op_on_the_host():
    # lengths 5, 16, 33; a right-padded and a left-padded prompt with a hole-free middle
    compute, names, worst = _roberta_error([(5, 0, 0), (16, 0, 0), (33, 0, 0), (20, 0, 6), (20, 5, 0)])
    assert compute == 0, names
    assert worst < 1e-5
