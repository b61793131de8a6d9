"""Integer arithmetic on a 0 / 1 attention mask cast to float32 (Bloom's ALiBi positions,
astype((cumsum(mask) - 1) * mask)) runs on the NPU as float32 arithmetic on the mask's twin
(normalise/mask_positions.py): bit-equal to the int64 arithmetic, no host call; a range beyond
2^24 or another input keeps its host ops."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend

SLOPES = np.array([0.5, 0.25, 0.125, 0.0625], np.float32).reshape(1, 4, 1)


def _alibi(n: int, *, name: str = "attention_mask", dtype: str = "int64", offset: int = 1):
    """slopes * astype(expand_dims((cumsum(mask) - offset) * mask, 1), float32), as Bloom writes it."""
    bb = relax.BlockBuilder()
    mask = relax.Var(name, relax.TensorType((1, n), dtype))
    with bb.function("main", [mask]):
        with bb.dataflow():
            counts = bb.emit(relax.op.cumsum(mask, axis=-1))
            shifted = bb.emit(relax.op.subtract(counts, relax.const(np.array([offset], dtype), dtype)))
            positions = bb.emit(relax.op.multiply(shifted, mask))
            cast = bb.emit(relax.op.astype(relax.op.expand_dims(positions, 1), "float32"))
            out = bb.emit_output(relax.op.multiply(relax.const(SLOPES), cast))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, mask):
    with npu_backend.profile() as prof:
        vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(mask)).numpy()
    return out, prof


def _expected(mask, offset=1):
    positions = (np.cumsum(mask, axis=-1) - offset) * mask  # int64, as PyTorch computes it
    return SLOPES * positions[:, None, :].astype(np.float32)


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 70), left=st.integers(0, 70), right=st.integers(0, 70), holes=st.integers(0, 2 ** 31),
       dtype=st.sampled_from(["int64", "int32"]))
def test_alibi_positions_run_on_the_npu_bit_equal(n, left, right, holes, dtype):
    mask = np.ones((1, n), dtype)
    mask[0, :min(left, n)] = 0  # left padding (Bloom's batched prompts)
    mask[0, n - min(right, n):] = 0
    mask[0, np.random.default_rng(holes).random(n) < 0.1] = 0
    out, prof = _run(_alibi(n, dtype=dtype), mask)
    np.testing.assert_array_equal(out, _expected(mask))
    assert prof.host_calls == [], prof.host_calls


def test_a_range_float32_cannot_hold_or_another_input_stays_on_the_host():
    """(cumsum - 2^30) * mask is an int64 float32 rounds: not rewritten. Neither is the same
    arithmetic on an input the 0 / 1 contract does not name."""
    mask = np.ones((1, 8), "int64")
    for mod, offset in ((_alibi(8, offset=1 << 30), 1 << 30), (_alibi(8, name="token_counts"), 1)):
        placements = npu_backend.explain(mod, "cgra-8x8")
        assert {"cumsum", "astype"} <= {p.op for p in placements if p.where == "host"}, placements
        out, _ = _run(mod, mask)
        np.testing.assert_array_equal(out, _expected(mask, offset))
