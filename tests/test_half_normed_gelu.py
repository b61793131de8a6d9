"""A bfloat16 / float16 fc1 + GELU whose pre-norm runs in the GEMM's prologue: one kernel
(kernels/gemm/half_row_norm.py's roots under half_bias.py's rounded activation).

HF's 16-bit GPT-2 / ViT MLP: `act(fc1(ln_2(x)))` in h, which PyTorch computes as the layer norm in
float32 rounded to h, the linear's float32 sum plus its bias rounded to h, the activation in
float32 on that value widened, rounded to h. Hypothesis holds the fused kernel, on every preset,
bit for bit to numpy's model of that sequence (ml_dtypes' roundings of the layer norm's float32
result, test_half_normed_linears._layer_panel_model: the panel centred once, or the norm's own
kernel's where the fold is refused; of the biased sum, of the simulator's GELU) through a signed permutation W (each
sum one panel value, exact in any order); the GPT-2 (matmul of W) and ViT (linear: W transposed)
forms, GELU's erf and tanh forms; and a linear's tanh (ViT's pooler) the same way, without a norm.
"""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from cgra_sim import special
from cgra_sim.mapping import sigmoid as fabric
from npu_backend.tools.workloads import numpy_dtype, relax_module, run
from test_half_normed_linears import _layer_panel_model

PRESETS = ["cgra-4x4", "cgra-8x8", "cgra-16x16"]
HALVES = ["bfloat16", "float16"]
#: GELU's two forms: the Relax op and the simulator's functions (VFUNC, FABRIC) either may run.
ACTS = {"gelu": (relax.op.nn.gelu, (special.gelu, fabric.gelu) if hasattr(fabric, "gelu") else (special.gelu,)),
        "gelu_tanh": (relax.op.nn.gelu_tanh, (special.gelu_tanh, fabric.gelu_tanh))}


def _module(dtype: str, rows: int, cols: int, gamma, beta, w, bias, act: str, linear: bool):
    """main(x_h) = astype(act(reshape(astype(astype(ln(x) @ W + b, h), float32))), h), ln the
    16-bit layer norm as half_casts.py writes it; W (cols, n) read as a matmul (GPT-2's Conv1D) or
    (n, cols) through permute_dims (ViT's nn.Linear); the bias a float32 constant of h values (the
    importer's widened bias)."""
    n = w.shape[0] if linear else w.shape[1]

    def body(bb, x):
        wide = bb.emit(relax.op.astype(x, "float32"))
        normed = bb.emit(relax.op.nn.layer_norm(wide, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=1e-5))
        rows_h = bb.emit(relax.op.reshape(bb.emit(relax.op.astype(normed, dtype)), (rows, cols)))
        weight = bb.emit(relax.op.permute_dims(relax.const(w, dtype))) if linear else relax.const(w, dtype)
        product = bb.emit(relax.op.matmul(rows_h, weight, out_dtype="float32"))
        summed = bb.emit(relax.op.add(relax.const(bias.astype(np.float32)), product))
        back = bb.emit(relax.op.astype(bb.emit(relax.op.astype(summed, dtype)), "float32"))
        activated = bb.emit(ACTS[act][0](bb.emit(relax.op.reshape(back, (1, rows, n)))))
        return bb.emit(relax.op.astype(activated, dtype))
    return relax_module([("x", (1, rows, cols), dtype)], body)


def _rounded(value, dtype: str) -> np.ndarray:
    return np.asarray(value, np.float32).astype(numpy_dtype(dtype)).astype(np.float32)


@settings(max_examples=6, deadline=None)  # two compiles each: about 5 s
@given(arch=st.sampled_from(PRESETS), dtype=st.sampled_from(HALVES), rows=st.integers(1, 40),
       cols=st.sampled_from([16, 32, 64]), act=st.sampled_from(sorted(ACTS)), linear=st.booleans(),
       offset=st.sampled_from([0.0, 20.0]), seed=st.integers(0, 2**16))
@example(arch="cgra-8x8", dtype="bfloat16", rows=32, cols=64, act="gelu_tanh", linear=False, offset=0.0, seed=0)  # GPT-2
@example(arch="cgra-8x8", dtype="bfloat16", rows=17, cols=64, act="gelu", linear=True, offset=0.0, seed=1)  # ViT
@example(arch="cgra-16x16", dtype="float16", rows=17, cols=64, act="gelu", linear=True, offset=20.0, seed=2)
@example(arch="cgra-4x4", dtype="float16", rows=32, cols=64, act="gelu_tanh", linear=False, offset=0.0, seed=3)
def test_a_16_bit_fc1_and_gelu_after_a_half_norm_prologue_are_the_models_rounding_sequence(
        arch, dtype, rows, cols, act, linear, offset, seed):
    rng = np.random.default_rng(seed)
    half = numpy_dtype(dtype)
    gamma, beta = rng.uniform(-2, 2, cols).astype(np.float32), rng.standard_normal(cols).astype(np.float32)
    x = (rng.standard_normal((1, rows, cols)) * 3 + offset).astype(half)
    perm, signs = rng.permutation(cols), rng.choice([-1.0, 1.0], cols)
    picks = np.zeros((cols, cols), np.float32)
    picks[perm, np.arange(cols)] = signs  # output column j reads panel column perm[j], signed
    bias = rng.uniform(-2, 2, cols).astype(half)
    w = picks.T.copy() if linear else picks
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(_module(dtype, rows, cols, gamma, beta, w.astype(half), bias, act, linear), arch),
                  [x])
    assert out.dtype == half and out.shape == (1, rows, cols)
    # the panel: the layer norm's float32 rows, rounded to h (test_half_normed_linears.py)
    folded = any("layer_norm" in k.name and "matmul" in k.name for k in prof.kernels)
    panel = _layer_panel_model(x.astype(np.float32).reshape(rows, cols), gamma, beta, 1e-5, arch, folded).astype(half)
    summed = _rounded(panel.astype(np.float32)[:, perm] * signs.astype(np.float32) + bias.astype(np.float32), dtype)
    got = out.astype(np.float32).reshape(rows, cols)
    assert any(np.array_equal(got, _rounded(gelu(summed), dtype)) for gelu in ACTS[act][1])
    names = [k.name for k in prof.kernels]
    # where the function unit computes the GELU (not cgra-4x4's tanh form) and the panel program
    # fits whole-depth tiles (row_norm.py), the norm, fc1, GELU and the roundings are one kernel;
    # x's widening is a cast kernel where the widened root's program is priced as dear as the
    # norm's own kernel (row_norm.check_row_norm: 17 rows on cgra-16x16)
    if arch != "cgra-4x4" and rows >= 17:
        fused = [name for name in names if "layer_norm" in name and "gelu" in name]
        assert len(fused) == 1 and all(name == "fused_relax_astype_cgra" for name in names if name not in fused), names


def _pooler_module(dtype: str, w, bias, rows: int):
    """main(x_h) = astype(tanh(astype(astype(x W^T + b, h), float32)), h): ViT's pooler as the
    importer and half_casts.py write a 16-bit one."""
    def body(bb, x):
        product = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(relax.const(w, dtype))), out_dtype="float32"))
        summed = bb.emit(relax.op.add(product, relax.const(bias.astype(np.float32))))
        back = bb.emit(relax.op.astype(bb.emit(relax.op.astype(summed, dtype)), "float32"))
        return bb.emit(relax.op.astype(bb.emit(relax.op.tanh(back)), dtype))
    return relax_module([("x", (rows, w.shape[1]), dtype)], body)


@settings(max_examples=4, deadline=None)  # a compile each: about 3 s
@given(arch=st.sampled_from(PRESETS), dtype=st.sampled_from(HALVES), rows=st.integers(1, 20),
       seed=st.integers(0, 2**16))
@example(arch="cgra-8x8", dtype="bfloat16", rows=1, seed=0)  # ViT's pooler: the CLS row
@example(arch="cgra-4x4", dtype="float16", rows=17, seed=1)
def test_a_16_bit_linear_and_its_tanh_are_one_kernel_bit_for_bit(arch, dtype, rows, seed):
    """The biased sum rounded, widened, tanh (the VFUNC), rounded: one kernel, the model's
    values (inputs whose sums are exact in float32)."""
    rng = np.random.default_rng(seed)
    half = numpy_dtype(dtype)
    x = (rng.integers(-16, 17, (rows, 64)) / 16).astype(half)
    w = (rng.integers(-16, 17, (32, 64)) / 64).astype(half)
    bias = (rng.integers(-16, 17, 32) / 8 + rng.uniform(-1, 1, 32) / 64).astype(half)
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(_pooler_module(dtype, w, bias, rows), arch), [x])
    summed = _rounded(x.astype(np.float32) @ w.astype(np.float32).T + bias.astype(np.float32), dtype)
    np.testing.assert_array_equal(out.astype(np.float32), _rounded(special.tanh(summed), dtype))
    assert len(prof.kernels) == 1, [k.name for k in prof.kernels]
