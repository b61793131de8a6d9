"""Bloom's padding row plus ALiBi rows from the attention mask's {0, 1} twin M as two GEMMs
(normalise/alibi_rows.py): bit for bit HF's slope * ((cumsum(M) - 1) * M) + where(M, 0, -inf),
computed in float64 and rounded once, over batches, heads (slopes that are powers of two and
that are not), lengths and masks (none, random, left padding, all padded); and Bloom with its
attention mask against PyTorch, the six setup kernels now two.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend

op = relax.op
FLT_MAX = np.float32(np.finfo(np.float32).max)


def _rows_graph(b, h, s, slopes, big=FLT_MAX):
    """The normalised form masks.py and mask_positions.py leave: M's padding row and ALiBi."""
    bb = relax.BlockBuilder()
    m = relax.Var("m", relax.TensorType((b, s), "float32"))
    with bb.function("main", [m]):
        with bb.dataflow():
            pad = bb.emit(op.subtract(bb.emit(op.reshape(m, (b, 1, 1, s))), relax.const(np.float32(1))))
            pad = bb.emit(op.multiply(bb.emit(op.multiply(pad, relax.const(np.float32(2)))), relax.const(np.float32(big))))
            summed = bb.emit(op.matmul(m, relax.const(np.triu(np.ones((s, s), np.float32))), out_dtype="float32"))
            positions = bb.emit(op.multiply(bb.emit(op.subtract(summed, relax.const(np.float32(1)))), m))
            alibi = bb.emit(op.multiply(relax.const(slopes.reshape(1, h, 1)), bb.emit(op.expand_dims(positions, [1]))))
            alibi = bb.emit(op.reshape(bb.emit(op.reshape(alibi, (b * h, 1, s))), (b, h, 1, s)))
            out = bb.emit_output(op.add(pad, alibi))
        bb.emit_func_output(out)
    return bb.get()


def _slopes(h, power_of_two):
    if power_of_two:
        return (np.float32(2.0) ** -np.arange(1, h + 1, dtype=np.float32)).astype(np.float32)
    return (np.float32(2.0) ** (-8.0 * np.arange(1, h + 1) / (h + 0.5))).astype(np.float32)


@settings(max_examples=10, deadline=None)
@given(b=st.integers(1, 2), h=st.integers(1, 16), s=st.integers(2, 70), power_of_two=st.booleans(),
       padding=st.sampled_from(["none", "random", "left", "all"]), seed=st.integers(0, 2 ** 16))
@example(b=1, h=4, s=32, power_of_two=True, padding="left", seed=0)  # the benchmarks' Bloom
@example(b=2, h=16, s=37, power_of_two=False, padding="random", seed=1)  # bloom-560m's 16 heads
def test_rows_match_hf_bit_for_bit(b, h, s, power_of_two, padding, seed):
    rng = np.random.default_rng(seed)
    m = np.ones((b, s), np.float32)
    if padding == "random":
        m = (rng.random((b, s)) < 0.6).astype(np.float32)
    elif padding == "left":
        m[:, :rng.integers(1, s)] = 0
    elif padding == "all":
        m[:] = 0
    slopes = _slopes(h, power_of_two)
    executable = npu_backend.compile(_rows_graph(b, h, s, slopes), "cgra-8x8")
    with npu_backend.profile() as prof:
        out = tvm.relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(m)).numpy()
    kernels = [kernel.name for kernel in prof.kernels]
    assert len(kernels) == 2 and all("matmul" in name for name in kernels), kernels
    positions = (np.cumsum(m.astype(np.float64), -1) - 1) * m  # integers: exact
    expected = np.where(m[:, None, None, :] != 0,
                        (slopes.astype(np.float64)[None, :, None, None] * positions[:, None, None, :]).astype(np.float32),
                        np.float32(-np.inf))
    assert out.dtype == np.float32 and np.array_equal(out, expected), np.abs(out - expected).max()
    assert np.array_equal(np.signbit(out), np.signbit(expected))


def test_other_rows_are_left_alone():
    """A padding row of another constant than masks.py's -inf form keeps its ops as they are."""
    from npu_backend.normalise.alibi_rows import alibi_rows

    def ops(big):
        return {c.op.name for c in _calls(alibi_rows(_rows_graph(1, 2, 8, _slopes(2, True), big)))}

    assert "relax.subtract" not in ops(FLT_MAX)
    assert "relax.subtract" in ops(np.float32(1e30))


def _calls(mod):
    calls = []
    relax.analysis.post_order_visit(mod["main"], lambda e: calls.append(e) if isinstance(e, relax.Call) and
                                    isinstance(e.op, tvm.ir.Op) else None)
    return calls


@pytest.mark.parametrize("padding", ["left", "all"])
def test_bloom_with_its_mask_builds_the_rows_in_two_gemms(padding):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tvm.relax.frontend.torch import from_exported_program

    from transformer_models import build, first_output

    model, (ids, mask) = build("bloom", 20)
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(model, (ids, mask)))
    mask = mask.clone()
    mask[:, :7 if padding == "left" else 20] = 0
    with torch.no_grad():
        expected = first_output(model(ids, mask)).numpy()
    vm = tvm.relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    with npu_backend.profile() as prof:
        out = first_output(vm["main"](tvm.runtime.tensor(ids.numpy()), tvm.runtime.tensor(mask.numpy()))).numpy()
    kernels = [kernel.name for kernel in prof.kernels]
    assert kernels.count("fused_relax_matmul_relax_add_cgra") == 1 and kernels.count("fused_relax_matmul_cgra") == 1, kernels
    assert not any(name.startswith(("fused_relax_subtract", "fused_relax_add_cgra")) for name in kernels), kernels
    error = np.abs(out.astype(np.float64) - expected).max() / np.abs(expected).max()
    assert error < 1e-5, error
