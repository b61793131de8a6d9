"""lower/padded_rows.py: a static matmul whose rows pad one row tile (17 tokens in a tile of 24)
runs its epilogue's vector commands on the rows that exist: the same outputs as numpy, and the
vector unit busy for fewer cycles than the same kernel over a whole tile of valid rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from cgra_sim import isa
from npu_backend.lower.padded_rows import cut_padded_rows

ACTS = {"gelu": (relax.op.nn.gelu, lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))),
        "silu": (relax.op.nn.silu, lambda x: x / (1 + np.exp(-x))),
        "tanh": (relax.op.tanh, np.tanh)}


def _linear(rows: int, act: str, residual: bool, width: int = 64, seed: int = 0):
    """(module, inputs, numpy reference): act(x W^T + b) [+ r] over `rows` rows, float32."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, width)).astype("float32")
    w = (rng.standard_normal((width, width)) / 8).astype("float32")
    b = rng.standard_normal(width).astype("float32")
    r = rng.standard_normal((rows, width)).astype("float32")
    bb = relax.BlockBuilder()
    params = [relax.Var("x", relax.TensorType((rows, width), "float32"))] + \
        ([relax.Var("r", relax.TensorType((rows, width), "float32"))] if residual else [])
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(params[0], relax.op.permute_dims(relax.const(w))))
            y = bb.emit(relax.op.add(y, relax.const(b)))
            y = bb.emit(relax.op.add(y, params[1]) if residual else ACTS[act][0](y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    total = x.astype(np.float64) @ w.T.astype(np.float64) + b
    expected = total + r if residual else ACTS[act][1](total)
    return bb.get(), [x, r] if residual else [x], expected


@settings(max_examples=8)
@given(rows=st.sampled_from([1, 3, 9, 17, 20, 23]), act=st.sampled_from(sorted(ACTS)), residual=st.booleans())
def test_a_padded_tile_matches_numpy(rows, act, residual):
    mod, inputs, expected = _linear(rows, act, residual)
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())


@pytest.mark.parametrize("act", ["gelu", "silu"])
def test_the_activation_runs_on_the_valid_rows_only(act):
    """17 tokens pad to 24 rows; the EPILOGUEs and the activation's VFUNCs (through the function
    unit's one lane: an element a cycle) run on the 17 (without the cut: 24, or pieces of 8)."""
    mod, inputs, _ = _linear(17, act, False)
    with npu_backend.profile(keep_timelines=True) as prof:
        relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](
            *[tvm.runtime.tensor(a) for a in inputs])
    rows = {}
    for record in prof.timelines[0].commands:
        op = isa.Op(int(record[0]))
        if op in (isa.Op.EPILOGUE, isa.Op.VFUNC):
            field = "m" if op == isa.Op.EPILOGUE else "rows"
            rows.setdefault(op.name, set()).add(int(record[isa.FIELDS[op].index(field)]))
    # a whole tile's commands, or pieces of 8 rows (the last holding the 17th row alone)
    assert rows["EPILOGUE"] == rows["VFUNC"] and rows["VFUNC"] in ({17}, {8, 1}), rows


def test_a_kernel_without_the_attribute_is_left_as_it_is():
    func = tvm.tirx.PrimFunc([], tvm.tirx.Evaluate(0))
    assert cut_padded_rows(func).same_as(func)
