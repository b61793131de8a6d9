"""lower/norm_rows.py: a pre-norm's A panel loaded and normalised a vector unit's lanes of rows at a
time (row_norm.py's program per piece, each piece's after its rows' DMA). End to end on the
simulator, against the same kernel without the pass: the same bits, never more cycles (fewer where
the program held the first GEMM back: GPT-NeoX's q / k / v); the program's commands over at most a piece of rows, the first
REDUCE under way before the panel's last rows are in; within 1e-5 of float64."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tvm
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import relax

import npu_backend
from cgra_sim.isa import FIELDS, Op
from npu_backend import pipeline
from npu_backend.lower.norm_rows import norm_in_rows
from npu_backend.lower.skew_panels import skew_panels
from npu_backend.target import relax_ext
from test_normed_linears import _normed_linear, _reference

_ROWS = FIELDS[Op.REDUCE].index("rows")


PASSES = {"norm_in_rows": norm_in_rows, "skew_panels": skew_panels}


def compiled_norm(mod, x, arch: str, mp, **passes: bool):
    """(output, the norm kernel's launch timeline and commands), the kernel compiled afresh with
    each of pipeline's PASSES named in `passes` kept (True) or replaced by the identity (False);
    test_skew_panels uses it too. Each is set either way: an earlier call in the same MonkeyPatch
    context may have replaced it."""
    mp.setenv("CGRA_KERNEL_CACHE", "off")
    mp.setattr(relax_ext, "_KERNEL_CACHE", collections.OrderedDict())
    for name, keep in passes.items():
        mp.setattr(pipeline, name, PASSES[name] if keep else (lambda func: func))
    vm = relax.VirtualMachine(npu_backend.compile(mod, arch), tvm.cpu())
    with npu_backend.profile(keep_timelines=True) as prof:
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
    (launch,) = [t for t in prof.timelines if "norm" in t.name]
    return out, launch


def _panel(launch) -> tuple[list, list]:
    """(the REDUCEs' row counts, the indices of the DMA loads before the first GEMM), from the
    recorded commands."""
    ops = [Op(int(record[0])) for record in launch.commands]
    first_gemm = ops.index(Op.GEMM)
    reduces = [int(r[_ROWS]) for r, op in zip(launch.commands, ops) if op == Op.REDUCE]
    loads = [i for i in range(first_gemm) if ops[i] == Op.DMA_LOAD]
    return reduces, loads


@settings(max_examples=6, deadline=None)  # two compiles each: a few seconds
@given(arch=st.sampled_from(["cgra-8x8", "cgra-4x4"]), kind=st.sampled_from(["rms_norm", "layer_norm"]),
       rows=st.integers(1, 64), cols=st.sampled_from([16, 64, 96]), n=st.sampled_from([8, 64, 192]),
       seed=st.integers(0, 99))
@example(arch="cgra-8x8", kind="layer_norm", rows=17, cols=64, n=64, seed=0)  # 8, 8, 1: a ViT's 17 tokens
@example(arch="cgra-8x8", kind="rms_norm", rows=32, cols=64, n=192, seed=1)  # GPT-NeoX's q / k / v
@example(arch="cgra-8x8", kind="rms_norm", rows=25, cols=16, n=8, seed=0)  # two row tiles of 16, the last padded
@example(arch="cgra-8x8", kind="rms_norm", rows=9, cols=16, n=192, seed=0)  # 8 + 1: B's load the later
@example(arch="cgra-4x4", kind="rms_norm", rows=64, cols=64, n=64, seed=0)  # four row tiles: the first in pieces
@example(arch="cgra-8x8", kind="layer_norm", rows=48, cols=96, n=192, seed=0)  # 18,499 -> 18,165
def test_the_panel_in_pieces_is_the_same_bits_in_no_more_cycles(arch, kind, rows, cols, n, seed):
    mod, (g, beta, w, b) = _normed_linear(rows, cols, n, 1e-5, True, seed, kind=kind)
    x = ((np.random.default_rng(seed).standard_normal((1, rows, cols)) + 3.0) * 2.0).astype(np.float32)
    with pytest.MonkeyPatch.context() as mp:
        whole, before = compiled_norm(mod, x, arch, mp, norm_in_rows=False)
        out, after = compiled_norm(mod, x, arch, mp, norm_in_rows=True)
    np.testing.assert_array_equal(out.view(np.uint32), whole.view(np.uint32))
    ref = _reference(x, 1e-5, g, beta, w, b, kind)
    assert np.abs(out.reshape(ref.shape) - ref).max() <= 1e-5 * np.abs(ref).max()
    assert after.timeline.cycles <= before.timeline.cycles
    lanes = npu_backend.load_arch(arch).vector_lanes
    reduces, _ = _panel(after)
    whole_reduces, _ = _panel(before)
    assert sum(reduces) == sum(whole_reduces)  # every row of the panel, once per REDUCE of the program
    # (a panel loaded with a zero halo, the padded last of several row tiles, stays whole; of
    # several row tiles, only the first is in pieces)
    assert reduces == whole_reduces or reduces[0] <= lanes < whole_reduces[0]


def test_the_first_rows_are_normalised_while_the_rest_load():
    """GPT-NeoX's q / k / v at 32 tokens (the plain norm; rms_norm over 64, 192 columns) on
    cgra-8x8: the panel in four loads of 8 rows, the first REDUCE started before the last load ends;
    7,418 cycles with the panel whole, 6,984 in pieces."""
    mod, _ = _normed_linear(32, 64, 192, 1e-5, True, 0)
    x = np.random.default_rng(0).standard_normal((1, 32, 64)).astype(np.float32)
    with pytest.MonkeyPatch.context() as mp:
        _, before = compiled_norm(mod, x, "cgra-8x8", mp, norm_in_rows=False)
        _, after = compiled_norm(mod, x, "cgra-8x8", mp, norm_in_rows=True)
    reduces, loads = _panel(after)
    assert reduces == [8, 8, 8, 8]
    ops = [Op(int(record[0])) for record in after.commands]
    timeline = after.timeline
    first_reduce = ops.index(Op.REDUCE)
    assert loads[0] < first_reduce < loads[1]  # the first piece's program right after its load
    assert timeline.starts[first_reduce] < timeline.ends[loads[3]]  # while the panel's last rows load
    assert after.timeline.cycles < before.timeline.cycles - 300


def test_a_kernel_without_an_arch_is_left_as_it_is():
    func = tvm.tirx.PrimFunc([], tvm.tirx.Evaluate(0))
    assert norm_in_rows(func).same_as(func)
