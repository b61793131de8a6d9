"""A bfloat16 / float16 model's RMSNorm or layer norm folded into the linear that reads it
(normalise/half_normed_linears.py, kernels/gemm/half_row_norm.py).

HF's `weight * rms_norm(x.float()).to(h)` before a linear, multiply(g, astype(rms_norm(x, ones),
h)) @ W, is one GEMM kernel whose A panel runs the norm kernel's half program: the float32 norm,
rounded to h (nearest even), times g in h (the exact float32 product, rounded). Hypothesis holds
it, on every preset, bit for bit to numpy's model of that arithmetic (ml_dtypes' rounding of the
float32 norm kernel's result) through a signed permutation, float32's summation bound through a
random W; and the model to float64 within the format's bound. A layer norm
(astype(layer_norm(astype(x_h, float32) or x, gamma, beta), h), PyTorch's CPU arithmetic: in
float32, gamma and beta applied, rounded once) likewise, its panel centring the rows once
(half_row_norm.centred_once): numpy's centring, then the float32 RMSNorm kernel plus beta.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tvm
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from npu_backend.normalise.half_normed_linears import half_norms_into_linears
from npu_backend.tools.workloads import numpy_dtype, relax_module, run

PRESETS = ["cgra-4x4", "cgra-8x8", "cgra-16x16"]
HALVES = ["bfloat16", "float16"]
#: The unit roundoff of each format: half the distance from 1 to the next value.
UNIT = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}


def _module(dtype: str, rows: int, cols: int, n: int, eps: float, g, w, gamma_first: bool, lead: bool):
    """main(x) = reshape(g * astype(rms_norm(x, ones), h)) @ W^T in float32, x float32 (1, rows, cols)
    or (rows, cols): the graph rms_norms.py and half_casts.py leave of HF's 16-bit norm and linear."""
    def body(bb, x):
        normed = bb.emit(relax.op.nn.rms_norm(x, relax.const(np.ones(cols, np.float32)), axes=[-1], epsilon=eps))
        rounded = bb.emit(relax.op.astype(normed, dtype))
        gamma = relax.const(g, dtype)
        scaled = bb.emit(relax.op.multiply(gamma, rounded) if gamma_first else relax.op.multiply(rounded, gamma))
        flat = bb.emit(relax.op.reshape(scaled, (rows, cols))) if lead else scaled
        return bb.emit(relax.op.matmul(flat, bb.emit(relax.op.permute_dims(relax.const(w, dtype))), out_dtype="float32"))
    return relax_module([("x", (1, rows, cols) if lead else (rows, cols), "float32")], body)


def _panel_model(wide, g, dtype: str):
    """numpy's model of the panel: the float32 norm rounded to h, times g (exact in float32), rounded."""
    half = numpy_dtype(dtype)
    return (wide.astype(half).astype(np.float32) * g.astype(np.float32)).astype(half)


def _folded(prof, rows: int, arch: str) -> None:
    """The norm ran in the GEMM's panel: one kernel. At fewer rows than a model's 17 (ViT) or 32 the
    fold may be refused where its program costs as much as the norm's own kernel (row_norm.py's
    check_row_norm: one row of 64 on cgra-4x4), and on cgra-4x4 where no whole-depth tile has room
    for the program (row_norm.panel_bytes); then the norm is a kernel of its own."""
    names = [k.name for k in prof.kernels]
    assert len(names) == 1 or ((rows < 17 or arch == "cgra-4x4") and len(names) == 2), names


def _npu(mod, x, arch: str):
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(mod, arch), [x])
    return out, prof


@settings(max_examples=6, deadline=None)  # three compiles each: about 5 s
@given(arch=st.sampled_from(PRESETS), dtype=st.sampled_from(HALVES), rows=st.integers(1, 40),
       cols=st.sampled_from([16, 32, 64]), n=st.sampled_from([16, 64, 128, 256]), eps=st.sampled_from([1e-6, 1e-5]),
       gamma_first=st.booleans(), lead=st.booleans(), scale=st.sampled_from([1e-2, 1.0, 30.0]),
       seed=st.integers(0, 2**16))
@example(arch="cgra-8x8", dtype="bfloat16", rows=32, cols=64, n=128, eps=1e-6, gamma_first=True, lead=True,
         scale=1.0, seed=0)  # Llama's q / k / v
@example(arch="cgra-16x16", dtype="float16", rows=32, cols=64, n=256, eps=1e-6, gamma_first=False, lead=True,
         scale=30.0, seed=1)  # its gate / up
@example(arch="cgra-4x4", dtype="bfloat16", rows=7, cols=16, n=16, eps=1e-5, gamma_first=True, lead=False,
         scale=1e-2, seed=2)
def test_a_16_bit_rmsnorm_before_a_linear_is_the_gemms_panel_bit_for_bit(arch, dtype, rows, cols, n, eps, gamma_first,
                                                                          lead, scale, seed):
    """Through a signed permutation W every output is one panel value (its sum exact in any order):
    bit for bit numpy's model of the panel. Through a random W, within float32's summation bound
    of the model's panel times W (the products of two 16-bit floats are exact in float32); the
    panel model itself within two roundings of float64's norm times g."""
    rng = np.random.default_rng(seed)
    half = numpy_dtype(dtype)
    g = rng.uniform(-2, 2, cols).astype(half)
    x = (rng.standard_normal((1, rows, cols) if lead else (rows, cols)) * scale).astype(np.float32)
    # numpy's model of the panel, from the float32 norm kernel's own result
    norm = relax_module([("x", (rows, cols), "float32")], lambda bb, v: bb.emit(relax.op.nn.rms_norm(
        v, relax.const(np.ones(cols, np.float32)), axes=[-1], epsilon=eps)))
    panel = _panel_model(run(npu_backend.compile(norm, arch), [x.reshape(rows, cols)]), g, dtype)
    perm = rng.permutation(cols)
    signs = rng.choice([-1.0, 1.0], cols)
    picks = np.zeros((cols, cols), np.float32)
    picks[np.arange(cols), perm] = signs  # output column j reads panel column perm[j], signed
    out, prof = _npu(_module(dtype, rows, cols, cols, eps, g, picks.astype(half), gamma_first, lead), x, arch)
    _folded(prof, rows, arch)
    np.testing.assert_array_equal(out, panel.astype(np.float32)[:, perm] * signs.astype(np.float32))
    w = (rng.standard_normal((n, cols)) / np.sqrt(cols)).astype(half)
    out, prof = _npu(_module(dtype, rows, cols, n, eps, g, w, gamma_first, lead), x, arch)
    _folded(prof, rows, arch)
    exact, magnitude = (p.astype(np.float64) @ q.astype(np.float64).T for p, q in ((panel, w), (np.abs(panel), np.abs(w))))
    assert np.all(np.abs(out.astype(np.float64) - exact) <= cols * 2.0 ** -24 * magnitude + 1e-38)
    # and the model against float64: each panel value within two roundings of the exact norm times g
    normed = x.reshape(rows, cols).astype(np.float64)
    normed = normed / np.sqrt((normed ** 2).mean(-1, keepdims=True) + eps) * g.astype(np.float64)
    bound = (2 * UNIT[dtype] + UNIT[dtype] ** 2 + 1e-5) * np.abs(normed) + 1e-30
    assert np.all(np.abs(panel.astype(np.float64) - normed) <= bound)


def _layer_module(dtype: str, rows: int, cols: int, n: int, eps: float, gamma, beta, w, widened: bool):
    """main(x) = astype(layer_norm(astype(x_h, float32) or x, gamma, beta), h) @ W^T in float32:
    half_casts.py's form of PyTorch's 16-bit layer norm before a linear."""
    def body(bb, x):
        x = bb.emit(relax.op.astype(x, "float32")) if widened else x
        normed = bb.emit(relax.op.nn.layer_norm(x, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=eps))
        flat = bb.emit(relax.op.reshape(bb.emit(relax.op.astype(normed, dtype)), (rows, cols)))
        return bb.emit(relax.op.matmul(flat, bb.emit(relax.op.permute_dims(relax.const(w, dtype))), out_dtype="float32"))
    return relax_module([("x", (1, rows, cols), dtype if widened else "float32")], body)


@settings(max_examples=6, deadline=None)  # three compiles each: about 5 s
@given(arch=st.sampled_from(PRESETS), dtype=st.sampled_from(HALVES), rows=st.integers(1, 40),
       cols=st.sampled_from([16, 32, 64]), n=st.sampled_from([16, 64, 128]), widened=st.booleans(),
       offset=st.sampled_from([0.0, 20.0]), seed=st.integers(0, 2**16))
@example(arch="cgra-8x8", dtype="bfloat16", rows=17, cols=64, n=128, widened=True, offset=0.0, seed=0)  # ViT's MLP
@example(arch="cgra-16x16", dtype="float16", rows=17, cols=64, n=128, widened=False, offset=20.0, seed=1)
@example(arch="cgra-4x4", dtype="bfloat16", rows=5, cols=16, n=16, widened=True, offset=0.0, seed=2)
@example(arch="cgra-4x4", dtype="float16", rows=36, cols=64, n=16, widened=True, offset=20.0, seed=15845)  # the CI's
def test_a_16_bit_layer_norm_before_a_linear_is_the_gemms_panel_bit_for_bit(arch, dtype, rows, cols, n, widened,
                                                                             offset, seed):
    """The panel is bit for bit the float32 layer norm kernel's result on x (x_h widened), rounded
    to h by ml_dtypes (seen through a signed permutation W); through a random W within float32's
    summation bound of that panel times W."""
    rng = np.random.default_rng(seed)
    half, eps = numpy_dtype(dtype), 1e-5
    gamma, beta = rng.uniform(-2, 2, cols).astype(np.float32), rng.standard_normal(cols).astype(np.float32)
    x_in = (rng.standard_normal((1, rows, cols)) * 3 + offset).astype(half if widened else np.float32)
    x = x_in.astype(np.float32).reshape(rows, cols)
    perm, signs = rng.permutation(cols), rng.choice([-1.0, 1.0], cols)
    picks = np.zeros((cols, cols), np.float32)
    picks[np.arange(cols), perm] = signs
    out, prof = _npu(_layer_module(dtype, rows, cols, cols, eps, gamma, beta, picks.astype(half), widened), x_in, arch)
    _folded(prof, rows, arch)  # no norm kernel, no cast kernel
    panel = _layer_panel_model(x, gamma, beta, eps, arch, len(prof.kernels) == 1).astype(half)
    np.testing.assert_array_equal(out, panel.astype(np.float32)[:, perm] * signs.astype(np.float32))
    w = (rng.standard_normal((n, cols)) / np.sqrt(cols)).astype(half)
    out, prof = _npu(_layer_module(dtype, rows, cols, n, eps, gamma, beta, w, widened), x_in, arch)
    _folded(prof, rows, arch)
    exact, magnitude = (p.astype(np.float64) @ q.astype(np.float64).T for p, q in ((panel, w), (np.abs(panel), np.abs(w))))
    assert np.all(np.abs(out.astype(np.float64) - exact) <= cols * 2.0 ** -24 * magnitude + 1e-38)
    centred = x.astype(np.float64) - x.astype(np.float64).mean(-1, keepdims=True)
    normed = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + eps) * gamma + beta
    scale = np.abs(gamma).max() + np.abs(beta).max()
    assert np.all(np.abs(panel.astype(np.float64) - normed) <= UNIT[dtype] * np.abs(normed) + 1e-5 * scale)


def _centred_rows(x):
    """numpy's model of the panel's centring (half_row_norm.centred_once): the REDUCE's sum left
    to right in float32 (cumsum's order), the VFUNC's product by float32 1 / n, the ELTWISE x - mean."""
    mean = np.cumsum(x, axis=-1, dtype=np.float32)[:, -1:] * np.float32(1.0 / x.shape[-1])
    return (x - mean).astype(np.float32)


def _layer_panel_model(x, gamma, beta, eps: float, arch: str, folded: bool):
    """The float32 values the 16-bit layer norm rounds to h: folded into the GEMM, numpy's centring
    then the float32 RMSNorm kernel times gamma plus beta (the panel's program, centred once);
    where the fold was refused, the float32 layer norm kernel's (the norm's own kernel's program)."""
    rows, cols = x.shape
    if not folded:
        norm = relax_module([("x", (rows, cols), "float32")], lambda bb, v: bb.emit(relax.op.nn.layer_norm(
            v, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=eps)))
        return run(npu_backend.compile(norm, arch), [x])
    rms = relax_module([("x", (rows, cols), "float32")], lambda bb, v: bb.emit(relax.op.add(bb.emit(
        relax.op.nn.rms_norm(v, relax.const(gamma), axes=[-1], epsilon=eps)), relax.const(beta))))
    with npu_backend.profile() as prof:
        out = run(npu_backend.compile(rms, arch), [_centred_rows(x)])
    assert len(prof.kernels) == 1, [k.name for k in prof.kernels]  # one RMSNorm kernel adding beta
    return out


@pytest.mark.parametrize("readers", [1, 2])
def test_the_rewrite_writes_the_norm_into_its_one_linear_and_leaves_float32_alone(readers):
    """Read by one linear, the 16-bit norm (g on its right) becomes that linear's left operand,
    multiply(g, astype(rms_norm(reshape(x), R.ones), h)); read by two (the half program twice costs
    more than its own kernel once: cgra-4x4's gate and up), and in a float32 graph, nothing changes."""
    rng = np.random.default_rng(0)
    g = rng.uniform(0.5, 1.5, 16).astype(ml_dtypes.bfloat16)
    ws = [rng.standard_normal((8, 16)).astype(ml_dtypes.bfloat16) for _ in range(readers)]

    def body(dtype):
        def emit(bb, x):
            normed = bb.emit(relax.op.nn.rms_norm(x, relax.const(np.ones(16, np.float32)), axes=[-1], epsilon=1e-6))
            if dtype == "float32":
                scaled = bb.emit(relax.op.multiply(relax.const(g.astype(np.float32)), normed))
            else:
                scaled = bb.emit(relax.op.multiply(bb.emit(relax.op.astype(normed, dtype)), relax.const(g, dtype)))
            flat = bb.emit(relax.op.reshape(scaled, (4, 16)))
            outs = [bb.emit(relax.op.matmul(flat, bb.emit(relax.op.permute_dims(relax.const(w.astype(
                numpy_dtype(dtype)), dtype))), out_dtype="float32")) for w in ws]
            return bb.emit(relax.op.add(*outs)) if readers == 2 else outs[0]
        return emit

    mod = relax_module([("x", (1, 4, 16), "float32")], body("bfloat16"))
    if readers == 1:
        text = half_norms_into_linears(mod).script()
        assert text.count("R.nn.rms_norm") == 1 and text.count("R.ones") == 1 and text.count("R.astype(") == 1
        assert "R.reshape(x, R.shape([4, 16]))" in text and "R.multiply(metadata" in text
    else:
        tvm.ir.assert_structural_equal(half_norms_into_linears(mod), mod)
    float32 = relax_module([("x", (1, 4, 16), "float32")], body("float32"))
    tvm.ir.assert_structural_equal(half_norms_into_linears(float32), float32)


@pytest.mark.parametrize("dtype", HALVES)
def test_a_norm_read_by_more_than_linears_keeps_its_kernel(dtype):
    """A 16-bit norm also read by an add (a residual) is not copied: it stays one norm kernel."""
    rng = np.random.default_rng(1)
    half = numpy_dtype(dtype)
    g, w = rng.uniform(0.5, 1.5, 16).astype(half), rng.standard_normal((8, 16)).astype(half)

    def body(bb, x):
        normed = bb.emit(relax.op.nn.rms_norm(x, relax.const(np.ones(16, np.float32)), axes=[-1], epsilon=1e-6))
        scaled = bb.emit(relax.op.multiply(relax.const(g, dtype), bb.emit(relax.op.astype(normed, dtype))))
        y = bb.emit(relax.op.matmul(scaled, bb.emit(relax.op.permute_dims(relax.const(w, dtype))), out_dtype=dtype))
        return bb.emit(relax.op.concat([y, scaled], axis=-1))

    mod = relax_module([("x", (4, 16), "float32")], body)
    tvm.ir.assert_structural_equal(half_norms_into_linears(mod), mod)


def test_a_program_over_several_row_tiles_fits_the_scratchpad_it_was_priced_in():
    """The CI's input (cgra-4x4, a widened float16 layer norm of 36 rows of 64 before a linear, row
    tiles of 20): every buffer of the panel program was double buffered while the search counted
    one copy (78,464 bytes of 65,536: the codegen refused the kernel, then a guard ran the norm on
    its own). The program's intermediates are one copy now, the panel the GEMMs read two, priced
    so (row_norm.panel_bytes): one kernel, bit for bit the model of its panel (centred once) times W."""
    rows, cols, n, eps = 36, 64, 16, 1e-5
    rng = np.random.default_rng(0)
    gamma, beta = rng.uniform(-2, 2, cols).astype(np.float32), rng.standard_normal(cols).astype(np.float32)
    x_in = (rng.standard_normal((1, rows, cols)) * 3 + 20.0).astype(np.float16)
    x = x_in.astype(np.float32).reshape(rows, cols)
    panel = _layer_panel_model(x, gamma, beta, eps, "cgra-4x4", True).astype(np.float16)
    picks = np.eye(cols, n, dtype=np.float16)  # the panel's first n columns
    out, prof = _npu(_layer_module("float16", rows, cols, n, eps, gamma, beta, picks.T.copy(), True), x_in, "cgra-4x4")
    assert len(prof.kernels) == 1, [k.name for k in prof.kernels]
    np.testing.assert_array_equal(out, panel.astype(np.float32)[:, :n])


@pytest.mark.parametrize("in_dtype", ["float32", "bfloat16"])
def test_the_16_bit_layer_norm_panel_centres_once_and_other_programs_stay(in_dtype):
    """The panel's 16-bit layer norm program drops the mean-rounding correction (drift, shift,
    centred) and reads the rows centred once; the norm kernel's own program, a 16-bit RMSNorm's
    and float32's panels keep theirs."""
    from types import SimpleNamespace

    from npu_backend.kernels.gemm.half_row_norm import centred_once
    from npu_backend.kernels.rows.norms import steps_of
    from npu_backend.kernels.rows.rows import RowSpec

    roles = dict(row_roles=("gamma", "beta"), out_dtype="bfloat16", in_dtype=in_dtype)
    plain = steps_of(RowSpec("layer_norm", "layer_norm", (64,), (64,), 1, 64, 1e-5, **roles))
    panel = centred_once(SimpleNamespace(row_norm=("layer_norm", 1e-5, "bfloat16", in_dtype)), plain)
    wide = ("wide",) if in_dtype != "float32" else ()
    assert [s.name for s in panel] == [*wide, "total", "mean", "centred0", "squares", "scale", "normed", "scaled",
                                       "layer_norm", "rounded"]
    assert {s.name for s in plain} - {s.name for s in panel} == {"drift", "shift", "centred"}
    assert all("centred" not in s.inputs for s in panel)
    assert [s.inputs for s in panel if s.name in ("squares", "normed")] == [("centred0",), ("centred0", "scale")]
    for row_norm in (None, ("layer_norm", 1e-5), ("rms_norm", 1e-6, "bfloat16", "float32")):
        assert centred_once(SimpleNamespace(row_norm=row_norm), plain) == plain
