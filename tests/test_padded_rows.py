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


def _linear(rows: int, act: str, residual: bool, width: int = 64, seed: int = 0, normed: bool = False):
    """(module, inputs, numpy reference): act(x' W^T + b) [+ r] over `rows` rows, float32; x' the
    layer norm of x (`normed`: a pre-norm the GEMM runs on its A panel, row_norm.py) or x."""
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
            lhs = bb.emit(relax.op.nn.layer_norm(params[0], relax.const(np.ones(width, "float32")), relax.const(
                np.zeros(width, "float32")), axes=[-1])) if normed else params[0]
            y = bb.emit(relax.op.matmul(lhs, relax.op.permute_dims(relax.const(w))))
            y = bb.emit(relax.op.add(y, relax.const(b)))
            y = bb.emit(relax.op.add(y, params[1]) if residual else ACTS[act][0](y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    x64 = x.astype(np.float64)
    if normed:
        x64 = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    total = x64 @ w.T.astype(np.float64) + b
    expected = total + r if residual else ACTS[act][1](total)
    return bb.get(), [x, r] if residual else [x], expected


@settings(max_examples=8)
@given(rows=st.sampled_from([1, 3, 9, 17, 20, 23]), act=st.sampled_from(sorted(ACTS)), residual=st.booleans(),
       normed=st.booleans())
def test_a_padded_tile_matches_numpy(rows, act, residual, normed):
    mod, inputs, expected = _linear(rows, act, residual, normed=normed)
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())


@pytest.mark.parametrize("act, normed", [("gelu", False), ("silu", False), ("gelu", True), ("tanh", True)])
def test_the_activation_runs_on_the_valid_rows_only(act, normed):
    """17 tokens pad to 24 rows; the EPILOGUEs and the activation's VFUNCs (through the function
    unit's one lane: an element a cycle) run on the 17 (without the cut: 24, or pieces of 8), and
    so do the GEMMs and a pre-norm's program on the A panel."""
    mod, inputs, _ = _linear(17, act, False, normed=normed)
    with npu_backend.profile(keep_timelines=True) as prof:
        relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](
            *[tvm.runtime.tensor(a) for a in inputs])
    rows = {}
    for record in prof.timelines[0].commands:
        op = isa.Op(int(record[0]))
        if op in (isa.Op.EPILOGUE, isa.Op.VFUNC, isa.Op.GEMM, isa.Op.REDUCE, isa.Op.ELTWISE):
            field = "m" if op in (isa.Op.EPILOGUE, isa.Op.GEMM) else "rows"
            # (a pre-norm's rsqrt is a VFUNC of one column: its program's, not the epilogue's)
            name = "PANEL_VFUNC" if op == isa.Op.VFUNC and int(record[isa.FIELDS[op].index("cols")]) == 1 \
                else op.name
            rows.setdefault(name, set()).add(int(record[isa.FIELDS[op].index(field)]))
    # a whole tile's commands, or pieces of 8 rows (the last holding the 17th row alone); a
    # pre-norm's REDUCEs, ELTWISEs and VFUNCs over the panel's 17 rows in pieces of 8, 8 and 1
    # (lower/norm_rows.py)
    # (a GEMM piece of 8 rows of a tile loaded by DMA reads its zero padding: left as it is)
    # (a bias before a VFUNC may be loaded into the accumulator instead: no EPILOGUE, bias_acc.py)
    epilogue = rows.get("EPILOGUE", rows["VFUNC"])
    assert epilogue in ({17}, {8, 1}) and rows["GEMM"] in ({17}, {8, 1}, {8}), rows
    assert rows["VFUNC"] - {17} <= epilogue, rows
    if normed:  # and A's load streams no zero halo for the padding: its 17 rows
        assert rows["REDUCE"] == rows["ELTWISE"] == rows["PANEL_VFUNC"] == {8, 1} and rows["GEMM"] != {8}, rows
        (kernel,) = prof.kernels
        assert kernel.dma_load_box_bytes == kernel.dma_load_bytes, (kernel.dma_load_box_bytes, kernel.dma_load_bytes)


def test_a_kernel_without_the_attribute_is_left_as_it_is():
    func = tvm.tirx.PrimFunc([], tvm.tirx.Evaluate(0))
    assert cut_padded_rows(func).same_as(func)


@pytest.mark.parametrize("rows, residual", [(4, True), (3, False), (17, True)])
def test_a_whole_tiles_a_and_residual_load_no_zero_halo(rows, residual):
    """A tile's A and residual read only by whole-tile GEMMs and EPILOGUEs (cut to the valid rows)
    load the valid rows alone: no halo zeros streamed (ConvNeXt's fc2 at 4 tokens: 640 cycles of
    its load engine); the same outputs."""
    mod, inputs, expected = _linear(rows, "gelu", residual)
    with npu_backend.profile(keep_timelines=True) as prof:
        out = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](
            *[tvm.runtime.tensor(a) for a in inputs]).numpy()
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())
    (kernel,) = prof.kernels
    gemm_rows = {int(r[isa.FIELDS[isa.Op.GEMM].index("m")]) for r in prof.timelines[0].commands
                 if isa.Op(int(r[0])) == isa.Op.GEMM}
    assert gemm_rows == {rows} or rows > 8, gemm_rows
    if gemm_rows == {rows}:  # whole tiles (not GEMM pieces of a DMA-loaded tile)
        assert kernel.dma_load_box_bytes == kernel.dma_load_bytes == kernel.compulsory_load_bytes
