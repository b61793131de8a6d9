"""A bfloat16 / float16 post-norm in the epilogue of the GEMM before it (kernels/gemm/half_post_norm.py).

astype(layer_norm(astype(reshape(astype(x_h W_h^T + b_h, h)) + r_h, float32), gamma, beta), h),
PyTorch's arithmetic for HF BERT's `LayerNorm(dense(h) + x)` in h, is one GEMM kernel. Hypothesis
holds it bit for bit to numpy's model of that rounding sequence (ml_dtypes): the linear's float32
sum rounded to h, the residual added in float32 and rounded to h, widened, the float32 layer norm
kernel's own result on that, rounded to h; the GEMM's sum exact in any order (small integers
times a power of two), so that the model's is the kernel's.
"""

from __future__ import annotations

import contextlib
import pathlib
import sys

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.kernels import registry
from npu_backend.kernels.gemm import gemm
from npu_backend.tools.workloads import numpy_dtype, relax_module, run

PRESETS = ["cgra-4x4", "cgra-8x8"]
HALVES = ["bfloat16", "float16"]


def _module(dtype: str, rows: int, depth: int, n: int, eps: float, w, b, gamma, beta, lead: bool, swapped: bool):
    """main(x, r) = astype(layer_norm(astype(reshape(astype(x W^T + b, h)) + r, f32), gamma, beta), h):
    TVM's import of a 16-bit linear, its residual add and layer norm, as half_casts.py leaves it."""
    out_shape = (1, rows, n) if lead else (rows, n)

    def body(bb, x, r):
        product = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(relax.const(w, dtype))), out_dtype="float32"))
        biased = bb.emit(relax.op.add(product, bb.emit(relax.op.astype(relax.const(b, dtype), "float32"))))
        rounded = bb.emit(relax.op.astype(biased, dtype))
        shaped = bb.emit(relax.op.reshape(rounded, out_shape)) if lead else rounded
        added = bb.emit(relax.op.add(r, shaped) if swapped else relax.op.add(shaped, r))
        wide = bb.emit(relax.op.astype(added, "float32"))
        normed = bb.emit(relax.op.nn.layer_norm(wide, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=eps))
        return bb.emit(relax.op.astype(normed, dtype))
    return relax_module([("x", (rows, depth), dtype), ("r", out_shape, dtype)], body)


@contextlib.contextmanager
def _fold_taken():
    """The fold taken whatever its price (post_norm_cost.check_post_norm refuses the shapes where
    the kernels apart are estimated cheaper, e.g. one row): its bits are what is tested here."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gemm, "check_post_norm", lambda *args: None)
        # (and its tilings kept apart: registry.tiling_of would hand them to a later priced compile)
        patch.setattr(registry, "_TILINGS", {})
        yield


def _model(x, w, b, r, dtype: str, norm):
    """numpy's model: the exact float32 sum plus b rounded to h, plus r rounded to h, widened, the
    float32 norm kernel's result (`norm`) on it rounded to h."""
    half = numpy_dtype(dtype)
    f32 = np.float32
    linear = (x.astype(f32) @ w.astype(f32).T + b.astype(f32)).astype(half)
    added = (linear.astype(f32) + r.reshape(linear.shape).astype(f32)).astype(half)
    return norm(added.astype(f32)).astype(half)


def _inputs(rng, dtype: str, rows: int, depth: int, n: int, scale: float, offset: float):
    """x, W of small integers times powers of two (every product and sum exact in float32), b and the
    residual r of random h values around `offset`."""
    half = numpy_dtype(dtype)
    x = (rng.integers(-8, 9, (rows, depth)) * 2.0 ** rng.integers(-3, 1)).astype(half)
    w = (rng.integers(-8, 9, (n, depth)) * 2.0 ** rng.integers(-6, -2)).astype(half)
    b = (rng.standard_normal(n) * scale).astype(half)
    r = (rng.standard_normal((rows, n)) * scale + offset).astype(half)
    return x, w, b, r


@settings(max_examples=8, deadline=None)  # two compiles each: a few seconds
@given(arch=st.sampled_from(PRESETS), dtype=st.sampled_from(HALVES), rows=st.integers(1, 40),
       depth=st.sampled_from([16, 64, 128]), n=st.sampled_from([16, 32, 64]),
       eps=st.sampled_from([1e-12, 1e-5, 1e-2]), lead=st.booleans(), swapped=st.booleans(),
       scale=st.sampled_from([0.1, 1.0, 8.0]), offset=st.sampled_from([0.0, 20.0]), seed=st.integers(0, 2**16))
@example(arch="cgra-8x8", dtype="bfloat16", rows=32, depth=64, n=64, eps=1e-12, lead=True, swapped=False,
         scale=1.0, offset=0.0, seed=0)  # BERT's attention output
@example(arch="cgra-8x8", dtype="bfloat16", rows=32, depth=128, n=64, eps=1e-12, lead=True, swapped=True,
         scale=1.0, offset=0.0, seed=1)  # its MLP's down projection
@example(arch="cgra-4x4", dtype="float16", rows=5, depth=16, n=16, eps=1e-5, lead=False, swapped=False,
         scale=8.0, offset=20.0, seed=2)
def test_a_16_bit_post_norm_runs_in_its_gemm_bit_for_bit(arch, dtype, rows, depth, n, eps, lead, swapped, scale,
                                                           offset, seed):
    rng = np.random.default_rng(seed)
    x, w, b, r = _inputs(rng, dtype, rows, depth, n, scale, offset)
    gamma = rng.uniform(0.5, 2, n).astype(np.float32)
    beta = rng.uniform(-1, 1, n).astype(np.float32)
    norm_mod = relax_module([("v", (rows, n), "float32")], lambda bb, v: bb.emit(relax.op.nn.layer_norm(
        v, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=eps)))
    norm_ex = npu_backend.compile(norm_mod, arch)
    expected = _model(x, w, b, r, dtype, lambda v: run(norm_ex, [v]))
    residual = r.reshape((1, rows, n)) if lead else r
    with _fold_taken(), npu_backend.profile() as prof:
        out = run(npu_backend.compile(_module(dtype, rows, depth, n, eps, w, b, gamma, beta, lead, swapped), arch),
                  [x, residual])
    names = [k.name for k in prof.kernels]
    assert len(names) == 1 and "layer_norm" in names[0], names
    np.testing.assert_array_equal(out.reshape(rows, n).view(np.uint16), expected.view(np.uint16))


def _rms_module(dtype: str, rows: int, depth: int, n: int, eps: float, w, g, weight_first: bool):
    """main(x, r) = g * astype(rms_norm(reshape(x W^T) + r, R.ones), h), x and W in h, r float32: a
    16-bit Llama's down projection (normalise/half_linears.py), residual and final norm."""
    def body(bb, x, r):
        product = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(relax.const(w, dtype))), out_dtype="float32"))
        added = bb.emit(relax.op.add(r, bb.emit(relax.op.reshape(product, (1, rows, n)))))
        ones = bb.emit(relax.op.ones(relax.ShapeExpr([n]), "float32"))
        rounded = bb.emit(relax.op.astype(bb.emit(relax.op.nn.rms_norm(added, ones, axes=[-1], epsilon=eps)), dtype))
        gamma = relax.const(g, dtype)
        return bb.emit(relax.op.multiply(gamma, rounded) if weight_first else relax.op.multiply(rounded, gamma))
    return relax_module([("x", (rows, depth), dtype), ("r", (1, rows, n), "float32")], body)


@settings(max_examples=6, deadline=None)
@given(arch=st.sampled_from(PRESETS), dtype=st.sampled_from(HALVES), rows=st.integers(1, 40),
       depth=st.sampled_from([16, 128]), n=st.sampled_from([16, 64]), eps=st.sampled_from([1e-6, 1e-5]),
       weight_first=st.booleans(), scale=st.sampled_from([0.1, 1.0, 8.0]), seed=st.integers(0, 2**16))
@example(arch="cgra-8x8", dtype="bfloat16", rows=32, depth=128, n=64, eps=1e-6, weight_first=True, scale=1.0,
         seed=0)  # Llama's final norm
@example(arch="cgra-4x4", dtype="float16", rows=3, depth=16, n=16, eps=1e-5, weight_first=False, scale=8.0, seed=1)
def test_a_16_bit_llamas_final_norm_runs_in_its_down_projection_bit_for_bit(arch, dtype, rows, depth, n, eps,
                                                                            weight_first, scale, seed):
    """The float32 sum plus the float32 residual, the float32 RMSNorm kernel's result on it
    (weight ones: exact) rounded to h, times g rounded to h: bit for bit."""
    rng = np.random.default_rng(seed)
    half = numpy_dtype(dtype)
    x, w, _, r = _inputs(rng, dtype, rows, depth, n, scale, 0.0)
    r = (rng.standard_normal((1, rows, n)) * scale).astype(np.float32)
    g = rng.uniform(-2, 2, n).astype(half)
    norm_mod = relax_module([("v", (rows, n), "float32")], lambda bb, v: bb.emit(relax.op.nn.rms_norm(
        v, relax.const(np.ones(n, np.float32)), axes=[-1], epsilon=eps)))
    summed = (x.astype(np.float32) @ w.astype(np.float32).T + r.reshape(rows, n)).astype(np.float32)
    normed = run(npu_backend.compile(norm_mod, arch), [summed]).astype(half)
    expected = (normed.astype(np.float32) * g.astype(np.float32)).astype(half)
    with _fold_taken(), npu_backend.profile() as prof:
        out = run(npu_backend.compile(_rms_module(dtype, rows, depth, n, eps, w, g, weight_first), arch), [x, r])
    names = [k.name for k in prof.kernels]
    assert len(names) == 1 and "rms_norm" in names[0], names
    np.testing.assert_array_equal(out.reshape(rows, n).view(np.uint16), expected.view(np.uint16))


@pytest.mark.slow  # about 60 s each: an export and a compile
@pytest.mark.parametrize("name, fused", [("bert", 4), ("llama", 1)])
def test_bf16_bert_and_llama_run_their_post_norms_in_their_gemms_within_the_formats_tolerance(name, fused):
    """BERT's four post-norms (two layers: attention output, MLP) and Llama's final norm run in
    the GEMM before them: the only norm kernel left on its own is BERT's embedding norm. Llama's
    last down projection on cgra-8x8 rounds its own A panel and carries the final norm
    (test_a_rounded_operands_fold_is_the_cheapest_way): no cast kernel. Within 2 ** -5 of the
    output's scale of PyTorch's bf16 run, as bench_half.py's other bf16 runs."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_half import run as run_model

    _, _, error, prof = run_model(name, "bfloat16", "cgra-8x8", 32)
    assert error <= 2.0 ** -5
    norm = "layer_norm" if name == "bert" else "rms_norm"
    # (Llama's pre-norms run in the prologues of the GEMMs after them: the norm before the matmul)
    assert sum(0 <= k.name.find("matmul") < k.name.find(norm) for k in prof.kernels) == fused
    alone = [k.name for k in prof.kernels if norm in k.name and "matmul" not in k.name]
    assert len(alone) == (1 if name == "bert" else 0), alone
    assert not [k.name for k in prof.kernels if k.name == "fused_relax_astype_cgra"], prof.kernels


def _rounded_rms_module(dtype: str, rows: int, depth: int, n: int, eps: float, w, g):
    """main(x, r) = g * astype(rms_norm(reshape(astype(x, h) W^T) + r, R.ones), h), x and r float32:
    a bf16 Llama's last down projection of `act(gate) * up` rounded to h (half_linears.py)."""
    def body(bb, x, r):
        narrow = bb.emit(relax.op.astype(x, dtype))
        product = bb.emit(relax.op.matmul(narrow, bb.emit(relax.op.permute_dims(relax.const(w, dtype))),
                                          out_dtype="float32"))
        added = bb.emit(relax.op.add(r, bb.emit(relax.op.reshape(product, (1, rows, n)))))
        ones = bb.emit(relax.op.ones(relax.ShapeExpr([n]), "float32"))
        rounded = bb.emit(relax.op.astype(bb.emit(relax.op.nn.rms_norm(added, ones, axes=[-1], epsilon=eps)), dtype))
        return bb.emit(relax.op.multiply(relax.const(g, dtype), rounded))
    return relax_module([("x", (rows, depth), "float32"), ("r", (1, rows, n), "float32")], body)


def _rounding_inputs(rng, dtype: str, rows: int, depth: int):
    """float32 x of random low bits over 2^-10 .. 2^10 (many round up, down, to even), a tenth
    exact ties of h: its panel's rounding is what the test holds to numpy's."""
    x = (rng.standard_normal((rows, depth)) * 2.0 ** rng.integers(-10, 10, (rows, depth))).astype(np.float32)
    keep, tie = (0xFFFF0000, 0x8000) if dtype == "bfloat16" else (0xFFFFE000, 0x1000)
    ties = ((x.view(np.uint32) & np.uint32(keep)) | np.uint32(tie)).view(np.float32)
    return np.where(rng.random((rows, depth)) < 0.1, ties, x)


@settings(max_examples=6, deadline=None)
@given(arch=st.sampled_from(PRESETS), dtype=st.sampled_from(HALVES), rows=st.integers(1, 40),
       depth=st.sampled_from([16, 48, 128]), n=st.sampled_from([16, 64]), eps=st.sampled_from([1e-6, 1e-5]),
       seed=st.integers(0, 2**16))
@example(arch="cgra-8x8", dtype="bfloat16", rows=32, depth=128, n=64, eps=1e-6, seed=0)  # Llama's last layer
@example(arch="cgra-4x4", dtype="float16", rows=3, depth=16, n=16, eps=1e-5, seed=1)
def test_a_rounded_operands_final_norm_runs_in_its_down_projection_bit_for_bit(arch, dtype, rows, depth, n, eps,
                                                                               seed):
    """astype(x, h) rounded on the A panel (half_rounded_lhs.py) before the RMS form: no cast
    kernel. W has two entries a row, ± powers of two, so that each float32 sum is the rounded
    inputs' (exact products) rounded once in any order: numpy's; then as the test above."""
    rng = np.random.default_rng(seed)
    half = numpy_dtype(dtype)
    x = _rounding_inputs(rng, dtype, rows, depth)
    w = np.zeros((n, depth), np.float32)
    for col in range(2):
        w[np.arange(n), rng.integers(0, depth, n)] += rng.choice([-1, 1], n) * 2.0 ** rng.integers(-3, 2, n)
    w = w.astype(half)
    r = (rng.standard_normal((1, rows, n)) * 4).astype(np.float32)
    g = rng.uniform(-2, 2, n).astype(half)
    norm_mod = relax_module([("v", (rows, n), "float32")], lambda bb, v: bb.emit(relax.op.nn.rms_norm(
        v, relax.const(np.ones(n, np.float32)), axes=[-1], epsilon=eps)))
    summed = (x.astype(half).astype(np.float32) @ w.astype(np.float32).T + r.reshape(rows, n)).astype(np.float32)
    normed = run(npu_backend.compile(norm_mod, arch), [summed]).astype(half)
    expected = (normed.astype(np.float32) * g.astype(np.float32)).astype(half)
    with _fold_taken(), npu_backend.profile() as prof:
        out = run(npu_backend.compile(_rounded_rms_module(dtype, rows, depth, n, eps, w, g), arch), [x, r])
    names = [k.name for k in prof.kernels]
    assert len(names) == 1 and names[0].startswith("fused_relax_astype") and "rms_norm" in names[0], names
    np.testing.assert_array_equal(out.reshape(rows, n).view(np.uint16), expected.view(np.uint16))


#: Llama bf16's last down projection and final norm (32 x 128 x 64), run (cycles) as the rounded
#: operand's fold / the GEMM rounding its panel + the norm kernel / a cast kernel + the plain fold:
#: cgra-4x4 15,184 / 10,760 + 2,685 / 2,320 + 9,642; cgra-8x8 4,752 / 3,408 + 1,501 / 1,368 + 3,856;
#: cgra-16x16 2,692 / 1,642 + 964 (within HALF_MARGIN of the fold's estimate) / 880 + 2,018.
#: The cheapest is taken (the fold within HALF_MARGIN): its kernels' names and cycles.
CHEAPEST = {"cgra-4x4": (("fused_relax_astype_cgra", "fused_relax_permute_dims_relax_matmul"), 11_962),
            "cgra-8x8": (("fused_relax_astype_relax_permute_dims_relax_matmul",), 4_752),
            "cgra-16x16": (("fused_relax_astype_relax_permute_dims_relax_matmul",), 2_692)}


@pytest.mark.parametrize("arch", list(CHEAPEST))
def test_a_rounded_operands_fold_is_the_cheapest_way(arch):
    """Llama bf16's last down projection and final norm (32 x 128 x 64) run the cheapest of the
    three ways (CHEAPEST): the fold rounding the operand on its A panel where it pays (cgra-8x8,
    16x16); else the cast kernel + the plain fold against the GEMM rounding its panel + the norm
    kernel, each priced (rounded_lhs_cost.py): on cgra-4x4 the cast kernel and the fold (until
    the GEMM's estimate counted its float32 panel, 9,262 cycles against 10,760 run, the GEMM
    and the norm kernel apart ran: 13,445 cycles; on cgra-8x8 4,909)."""
    rows, depth, n = 32, 128, 64
    rng = np.random.default_rng(0)
    w, g = rng.standard_normal((n, depth)).astype(numpy_dtype("bfloat16")), np.ones(n, numpy_dtype("bfloat16"))
    x = rng.standard_normal((rows, depth)).astype(np.float32)
    r = rng.standard_normal((1, rows, n)).astype(np.float32)
    with npu_backend.profile() as prof:
        run(npu_backend.compile(_rounded_rms_module("bfloat16", rows, depth, n, 1e-6, w, g), arch), [x, r])
    names, (starts, cycles) = [k.name for k in prof.kernels], CHEAPEST[arch]
    assert len(names) == len(starts) and all(name.startswith(start) for name, start in zip(names, starts)), names
    assert "rms_norm" in names[-1], names
    assert sum(k.cycles for k in prof.kernels) == cycles, [(k.name, k.cycles) for k in prof.kernels]
