"""A pre-norm's gamma and beta folded into the linear layers that read it (normalise/norm_folds.py),
and the plain norm kernel that is left (kernels/rows/norms.py): the folded model matches float64
within the GEMM's own rounding, the norm kernel runs without its gamma and beta steps, and a norm
read by anything but a linear layer keeps them."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.norm_folds import fold_norm_weights


def _module(rows: int, cols: int, n: int, kind: str, seed: int, residual: bool = False):
    """main(x, y) -> (norm(x) @ W1^T + b1 [+ norm(x)], norm(x) viewed as rows @ W2): HF's
    nn.Linear (a transposed weight, a bias) and GPT-2's Conv1D (a (K, N) weight, no bias here)."""
    rng = np.random.default_rng(seed)
    gamma, beta = (rng.standard_normal(cols).astype(np.float32) for _ in range(2))
    w1 = rng.standard_normal((n, cols)).astype(np.float32)
    b1 = rng.standard_normal(n).astype(np.float32)
    w2 = rng.standard_normal((cols, n)).astype(np.float32)
    x = relax.Var("x", relax.TensorType((1, rows, cols), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            if kind == "layer_norm":
                norm = bb.emit(relax.op.nn.layer_norm(x, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=1e-5))
            else:
                norm = bb.emit(relax.op.nn.rms_norm(x, relax.const(gamma), axes=[-1], epsilon=1e-6))
            first = bb.emit(relax.op.matmul(norm, bb.emit(relax.op.permute_dims(relax.const(w1)))))
            first = bb.emit(relax.op.add(first, relax.const(b1)))
            if residual:
                first = bb.emit(relax.op.add(first, bb.emit(relax.op.concat([norm] * (n // cols), axis=-1))))
            flat = bb.emit(relax.op.reshape(norm, (rows, cols)))
            second = bb.emit(relax.op.matmul(flat, relax.const(w2)))
            out = bb.emit_output(relax.Tuple([first, second]))
        bb.emit_func_output(out)
    return bb.get(), (gamma, beta if kind == "layer_norm" else np.zeros_like(beta), w1, b1, w2)


def _reference(x, kind, gamma, beta, w1, b1, w2, residual=False):
    d = x.astype(np.float64)
    if kind == "layer_norm":
        d = d - d.mean(-1, keepdims=True)
        normed = d / np.sqrt((d ** 2).mean(-1, keepdims=True) + 1e-5) * gamma + beta
    else:
        normed = d / np.sqrt((d ** 2).mean(-1, keepdims=True) + 1e-6) * gamma
    first = normed @ w1.T.astype(np.float64) + b1
    if residual:
        first = first + np.concatenate([normed] * (w1.shape[0] // x.shape[-1]), axis=-1)
    return first, normed.reshape(-1, x.shape[-1]) @ w2.astype(np.float64)


def _norm_kernels(mod):
    return [p.kernel.split()[0] for p in npu_backend.explain(mod, "cgra-8x8") if "norm" in p.op]


@settings(max_examples=4, deadline=None)
@given(kind=st.sampled_from(["layer_norm", "rms_norm"]), rows=st.integers(1, 20), seed=st.integers(0, 99),
       offset=st.sampled_from([0.0, 20.0]))
def test_a_pre_norm_folds_into_its_linears_within_float_rounding(kind, rows, seed, offset):
    """Both linears read the plain norm; the outputs are within 1e-5 of float64 relative to the
    largest (the transformer tests' bound for PyTorch), at a mean of 20 standard deviations too."""
    mod, (gamma, beta, w1, b1, w2) = _module(rows, 16, 32, kind, seed)
    assert _norm_kernels(mod) == [f"cgra.{kind}_plain"]
    x = (np.random.default_rng(seed).standard_normal((1, rows, 16)) + offset).astype(np.float32)
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    got = [r.numpy() for r in vm["main"](tvm.runtime.tensor(x))]
    for out, ref in zip(got, _reference(x, kind, gamma, beta, w1, b1, w2)):
        assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


def test_the_folded_weights_and_bias_are_gamma_times_w_and_beta_at_w_plus_b():
    mod, (gamma, beta, w1, b1, w2) = _module(4, 8, 16, "layer_norm", 3)
    folded = fold_norm_weights(mod)
    consts = [c.value.numpy() for c in _constants(folded["main"])]
    shapes = {c.shape: c for c in consts}
    np.testing.assert_allclose(shapes[(16, 8)], w1 * gamma, rtol=1e-7)
    np.testing.assert_allclose(shapes[(8, 16)], w2 * gamma[:, None], rtol=1e-7)
    biases = [c for c in consts if c.shape == (16,)]
    assert len(biases) == 2
    for expected in (b1 + beta @ w1.T, beta @ w2):  # joined to b1; a new bias add
        assert any(np.allclose(bias, expected, rtol=1e-6, atol=1e-5) for bias in biases)
    assert any(np.all(c == 1) for c in consts if c.shape == (8,))


def _constants(func):
    found = []
    relax.analysis.post_order_visit(func, lambda e: found.append(e) if isinstance(e, tvm.ir.GenericConst) else None)
    return found


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_a_norm_read_by_a_residual_keeps_its_gamma_and_beta(kind):
    """Post-norm (BERT): the normalised tensor itself is needed, so nothing folds."""
    mod, (gamma, beta, w1, b1, w2) = _module(5, 8, 16, kind, 1, residual=True)
    assert fold_norm_weights(mod).same_as(mod)
    assert _norm_kernels(mod) == [f"cgra.{kind}"]
    x = np.random.default_rng(1).standard_normal((1, 5, 8)).astype(np.float32)
    vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
    got = [r.numpy() for r in vm["main"](tvm.runtime.tensor(x))]
    for out, ref in zip(got, _reference(x, kind, gamma, beta, w1, b1, w2, residual=True)):
        assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


def test_the_plain_kernel_takes_only_ones_and_zeros():
    """A norm whose gamma is a constant other than ones is the weighted kernel's; ones and zeros
    (HF's initial LayerNorm) are the plain one's, which leaves out two vector steps a tile."""
    x = relax.Var("x", relax.TensorType((32, 64), "float32"))
    kernels, cycles = [], []
    for gamma in (np.ones(64, np.float32), np.full(64, 2.0, np.float32)):
        bb = relax.BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(relax.op.nn.layer_norm(x, relax.const(gamma), relax.const(np.zeros(64, np.float32)),
                                                            axes=[-1], epsilon=1e-5))
            bb.emit_func_output(out)
        mod = bb.get()
        kernels += _norm_kernels(mod)
        data = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
        vm = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())
        with npu_backend.profile() as prof:
            got = vm["main"](tvm.runtime.tensor(data)).numpy()
        cycles.append(prof.total_cycles)
        d = data.astype(np.float64) - data.mean(-1, keepdims=True)
        ref = d / np.sqrt((d ** 2).mean(-1, keepdims=True) + 1e-5) * gamma
        assert np.abs(got - ref).max() <= 3e-6 * np.abs(ref).max()
    assert kernels == ["cgra.layer_norm_plain", "cgra.layer_norm"]
    assert cycles[0] < 0.85 * cycles[1]


def _post_norm(gamma, seed: int = 5, rows: int = 6, cols: int = 8):
    """BERT's post-norm: h = LN(x); out = LN2(reshape(relu(reshape(h) @ A^T) @ V^T + c) + h), and
    the constants; LN2 is the model's output, so it stays weighted."""
    rng = np.random.default_rng(seed)
    beta, gamma2, beta2, c = (rng.standard_normal(cols).astype(np.float32) for _ in range(4))
    v, a = (rng.standard_normal((cols, cols)).astype(np.float32) for _ in range(2))
    x = relax.Var("x", relax.TensorType((1, rows, cols), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.layer_norm(x, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=1e-5))
            flat = bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(
                bb.emit(relax.op.reshape(h, (rows, cols))), bb.emit(relax.op.permute_dims(relax.const(a)))))))
            y = bb.emit(relax.op.add(relax.const(c), bb.emit(relax.op.matmul(
                flat, bb.emit(relax.op.permute_dims(relax.const(v)))))))
            total = bb.emit(relax.op.add(bb.emit(relax.op.reshape(y, (1, rows, cols))), h))
            out = bb.emit_output(relax.op.nn.layer_norm(total, relax.const(gamma2), relax.const(beta2), axes=[-1],
                                                        epsilon=1e-5))
        bb.emit_func_output(out)
    x_data = (rng.standard_normal((1, rows, cols)) * 3 + 1).astype(np.float32)

    def ln(t, g, b):
        t = t - t.mean(-1, keepdims=True)
        return t / np.sqrt((t ** 2).mean(-1, keepdims=True) + 1e-5) * g + b
    hd = ln(x_data.astype(np.float64), gamma, beta)
    inner = np.maximum(hd.reshape(rows, cols) @ a.T.astype(np.float64), 0)
    return bb.get(), x_data, ln((inner @ v.T.astype(np.float64) + c).reshape(hd.shape) + hd, gamma2, beta2)


def test_a_post_norm_folds_through_the_residual_add_into_the_linear_before_it():
    """gamma (x @ (V / gamma) + (c + beta) / gamma + plain): the first norm is plain, the sum's
    multiply by gamma runs in the out-projection's epilogue, and so does the second norm
    (kernels/gemm/post_norm.py); within 1e-5 of float64."""
    gamma = np.random.default_rng(9).uniform(0.2, 2.0, 8).astype(np.float32) * np.array([1, -1] * 4, np.float32)
    mod, x, ref = _post_norm(gamma)
    kernels = [(p.kernel or "").split(" ")[0] for p in npu_backend.explain(mod, "cgra-8x8")]
    assert kernels.count("cgra.layer_norm_plain") == 1 and "cgra.layer_norm" not in kernels
    assert any(k.endswith("_post_norm") for k in kernels), kernels  # the add, the multiply by gamma, the norm
    got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_a_post_norm_with_a_zero_in_gamma_keeps_it():
    gamma = np.ones(8, np.float32) * 0.5
    gamma[3] = 0.0
    mod, _, _ = _post_norm(gamma)
    assert fold_norm_weights(mod).same_as(mod)


@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_a_plain_norm_of_a_long_row_runs_in_passes(kind):
    """A row longer than cgra-4x4's scratchpad holds with the intermediates (rows_long.py): the
    plain program there too, within 3e-6 of float64 at a mean of 30 standard deviations."""
    cols = 1024
    x = relax.Var("x", relax.TensorType((3, cols), "float32"))
    ones, zeros = relax.const(np.ones(cols, np.float32)), relax.const(np.zeros(cols, np.float32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            norm = (relax.op.nn.layer_norm(x, ones, zeros, axes=[-1], epsilon=1e-5) if kind == "layer_norm"
                    else relax.op.nn.rms_norm(x, ones, axes=[-1], epsilon=1e-5))
            out = bb.emit_output(norm)
        bb.emit_func_output(out)
    mod = bb.get()
    assert [p.kernel.split()[0] for p in npu_backend.explain(mod, "cgra-4x4")] == [f"cgra.{kind}_plain"]
    data = (np.random.default_rng(2).standard_normal((3, cols)) + 30).astype(np.float32)
    got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-4x4"), tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    d = data.astype(np.float64)
    d = d - d.mean(-1, keepdims=True) if kind == "layer_norm" else d
    ref = d / np.sqrt((d ** 2).mean(-1, keepdims=True) + 1e-5)
    assert np.abs(got - ref).max() <= 3e-6 * np.abs(ref).max()
