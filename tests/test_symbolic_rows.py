"""Elementwise ops on a (1, s, C) activation run on the NPU on their (s, C) rows
(normalise/symbolic_rows.py): a transformer's residual add and SwiGLU's SiLU and multiply at a
symbolic sequence length, compiled once, equal to numpy."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx

import npu_backend
from npu_backend.normalise.symbolic_rows import symbolic_rows

ARCH = "cgra-8x8"


def _swiglu_block():
    """out = x + silu(g) * u, every tensor (1, s, 32); a (32,) bias added to g first."""
    s = tirx.Var("s", "int64")
    x, g, u = (relax.Var(name, relax.TensorType((1, s, 32), "float32")) for name in "xgu")
    bias = relax.const(np.linspace(-1, 1, 32, dtype="float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, g, u], attrs={"tir_var_upper_bound": {"s": 256}}):
        with bb.dataflow():
            biased = bb.emit(relax.op.add(g, bias))
            silu = bb.emit(relax.op.multiply(biased, relax.op.sigmoid(biased)))
            gated = bb.emit(relax.op.multiply(silu, u))
            out = bb.emit_output(relax.op.add(x, gated))
        bb.emit_func_output(out)
    return bb.get()


def test_every_op_of_a_swiglu_block_at_a_symbolic_length_runs_on_the_npu():
    mod = _swiglu_block()
    placements = npu_backend.explain(mod, ARCH, dims={"s": 9})
    compute = [p for p in placements if p.op != "reshape"]
    assert compute and all(p.where == "npu" for p in compute), [(p.op, p.reason) for p in compute if p.where == "host"]
    vm = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())
    bias = np.linspace(-1, 1, 32, dtype="float32")
    for n in (1, 9, 70):
        rng = np.random.default_rng(n)
        x, g, u = (rng.standard_normal((1, n, 32)).astype("float32") for _ in range(3))
        out = vm["main"](*(tvm.runtime.tensor(a) for a in (x, g, u))).numpy()
        b = g + bias
        np.testing.assert_allclose(out, x + b / (1 + np.exp(-b)) * u, rtol=1e-5, atol=1e-5)


def test_silu_still_reads_one_tensor_twice():
    """sigmoid and multiply read the same (s, C) view, so the SiLU pattern still matches."""
    text = symbolic_rows(_swiglu_block()).script()
    assert text.count("R.sigmoid") == 1 and text.count("R.reshape(biased") <= 1


def test_a_static_module_is_left_as_it_is():
    x = relax.Var("x", relax.TensorType((1, 8, 32), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        out = bb.emit(relax.op.add(x, x))
        bb.emit_func_output(out)
    mod = bb.get()
    assert symbolic_rows(mod).script() == mod.script()


def test_rope_on_heads_at_a_symbolic_length_runs_on_the_npu():
    """q (1, H, s, d) * cos (1, 1, s, d) + q: viewed (H, s d) and (1, s d), the length in the
    trailing axis."""
    s = tirx.Var("s", "int64")
    q = relax.Var("q", relax.TensorType((1, 4, s, 16), "float32"))
    cos = relax.Var("cos", relax.TensorType((1, 1, s, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [q, cos], attrs={"tir_var_upper_bound": {"s": 512}}):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.multiply(q, cos), q))
        bb.emit_func_output(out)
    mod = bb.get()
    placements = npu_backend.explain(mod, ARCH, dims={"s": 5})
    assert [p.where for p in placements if p.op != "reshape"] == ["npu", "npu"]
    vm = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())
    for n in (1, 5, 45):
        rng = np.random.default_rng(n)
        a, c = rng.standard_normal((1, 4, n, 16)).astype("float32"), rng.standard_normal((1, 1, n, 16)).astype("float32")
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(c)).numpy(), a * c + a,
                                   rtol=1e-6, atol=1e-6)


def test_an_op_a_kernel_epilogue_takes_is_left_as_it_is():
    """A conv2d's relu over (1, C, h, 6): reshaped, it would leave the conv2d's epilogue."""
    h = tirx.Var("h", "int64")
    x = relax.Var("x", relax.TensorType((1, 4, h, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 4, 3, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.nn.conv2d(x, w)))
        bb.emit_func_output(out)
    mod = bb.get()
    assert symbolic_rows(mod).script() == mod.script()
