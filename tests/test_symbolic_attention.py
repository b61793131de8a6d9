"""Attention's matmuls with a symbolic sequence length run on the NPU (kernels/gemm/symbolic_matmul.py):
Q Kᵀ (rows and columns symbolic), P V (rows and reduction symbolic), a decode step's q Kᵀ (columns
symbolic), compiled once, equal to numpy at every length and close to a kernel compiled for it."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import npu_backend
from npu_backend.tools.explain import explain, npu_mac_fraction

ARCH = "cgra-8x8"
HEADS, DEPTH = 4, 16


def _matmul(kind: str, s, bound: int | None = 512, transposed: bool = False, heads: int = HEADS):
    """(H, s, d) @ (H, d, s) for "qk", (H, s, s) @ (H, s, d) for "pv", (H, 1, d) @ (H, d, s) for
    "decode"; `transposed`: the right operand stored (H, s, d) and permuted (PyTorch's k.transpose)."""
    lhs = {"qk": (heads, s, DEPTH), "pv": (heads, s, s), "decode": (heads, 1, DEPTH)}[kind]
    rhs = (heads, DEPTH, s) if kind != "pv" else (heads, s, DEPTH)
    if transposed:
        rhs = (heads, s, DEPTH)
    a = relax.Var("a", relax.TensorType(lhs, "float32"))
    b = relax.Var("b", relax.TensorType(rhs, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [a, b], attrs={"tir_var_upper_bound": {"s": bound}} if bound else {}):
        with bb.dataflow():
            right = bb.emit(relax.op.permute_dims(b, [0, 2, 1])) if transposed else b
            out = bb.emit_output(relax.op.matmul(a, right))
        bb.emit_func_output(out)
    return bb.get()


def _operands(mod, n: int, seed: int):
    rng = np.random.default_rng(seed)
    shapes = [[n if not isinstance(d, int) else d for d in (int(x) if isinstance(x, tirx.IntImm) else x
                                                            for x in p.ty.shape)] for p in mod["main"].params]
    return [rng.standard_normal(shape).astype("float32") for shape in shapes]


def _run(vm, arrays):
    with npu_backend.profile() as prof:
        out = vm["main"](*(tvm.runtime.tensor(a) for a in arrays)).numpy()
    return out, prof


@pytest.mark.parametrize("kind,transposed", [("qk", False), ("pv", False), ("decode", False), ("qk", True)])
def test_one_head_s_symbolic_matmul_is_right_at_every_length(kind, transposed):
    """A batch of one: the kernel's output keeps the caller's rank (1, s, n), not the spec's 2-D
    output shape. P V's static columns were read as the symbolic length there, and every length but
    the head dim was refused at run time ("rhs dimension 2: expected 5, got 16"; a one-head Bloom)."""
    s = tirx.Var("s", "int64")
    mod = _matmul(kind, s, transposed=transposed, heads=1)
    vm = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())
    for n in (1, 5, DEPTH, 37):
        a, b = _operands(mod, n, n)
        out, _ = _run(vm, (a, b))
        np.testing.assert_allclose(out, a @ (b.transpose(0, 2, 1) if transposed else b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind,transposed", [("qk", False), ("pv", False), ("decode", False), ("qk", True)])
def test_a_matmul_of_two_symbolic_activations_runs_on_the_npu_at_every_length(kind, transposed):
    s = tirx.Var("s", "int64")
    mod = _matmul(kind, s, transposed=transposed)
    assert npu_mac_fraction(explain(mod, ARCH, dims={"s": 7})) == 1.0
    vm = relax.VirtualMachine(npu_backend.compile(mod, ARCH), tvm.cpu())
    for n in (1, 7, 33, 70):
        a, b = _operands(mod, n, n)
        out, prof = _run(vm, (a, b))
        expected = a @ (b.transpose(0, 2, 1) if transposed else b)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
        assert len(prof.kernels) == 1 and prof.kernels[0].macs == expected.size * a.shape[-1]


@pytest.mark.parametrize("kind", ["qk", "pv"])
def test_the_symbolic_kernel_is_close_to_a_static_one(kind):
    """Its last tiles are cut to the rows, columns and reduction that exist."""
    vm = relax.VirtualMachine(npu_backend.compile(_matmul(kind, tirx.Var("s", "int64"), 2048), ARCH), tvm.cpu())
    for n in (5, 16, 40):
        static = relax.VirtualMachine(npu_backend.compile(_matmul(kind, n), ARCH), tvm.cpu())
        arrays = _operands(_matmul(kind, n), n, 0)
        (_, symbolic), (_, fixed) = _run(vm, arrays), _run(static, arrays)
        assert symbolic.total_cycles <= 1.2 * fixed.total_cycles, (n, symbolic.total_cycles, fixed.total_cycles)


def test_a_bias_after_a_symbolic_right_operand_leaves_the_matmul_on_the_npu():
    s = tirx.Var("s", "int64")
    a = relax.Var("a", relax.TensorType((HEADS, s, DEPTH), "float32"))
    b = relax.Var("b", relax.TensorType((HEADS, DEPTH, s), "float32"))
    bias = relax.Var("bias", relax.TensorType((s,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [a, b, bias]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.matmul(a, b), bias))
        bb.emit_func_output(out)
    placements = explain(bb.get(), ARCH, dims={"s": 4})
    assert [p.where for p in placements if p.op == "matmul"] == ["npu"]


def test_a_symbolic_reduction_of_two_matrices_runs_on_the_npu():
    """(8, k) @ (k, 16): the reduction's last tile cut to k (it stayed on the host before)."""
    k = tirx.Var("k", "int64")
    x = relax.Var("x", relax.TensorType((8, k), "float32"))
    w = relax.Var("w", relax.TensorType((k, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(npu_backend.compile(bb.get(), ARCH), tvm.cpu())
    rng = np.random.default_rng(0)
    for n in (1, 9, 300):
        a, b = rng.standard_normal((8, n)).astype("float32"), rng.standard_normal((n, 16)).astype("float32")
        out, prof = _run(vm, (a, b))
        np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
        assert prof.kernels[0].macs == 8 * 16 * n


def _softmax(shape, bound: int | None):
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_upper_bound": {"s": bound}} if bound else {}):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.softmax(x, axis=-1))
        bb.emit_func_output(out)
    return bb.get()


def _numpy_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("shape", [lambda s: (1, HEADS, s, s), lambda s: (1, HEADS, 1, s)])
def test_a_softmax_over_rows_of_symbolic_length_runs_on_the_npu(shape):
    """Attention's scores (1, H, s, s) in prefill, (1, H, 1, t) in a decode step: the row held
    whole in a tile as wide as the bound, every command cut to the length (rows.py)."""
    s = tirx.Var("s", "int64")
    vm = relax.VirtualMachine(npu_backend.compile(_softmax(shape(s), 300), ARCH), tvm.cpu())
    for n in (1, 6, 45, 300):
        x = np.random.default_rng(n).standard_normal(shape(n)).astype("float32")
        x[..., 0] = -np.inf  # a masked entry
        out, prof = _run(vm, (x,))
        np.testing.assert_allclose(out, _numpy_softmax(x), rtol=4e-6, atol=1e-7)
        assert len(prof.kernels) == 1
        static = relax.VirtualMachine(npu_backend.compile(_softmax(shape(n), None), ARCH), tvm.cpu())
        assert prof.total_cycles <= 1.15 * _run(static, (x,))[1].total_cycles


def test_a_row_longer_than_its_bound_is_refused_naming_the_bound():
    vm = relax.VirtualMachine(npu_backend.compile(_softmax((1, HEADS, 1, tirx.Var("s", "int64")), 64), ARCH),
                              tvm.cpu())
    # checked on entry (device/length_checks.py), before the kernel's own check would refuse it
    with pytest.raises(npu_backend.LengthPastBound, match=r"x.shape\[3\] \(symbolic s\) = 65 is past its bound 64.*"
                                                         "shape_bounds"):
        vm["main"](tvm.runtime.tensor(np.zeros((1, HEADS, 1, 65), "float32")))


def test_a_row_max_over_a_symbolic_length_runs_on_the_npu():
    """A causal mask's rows (1, 1, s, s) -> (1, 1, s, 1): the REDUCE cut to the length."""
    s = tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType((1, 1, s, s), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], attrs={"tir_var_upper_bound": {"s": 128}}):
        with bb.dataflow():
            out = bb.emit_output(relax.op.max(x, axis=[-1], keepdims=True))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(npu_backend.compile(bb.get(), ARCH), tvm.cpu())
    for n in (1, 9, 128):
        a = np.random.default_rng(n).standard_normal((1, 1, n, n)).astype("float32")
        out, prof = _run(vm, (a,))
        np.testing.assert_array_equal(out, a.max(-1, keepdims=True))
        assert len(prof.kernels) == 1
