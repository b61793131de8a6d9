"""Attention's q / k / v projections of one input as one linear (normalise/qkv_merges.py).

A Hypothesis property test against the unrewritten module on the host (any head size, heads per
projection, with and without biases), the forms that must stay apart (two inputs, a projection
read by more than its reshape into heads), and on the NPU: one GEMM kernel for the three."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import npu_backend
from models import run
from npu_backend.normalise.qkv_merges import qkv_merged


def projections_model(heads, s=8, k=16, d=4, bias=False, inputs=1, extra_reader=False, seed=0, windows=1):
    """main(x[, x2]): for each entry of `heads`, linear(x, W_i [+ b_i]) cut into heads_i heads of
    `d` and transposed to (1, heads_i, s, d) as torch.export writes HF's q / k / v projections;
    out: the parts concatenated along the head axis (with `extra_reader`, plus the first
    projection's output read once more; `windows`: the s rows cut into that many windows of
    tokens, (windows, s / windows, heads_i, d), as Swin's are). Returns (module, input arrays)."""
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((1, s, k)).astype("float32") for _ in range(inputs)]
    params = [relax.Var(f"x{i}", relax.TensorType((1, s, k), "float32")) for i in range(inputs)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            parts, first = [], None
            for index, h in enumerate(heads):
                w = (rng.standard_normal((h * d, k)) / np.sqrt(k)).astype("float32")
                flat = bb.emit(relax.op.reshape(params[index % inputs], (s, k)))
                y = bb.emit(relax.op.matmul(flat, bb.emit(relax.op.permute_dims(relax.const(w))), out_dtype="float32"))
                if bias:
                    y = bb.emit(relax.op.add(relax.const(rng.standard_normal(h * d).astype("float32")), y))
                first = y if first is None else first
                y3 = bb.emit(relax.op.reshape(y, (windows, s // windows, h * d)))
                y4 = bb.emit(relax.op.reshape(y3, (windows, s // windows, h, d)))
                parts.append(bb.emit(relax.op.permute_dims(y4, [0, 2, 1, 3])))
            out = bb.emit(relax.op.concat(parts, axis=1))
            if extra_reader:
                again = bb.emit(relax.op.reshape(first, (1, heads[0], s, d)))
                out = bb.emit(relax.op.add(out, bb.emit(relax.op.concat(
                    [again] + [bb.emit(relax.op.zeros((1, h, s, d), "float32")) for h in heads[1:]], axis=1))))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get(), xs


def on_host(mod, xs):
    return run(tvm.compile(mod, target="llvm"), xs)


def matmuls(mod) -> int:
    return sum(1 for b in mod["main"].body.blocks[0].bindings
               if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.matmul")


@given(heads=st.lists(st.integers(1, 4), min_size=2, max_size=3), d=st.sampled_from([2, 4, 8]),
       s=st.integers(1, 9), bias=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_merged_projections_equal_the_separate_ones(heads, d, s, bias, seed):
    mod, xs = projections_model(heads, s=s, d=d, bias=bias, seed=seed)
    merged = qkv_merged(mod)
    assert matmuls(mod) == len(heads) and matmuls(merged) == 1
    np.testing.assert_allclose(on_host(merged, xs), on_host(mod, xs), rtol=1e-6, atol=1e-6)


@given(heads=st.lists(st.integers(1, 3), min_size=2, max_size=3), windows=st.sampled_from([2, 4]),
       tokens=st.integers(1, 4), bias=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_swins_windowed_projections_merge_too(heads, windows, tokens, bias, seed):
    """Swin's projections of windows of tokens, read as (windows, tokens, heads, d)."""
    mod, xs = projections_model(heads, s=windows * tokens, d=4, bias=bias, seed=seed, windows=windows)
    merged = qkv_merged(mod)
    assert matmuls(merged) == 1
    np.testing.assert_allclose(on_host(merged, xs), on_host(mod, xs), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", ["two_inputs", "extra_reader"])
def test_projections_that_must_stay_apart(case):
    heads = [2, 1, 1]
    mod, xs = projections_model(heads, inputs=2 if case == "two_inputs" else 1,
                                extra_reader=case == "extra_reader")
    merged = qkv_merged(mod)
    # two inputs: x0 has projections 0 and 2, which still merge; an extra reader keeps its one apart
    assert matmuls(merged) == 2
    np.testing.assert_allclose(on_host(merged, xs), on_host(mod, xs), rtol=1e-6, atol=1e-6)


def test_q_k_v_run_as_one_gemm_kernel_on_the_npu():
    mod, xs = projections_model([4, 2, 2], s=32, k=64, d=16, bias=True)
    ref = on_host(mod, xs)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), xs)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    assert sum("matmul" in k.source_ops for k in prof.kernels) == 1


@pytest.mark.parametrize("name", ["llama", "gemma", "gptj"])
def test_a_decoders_projections_of_one_input_are_one_linear(name):
    """Six matmuls a layer in Hugging Face's Llama and Gemma (q / k / v as one, the attention's
    two, o_proj, gate / up as one, down) and GPT-J (q / k / v as one, the attention's two,
    out_proj, fc_in, fc_out: fc_in reads the same normed input as q / k / v, but not into heads,
    so it stays apart)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tvm.relax.frontend.torch import from_exported_program

    from npu_backend.normalise.stage import normalise
    from npu_backend.options import CompileOptions
    from transformer_models import build

    model, inputs = build(name)
    with torch.no_grad():
        mod = from_exported_program(torch.export.export(model, inputs))
    mod = normalise(mod, npu_backend.load_arch("cgra-8x8"), CompileOptions())
    assert matmuls(mod) == 2 * 6


def half_projections_model(heads, dtype, s=8, k=16, d=4, seed=0):
    """projections_model's projections in a 16-bit float `dtype` as TVM's importer and
    half_casts.py write a bf16 / fp16 BERT's or ViT's: astype(astype(add(matmul(x_h, W_h^T,
    out_dtype=float32), astype(b_h, float32)), h), float32), then cut into heads."""
    import ml_dtypes

    rng, h_dtype = np.random.default_rng(seed), np.dtype(getattr(ml_dtypes, dtype, dtype))  # numpy's bfloat16
    x = rng.standard_normal((1, s, k)).astype(h_dtype)
    param = relax.Var("x", relax.TensorType((1, s, k), dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [param]):
        with bb.dataflow():
            flat, parts = bb.emit(relax.op.reshape(param, (s, k))), []
            for h in heads:
                w = (rng.standard_normal((h * d, k)) / np.sqrt(k)).astype(h_dtype)
                b = bb.emit(relax.op.astype(relax.const(rng.standard_normal(h * d).astype(h_dtype), dtype), "float32"))
                y = bb.emit(relax.op.matmul(flat, bb.emit(relax.op.permute_dims(relax.const(w, dtype))),
                                            out_dtype="float32"))
                y = bb.emit(relax.op.astype(bb.emit(relax.op.astype(bb.emit(relax.op.add(b, y)), dtype)), "float32"))
                y4 = bb.emit(relax.op.reshape(bb.emit(relax.op.reshape(y, (1, s, h * d))), (1, s, h, d)))
                parts.append(bb.emit(relax.op.permute_dims(y4, [0, 2, 1, 3])))
            out = bb.emit_output(bb.emit(relax.op.concat(parts, axis=1)))
        bb.emit_func_output(out)
    return bb.get(), [x]


@settings(max_examples=10, deadline=None)  # two host compiles each
@given(heads=st.lists(st.integers(1, 4), min_size=2, max_size=3), d=st.sampled_from([2, 4, 8]),
       s=st.integers(1, 9), dtype=st.sampled_from(["bfloat16", "float16"]), seed=st.integers(0, 2 ** 16))
def test_rounded_half_projections_merge_bit_for_bit(heads, d, s, dtype, seed):
    """A 16-bit model's rounded and widened-back projections (qkv_merges.py's module doc): one
    linear, each column rounded once as before, so the same bits on the host."""
    mod, xs = half_projections_model(heads, dtype, s=s, d=d, seed=seed)
    merged = qkv_merged(mod)
    assert matmuls(mod) == len(heads) and matmuls(merged) == 1
    np.testing.assert_array_equal(on_host(merged, xs), on_host(mod, xs))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_rounded_half_projections_run_as_one_gemm_kernel_on_the_npu(dtype):
    """On cgra-8x8: one GEMM kernel (cgra.linear_bias_rounded_wide) for the three, within one
    rounding of the 16-bit dtype of the host's run (the GEMM's summation order may differ)."""
    mod, xs = half_projections_model([4, 2, 2], dtype, s=32, k=64, d=16)
    ref = on_host(mod, xs)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, "cgra-8x8"), xs)
    ulp = 2.0 ** -7 if dtype == "bfloat16" else 2.0 ** -10
    np.testing.assert_allclose(out, ref, rtol=ulp, atol=ulp * np.abs(ref).max())
    assert sum("matmul" in k.source_ops for k in prof.kernels) == 1
