"""A post-norm, LayerNorm(x + proj(h)), in the epilogue of the GEMM that computes its input
(kernels/gemm/post_norm.py): one kernel instead of the GEMM's and the norm's, the norm kernel's
own commands on each tile of whole rows; within 1e-5 of float64 relative to the output's largest
value (also at a row mean of 20 standard deviations), and equal to the two kernels apart up to
the GEMM's summation order. A hidden size the tiles cannot hold whole keeps the norm's kernel,
and explain says why."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
import tvm
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.tools.explain import format_placements


def _post_norm(rows, hidden, depth, eps, seed, affine=True, scaled=False, bias=True, norm=True):
    """main(h, x) = LN([g *] (reshape(h @ W^T [+ b]) + x), gamma, beta) (without `norm`: the sum);
    W scaled so that the projection's rows are of unit spread, as the residual's."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((hidden, depth)) / np.sqrt(depth)).astype(np.float32)
    b = rng.standard_normal(hidden).astype(np.float32) if bias else np.zeros(hidden, np.float32)
    g = rng.uniform(0.5, 1.5, hidden).astype(np.float32) if scaled else np.ones(hidden, np.float32)
    gamma = rng.uniform(0.5, 1.5, hidden).astype(np.float32) if affine else np.ones(hidden, np.float32)
    beta = rng.standard_normal(hidden).astype(np.float32) if affine else np.zeros(hidden, np.float32)
    h = relax.Var("h", relax.TensorType((rows, depth), "float32"))
    x = relax.Var("x", relax.TensorType((1, rows, hidden), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [h, x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(h, bb.emit(relax.op.permute_dims(relax.const(w)))))
            y = bb.emit(relax.op.add(y, relax.const(b))) if bias else y
            total = bb.emit(relax.op.add(bb.emit(relax.op.reshape(y, (1, rows, hidden))), x))
            total = bb.emit(relax.op.multiply(total, relax.const(g))) if scaled else total
            out = relax.op.nn.layer_norm(total, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=eps)
            out = bb.emit_output(out if norm else total)
        bb.emit_func_output(out)
    return bb.get(), (w, b, g, gamma, beta)


def _reference(h, x, eps, w, b, g, gamma, beta):
    total = ((h.astype(np.float64) @ w.T.astype(np.float64) + b) + x[0]) * g
    d = total - total.mean(-1, keepdims=True)
    return d / np.sqrt((d ** 2).mean(-1, keepdims=True) + eps) * gamma + beta


def _kernels(mod, arch="cgra-8x8"):
    return [(p.kernel or "").split(" ")[0] for p in npu_backend.explain(mod, arch)]


def _run(mod, *inputs, arch="cgra-8x8"):
    vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    with npu_backend.profile() as prof:
        got = vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()
    return got, prof


@contextlib.contextmanager
def _no_plans():
    """No kernel cache, so no partition plan (partition/plans.py) either: its key sees the
    module's structure, not gamma's 64 or more values, and a plan made for the plain norm would
    try only the plain pattern on a weighted one of the same shapes."""
    saved = os.environ.get("CGRA_KERNEL_CACHE")
    os.environ["CGRA_KERNEL_CACHE"] = "off"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["CGRA_KERNEL_CACHE"]
        else:
            os.environ["CGRA_KERNEL_CACHE"] = saved


def _inputs(rows, hidden, depth, seed, offset=0.0, scale=1.0):
    rng = np.random.default_rng(seed + 1)
    h = (rng.standard_normal((rows, depth)) * scale).astype(np.float32)
    return h, ((rng.standard_normal((1, rows, hidden)) + offset) * scale).astype(np.float32)


@settings(max_examples=10, deadline=None)
@given(rows=st.integers(1, 40), hidden=st.sampled_from([8, 16, 32, 64, 128]), depth=st.sampled_from([8, 24, 64, 128]),
       eps=st.sampled_from([1e-12, 1e-5, 0.1]), affine=st.booleans(), scaled=st.booleans(), bias=st.booleans(),
       seed=st.integers(0, 99), offset=st.sampled_from([0.0, 20.0]), scale=st.sampled_from([1e-3, 1.0, 30.0]))
@example(rows=32, hidden=64, depth=64, eps=1e-12, affine=False, scaled=True, bias=True, seed=0, offset=20.0, scale=30.0)
def test_a_post_norm_runs_in_its_gemm_within_float_rounding(rows, hidden, depth, eps, affine, scaled, bias, seed,
                                                             offset, scale):
    """Random rows, widths, depths, eps, gamma and beta (or the plain norm), a per-channel scale
    (BERT's folded gamma) and a bias or not, a row mean of 0 or 20 standard deviations: no norm
    kernel, or one explain gives a reason for; within 1e-5 of float64."""
    mod, (w, b, g, gamma, beta) = _post_norm(rows, hidden, depth, eps, seed, affine, scaled, bias)
    with _no_plans():
        norm = [p for p in npu_backend.explain(mod, "cgra-8x8") if p.op == "nn.layer_norm"][0]
        if norm.kernel.startswith("cgra.layer_norm"):
            assert "costs as much as" in norm.reason, norm  # refused as no cheaper (check_post_norm)
        else:
            assert "_post_norm" in norm.kernel, norm
        h, x = _inputs(rows, hidden, depth, seed, offset, scale)
        got, _ = _run(mod, h, x)
    ref = _reference(h, x, eps, w, b, g, gamma, beta)
    assert np.abs(got[0] - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("affine, scaled, depth", [(False, True, 64), (False, False, 64), (True, True, 128)])
def test_the_fold_equals_the_two_kernels_and_costs_less(affine, scaled, depth):
    """The same commands on the same sums as the GEMM kernel and the norm kernel run apart (the
    sum stored and loaded between them), up to the GEMM's summation order, in fewer cycles: 32
    tokens of 64, BERT's out-projection (the kernel holds B for its row tiles) and its last MLP
    (the model's output norm, weighted)."""
    rows, hidden, eps = 32, 64, 1e-12
    mod, (_, _, _, gamma, beta) = _post_norm(rows, hidden, depth, eps, 3, affine, scaled)
    summed, _ = _post_norm(rows, hidden, depth, eps, 3, affine, scaled, norm=False)
    x = relax.Var("x", relax.TensorType((1, rows, hidden), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.layer_norm(x, relax.const(gamma), relax.const(beta), axes=[-1],
                                                        epsilon=eps))
        bb.emit_func_output(out)
    norm = bb.get()
    assert {k for k in _kernels(mod) if k} == {"cgra.linear_post_norm" + ("" if affine else "_plain")}
    h, x = _inputs(rows, hidden, depth, 3, offset=20.0)
    fused, prof = _run(mod, h, x)
    total, prof_sum = _run(summed, h, x)
    apart, prof_norm = _run(norm, total)
    assert np.abs(fused - apart).max() <= 2e-6 * np.abs(apart).max()
    assert prof.total_cycles < 0.92 * (prof_sum.total_cycles + prof_norm.total_cycles)


def test_a_row_the_tiles_cannot_hold_keeps_its_norm_kernel_and_explain_says_why():
    """12 columns pad to 16 on cgra-8x8 (a padded column would join the variance); 1024 do not
    fit cgra-4x4's scratchpad as tiles of whole rows: the norm runs as its own kernel, and the
    reason is its placement's."""
    for arch, rows, hidden, why in (("cgra-8x8", 32, 12, "pad to whole columns"),
                                    ("cgra-4x4", 16, 1024, "does not fit the 65536-byte scratchpad")):
        mod, (w, b, g, gamma, beta) = _post_norm(rows, hidden, 16, 1e-5, 0)
        placements = npu_backend.explain(mod, arch)
        norm = [p for p in placements if p.op == "nn.layer_norm"][0]
        assert norm.kernel.startswith("cgra.layer_norm") and why in norm.reason, norm
        assert why in format_placements(placements)
        if arch == "cgra-8x8":
            h, x = _inputs(rows, hidden, 16, 0)
            got, _ = _run(mod, h, x, arch=arch)
            ref = _reference(h, x, 1e-5, w, b, g, gamma, beta)
            assert np.abs(got[0] - ref).max() <= 1e-5 * np.abs(ref).max()


def test_bert_runs_no_norm_kernel_after_its_attention_output_or_its_mlp():
    """BERT (2 layers, hidden 64, 32 tokens): its four post-norms are in the epilogues of the
    out-projections and the MLPs' down projections; the embedding's norm keeps its kernel."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch
    from tvm.relax.frontend.torch import from_exported_program
    from transformer_models import build

    model, inputs = build("bert", tokens=32)
    mod = from_exported_program(torch.export.export(model, inputs))
    kernels = [k for k in _kernels(mod) if k]
    norms = [k for k in kernels if k.startswith("cgra.layer_norm")]
    post = {k for k in kernels if "_post_norm" in k}
    assert len(norms) == 1 and post == {"cgra.linear_post_norm", "cgra.linear_post_norm_plain"}, (norms, post)


def _rms_post_norm(rows, hidden, depth, eps, seed, beta=True):
    """main(h, x) = rms_norm(reshape(h @ W^T + b) + x, gamma) [+ beta]: a centred stream's final
    layer norm (normalise/centred_streams.py: GPT-J's and GPT-NeoX's ln_f after their last MLP)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((hidden, depth)) / np.sqrt(depth)).astype(np.float32)
    b, gamma, shift = (rng.standard_normal(hidden).astype(np.float32) for _ in range(3))
    h = relax.Var("h", relax.TensorType((rows, depth), "float32"))
    x = relax.Var("x", relax.TensorType((1, rows, hidden), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [h, x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(h, bb.emit(relax.op.permute_dims(relax.const(w))))),
                                     relax.const(b)))
            total = bb.emit(relax.op.add(bb.emit(relax.op.reshape(y, (1, rows, hidden))), x))
            out = bb.emit(relax.op.nn.rms_norm(total, relax.const(gamma), axes=[-1], epsilon=eps))
            out = bb.emit_output(relax.op.add(out, relax.const(shift)) if beta else out)
        bb.emit_func_output(out)
    return bb.get(), (w, b, gamma, shift if beta else np.zeros(hidden, np.float32))


@settings(max_examples=6, deadline=None)
@given(rows=st.integers(1, 40), hidden=st.sampled_from([8, 32, 64]), depth=st.sampled_from([8, 64, 128]),
       eps=st.sampled_from([1e-12, 1e-5, 0.1]), beta=st.booleans(), seed=st.integers(0, 99),
       scale=st.sampled_from([1e-3, 1.0, 30.0]))
def test_an_rms_post_norm_and_its_beta_run_within_float_rounding(rows, hidden, depth, eps, beta, seed, scale):
    """An RMSNorm [+ beta] after a linear and its residual, in the GEMM's epilogue or (refused as
    no cheaper) apart: within 1e-5 of float64."""
    mod, (w, b, gamma, shift) = _rms_post_norm(rows, hidden, depth, eps, seed, beta)
    with _no_plans():
        h, x = _inputs(rows, hidden, depth, seed, scale=scale)
        got, _ = _run(mod, h, x)
    total = h.astype(np.float64) @ w.T.astype(np.float64) + b + x[0]
    ref = total / np.sqrt((total ** 2).mean(-1, keepdims=True) + eps) * gamma + shift
    assert np.abs(got[0] - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("beta", [True, False])
def test_gptjs_final_norm_runs_in_its_last_gemm_in_fewer_cycles(beta):
    """GPT-J's last MLP projection (32 tokens, 256 -> 64), its residual and ln_f as a centred
    stream's RMSNorm + beta: one kernel (no norm kernel, no add kernel), within 1e-5 of float64,
    and cheaper than the GEMM, the norm and the add apart."""
    rows, hidden, depth, eps = 32, 64, 256, 1e-5
    mod, (w, b, gamma, shift) = _rms_post_norm(rows, hidden, depth, eps, 5, beta)
    with _no_plans():
        assert {k for k in _kernels(mod) if k} == {"cgra.linear_post_norm_rms" + ("_beta" if beta else "")}
        h, x = _inputs(rows, hidden, depth, 5)
        got, prof = _run(mod, h, x)
    total = h.astype(np.float64) @ w.T.astype(np.float64) + b + x[0]
    ref = total / np.sqrt((total ** 2).mean(-1, keepdims=True) + eps) * gamma + shift
    assert np.abs(got[0] - ref).max() <= 1e-5 * np.abs(ref).max()
    assert len(prof.kernels) == 1, [k.name for k in prof.kernels]
