"""A prompt past the bound its model was compiled for (device/length_checks.py): a LengthPastBound
(a ValueError) naming the input, the length, the bound and how to raise it, raised on entry,
before the VM allocates a tensor at the bound's storage (before, an InternalError "storage
allocation failure"); the check is no host operator in a profile."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import npu_backend

BOUND = 8


@pytest.fixture(scope="module")
def lookup():
    """An embedding of a symbolic number of ids (an NPU lookup), then a scaling: s at most BOUND."""
    s = tirx.Var("s", "int64")
    ids = relax.Var("input_ids", relax.TensorType([1, s], "int64"))
    table = np.random.default_rng(0).standard_normal((50, 16)).astype("float32")
    bb = relax.BlockBuilder()
    with bb.function("main", [ids], attrs={"tir_var_upper_bound": {"s": BOUND}}):
        with bb.dataflow():
            rows = bb.emit(relax.op.take(relax.const(table), relax.op.reshape(ids, relax.ShapeExpr([s])), axis=0))
            out = bb.emit_output(relax.op.multiply(rows, relax.const(2.0, "float32")))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(npu_backend.compile(bb.get(), "cgra-8x8"), tvm.cpu())
    return vm, table


def test_a_prompt_at_the_bound_runs_and_checks_nothing_on_the_host(lookup):
    vm, table = lookup
    ids = np.arange(BOUND, dtype="int64")[None]
    with npu_backend.profile() as prof:
        out = vm["main"](tvm.runtime.tensor(ids)).numpy()
    np.testing.assert_array_equal(out, table[ids[0]] * 2)
    assert prof.host_cycles == 0 and not prof.host_calls


def test_a_prompt_past_the_bound_is_a_length_past_bound_naming_it(lookup):
    vm, _ = lookup
    with pytest.raises(npu_backend.LengthPastBound,
                       match=rf"input_ids.shape\[1\] \(symbolic s\) = {BOUND + 1} is past its bound {BOUND}: .*"
                             r"torch.export.Dim\('s', max=...\), npu_backend.compile\(..., shape_bounds=\{'s': ...\}\)"):
        vm["main"](tvm.runtime.tensor(np.zeros((1, BOUND + 1), "int64")))
    assert issubclass(npu_backend.LengthPastBound, ValueError)
