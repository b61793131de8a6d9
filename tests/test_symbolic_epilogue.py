"""A linear layer with symbolic rows keeps its epilogue: SwiGLU as one gated GEMM (gate and up
interleaved, kernels/gemm/gated.py: the ragged tile's VFUNC and ELTWISE cut by lower/ragged.py), and a residual
add read through the (1, s, C) view of the GEMM's result (normalise/symbolic_rows.py); RoPE's
negation folded into a sine computed at run time (normalise/rotations.py)."""

from __future__ import annotations

import functools

import numpy as np
import tvm
from hypothesis import example, given, settings, strategies as st
from tvm import relax, tirx

import npu_backend
from npu_backend.tools.explain import explain

ARCH = "cgra-8x8"


def _swiglu_block():
    """x (1, s, 64): down(silu(gate(x)) * up(x)) + x, as torch.export writes a Llama MLP."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([1, s, 64], "float32"))
    rng = np.random.default_rng(0)
    weights = {name: relax.const((rng.standard_normal(shape) * 0.1).astype("float32"))
               for name, shape in (("gate", (128, 64)), ("up", (128, 64)), ("down", (64, 128)))}
    bb = relax.BlockBuilder()
    op = relax.op
    with bb.function("main", [x], attrs={"tir_var_upper_bound": {"s": 256}}):
        with bb.dataflow():
            def linear(inp, name, cols):
                rows = bb.emit(op.reshape(inp, relax.ShapeExpr([s, inp.ty.shape.values[-1]])))
                out = bb.emit(op.matmul(rows, bb.emit(op.permute_dims(weights[name]))))
                return bb.emit(op.reshape(out, relax.ShapeExpr([1, s, cols])))
            gate = linear(x, "gate", 128)
            hidden = bb.emit(op.multiply(bb.emit(op.nn.silu(gate)), linear(x, "up", 128)))
            out = bb.emit_output(op.add(x, linear(hidden, "down", 64)))
        bb.emit_func_output(out)
    return bb.get(), {name: w.value.numpy() for name, w in weights.items()}


def test_swiglu_and_the_residual_fuse_into_the_symbolic_linears():
    mod, w = _swiglu_block()
    placements = explain(mod, ARCH, dims={"s": 9})
    npu = [p for p in placements if p.where == "npu"]
    kernels = {p.symbol for p in npu}
    assert len(kernels) == 2, sorted(kernels)  # gate and up as one gated GEMM, down + x
    assert {p.op for p in npu} >= {"nn.silu", "multiply", "add", "matmul"}
    assert any("silu_relax_multiply" in kernel for kernel in kernels), sorted(kernels)
    vm = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())
    rng = np.random.default_rng(1)
    for n in (1, 9, 33, 100):  # one row, ragged tiles, several tiles
        x = rng.standard_normal((1, n, 64)).astype("float32")
        with npu_backend.profile() as prof:
            out = vm["main"](tvm.runtime.tensor(x)).numpy()
        gate = x[0] @ w["gate"].T
        expected = x[0] + ((gate / (1 + np.exp(-gate))) * (x[0] @ w["up"].T)) @ w["down"].T
        np.testing.assert_allclose(out[0], expected, rtol=1e-4, atol=1e-5, err_msg=f"s = {n}")
        assert len(prof.kernels) == 2, n


def test_rope_negation_folds_into_a_sine_computed_at_run_time():
    """With a symbolic length the sine is no constant to fold rotate_half's negation into
    (rotations.py): it is multiplied once by the row of signs, and each q / k rotation reads its
    halves unnegated (exact: (-a) * s == a * (-s))."""
    from npu_backend.normalise.rotations import rotations_folded

    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([1, 4, s, 16], "float32"))
    angle = relax.Var("angle", relax.TensorType([1, s, 16], "float32"))
    bb = relax.BlockBuilder()
    op = relax.op
    with bb.function("main", [x, angle]):
        with bb.dataflow():
            sin = bb.emit(op.expand_dims(bb.emit(op.sin(angle)), [1]))
            low = bb.emit(op.strided_slice(x, [3], [0], [8]))
            high = bb.emit(op.strided_slice(x, [3], [8], [16]))
            rotated = bb.emit(op.concat([bb.emit(op.negative(high)), low], axis=-1))
            out = bb.emit_output(op.multiply(rotated, sin))
        bb.emit_func_output(out)
    before = bb.get()
    after = rotations_folded(before)
    assert "negative" not in after.script()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((1, 4, 5, 16)).astype("float32"), rng.standard_normal((1, 5, 16)).astype("float32")]
    outs = [relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())["main"](*map(tvm.runtime.tensor, arrays)).numpy()
            for mod in (before, after)]
    np.testing.assert_array_equal(outs[0], outs[1])


def _static_block(n: int):
    """_swiglu_block's module with s bound to n (the same weights)."""
    mod, _ = _swiglu_block()
    return relax.transform.BindSymbolicVars({"s": n})(mod)


@settings(max_examples=4, deadline=None)
@given(n=st.integers(1, 256))
@example(n=256)
@example(n=17)
@example(n=1)
def test_the_symbolic_gated_linear_equals_and_costs_the_static_compile(n):
    """Any length up to the bound (the last row tile ragged): the output equals a compile for
    exactly n rows (to float32 rounding: the two compiles may tile the reduction differently), and
    the gated GEMM's cycles are within 5% of that compile's (at n = 1 the static compile keeps gate
    and up apart: the symbolic one is then faster in all)."""
    vm = _compiled()
    x = np.random.default_rng(n).standard_normal((1, n, 64)).astype("float32")
    outs, profiles = [], []
    static = relax.VirtualMachine(npu_backend.compile(_static_block(n), ARCH), tvm.cpu())
    for machine in (vm, static):
        with npu_backend.profile() as prof:
            outs.append(machine["main"](tvm.runtime.tensor(x)).numpy())
        profiles.append(prof)
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    gated = [[k.cycles for k in prof.kernels if "silu_relax_multiply" in k.name] for prof in profiles]
    assert len(gated[0]) == 1, [k.name for k in profiles[0].kernels]
    if gated[1]:
        assert gated[0][0] <= 1.05 * gated[1][0], gated
    else:
        assert profiles[0].total_cycles < profiles[1].total_cycles


@functools.lru_cache(maxsize=1)
def _compiled():
    return relax.VirtualMachine(npu_backend.compile(_swiglu_block()[0], ARCH), tvm.cpu())
