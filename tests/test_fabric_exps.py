"""exp on the PE fabric (cgra_sim/mapping/exp.py) and the whole-row attention's exps split between
it and the function unit (kernels/attention/fabric_exps.py, rows.py).

Stated bound of the fabric's exp(s z), s a power of two, z <= 0: within 2^-21 relative of float64
where exp(s z) >= 2^-126, within 2^-126 absolute below, exactly +0 for s z <= -88.03 and z = -inf,
exactly 1 at z = 0. The kernel with any share of its rows on the fabric: within test_attention's
bound of float64 (4e-6 of the largest |O|), a -inf score's weight exactly 0, a row of -inf NaN.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import npu_backend
from cgra_sim.fabric import Fabric
from cgra_sim.mapping import body as bodies
from cgra_sim.mapping import exp as fabric_exp
from npu_backend.kernels.attention.attention_tiles import (RowTiling, choose_attention_tiling,
                                                           estimate_attention_cycles)
from npu_backend.kernels.attention.spec import AttentionSpec
from attention_tilings import compiled_afresh
from test_attention import BOUND, _graph, _reference, _run

SCALES = [None, 0.125, 0.25, 0.5, 2.0]
RELATIVE, ABSOLUTE = 2.0 ** -21, 2.0 ** -126


def _check_exp(z: np.ndarray, scale) -> None:
    s = 1.0 if scale is None else scale
    got = fabric_exp.exp(z, scale)
    scaled = z.astype(np.float64) * s
    want = np.exp(scaled)
    normal = want >= ABSOLUTE
    assert np.all(np.abs(got[normal] - want[normal]) <= RELATIVE * want[normal]), z[normal][
        np.argmax(np.abs(got[normal] - want[normal]) / want[normal])]
    assert np.all(np.abs(got[~normal] - want[~normal]) <= ABSOLUTE)
    assert np.all(got[scaled <= -88.03] == 0) and not np.any(np.signbit(got))
    assert np.all(got[z == 0] == 1)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.lists(st.floats(-60, 60, width=32), min_size=1, max_size=40), min_size=1, max_size=6),
       spread=st.sampled_from([0.1, 1.0, 8.0, 40.0]), masked=st.floats(0, 0.6), scale=st.sampled_from(SCALES),
       seed=st.integers(0, 2 ** 16))
@example(rows=[[0.0, -87.0, -87.4, -88.0, -88.03, -88.1, -103.9, -104.0, -200.0, -3e38]], spread=1.0, masked=0.0,
         scale=None, seed=0)
def test_exp_body_matches_float64_on_softmax_like_inputs(rows, spread, masked, scale, seed):
    """z = x - max(x) per row (x scaled by `spread`, some entries -inf as a mask makes them):
    z <= 0, the maximum exactly 0; every element within the stated bound, -inf exactly +0."""
    rng = np.random.default_rng(seed)
    width = max(len(r) for r in rows)
    x = np.array([r + [0.0] * (width - len(r)) for r in rows], np.float32) * np.float32(spread)
    x[rng.random(x.shape) < masked] = -np.inf
    x[:, 0] = np.where(np.isinf(x[:, 0]), 0, x[:, 0])  # every row keeps a finite score
    s = 1.0 if scale is None else scale
    z = (x - x.max(-1, keepdims=True)).astype(np.float32) / np.float32(s)  # scale z is x - max
    _check_exp(z, scale)
    assert np.all(fabric_exp.exp(z, scale)[np.isneginf(z)] == 0)


@settings(max_examples=40, deadline=None)
@given(z=st.lists(st.floats(-2.0 ** 100, 0, width=32), min_size=1, max_size=64), scale=st.sampled_from(SCALES))
def test_exp_body_on_very_negative_arguments(z, scale):
    _check_exp(np.array(z, np.float32), scale)


def test_exp_bodies_fit_the_fabric_and_stream_an_element_a_cycle_on_cgra_8x8():
    """Each body is a legal FABRIC body (16 nodes at most, shifts on int32) and the three map on
    cgra-8x8 at about the function unit's rate together (0.95 elements a cycle)."""
    fabric = Fabric.of(npu_backend.load_arch("cgra-8x8"))
    per_element = 0.0
    for nodes, dtype in fabric_exp.passes(0.125):
        bodies.check_body(nodes, dtype)
        program = bodies.program(nodes, dtype, fabric)
        per_element += program.ii / program.lanes
    assert 1 / per_element >= 0.9


def test_a_nan_argument_gives_nan_or_zero_never_a_number():
    with np.errstate(invalid="ignore"):
        z = np.array([np.nan, -np.nan, np.float32(np.inf) - np.float32(np.inf)], np.float32)
    got = fabric_exp.exp(z)
    assert np.all(np.isnan(got) | (got == 0))


def _forced(fabric_rows: int | None):
    """The search's tiling with `fabric_rows` rows of each item on the fabric (at most its rows;
    None: as the search chooses), compiled afresh."""
    if fabric_rows is None:
        return compiled_afresh()
    return compiled_afresh(fabric_tiling=lambda spec, arch, t: dataclasses.replace(t, fabric_rows=min(fabric_rows, t.rows)))


@settings(max_examples=6, deadline=None)
@given(b=st.integers(1, 3), h=st.sampled_from([1, 2]), s=st.integers(2, 20), d=st.sampled_from([16, 32]),
       mask=st.sampled_from(["none", "bias", "minus-inf"]), fabric_rows=st.integers(1, 20), seed=st.integers(0, 2 ** 16))
@example(b=2, h=2, s=16, d=32, mask="bias", fabric_rows=6, seed=1)  # Swin's first-stage item
def test_the_split_kernel_matches_float64(b, h, s, d, mask, fabric_rows, seed):
    """Any share of the rows on the fabric (forced): within test_attention's bound, a -inf
    score's weight exactly 0 (a key masked for every query row leaves the output as without it)."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(3))
    bias = None
    if mask != "none":
        bias = rng.standard_normal((1, h, s, s)).astype(np.float32)
        if mask == "minus-inf":  # keys masked for every query row, key 0 kept
            bias[..., 1:][..., rng.random(s - 1) < 0.3] = -np.inf
    scale = float(d) ** -0.5  # 1/4 (the exp's scale without a mask) or 1/sqrt(32) (the Q tile's)
    with _forced(fabric_rows):
        out, prof = _run(_graph(b, h, h, s, s, d, scale, mask_const=bias), [q, k, v], "cgra-8x8")
    assert sum(kernel.op_counts["FABRIC"] for kernel in prof.kernels) > 0
    expected = _reference(q, k, v, bias, scale, safe=False)
    assert np.abs(out - expected).max() <= BOUND * np.abs(expected).max()


def test_a_row_of_minus_infinity_gives_nan_through_the_fabric():
    """A plain softmax's row that sees no key: NaN on the fabric's rows as on the VFUNC's."""
    rng = np.random.default_rng(3)
    b, h, s, d = 1, 1, 8, 16
    q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(3))
    mask = np.zeros((b, 1, s, s), np.float32)
    mask[..., 1, :] = mask[..., 6, :] = -np.inf  # row 1 on the fabric, row 6 on the function unit
    with _forced(3):
        out, prof = _run(_graph(b, h, h, s, s, d, 0.25, mask_shape=mask.shape), [q, k, v, mask], "cgra-8x8")
    assert sum(kernel.op_counts["FABRIC"] for kernel in prof.kernels) > 0
    assert np.all(np.isnan(out[0, 0, [1, 6]]))
    expected = _reference(q, k, v, mask, 0.25, safe=False)
    kept = [i for i in range(s) if i not in (1, 6)]
    assert np.abs(out[..., kept, :] - expected[..., kept, :]).max() <= BOUND * np.abs(expected[..., kept, :]).max()


SWIN = AttentionSpec(32, 1, 1, 16, 16, 32, 32, scale=32 ** -0.5, mask_shape=(1, 1, 1, 16, 16))


def test_swin_windows_take_the_fabric_where_it_is_priced_cheaper():
    """Swin's window attention (16 x 16 items, the vector unit the busier unit) takes a share;
    a safe softmax, a causal one and a GEMM-bound one (64 dims over 128 keys) keep the VFUNC."""
    arch = npu_backend.load_arch("cgra-8x8")
    t = choose_attention_tiling(SWIN, arch)
    assert isinstance(t, RowTiling) and 0 < t.fabric_rows < t.rows, t
    assert estimate_attention_cycles(SWIN, arch, t) < estimate_attention_cycles(
        SWIN, arch, dataclasses.replace(t, fabric_rows=0))
    for spec in (dataclasses.replace(SWIN, safe=True), dataclasses.replace(SWIN, mask_shape=(), causal=0),
                 AttentionSpec(1, 2, 1, 128, 128, 64, 64, scale=0.125)):
        assert getattr(choose_attention_tiling(spec, arch), "fabric_rows", 0) == 0, spec


@pytest.mark.slow
def test_swin_window_attention_is_faster_with_the_fabric():
    """Swin's first stage's shape on cgra-8x8: the split kernel against the VFUNC alone, both
    measured (the estimate's choice is cheaper on the simulator too)."""
    rng = np.random.default_rng(0)
    b, h, s, d = 16, 2, 16, 16
    q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(3))
    bias = rng.standard_normal((1, h, s, s)).astype(np.float32)
    mod = _graph(b, h, h, s, s, d, 0.25, mask_const=bias)
    cycles = {}
    for split in (True, False):
        with _forced(None if split else 0):
            _, prof = _run(mod, [q, k, v], "cgra-8x8")
        cycles[split] = sum(kernel.cycles for kernel in prof.kernels if kernel.op_counts["GEMM"])
        assert (sum(kernel.op_counts["FABRIC"] for kernel in prof.kernels) > 0) == split
    assert cycles[True] < 0.9 * cycles[False], cycles
