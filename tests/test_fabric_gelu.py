"""GELU's erf form on the PE fabric (cgra_sim/mapping/gelu_erf.py) and a GEMM + GELU kernel's
GELUs split between it and the VFUNC (kernels/gemm/fabric_gelu.py).

Stated bound of the fabric's x Phi(x) against float64 (math.erfc): within 4.6 ulps for x >= -1,
8.2 for x >= -2, 23 for x >= -4, 1.7e-5 relative on [-5, -4), 3.2e-7 absolute below -5;
|error| <= 2.2e-7 |x| everywhere; +inf -> +inf, -inf and NaN -> NaN. Each pass in the simulator
is its numpy model bit for bit. The kernel with any share of its rows on the fabric: within 1e-5
of the largest output of float64 numpy, the share's rows bit-exact to the model where the GEMM
sums exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

from cgra_sim import load_arch, simulate
from cgra_sim.mapping import body as bodies
from cgra_sim.mapping import gelu_erf
from npu_backend.kernels import registry
from npu_backend.kernels.gemm import fabric_gelu, gemm
from npu_backend.target import relax_ext
from test_bias_accumulator import _linear, _reference, _run
from test_sim_fabric import _stream

SMALL = load_arch("cgra-4x4")
_ERFC = np.vectorize(math.erfc)


def _float64_gelu(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x * 0.5 * _ERFC(-x / math.sqrt(2))


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.abs(got - want) / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)


def test_the_fabric_gelu_keeps_its_stated_bound():
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-12, 12, 120001), 3 * rng.standard_normal(30000)]).astype(np.float32)
    got, want = gelu_erf.gelu(x).astype(np.float64), _float64_gelu(x)
    for low, ulps in ((-1, 4.6), (-2, 8.2), (-4, 23.5)):
        kept = x >= low
        assert _ulps(got[kept], want[kept]).max() <= ulps, low
    band = (x >= -5) & (x < -4)
    assert np.max(np.abs(got[band] - want[band]) / np.abs(want[band])) <= 1.7e-5
    assert np.abs(got[x < -5] - want[x < -5]).max() <= 3.2e-7
    assert np.all(np.abs(got - want) <= 2.2e-7 * np.abs(x.astype(np.float64)))


def test_specials():
    got = gelu_erf.gelu(np.array([0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 6.0], np.float32))
    assert got[0] == 0 and got[1] == np.inf and np.isnan(got[2]) and np.isnan(got[3])
    assert got[4] == np.float32(1e30) and got[5] == 0 and got[6] == np.float32(6.0)


def test_bodies_fit_a_record_and_map_on_every_preset():
    for nodes, dtype in gelu_erf.passes() + ((gelu_erf.bias_add(), "float32"),):
        bodies.check_body(nodes, dtype)
    for preset in ("cgra-4x4", "cgra-8x8", "cgra-16x16"):
        assert fabric_gelu.fabric_cycles(load_arch(preset), 4, 16) > 0


def _pass(nodes, dtype, a: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """One pass over a rows x cols tile through the simulator."""
    rows, cols = a.shape
    out = np.zeros((rows, cols), dtype)
    records = _stream(nodes, dtype, rows, cols, (a.ravel(), cols, 1), None if b is None else (b.ravel(), cols, 1), cols)
    simulate(SMALL, records, [a.ravel().copy()] + ([] if b is None else [b.ravel().copy()]) + [out])
    return out


values = st.one_of(st.floats(-12, 12, width=32), st.sampled_from([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e-30]))


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 4), cols=st.integers(1, 9), data=st.data())
def test_each_pass_in_the_simulator_is_its_numpy_model_bit_for_bit(rows, cols, data):
    x = np.array(data.draw(st.lists(values, min_size=rows * cols, max_size=rows * cols)), np.float32).reshape(rows, cols)
    (high, f32), (low, _), (first, _), (second, _), (third, i32), (logistic, _) = gelu_erf.passes()
    q = _pass(high, f32, x, None)
    z = _pass(low, f32, x, q)
    t = _pass(first, f32, z, None)
    p = _pass(second, f32, z, t)
    e = _pass(third, i32, t.view(np.int32), p.view(np.int32)).view(np.float32)
    out = _pass(logistic, f32, x, e)
    np.testing.assert_array_equal(q, bodies.evaluate(high, f32, x))
    np.testing.assert_array_equal(z, bodies.evaluate(low, f32, x, q))
    np.testing.assert_array_equal(out.view(np.int32), gelu_erf.gelu(x).view(np.int32))


@contextlib.contextmanager
def _forced(rows: int | None, taken: list | None = None):
    """Compiles afresh with the share forced to `rows` of each tile where it applies (its
    epilogue then in one piece; 0: none; None: the priced choice); `taken` gets the tilings."""
    def force(spec, t, arch, bias):
        whole = dataclasses.replace(t, epilogue_rows=0)
        if not fabric_gelu.applies(spec, whole):
            return t
        t = dataclasses.replace(whole, fabric_gelu_rows=min(rows, t.tm), bias_in_acc=False)
        if taken is not None:
            taken.append(t)
        return t

    with pytest.MonkeyPatch.context() as patch:
        if rows:
            patch.setattr(gemm, "share_tiling", force)
        elif rows == 0:
            patch.setattr(gemm, "share_tiling", lambda spec, t, arch, bias: t)
        patch.setenv("CGRA_KERNEL_CACHE", "off")
        patch.setattr(registry, "_TILINGS", {})
        patch.setattr(gemm, "_TILINGS", {})
        relax_ext.clear_kernel_cache()
        try:
            yield
        finally:
            relax_ext.clear_kernel_cache()


def _fabric_count(prof) -> int:
    return sum(kernel.op_counts.get("FABRIC", 0) for kernel in prof.kernels)


@settings(max_examples=5, deadline=None)
@given(rows=st.sampled_from([8, 16, 24, 32]), depth=st.sampled_from([8, 16]), n=st.sampled_from([8, 16, 32]),
       share=st.integers(1, 32), seed=st.integers(0, 2 ** 16))
@example(rows=16, depth=16, n=16, share=3, seed=1)
def test_any_share_matches_float64(rows, depth, n, share, seed):
    """Any share of the rows on the fabric (forced where it applies: whole row tiles), on
    cgra-8x8: within 1e-5 of the largest output."""
    mod, (w, b) = _linear(rows, depth, n, "gelu", None, seed)
    x = np.random.default_rng(seed + 1).standard_normal((rows, depth)).astype(np.float32)
    taken = []
    with _forced(share, taken):
        got, prof = _run(mod, x, "cgra-8x8")
    assert (_fabric_count(prof) > 0) == bool(taken)
    assert taken or rows == 24
    want = _reference(x, w, b, "gelu", None)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def _grid_linear(rows: int, depth: int, n: int, seed: int):
    """main(x) = gelu(x @ W^T + b) with W and b on a grid of 1/8 (small): x on that grid too, the
    GEMM's sums are exact in float32 whatever their order."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-8, 9, (n, depth)).astype(np.float32) / 8
    b = rng.integers(-8, 9, n).astype(np.float32) / 8
    x = relax.Var("x", relax.TensorType((rows, depth), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(relax.const(w))))),
                                     relax.const(b)))
            out = bb.emit_output(relax.op.nn.gelu(y))
        bb.emit_func_output(out)
    return bb.get(), (w, b)


@pytest.mark.parametrize("share", [3, 8])
def test_the_share_rows_are_the_model_bit_for_bit(share):
    """The share's rows of each tile equal gelu_erf.gelu of the exact x W^T + b (3 rows: t in the
    scratch's other half; all 8 of a tile: x's first half holds the second half's t)."""
    rows, depth, n = 16, 8, 16
    mod, (w, b) = _grid_linear(rows, depth, n, 4)
    x = np.random.default_rng(5).integers(-8, 9, (rows, depth)).astype(np.float32) / 8
    tiles = []
    with _forced(share, tiles):
        got, prof = _run(mod, x, "cgra-8x8")
    assert _fabric_count(prof) > 0 and tiles
    exact = x.astype(np.float64) @ w.T.astype(np.float64) + b
    assert np.array_equal(exact.astype(np.float32), exact)
    tiling = tiles[-1]
    mine = [r for r in range(rows) if r % tiling.tm < tiling.fabric_gelu_rows]
    np.testing.assert_array_equal(got[mine], gelu_erf.gelu(exact.astype(np.float32))[mine])
    want = _reference(x, w, b, "gelu", None)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_the_share_pays_on_cgra_4x4_and_is_refused_where_it_does_not():
    """cgra-4x4 has no function unit (GELU on its lanes): the priced share is taken and the kernel
    is faster; on cgra-8x8 a 16-deep fc1 with its bias in the accumulator takes none."""
    mod, (w, b) = _linear(64, 16, 32, "gelu", None, 2)
    x = np.random.default_rng(3).standard_normal((64, 16)).astype(np.float32)
    want = _reference(x, w, b, "gelu", None)
    with _forced(None):
        shared, prof = _run(mod, x, "cgra-4x4")
    with _forced(0):
        alone, base = _run(mod, x, "cgra-4x4")
    assert _fabric_count(prof) > 0 and _fabric_count(base) == 0
    assert sum(k.cycles for k in prof.kernels) < sum(k.cycles for k in base.kernels)
    for got in (shared, alone):
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_a_normed_fc1_shares_on_cgra_4x4():
    """Swin's layer norm + fc1 + GELU kernel (the norm on the A panel): the priced share is
    taken, within 1e-5 of float64."""
    mod, (w, b) = _linear(32, 32, 32, "gelu", "layer_norm", 6)
    x = np.random.default_rng(7).standard_normal((32, 32)).astype(np.float32)
    with _forced(None):
        got, prof = _run(mod, x, "cgra-4x4")
    assert _fabric_count(prof) > 0
    want = _reference(x, w, b, "gelu", "layer_norm")
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
