"""A GEMM whose residual is its own left operand (kernels/gemm/residual_lhs.py): x @ W + x and
relu(conv2d(x) + x) are one kernel (the add and relu in its epilogue, the residual loaded from
x), within float32 rounding of float64; a symbolic size keeps the add apart
(tests/test_dynamic_images.py runs that case)."""

from __future__ import annotations

import itertools

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend


def _module(kind, shape, weight, relu_first, bias):
    """main(x) = relu(gemm(h) [+ b] + h), h = relu(x) or x itself (a parameter)."""
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(x)) if relu_first else x
            y = bb.emit(relax.op.matmul(h, relax.const(weight)) if kind == "matmul" else
                        relax.op.nn.conv2d(h, relax.const(weight), padding=weight.shape[-1] // 2))
            if bias is not None:
                y = bb.emit(relax.op.add(y, relax.const(bias)))
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(y, h)))
        bb.emit_func_output(out)
    return bb.get()


def _reference(kind, data, weight, relu_first, bias):
    h = np.maximum(data, 0).astype(np.float64) if relu_first else data.astype(np.float64)
    if kind == "matmul":
        y = h @ weight
    else:
        k = weight.shape[-1]
        pad = np.pad(h, ((0, 0), (0, 0), (k // 2, k // 2), (k // 2, k // 2)))
        y = sum(np.einsum("nchw,fc->nfhw", pad[:, :, ky:ky + h.shape[2], kx:kx + h.shape[3]], weight[:, :, ky, kx])
                for ky, kx in itertools.product(range(k), range(k)))
    return np.maximum(y + (0 if bias is None else bias) + h, 0)


@settings(max_examples=8, deadline=None)
@given(kind=st.sampled_from(["matmul", "conv2d"]), rows=st.integers(1, 40), width=st.sampled_from([8, 16, 64]),
       k=st.sampled_from([1, 3]), relu_first=st.booleans(), bias=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_a_gemm_adds_its_own_input_in_its_epilogue(kind, rows, width, k, relu_first, bias, seed):
    """Random sizes, a computed or a parameter left operand, with and without a bias: one GEMM
    kernel takes the add and the relu (no add kernel), within float32 rounding of float64."""
    rng = np.random.default_rng(seed)
    if kind == "matmul":
        shape, weight = (rows, width), rng.standard_normal((width, width)).astype(np.float32) / 8
        b = rng.standard_normal(width).astype(np.float32) if bias else None
    else:
        shape = (1, width // 2, 1 + rows % 9, 1 + rows // 4)
        weight = rng.standard_normal((width // 2, width // 2, k, k)).astype(np.float32) / 8
        b = rng.standard_normal((1, width // 2, 1, 1)).astype(np.float32) if bias else None
    mod = _module(kind, shape, weight, relu_first, b)
    kernels = [p.kernel.split(" ")[0] for p in npu_backend.explain(mod, "cgra-8x8") if p.op == "add"]
    assert all(kernel.startswith(f"cgra.{kind}_") and kernel.endswith("residual_relu") for kernel in kernels), kernels
    data = rng.standard_normal(shape).astype(np.float32)
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    with npu_backend.profile() as prof:
        got = vm["main"](tvm.runtime.tensor(data)).numpy()
    assert len(prof.kernels) == 1 + relu_first, [kernel.name for kernel in prof.kernels]
    want = _reference(kind, data, weight, relu_first, b)
    assert np.abs(got - want).max() <= 2e-6 * max(1.0, np.abs(want).max())


def test_a_normed_linear_adds_the_norms_input_not_its_output():
    """x + rms_norm(x) @ W^T: the normed root's left operand is x (row_norm.py normalises its A
    panel), and the residual read from it is x itself, not the normalised rows."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    x = relax.Var("x", relax.TensorType((32, 64), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            n = bb.emit(relax.op.nn.rms_norm(x, relax.const(np.ones(64, np.float32)), axes=[-1], epsilon=1e-6))
            y = bb.emit(relax.op.matmul(n, bb.emit(relax.op.permute_dims(relax.const(w)))))
            out = bb.emit_output(relax.op.add(y, x))
        bb.emit_func_output(out)
    mod = bb.get()
    assert {p.kernel.split(" ")[0] for p in npu_backend.explain(mod, "cgra-8x8")} == {"cgra.linear_rms_norm_residual"}
    data = (rng.standard_normal((32, 64)) * 3).astype(np.float32)
    got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    d = data.astype(np.float64)
    want = d / np.sqrt((d ** 2).mean(-1, keepdims=True) + 1e-6) @ w.T.astype(np.float64) + d
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
