"""A linear layer's output times a constant per-channel vector (DINOv2's layer scale) is folded
into its weights and bias (normalise/layer_scales.py): the residual add after it joins the
GEMM's epilogue, one kernel, within 1e-5 of float64; a multiply by anything else stays."""

from __future__ import annotations

import numpy as np
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.layer_scales import fold_layer_scales


def _block(x, w, b, scale, residual, *, reshape=True):
    """residual + reshape(x @ W^T + b) * scale, as torch.export writes DINOv2's layer scale."""
    rows, n = x.shape[0], w.shape[1]
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            h = relax.op.matmul(xv, relax.op.permute_dims(relax.const(w.T.copy())))
            h = bb.emit(relax.op.add(relax.const(b), h) if b is not None else h)
            if reshape:
                h = bb.emit(relax.op.reshape(h, (1, rows, n)))
            h = bb.emit(relax.op.multiply(h, relax.const(scale)))
            shape = (1, rows, n) if reshape else (rows, n)
            out = bb.emit_output(relax.op.add(h, relax.const(residual.reshape(shape))))
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=4, deadline=None)
@given(rows=st.integers(2, 40), k=st.sampled_from([16, 64]), n=st.sampled_from([32, 64]), bias=st.booleans(),
       reshape=st.booleans(), seed=st.integers(0, 99))
def test_a_layer_scale_folds_and_its_residual_joins_the_epilogue(rows, k, n, bias, reshape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, k)).astype("float32")
    w = (rng.standard_normal((k, n)) / 4).astype("float32")
    b = rng.standard_normal(n).astype("float32") if bias else None
    scale = (rng.standard_normal(n) * 1e-1).astype("float32").reshape((1, 1, n) if reshape else (n,))
    residual = rng.standard_normal((rows, n)).astype("float32")
    with npu_backend.profile() as prof:
        vm = relax.VirtualMachine(npu_backend.compile(_block(x, w, b, scale, residual, reshape=reshape), "cgra-8x8"),
                                  tvm.cpu())
        got = vm["main"](tvm.runtime.tensor(x)).numpy().reshape(rows, n)
    h = x.astype(np.float64) @ w + (b if bias else 0)
    expected = residual + h * scale.reshape(n)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    assert len(prof.kernels) == 1 and prof.host_calls == [], [kernel.name for kernel in prof.kernels]


def test_a_multiply_along_another_axis_stays():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype("float32")
    w, b = rng.standard_normal((16, 8)).astype("float32"), rng.standard_normal(8).astype("float32")
    per_row = rng.standard_normal((8, 1)).astype("float32")  # one value a row: not the weights' to take
    mod = _block(x, w, b, per_row, np.zeros((8, 8), "float32"), reshape=False)
    tvm.ir.assert_structural_equal(fold_layer_scales(mod), mod)
    got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, (x.astype(np.float64) @ w + b) * per_row, rtol=1e-5, atol=1e-5)


def test_dinov2s_layer_scales_leave_no_add_kernel():
    """The ratchet on the real model: DINOv2's adds ran as five elementwise kernels (the
    position embedding's and four after layer scales); none stays (the position embedding's is
    the patch conv's residual since position_embeddings.py)."""
    import pytest

    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tvm.relax.frontend.torch import from_exported_program

    from transformer_models import build

    model, inputs = build("dinov2", tokens=32)
    mod = from_exported_program(torch.export.export(model, inputs))
    with npu_backend.profile() as prof:
        relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](
            *[tvm.runtime.tensor(t.numpy()) for t in inputs])
    assert not any(kernel.name == "fused_relax_add_cgra" for kernel in prof.kernels)


def test_a_scale_and_shift_stay_the_epilogues():
    """(x @ W + b) * s + t, a batch norm after a linear, is the epilogue's scale and shift as
    written: folding s would leave t a second bias add, a kernel of its own."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((3, 4)).astype("float32"), rng.standard_normal((4, 8)).astype("float32")
    b, s, t = (rng.standard_normal(8).astype("float32") for _ in range(3))
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            h = bb.emit(relax.op.add(relax.op.matmul(xv, relax.const(w)), relax.const(b)))
            h = bb.emit(relax.op.multiply(h, relax.const(s)))
            out = bb.emit_output(relax.op.add(h, relax.const(t)))
        bb.emit_func_output(out)
    mod = bb.get()
    tvm.ir.assert_structural_equal(fold_layer_scales(mod), mod)


def test_a_scalar_scale_folds_too():
    """Whisper's query projection times head_dim^-0.5: the scalar is every channel's scale."""
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((6, 16)).astype("float32"), rng.standard_normal((16, 16)).astype("float32")
    b = rng.standard_normal(16).astype("float32")
    mod = _block(x, w, b, np.array(0.25, "float32"), np.zeros((6, 16), "float32"), reshape=True)
    folded = fold_layer_scales(mod)
    assert "multiply" not in str(folded["main"])
    with npu_backend.profile() as prof:
        got = relax.VirtualMachine(npu_backend.compile(mod, "cgra-8x8"), tvm.cpu())["main"](tvm.runtime.tensor(x))
    np.testing.assert_allclose(got.numpy().reshape(6, 16), (x.astype(np.float64) @ w + b) * 0.25, rtol=1e-5, atol=1e-5)
    assert len(prof.kernels) == 1


# ConvNeXt's x + gamma * linear(h) (the convswin branch's tests of its layer_scales.py, the same rewrite)


def _convnext_block(rows: int, k: int, n: int, seed: int, transposed: bool, also_read: bool = False):
    """main(x (1, rows, k), r (1, rows, n)) -> r + gamma * reshape(x @ W + b) [, x @ W + b]."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k) if transposed else (k, n)).astype(np.float32)
    b, gamma = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    x = relax.Var("x", relax.TensorType((rows, k), "float32"))
    r = relax.Var("r", relax.TensorType((1, rows, n), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, r]):
        with bb.dataflow():
            weight = bb.emit(relax.op.permute_dims(relax.const(w))) if transposed else relax.const(w)
            y = bb.emit(relax.op.add(relax.const(b), bb.emit(relax.op.matmul(x, weight))))
            scaled = bb.emit(relax.op.multiply(relax.const(gamma), bb.emit(relax.op.reshape(y, (1, rows, n)))))
            out = bb.emit(relax.op.add(r, scaled))
            out = bb.emit_output(relax.Tuple([out, y]) if also_read else out)
        bb.emit_func_output(out)
    return bb.get()


def _multiplies(mod) -> int:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(e, relax.Call) and
                                    e.op.same_as(tvm.ir.Op.get("relax.multiply")) else None)
    return len(found)


def _on_host(mod, *args):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


@settings(max_examples=5, deadline=None)
@given(rows=st.integers(1, 20), k=st.integers(1, 40), n=st.integers(1, 40), seed=st.integers(0, 2 ** 16),
       transposed=st.booleans())
def test_the_folded_block_matches_the_unrewritten_one_on_the_host(rows, k, n, seed, transposed):
    mod = _convnext_block(rows, k, n, seed, transposed)
    folded = fold_layer_scales(mod)
    assert _multiplies(folded) == 0
    rng = np.random.default_rng(seed + 1)
    x, r = rng.standard_normal((rows, k)).astype(np.float32), rng.standard_normal((1, rows, n)).astype(np.float32)
    expected, out = _on_host(mod, x, r), _on_host(folded, x, r)
    # the GEMM's own rounding: (k + 2) ulps of the sum of the terms' magnitudes, plus the residual's
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k) if transposed else (k, n)).astype(np.float64)
    w = w.T if transposed else w
    b, gamma = (rng.standard_normal(n) for _ in range(2))
    bound = (k + 4) * 2.0 ** -24 * (np.abs(x) @ np.abs(w * gamma) + np.abs(b * gamma) + np.abs(r[0]))
    assert np.all(np.abs(out - expected)[0] <= bound + 1e-30)


def test_a_scale_of_an_output_read_elsewhere_stays():
    mod = _convnext_block(4, 8, 8, 0, True, also_read=True)
    assert _multiplies(fold_layer_scales(mod)) == 1
