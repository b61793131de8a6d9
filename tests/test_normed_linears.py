"""RMSNorm folded into the GEMM that reads it (normalise/normed_linears.py, kernels/gemm/row_norm.py):
the kernel normalises its own A panel (REDUCE, VFUNC rsqrt, ELTWISE), so no norm kernel runs before
a linear layer; within 1e-5 of float64 relative to the output's largest value (the transformer
tests' bound for PyTorch), and bit-exact to the norm kernel followed by the GEMM."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend


def _normed_linear(rows: int, cols: int, n: int, eps: float, bias: bool, seed: int, lead: bool = True,
                   gamma: bool = True, kind: str = "rms_norm"):
    """main(x) = norm(x, gamma [, beta]) [viewed as rows] @ W^T [+ b], x (1, rows, cols) or (rows, cols)."""
    rng = np.random.default_rng(seed)
    g = rng.uniform(0.5, 1.5, cols).astype(np.float32) if gamma else np.ones(cols, np.float32)
    beta = rng.standard_normal(cols).astype(np.float32) if gamma else np.zeros(cols, np.float32)
    w = rng.standard_normal((n, cols)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    x = relax.Var("x", relax.TensorType((1, rows, cols) if lead else (rows, cols), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            norm = bb.emit(relax.op.nn.rms_norm(x, relax.const(g), axes=[-1], epsilon=eps) if kind == "rms_norm"
                           else relax.op.nn.layer_norm(x, relax.const(g), relax.const(beta), axes=[-1], epsilon=eps))
            flat = bb.emit(relax.op.reshape(norm, (rows, cols))) if lead else norm
            y = bb.emit(relax.op.matmul(flat, bb.emit(relax.op.permute_dims(relax.const(w)))))
            out = bb.emit_output(relax.op.add(y, relax.const(b)) if bias else y)
        bb.emit_func_output(out)
    return bb.get(), (g, beta if kind == "layer_norm" else 0.0, w, b if bias else np.zeros_like(b))


def _reference(x, eps, g, beta, w, b, kind="rms_norm"):
    d = x.reshape(-1, x.shape[-1]).astype(np.float64)
    d = d - d.mean(-1, keepdims=True) if kind == "layer_norm" else d
    return (d / np.sqrt((d ** 2).mean(-1, keepdims=True) + eps) * g + beta) @ w.T.astype(np.float64) + b


def _kernels(mod, arch="cgra-8x8"):
    return {(p.kernel or "").split(" ")[0] for p in npu_backend.explain(mod, arch) if p.kernel}


def _run(mod, x, arch="cgra-8x8"):
    vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    with npu_backend.profile() as prof:
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
    return got, prof


@settings(max_examples=8, deadline=None)
@given(kind=st.sampled_from(["rms_norm", "layer_norm"]), rows=st.integers(1, 40),
       cols=st.sampled_from([8, 16, 24, 64, 96]), n=st.sampled_from([8, 24, 64, 128]),
       eps=st.sampled_from([1e-6, 1e-5, 0.1]), bias=st.booleans(), seed=st.integers(0, 99),
       scale=st.sampled_from([1e-3, 1.0, 30.0]), offset=st.sampled_from([0.0, 20.0]))
def test_a_linear_normalises_its_own_rows_within_float_rounding(kind, rows, cols, n, eps, bias, seed, scale, offset):
    """Random rows, widths, eps, gamma and beta (folded into the linear first), with and without a
    bias: one kernel, no norm kernel, within 1e-5 of float64 (rows of tiny and large magnitude,
    and a layer norm's at a mean of 20 standard deviations)."""
    mod, (g, beta, w, b) = _normed_linear(rows, cols, n, eps, bias, seed, kind=kind)
    kernels = _kernels(mod)
    assert not any(k.startswith(f"cgra.{kind}") for k in kernels), kernels
    assert any(k.startswith(f"cgra.linear_{kind}") for k in kernels), kernels
    x = ((np.random.default_rng(seed).standard_normal((1, rows, cols)) + offset) * scale).astype(np.float32)
    got, _ = _run(mod, x)
    ref = _reference(x, eps, g, beta, w, b, kind)
    assert np.abs(got.reshape(ref.shape) - ref).max() <= 1e-5 * np.abs(ref).max()


def test_the_fold_matches_the_norm_kernel_and_costs_less():
    """The panel program is the norm kernel's (REDUCE sum of squares, VFUNC rsqrt, ELTWISE), so the
    fused kernel agrees with the norm kernel and the GEMM apart (a norm with a second reader keeps
    its own kernel: the model output here) but for the GEMM's summation order (the fused kernel
    takes the reduction in one step, the plain one in four), in fewer cycles than both."""
    mod, (g, _, w, _) = _normed_linear(32, 64, 128, 1e-6, False, 3, lead=False, gamma=False)
    x = np.random.default_rng(3).standard_normal((32, 64)).astype(np.float32)
    fused, prof = _run(mod, x)
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType((32, 64), "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            norm = bb.emit(relax.op.nn.rms_norm(xv, relax.const(g), axes=[-1], epsilon=1e-6))
            y = bb.emit(relax.op.matmul(norm, bb.emit(relax.op.permute_dims(relax.const(w)))))
            out = bb.emit_output(relax.Tuple([y, norm]))
        bb.emit_func_output(out)
    apart = bb.get()
    assert "cgra.rms_norm_plain" in _kernels(apart)
    vm = relax.VirtualMachine(npu_backend.compile(apart, "cgra-8x8"), tvm.cpu())
    with npu_backend.profile() as prof_apart:
        separate = vm["main"](tvm.runtime.tensor(x))[0].numpy()
    # Summation order only: a few float32 ulps of the largest output (2.6e-7 with the AVX2 BLAS
    # numpy uses on one machine, under 2e-7 on another; the simulator's float GEMM is numpy's).
    assert np.abs(fused - separate).max() <= 1e-6 * np.abs(separate).max()
    norm_cycles = sum(k.cycles for k in prof_apart.kernels if "rms_norm" in k.name)
    # 5,442 against 5,590 (norm 1,062): the GEMM apart gained 96 cycles from loading B before A's
    # row pieces (lower/row_loads.py), which the fused kernel's normalised panel does not use.
    assert prof.total_cycles < prof_apart.total_cycles - 0.1 * norm_cycles


def _llama_block(rows: int = 16, cols: int = 32, seed: int = 0):
    """Llama's pre-norm layer as normalise leaves it: norm -> q/k/v linear; residual add -> norm ->
    gate/up linear with SiLU (gated) -> down linear + residual; the final norm is the output."""
    rng = np.random.default_rng(seed)
    wq = rng.standard_normal((2 * cols, cols)).astype(np.float32) / 4
    wg, wu = (rng.standard_normal((cols, cols)).astype(np.float32) / 4 for _ in range(2))
    wd = rng.standard_normal((cols, cols)).astype(np.float32) / 4
    g1, g2, g3 = (rng.uniform(0.5, 1.5, cols).astype(np.float32) for _ in range(3))
    x = relax.Var("x", relax.TensorType((1, rows, cols), "float32"))
    bb = relax.BlockBuilder()

    def norm(t, g):
        return bb.emit(relax.op.reshape(bb.emit(relax.op.nn.rms_norm(t, relax.const(g), axes=[-1], epsilon=1e-6)),
                                        (rows, cols)))

    def linear(t, w):
        return bb.emit(relax.op.matmul(t, bb.emit(relax.op.permute_dims(relax.const(w)))))

    with bb.function("main", [x]):
        with bb.dataflow():
            qkv = linear(norm(x, g1), wq)
            h = bb.emit(relax.op.add(x, bb.emit(relax.op.reshape(
                bb.emit(relax.op.strided_slice(qkv, [1], [0], [cols])), (1, rows, cols)))))
            n2 = norm(h, g2)
            act = bb.emit(relax.op.multiply(bb.emit(relax.op.nn.silu(linear(n2, wg))), linear(n2, wu)))
            h2 = bb.emit(relax.op.add(h, bb.emit(relax.op.reshape(linear(act, wd), (1, rows, cols)))))
            out = bb.emit_output(relax.op.nn.rms_norm(h2, relax.const(g3), axes=[-1], epsilon=1e-6))
        bb.emit_func_output(out)

    def reference(data):
        def rms(t, g):
            return t / np.sqrt((t ** 2).mean(-1, keepdims=True) + 1e-6) * g
        d = data.astype(np.float64).reshape(rows, cols)
        hd = d + (rms(d, g1) @ wq.T)[:, :cols]
        n = rms(hd, g2)
        a = n @ wg.T
        return rms(hd + (a / (1 + np.exp(-a)) * (n @ wu.T)) @ wd.T, g3).reshape(1, rows, cols)

    return bb.get(), reference


def test_a_llama_style_layer_runs_every_norm_inside_a_gemm():
    """Structure: the two pre-norms are gone into the q/k/v linear and the gated gate/up linear,
    the final norm (the model's output) into the down linear's epilogue after its residual add
    (kernels/gemm/post_norm.py): no norm kernel of its own. Within 1e-5 of float64."""
    mod, reference = _llama_block()
    placements = npu_backend.explain(mod, "cgra-8x8")
    norms = [(p.kernel or "").split(" ")[0] for p in placements if p.op == "nn.rms_norm"]
    assert sorted(norms) == ["cgra.linear_post_norm_rms", "cgra.linear_rms_norm", "cgra.linear_rms_norm_gated"], norms
    x = np.random.default_rng(1).standard_normal((1, 16, 32)).astype(np.float32)
    got, prof = _run(mod, x)
    assert not any("rms_norm" in k.name and "matmul" not in k.name for k in prof.kernels)
    ref = reference(x)
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("kind, readers, kernels", [
    ("rms_norm", 2, {"cgra.matmul_rms_norm"}),  # cheap enough twice (GPT-J's after centred_streams.py)
    ("rms_norm", 3, {"cgra.rms_norm_plain", "cgra.matmul"}),
    ("layer_norm", 2, {"cgra.layer_norm_plain", "cgra.matmul"})])
def test_a_norm_with_more_linears_keeps_its_kernel(kind, readers, kernels):
    """Each copy repeats the panel program, and a GEMM may refuse its copy: an RMSNorm goes into
    two linears, a layer norm (three times the program) into one; with more the kernel stays."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    ones, zeros = relax.const(np.ones(16, np.float32)), relax.const(np.zeros(16, np.float32))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            norm = bb.emit(relax.op.nn.rms_norm(x, ones, axes=[-1], epsilon=1e-6) if kind == "rms_norm" else
                           relax.op.nn.layer_norm(x, ones, zeros, axes=[-1], epsilon=1e-5))
            outs = [bb.emit(relax.op.matmul(norm, relax.const(rng.standard_normal((16, 8)).astype(np.float32))))
                    for _ in range(readers)]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    assert _kernels(bb.get()) == kernels


@pytest.mark.parametrize("arch", ["cgra-4x4"])
def test_a_row_too_deep_for_one_step_keeps_the_norm_kernel(arch):
    """A tiling that steps through the reduction cannot see the whole row: the root is refused
    and the norm runs as its own kernel, the result unchanged (within 1e-5 of float64)."""
    mod, _ = _normed_linear(16, 4096, 32, 1e-6, True, 0, lead=False)
    kernels = _kernels(mod, arch)
    assert "cgra.rms_norm_plain" in kernels and not any("linear_rms_norm" in k for k in kernels), kernels


def test_a_gemm_whose_vector_unit_is_busy_keeps_the_norm_kernel():
    """Swin's MLP (256 rows of 16, GELU's erf in the epilogue): the vector unit already bounds the
    GEMM, the panel programs of 32 row tiles cost what the norm's own kernel does: refused
    (folded it ran 28,104 cycles against 19,362 + 4,314 apart)."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((256, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            norm = bb.emit(relax.op.nn.layer_norm(x, relax.const(np.ones(16, np.float32)),
                                                  relax.const(np.zeros(16, np.float32)), axes=[-1], epsilon=1e-5))
            w = relax.const(rng.standard_normal((64, 16)).astype(np.float32))
            y = bb.emit(relax.op.add(relax.op.matmul(norm, relax.op.permute_dims(w)),
                                     relax.const(rng.standard_normal(64).astype(np.float32))))
            out = bb.emit_output(relax.op.nn.gelu(y))
        bb.emit_func_output(out)
    kernels = _kernels(bb.get())
    assert "cgra.layer_norm_plain" in kernels and not any("linear_layer_norm" in k for k in kernels), kernels


def test_a_causal_lm_reads_its_final_norm_in_the_lm_head():
    """Hugging Face's LlamaForCausalLM: the final norm's one reader is the lm_head, which takes it
    as a normed root (cgra.linear_rms_norm); with the layers' q / k / v (RoPE) and gate / up
    (gated) projections normalising theirs, no RMSNorm kernel is left. (tests/transformer_models.py's
    decoders have no head: their final norm is the output and keeps its kernel.)"""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tvm.relax.frontend.torch import from_exported_program
    from hf_models import randomised
    from transformer_models import DECODER, VOCAB

    class Logits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids, mask):
            return self.model(input_ids=ids, attention_mask=mask).logits

    config = transformers.LlamaConfig(num_key_value_heads=2, **DECODER)
    model = Logits(randomised(transformers.LlamaForCausalLM(config), 0)).eval()
    inputs = (torch.randint(0, VOCAB, (1, 16)), torch.ones(1, 16, dtype=torch.int64))
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(model, inputs))
    norms = sorted((p.kernel or "").split(" ")[0] for p in npu_backend.explain(mod, "cgra-8x8") if p.op == "nn.rms_norm")
    assert norms == ["cgra.linear_rms_norm"] + ["cgra.linear_rms_norm_gated"] * 2 + \
        ["cgra.linear_rms_norm_rope"] * 2, norms
